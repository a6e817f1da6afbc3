"""The heterogeneous MIMO trainer: an encoder and an LLM on disjoint ranks, joined by a bridge.

Importing the package or any of its modules imports no torch: torch/megatron are imported inside the
functions that use them (manifest.py, which `mimo-jobs status` reads checkpoints with, never imports them).

Modules, in the order a run uses them:
  main              entry point (`python -m mimo_jobs.trainer RUN_YAML`): preflight checks, the training loop
  cuda_shims        torch.cuda stand-ins megatron-core 0.16.1 needs on a CPU-only torch build
  build             builds one rank's TrainState: process groups, models, DDP, optimizers, data, bridge
  grids             process groups of both modules, created in one fixed order on every rank; the rank's role
  models            the ViT encoder + projector and the GPT LLM (dense or MoE), layout-independent init
  optimizer         MimoOptimizer: one megatron optimizer per module, world-wide grad norm and skip decision
  schedule          learning-rate schedules by consumed samples
  data              the mock data provider, and the switch to the energon provider (mimo_jobs.data)
  batch             the batch contract between data providers and the step (LaneBatch, Provider)
  step              one training iteration: data, encoder, bridge, LLM, gradient reduction, optimizer
  bridge            variable-token exchange of image embeddings and their gradients between the modules
  iterlog           Megatron-format iteration lines and the metrics.jsonl records
  checkpointer      the loop's checkpoint hooks: resume, periodic saves, stop-save-requeue
  signals           preemption signals and time limits: one world-wide stop decision, the requeue marker
  checkpoint        the collective, atomic save and load of a sharded checkpoint
  checkpoint_state  the torch state in a checkpoint: RNG, weights (dense | expert), optimizer state
  manifest          the checkpoint directory format, read without torch: manifest, latest, compatibility
"""
