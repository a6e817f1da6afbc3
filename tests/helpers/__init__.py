"""Helpers shared by the test packages (pytest puts tests/ on sys.path: `from helpers.submit import cli`)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
STUDIES = REPO / "studies"
