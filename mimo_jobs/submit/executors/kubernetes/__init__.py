"""The Kubernetes executor: a run becomes a Kubeflow Trainer `TrainJob` (trainer.kubeflow.org/v1alpha1),
queued by Kueue, in one package:

- `section`   its study section, `cluster.kubernetes` (namespace, runtime, image, PVC, Kueue queue, ...)
- `manifest`  the TrainJob of a run (pure): what `<run dir>/trainjob.yaml` holds
- `schema`    a manifest checked against the Trainer API's published models (`kubeflow-trainer-api`)
- `states`    a TrainJob's conditions and its pods as the scheduler facts every executor reports (pure)
- `executor`  its job side through the `kubernetes` client (imported only when a job is submitted or
              followed): submit, poll, cancel, per-node-rank logs into the run directory

docs/kubernetes.md says what the cluster needs (Kubeflow Trainer, Kueue, a PVC) and how a study names it.
"""
