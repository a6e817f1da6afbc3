"""Weights handed over or handed out: HuggingFace safetensors into a built module and a checkpoint out as
HuggingFace directories, and a Megatron-LM checkpoint's LLM weights in. Which tensor is which is each
family's (mimo_jobs/model/families/), through the torch-free mapping engine (mimo_jobs/model/hf_weights.py)
and checks (mimo_jobs/model/hf_check.py) that `validate` applies too.

Modules:
  hf_load         trainer.init from HuggingFace safetensors: checked, then read shard by shard
  positions       a ViT's position table resampled to another image size (bicubic)
  audio_hf        the audio encoder's HuggingFace weights: a Whisper directory in, a built module's out
  hf_export       a checkpoint (any layout) -> HuggingFace directories (`mimo-jobs export`)
  megatron_load   trainer.init.llm from a Megatron-LM distributed (torch_dist) checkpoint
"""
