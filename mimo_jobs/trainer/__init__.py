"""The heterogeneous MIMO trainer: encoder modules and an LLM, each module on ranks of its own joined to the
LLM by a bridge, or every module on every rank (colocated).

Training code: its modules import torch and megatron-core at the top (the toolkit imports none of them).
`python -m mimo_jobs.trainer` sets the device environment before torch is imported (device.py).

Modules, in the order a run uses them:
  __main__          `python -m mimo_jobs.trainer RUN_YAML`: hides CUDA for a CPU run, then main
  device            CPU or GPU, decided from run.yaml before torch is imported (torch-free)
  stack             the Python and megatron-core release the trainer needs, checked before megatron is imported
  main              entry point: preflight checks, the training loop
  cuda_shims        torch.cuda stand-ins megatron-core 0.19 needs for a CPU run
  build             builds one rank's TrainState: process groups, models, DDP, optimizers, data, bridge
  step/             one training iteration (iteration), one program per rank role iterating the encoder
                    modules by name (reference, colocated, encoder_rank, llm_stage; common: what they share)
  signals           preemption signals and time limits: one world-wide stop decision, the requeue marker
  parallel/
    grids           process groups of both modules, created in one fixed order on every rank; the rank's role
    bridge          variable-token exchange of image embeddings and their gradients between the modules
    pipeline        activations and gradients between adjacent LLM pipeline stages, the 1F1B order
  model/
    kernels         layer backend (Transformer Engine | local) and fused kernels, by device and packages
    models          the ViT encoder + projector and the GPT LLM (dense or MoE), layout-independent init
    audio_encoder   the Whisper-class audio encoder and its projector (AudioTower)
    optimizer       MimoOptimizer: one megatron optimizer per module, world-wide grad norm and skip decision
    schedule        learning-rate schedules by consumed samples
  checkpoint/
    checkpointer    the loop's checkpoint hooks: resume, periodic saves, stop-save-requeue
    files           the collective, atomic save and load of a sharded checkpoint
    state           the torch state in a checkpoint: RNG, weights (dense | expert), optimizer state
    as_data         handed-over pickles (checkpoint parts, a torch_dist index) read as data, never as code
    reshard         a checkpoint loaded under another layout, full tensors assembled from its shard table
  weights/
    hf_load         trainer.init from HuggingFace safetensors: checked, then read shard by shard
    positions       a ViT's position table resampled to another image size (bicubic)
    audio_hf        the audio encoder's HuggingFace weights: a Whisper directory in, a built module's out
    hf_export       a checkpoint (any layout) -> HuggingFace directories (`mimo-jobs export`)
    megatron_load   trainer.init.llm from a Megatron-LM distributed (torch_dist) checkpoint
  observe/
    iterlog         Megatron-format iteration lines and the metrics.jsonl records
    trackers        TensorBoard / W&B from the same records; a failing dashboard never stops training
    memory          measured memory per rank (saved activations, parameters, optimizer state)
    profile         the benchmark hook: per-rank phase times and peaks

Elsewhere: the batch contract and the mock provider are mimo_jobs.data.batch / mimo_jobs.data.mock; the
checkpoint directory format (read without torch) is mimo_jobs.contract.manifest.
"""
