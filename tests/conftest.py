"""Shared pytest fixtures. Keep this small; per-area fixtures live in their test folders."""

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
