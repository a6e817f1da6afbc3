"""The model description (pure data, no torch): architectures, packaged presets, HuggingFace configs."""
