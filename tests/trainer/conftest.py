"""Trainer tests: helpers live next to the tests (tr_helpers.py)."""


