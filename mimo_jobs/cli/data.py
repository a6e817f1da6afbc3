"""`mimo-jobs data synth DIR`: synthetic energon-ready image-caption + text-only datasets and a blend YAML.

Exit codes: 0 ok, 2 bad input (nothing written). energon is imported only inside the command body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .output import fail

data_app = typer.Typer(
    help="Datasets for the trainer (megatron-energon): synthetic data for tests and smoke runs.",
    no_args_is_help=True,
)


def _sizes(values: list[str] | None) -> tuple[tuple[int, int], ...] | None:
    from mimo_jobs.data.synth import parse_size

    if not values:
        return None
    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                out.append(parse_size(part))
    return tuple(out)


@data_app.command("synth")
def synth_cmd(
    dir: Path = typer.Argument(..., help="Output directory (created; must not already hold caps/ or text/)."),
    samples: int = typer.Option(512, "--samples", "-n", help="Total samples (image-caption + text-only)."),
    text_only_fraction: float = typer.Option(
        0.25, "--text-only-fraction", "-f", help="Share of text-only samples; also the blend weight of text."
    ),
    image_sizes: Optional[list[str]] = typer.Option(  # noqa: UP045 (typer needs Optional here)
        None,
        "--image-sizes",
        "-s",
        help="Image sizes, N (square) or HxW, repeatable or comma-separated; default 8,12,16 (tiny preset).",
    ),
    samples_per_shard: int = typer.Option(64, "--samples-per-shard", help="Samples per .tar shard."),
    seed: int = typer.Option(0, "--seed", help="Content seed (same arguments -> identical shards)."),
) -> None:
    """Write DIR/caps (CaptioningSample), DIR/text (TextSample), DIR/blend.yaml (use it as trainer.data.path)."""
    import contextlib
    import io
    import shutil

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.synth import SynthConfig, synth

    err = Console(stderr=True, highlight=False)
    try:
        sizes = _sizes(image_sizes)
        cfg = SynthConfig(
            samples=samples,
            text_only_fraction=text_only_fraction,
            image_sizes=sizes or SynthConfig().image_sizes,
            samples_per_shard=samples_per_shard,
            seed=seed,
        )
        cfg.check()
        clash = [p for p in (dir / "caps", dir / "text", dir / "blend.yaml") if p.exists()]
        if clash:
            raise DataError(
                f"{dir}: already holds {', '.join(str(p) for p in clash)}; choose an empty directory"
            )
    except DataError as e:
        fail(str(e))

    # Write into a staging folder and move the finished parts into place: a failure leaves nothing behind.
    stage = dir / f".synth-staging-{seed}"
    if stage.exists():
        shutil.rmtree(stage)
    dir_existed = dir.exists()
    try:
        with Progress(
            TextColumn("synth"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as prog:
            task = prog.add_task("samples", total=cfg.samples)
            with contextlib.redirect_stdout(io.StringIO()):  # energon's prepare prints progress lines
                res = synth(stage, cfg, progress=lambda n=1: prog.advance(task, n))
        for name in ("caps", "text", "blend.yaml", "synth.json"):
            if (stage / name).exists():
                (stage / name).rename(dir / name)
        stage.rmdir()
    except DataError as e:
        shutil.rmtree(stage, ignore_errors=True)
        if not dir_existed:
            shutil.rmtree(dir, ignore_errors=True)
        fail(str(e))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    sizes_s = ", ".join(f"{h}x{w}" for h, w in cfg.image_sizes)
    typer.echo(
        f"{dir}/caps: {res.n_caps} image-caption samples in {len(res.caps_shards)} shard(s), sizes {sizes_s}"
    )
    typer.echo(f"{dir}/text: {res.n_text} text-only samples in {len(res.text_shards)} shard(s)")
    typer.echo(
        f"{dir}/blend.yaml: text weight {cfg.text_only_fraction:g}, image-caption weight "
        f"{1 - cfg.text_only_fraction:g}"
    )
    typer.echo(f"use it:  trainer.data: {{provider: energon, path: {(dir / 'blend.yaml').resolve()}}}")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
