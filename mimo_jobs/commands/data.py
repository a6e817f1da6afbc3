"""CLI commands (placeholder: filled in by its owner)."""

import typer


def register(app: typer.Typer) -> None:
    pass
