"""The heterogeneous MIMO trainer (imports torch/megatron: never imported by the CLI at start-up)."""
