"""The model description (pure data, no torch): architectures, packaged presets, HuggingFace configs.

The families package loads here, before any module of this package is used: it fills model/registry.py, of
which the descriptions take their kinds and their families' rules.
"""

from mimo_jobs.model import families  # noqa: F401 - loaded for its registrations
