"""Checkpoint tests: helpers importable as `ckpt_helpers` (like the other test folders, no packages)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
