"""Trainer tests: shared helpers live in tests/helpers (trainer.py, checkpoint.py)."""
