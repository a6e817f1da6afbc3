"""`mimo-jobs export CHECKPOINT --to hf OUT`: a mimo-jobs checkpoint of any layout as HuggingFace directories
(OUT/llm, OUT/encoder and every other encoder module's OUT/<name>: config.json + safetensors that transformers
loads; each encoder's projector beside it). docs/weights.md.

The work needs torch, so it runs as its own process (mimo_jobs.trainer.weights.hf_export), like the
trainer. Exit codes: 0 written, 2 bad input (nothing written at OUT), 1 failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from .output import fail

FORMATS = ("hf",)


def export_cmd(
    checkpoint: Path = typer.Argument(
        ..., help="A checkpoints directory (its latest checkpoint) or one iter_N directory in it."
    ),
    out: Path = typer.Argument(..., help="Output directory (created; must not exist or be empty)."),
    to: str = typer.Option(..., "--to", help="Output format: hf (HuggingFace config.json + safetensors)."),
    dtype: Optional[str] = typer.Option(  # noqa: UP045 (typer needs Optional here)
        None, "--dtype", help="float32, bfloat16 or float16 (default: the run's precision)."
    ),
) -> None:
    """Write a checkpoint as HuggingFace directories: OUT/llm, OUT/encoder and OUT/<module> load in transformers."""
    if to not in FORMATS:
        fail(f"--to {to!r}: the formats are {', '.join(FORMATS)}")
    cmd = [sys.executable, "-m", "mimo_jobs.trainer.weights.hf_export", str(checkpoint), str(out)]
    if dtype:
        cmd += ["--dtype", dtype]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
        if lines:
            fail(lines[-1].removeprefix("error: "), code=p.returncode)
        fail(f"export failed (exit {p.returncode}):\n{p.stderr[-3000:]}", code=1)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    for side, files in doc["files"].items():
        typer.echo(f"{Path(doc['out']) / side}: {', '.join(files)}")
    typer.echo(f"exported iteration {doc['iteration']} of {checkpoint} to {doc['out']}")


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
