"""The Kubernetes executor's job side, through the official `kubernetes` client (imported here, when a job
is submitted or followed; never when the CLI starts). It talks to the cluster of the study's kubeconfig
context (`cluster.kubernetes.context`, else the kubeconfig's current one; inside a pod, its service
account), like kubectl does.

- submit: create the run's TrainJob (trainjob.yaml, with the attempt's name) with strict field validation,
  so the API server refuses a field it would otherwise drop; a name clash (409) is refused, not replaced.
- poll: read each TrainJob and the pods JobSet made for it (label jobset.sigs.k8s.io/jobset-name), mapped
  by states.py; when a job has ended its pods' logs are saved per node rank into the run directory
  (logs/k8s-<job>.node-<rank>.out) for `ingest`, beside torchrun's per-rank files on the PVC.
- cancel: save the logs, then delete the TrainJob (JobSet deletes its pods); reap: delete, and report done
  once no pod of it is left, so another attempt never starts beside it.
- find: the run's TrainJobs by its run-id label, as `find` of executors/base.py says.
- status: a suspended TrainJob's reason is Kueue's, read from the Workload it gates it with (states.py).
- requeue: a new attempt is a new TrainJob (`mj-<run id>-a<attempt>`) on the same run directory and PVC;
  the trainer resumes from the run's latest checkpoint as under SLURM.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timezone
from pathlib import Path
from typing import Any

import yaml

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.submit.jobs_table import JobFacts

from ..base import SubmitError
from . import manifest as M
from . import schema, states

REQUEST_TIMEOUT_S = 30  # one API call; a server that does not answer is an error, never a hang


class KubernetesExecutor:
    name = "kubernetes"
    pet_rendezvous = True

    def __init__(self) -> None:
        self._apis: dict[str | None, Any] = {}

    # ------------------------------------------------------------------------------ rendering

    def launch_file(self, rd: RunDir) -> Path:
        return rd.trainjob_yaml

    def artefacts(self, spec, rd: RunDir) -> dict[Path, str]:
        """trainjob.yaml: the run's TrainJob (attempt 0), checked against the Trainer API's models."""
        root = M.runs_root_of(rd.root)
        ck = rd.checkpoint_dir(spec.trainer.checkpoint_dir)
        if not ck.resolve().is_relative_to(root.resolve()):
            raise schema.ManifestError(
                f"trainer.checkpoint_dir {ck} is outside the runs root {root}: the pods see only the PVC "
                "mounted there (write a path under it)"
            )
        doc = M.trainjob(spec, rd, 0)
        schema.check(doc, f"{spec.name}: TrainJob")
        return {rd.trainjob_yaml: yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)}

    def problems(self, runs: list) -> list[str]:
        out = []
        for r in runs:
            if r.cluster.kubernetes is None:
                out.append(
                    f"{r.name}: --executor kubernetes needs cluster.kubernetes in the study (at least its "
                    "pvc: the PersistentVolumeClaim holding the runs root; docs/kubernetes.md)"
                )
            reserved = sorted(k for k in r.cluster.env if k.startswith(M.RESERVED_ENV_PREFIX))
            if reserved:
                out.append(
                    f"{r.name}: cluster.env sets {', '.join(reserved)}: Kubeflow Trainer's torch plugin owns "
                    f"the {M.RESERVED_ENV_PREFIX}* variables (its webhook refuses the TrainJob)"
                )
        return list(dict.fromkeys(out))

    # ------------------------------------------------------------------------------ the cluster

    def _target(self, rd: RunDir) -> tuple[dict, str | None]:
        """(the rendered manifest, the kubeconfig context) of a run directory."""
        try:
            doc = yaml.safe_load(rd.trainjob_yaml.read_text())
            run = yaml.safe_load(rd.run_yaml.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SubmitError(
                f"{rd.root}: cannot read the rendered TrainJob ({e}); render the run again"
            ) from None
        context = (((run.get("cluster") or {}).get("kubernetes")) or {}).get("context")
        return doc, context

    def _api(self, context: str | None):
        if context not in self._apis:
            try:
                from kubernetes import client, config
            except ImportError:
                raise SubmitError(
                    "the Kubernetes executor needs the `kubernetes` client: pip install 'mimo-jobs[kubernetes]'"
                ) from None

            try:
                if context is None and not _kubeconfig_exists() and "KUBERNETES_SERVICE_HOST" in os.environ:
                    config.load_incluster_config()
                    api = client.ApiClient()
                else:
                    # $KUBECONFIG as it is now: the client's default is the one at its import
                    api = config.new_client_from_config(config_file=_kubeconfig(), context=context)
            except Exception as e:  # noqa: BLE001 (the config loader raises several kinds)
                raise SubmitError(
                    f"no Kubernetes API to talk to (kubeconfig {_kubeconfig()}"
                    f"{', context ' + context if context else ''}): {e}"
                ) from None
            self._apis[context] = (api, client.CustomObjectsApi(api), client.CoreV1Api(api))
        return self._apis[context]

    def _call(
        self,
        what: str,
        fn,
        *args,
        missing_ok: bool = False,
        forbidden_ok: bool = False,
        conflict: str | None = None,
        **kw,
    ):
        """One API call; its errors as SubmitError naming `what` (404 as None when `missing_ok`, 403 when
        `forbidden_ok`; 409 as `conflict` when given)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT_S, **kw)
        except ApiException as e:
            if (missing_ok and e.status == 404) or (forbidden_ok and e.status == 403):
                return None
            if conflict and e.status == 409:
                raise SubmitError(conflict) from None
            body = e.body[:500] if isinstance(e.body, str) else ""
            raise SubmitError(
                f"{what}: the API server answered {e.status} {e.reason}: {body}".rstrip(": ")
            ) from None
        except (OSError, HTTPError) as e:  # connection refused, DNS, TLS, timeouts
            raise SubmitError(f"{what}: cannot reach the Kubernetes API server: {e}") from None

    def _trainjob(self, job_id: str, ns: str, context: str | None) -> dict | None:
        _, co, _ = self._api(context)
        return self._call(
            f"read TrainJob {ns}/{job_id}",
            co.get_namespaced_custom_object,
            M.GROUP,
            M.VERSION,
            ns,
            M.PLURAL,
            job_id,
            missing_ok=True,
        )

    def _pods(self, job_id: str, ns: str, context: str | None) -> list[dict]:
        api, _, core = self._api(context)
        selector = f"{M.JOBSET_NAME_LABEL}={job_id}"
        got = self._call(
            f"list the pods of {ns}/{job_id}", core.list_namespaced_pod, ns, label_selector=selector
        )
        pods = [api.sanitize_for_serialization(p) for p in got.items]
        # the selector is the server's to apply; a pod of another job is never counted as this one's
        return [
            p
            for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get(M.JOBSET_NAME_LABEL) == job_id
        ]

    def _workload(self, trainjob: dict, ns: str, context: str | None) -> dict | None:
        """The Workload Kueue gates the TrainJob with (by its uid label), in the first Kueue API version the
        server serves; None without Kueue, or where the user may not read Workloads (the reason is then
        the TrainJob's own)."""
        uid = (trainjob.get("metadata") or {}).get("uid")
        if not uid:
            return None
        _, co, _ = self._api(context)
        selector = f"{M.KUEUE_JOB_UID_LABEL}={uid}"
        for version in M.KUEUE_VERSIONS:
            got = self._call(
                f"list the Kueue Workloads of {ns}/{trainjob['metadata'].get('name')}",
                co.list_namespaced_custom_object, M.KUEUE_GROUP, version, ns, M.KUEUE_PLURAL,
                label_selector=selector, missing_ok=True, forbidden_ok=True,
            )  # fmt: skip
            if got is None:
                continue  # this version is not served (or not readable): try the next
            mine = [
                w
                for w in got.get("items") or []
                if ((w.get("metadata") or {}).get("labels") or {}).get(M.KUEUE_JOB_UID_LABEL) == uid
            ]
            return max(
                mine, key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "", default=None
            )
        return None

    # ------------------------------------------------------------------------------ the job side

    def submit_command(self, rd: RunDir, job_id: str | None = None) -> list[str]:
        return ["kubectl", "create", "-f", str(rd.trainjob_yaml)]

    def new_job_id(self) -> None:
        return None  # the name is the attempt's (manifest.job_name), set in submit

    def submit(
        self, rd: RunDir, attempt: int, time_limit_s: int, signal: str, job_id: str | None = None
    ) -> str:
        doc, context = self._target(rd)
        body = M.for_attempt(doc, attempt)
        try:
            schema.check(body, f"{rd.trainjob_yaml}")
        except schema.ManifestError as e:
            raise SubmitError(str(e)) from None
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        rd.logs.mkdir(parents=True, exist_ok=True)
        _, co, _ = self._api(context)
        self._call(
            f"create TrainJob {ns}/{name}", co.create_namespaced_custom_object, M.GROUP, M.VERSION, ns, M.PLURAL,
            body, field_validation="Strict",
            conflict=f"TrainJob {ns}/{name} already exists (a job of this run submitted from another store?); "
            f"delete it first: kubectl delete trainjob -n {ns} {name}",
        )  # fmt: skip
        return name

    def job_facts(self, job_id: str, rd: RunDir) -> JobFacts:
        doc, context = self._target(rd)
        ns = doc["metadata"]["namespace"]
        tj = self._trainjob(job_id, ns, context)
        pods = self._pods(job_id, ns, context) if tj is not None else []
        workload = self._workload(tj, ns, context) if states.held(tj) else None
        f = states.facts(job_id, tj, pods, workload)
        if tj is not None and not jobstates.is_active(f.state):
            self.save_logs(job_id, rd, pods, ns, context)
            if f.state == jobstates.BOOT_FAIL:  # ended for us: nothing of it may wait on the cluster
                self._delete(job_id, ns, context)
        return f

    def poll(self, rds: dict[str, RunDir]) -> dict[str, JobFacts]:
        return {job_id: self.job_facts(job_id, rd) for job_id, rd in rds.items()}

    def save_logs(
        self, job_id: str, rd: RunDir, pods: list[dict], ns: str, context: str | None
    ) -> list[Path]:
        """Each node rank's pod log (its `node` container) into the run directory, replaced atomically."""
        _, _, core = self._api(context)
        out = []
        for p in states.latest_pods(pods):
            pod = (p.get("metadata") or {}).get("name")
            text = self._call(
                f"read the log of pod {ns}/{pod}", core.read_namespaced_pod_log, pod, ns,
                container=M.NODE, missing_ok=True,
            )  # fmt: skip
            if text is None:
                continue
            path = rd.pod_log(job_id, states.node_rank(p))
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, text if isinstance(text, str) else str(text))
            out.append(path)
        return out

    def _delete(self, job_id: str, ns: str, context: str | None) -> None:
        _, co, _ = self._api(context)
        self._call(
            f"delete TrainJob {ns}/{job_id}", co.delete_namespaced_custom_object, M.GROUP, M.VERSION, ns,
            M.PLURAL, job_id, propagation_policy="Foreground", missing_ok=True,
        )  # fmt: skip

    def cancel(self, job_id: str, rd: RunDir) -> None:
        doc, context = self._target(rd)
        ns = doc["metadata"]["namespace"]
        if self._trainjob(job_id, ns, context) is None:
            return
        self.save_logs(job_id, rd, self._pods(job_id, ns, context), ns, context)
        self._delete(job_id, ns, context)

    def reap(self, job_id: str, rd: RunDir) -> bool:
        doc, context = self._target(rd)
        ns = doc["metadata"]["namespace"]
        self._delete(job_id, ns, context)
        return not self._pods(job_id, ns, context)

    def find(self, rd: RunDir, since_epoch: float) -> list[JobFacts]:
        """The run's TrainJobs (its run-id label) created since `since_epoch` (a minute's slack for the
        clocks of two machines) and every one not ended, however old."""
        doc, context = self._target(rd)
        ns, run_id = doc["metadata"]["namespace"], doc["metadata"]["labels"][M.LABEL_RUN_ID]
        _, co, _ = self._api(context)
        got = self._call(
            f"list the TrainJobs of run {run_id}", co.list_namespaced_custom_object, M.GROUP, M.VERSION, ns,
            M.PLURAL, label_selector=f"{M.LABEL_RUN_ID}={run_id}",
        )  # fmt: skip
        out = []
        for tj in (got or {}).get("items") or []:
            meta = tj.get("metadata") or {}
            if (meta.get("labels") or {}).get(M.LABEL_RUN_ID) != run_id:
                continue
            created = states.api_time(meta.get("creationTimestamp"))
            recent = created is None or created.replace(tzinfo=timezone.utc).timestamp() >= since_epoch - 60
            if recent or not states.ended(tj):  # as SLURM's squeue: a live job of the run, however old
                out.append(self.job_facts(meta["name"], rd))
        return out

    def log_path(self, rd: RunDir, job_id: str) -> str:
        return str(rd.pod_log(job_id, 0))


def _kubeconfig() -> str:
    """The kubeconfig files kubectl would read: $KUBECONFIG (paths joined by os.pathsep), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def _kubeconfig_exists() -> bool:
    return any(Path(p).expanduser().is_file() for p in _kubeconfig().split(os.pathsep) if p)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
