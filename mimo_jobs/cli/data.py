"""`mimo-jobs data synth DIR`: synthetic energon-ready datasets (image-caption, text-only, VQA, conversations,
audio) and a blend YAML. `mimo-jobs data prepare JSONL`: a LLaVA/ShareGPT-style JSONL file and its images as an
energon dataset. `mimo-jobs data stats PATH`: what a dataset's samples cost.

Exit codes: 0 ok, 2 bad input (nothing written). energon is imported only inside the command body.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
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
    vqa: int = typer.Option(
        0, "--vqa", help="VQA samples (question and answers in a JSON member), on top of --samples."
    ),
    conversations: int = typer.Option(
        0,
        "--conversations",
        help="Two-round image conversations (JSON member; train them with a chat-template tokenizer).",
    ),
    multi_image: int = typer.Option(
        0, "--multi-image", help="Conversations with several images each (a dataset of its own, DIR/multi)."
    ),
    interleaved: int = typer.Option(
        0, "--interleaved", help="Interleaved image-text samples (a dataset of its own, DIR/interleaved)."
    ),
    audio: int = typer.Option(
        0,
        "--audio",
        help="Samples with audio clips, images, both or neither (a dataset of its own, DIR/audio; train it "
        "with a model that has an audio encoder).",
    ),
    n_mels: int = typer.Option(80, "--n-mels", help="Mel bins of each audio clip (Whisper: 80)."),
    audio_frames: Optional[list[str]] = typer.Option(  # noqa: UP045 (typer needs Optional here)
        None,
        "--audio-frames",
        help="Audio clip lengths in frames (100 a second), repeatable or comma-separated; default 16,32.",
    ),
) -> None:
    """Write DIR/caps (CaptioningSample), DIR/text (TextSample), DIR/vqa (VQASample), DIR/chat
    (ConversationSample), DIR/blend.yaml (use it as trainer.data.path); DIR/multi and DIR/interleaved
    (several images per sample) and DIR/audio (ConversationSample, as `data prepare` writes: audio clips,
    images, both or neither) are datasets of their own."""
    import contextlib
    import io
    import shutil

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.synth import SynthConfig, synth
    from mimo_jobs.data.synth_audio import write_audio
    from mimo_jobs.data.synth_multi import write_interleaved, write_multi_image

    err = Console(stderr=True, highlight=False)
    try:
        sizes = _sizes(image_sizes)
        cfg = SynthConfig(
            samples=samples,
            text_only_fraction=text_only_fraction,
            image_sizes=sizes or SynthConfig().image_sizes,
            samples_per_shard=samples_per_shard,
            seed=seed,
            vqa_samples=vqa,
            conversation_samples=conversations,
        )
        cfg.check()
        from mimo_jobs.data.synth import MAX_SAMPLES

        if not (0 <= multi_image <= MAX_SAMPLES and 0 <= interleaved <= MAX_SAMPLES):
            raise DataError(f"--multi-image and --interleaved count samples: give 0 to {MAX_SAMPLES:,}")
        audio_cfg = _audio_config(audio, n_mels, audio_frames, cfg)
        if dir.exists() and not dir.is_dir():
            raise DataError(f"{dir}: a file, not a directory")
        parts = ("caps", "text", "vqa", "chat", "multi", "interleaved", "audio", "blend.yaml")
        clash = [dir / p for p in parts if (dir / p).exists()]
        if clash:
            raise DataError(
                f"{dir}: already holds {', '.join(str(p) for p in clash)}; choose an empty directory"
            )
    except DataError as e:
        fail(str(e))

    # Write into a staging folder and move the finished parts into place: a failure leaves nothing behind,
    # and a staging folder a killed run left (any seed) goes first.
    dir_existed = dir.exists()
    for old in dir.glob(".synth-staging-*") if dir_existed else ():
        shutil.rmtree(old, ignore_errors=True)
    stage = dir / f".synth-staging-{seed}"
    try:
        with Progress(
            TextColumn("synth"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as prog:
            task = prog.add_task("samples", total=cfg.total + audio)
            with contextlib.redirect_stdout(io.StringIO()):  # energon's prepare prints progress lines
                res = synth(stage, cfg, progress=lambda n=1: prog.advance(task, n))
                if multi_image:
                    write_multi_image(stage / "multi", multi_image, cfg.image_sizes, seed, samples_per_shard)
                if interleaved:
                    write_interleaved(
                        stage / "interleaved", interleaved, cfg.image_sizes, seed, samples_per_shard
                    )
                if audio:
                    write_audio(stage / "audio", audio_cfg, progress=lambda n=1: prog.advance(task, n))
        names = ("caps", "text", "vqa", "chat", "multi", "interleaved", "audio", "blend.yaml", "synth.json")
        for name in names:
            if (stage / name).exists():
                (stage / name).rename(dir / name)
        stage.rmdir()
    except (DataError, OSError) as e:
        shutil.rmtree(stage, ignore_errors=True)
        if not dir_existed:
            shutil.rmtree(dir, ignore_errors=True)
        fail(str(e) if isinstance(e, DataError) else f"{e.filename or dir}: {e.strerror or e}", code=1)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _print_written(dir, cfg, res, multi_image, interleaved)
    if audio:
        frames_s = ", ".join(str(f) for f in audio_cfg.frames)
        typer.echo(
            f"{dir}/audio: {audio} samples with audio clips ({audio_cfg.n_mels} mel bins x {frames_s} frames), "
            "images, both or neither (need a model with an audio encoder)"
        )


def _audio_config(audio: int, n_mels: int, frames: list[str] | None, cfg):
    """The audio dataset's settings (checked; DataError naming the option), whether or not one is asked
    for, so a bad --n-mels or --audio-frames is refused either way."""
    from mimo_jobs.data.audio import parse_frames
    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.synth import MAX_SAMPLES
    from mimo_jobs.data.synth_audio import AudioSynthConfig

    if not 0 <= audio <= MAX_SAMPLES:
        raise DataError(f"--audio={audio}: count samples from 0 to {MAX_SAMPLES:,}")
    try:
        lengths = tuple(parse_frames(p) for v in frames or () for p in v.split(",") if p.strip())
    except ValueError as e:
        raise DataError(f"--audio-frames: {e}") from None
    out = AudioSynthConfig(
        samples=max(audio, 1),
        n_mels=n_mels,
        frames=lengths or AudioSynthConfig(1).frames,
        image_sizes=cfg.image_sizes,
        seed=cfg.seed,
        samples_per_shard=cfg.samples_per_shard,
    )
    out.check()
    return out


def _print_written(dir: Path, cfg, res, multi_image: int, interleaved: int) -> None:
    sizes_s = ", ".join(f"{h}x{w}" for h, w in cfg.image_sizes)
    typer.echo(
        f"{dir}/caps: {res.n_caps} image-caption samples in {len(res.caps_shards)} shard(s), sizes {sizes_s}"
    )
    typer.echo(f"{dir}/text: {res.n_text} text-only samples in {len(res.text_shards)} shard(s)")
    if res.vqa_shards:
        typer.echo(f"{dir}/vqa: {cfg.vqa_samples} VQA samples in {len(res.vqa_shards)} shard(s)")
    if res.chat_shards:
        typer.echo(
            f"{dir}/chat: {cfg.conversation_samples} conversations in {len(res.chat_shards)} shard(s) "
            "(need trainer.data.tokenizer with a chat template)"
        )
    if multi_image:
        typer.echo(f"{dir}/multi: {multi_image} conversations with several images (need a chat tokenizer)")
    if interleaved:
        typer.echo(f"{dir}/interleaved: {interleaved} interleaved image-text samples")
    weights = ", ".join(f"{w['subflavors']['kind']} {w['weight']:.3g}" for w in res.blend_parts)
    typer.echo(f"{dir}/blend.yaml: weights {weights}")
    typer.echo(f"use it:  trainer.data: {{provider: energon, path: {(dir / 'blend.yaml').resolve()}}}")


@data_app.command("prepare")
def prepare_cmd(
    jsonl: Path = typer.Argument(..., help="LLaVA/ShareGPT-style JSONL: one record per line."),
    out: Path = typer.Option(..., "--out", "-o", help="The dataset directory to write (new or empty)."),
    images: Optional[Path] = typer.Option(  # noqa: UP045 (typer needs Optional here)
        None, "--images", help="The folder the records' image paths start at (default: the JSONL's folder)."
    ),
    split: str = typer.Option(
        "1,0,0", "--split", help="train,val,test shares, e.g. 0.98,0.01,0.01 or 8,1,1 (default: all train)."
    ),
    samples_per_shard: int = typer.Option(1000, "--samples-per-shard", help="Samples per .tar shard."),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="Skip (and count) bad records instead of stopping at the first."
    ),
    n_mels: int = typer.Option(
        80,
        "--n-mels",
        help="Mel bins of the audio clips: the audio encoder's num_mel_bins (Whisper: 80 or 128).",
    ),
    video_frames: Optional[int] = typer.Option(  # noqa: UP045 (typer needs Optional here)
        None,
        "--video-frames",
        help="Frames sampled uniformly in time from each video file (default 8; a multiple of the image "
        "module's temporal_patch_size wastes no padding frame).",
    ),
) -> None:
    """Write OUT as an energon dataset of conversations (ConversationSample, the images' own bytes): use it
    as trainer.data.path, with a tokenizer that has a chat template."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.llava import KNOWN_KEYS
    from mimo_jobs.data.prepare import PrepareConfig, check_paths, parse_split, prepare_jsonl
    from mimo_jobs.textsafe import visible

    folder = images if images is not None else jsonl.parent
    try:
        cfg = PrepareConfig(parse_split(split), samples_per_shard, skip_bad, n_mels)
        if video_frames is not None:
            cfg = replace(cfg, video_frames=video_frames)
        cfg.check()
        check_paths(jsonl, folder, out)
    except DataError as e:
        fail(str(e))
    err = Console(stderr=True, highlight=False)
    try:
        with Progress(
            TextColumn("prepare"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as prog:
            task = prog.add_task("records", total=jsonl.stat().st_size)
            res = prepare_jsonl(jsonl, folder, out, cfg, progress=lambda n: prog.advance(task, n))
    except DataError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or out}: {e.strerror or e}", code=1)
    per = ", ".join(f"{s} {n}" for s, n in res.samples.items())
    shards = sum(len(v) for v in res.shards.values())
    typer.echo(
        f"{out}: {res.total} samples ({per}) with {res.images} images"
        + (f", {res.videos} videos" if res.videos else "")
        + f" and {res.audio} audio clips "
        f"in {shards} shard(s)"
    )
    for key, n in res.unknown_keys.items():
        typer.echo(
            f"warning: {n} record(s) have the key {visible(repr(key))}, which nothing reads (known: "
            f"{', '.join(KNOWN_KEYS)}); it is not in the dataset",
            err=True,
        )
    if res.skipped:
        first = res.skipped_lines[0]
        typer.echo(
            f"skipped {res.skipped} bad record(s), listed in {out / 'prepare.json'}; the first, line "
            f"{first['line']}: {visible(first['reason'])}"
        )
    typer.echo(
        f"use it:  trainer.data: {{provider: energon, path: {out.resolve()}, tokenizer: <chat tokenizer>}}"
    )


@data_app.command("stats")
def stats_cmd(
    path: Optional[Path] = typer.Argument(  # noqa: UP045 (typer needs Optional here)
        None, help="A prepared energon dataset folder or a blend YAML (default with --study: its data.path)."
    ),
    model: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--model",
        "-m",
        help="The model whose encoder decides image tokens (default tiny): a model or encoder preset, a "
        "HuggingFace config.json of a CLIP/SigLIP vision model, or a trainer.model description in YAML.",
    ),
    study: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--study",
        help="Measure as this study trains: its first run's model, tiling, tokenizer, seq_length and data.",
    ),
    seq_length: Optional[int] = typer.Option(  # noqa: UP045
        None, "--seq-length", help="The LLM sequence length packing is measured at (with --study: its own)."
    ),
    tokenizer: Optional[str] = typer.Option(  # noqa: UP045
        None, "--tokenizer", help="Local HuggingFace tokenizer folder (default: the built-in one)."
    ),
    max_tiles: Optional[int] = typer.Option(  # noqa: UP045
        None,
        "--max-tiles",
        help="Tiles an image larger than the encoder's image size may become (as trainer.data; default 1).",
    ),
    thumbnail: bool = typer.Option(
        False, "--thumbnail", help="A tiled image also gives a thumbnail (as trainer.data.thumbnail)."
    ),
    out: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--out",
        "-o",
        help="JSON file to write (default: the study's trainer.data.stats, else beside the blend YAML, or "
        "inside the dataset folder).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of the tables."),
    trust_dataset_code: bool = typer.Option(
        False,
        "--trust-dataset-code",
        help="This dataset is code: let energon run its own .nv-meta loader (as trainer.data.trust_dataset_code).",
    ),
) -> None:
    """Per-sample image tokens (after tiling and downsampling), text tokens, images, tiles and packing
    efficiency of a dataset; `trainer.data.stats` (or the file's default place) lets predict and plan use it."""
    import json

    from mimo_jobs.contract.datastats import geometry_record, stats_file_for
    from mimo_jobs.data.errors import DataError

    if study is not None:
        given = [
            name
            for name, v in (
                ("PATH", path),
                ("--model", model),
                ("--seq-length", seq_length),
                ("--tokenizer", tokenizer),
                ("--max-tiles", max_tiles),
                ("--thumbnail", thumbnail or None),
            )
            if v is not None
        ]
        if given:
            fail(
                f"--study {study} gives the data path, model, seq_length, tokenizer and tiling; leave out "
                f"{', '.join(given)} (or leave out --study)"
            )
        measured = _study_settings(study)
    else:
        measured = _argument_settings(path, model, seq_length, tokenizer, max_tiles or 1, thumbnail)
    try:
        from mimo_jobs.data.scan import scan
        from mimo_jobs.data.stats import summarize

        tok, data_path = measured.tokenizer, measured.path
        if tok is not None and not Path(tok).is_dir():
            raise DataError(
                f"{measured.tokenizer_field} {tok}: not a directory (a local HuggingFace tokenizer folder)"
            )
        if out is not None and out.is_dir():
            raise DataError(f"--out {out}: a directory; give the JSON file to write")
        with stdout_to_stderr():  # what the loader prints (energon's notes on a bad sample) is not our output
            samples, skipped = scan(
                str(data_path.resolve()),
                measured.geometry,
                measured.vocab_size,
                tok,
                measured.audio,
                trust_dataset_code or measured.trust_code,
            )
        if not samples:
            raise DataError(f"{data_path}: no sample could be read ({skipped} skipped as bad)")
    except DataError as e:
        fail(str(e))
    except OSError as e:  # the dataset cannot be read
        fail(f"{e.filename or data_path}: {e.strerror or e}", code=1)
    doc = {
        "dataset": str(data_path.resolve()),
        "model": measured.model,
        **({"study": str(study)} if study is not None else {}),
        "tokenizer": tok or "builtin-char",
        **({"geometry": geometry_record(measured.geometry)} if measured.geometry is not None else {}),
        **summarize(samples, measured.seq_length, skipped, measured.modules),
    }
    dest = out or measured.stats or stats_file_for(data_path)
    try:
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(dest)  # a full disk leaves the previous file, never half of a new one
    except OSError as e:
        tmp.unlink(missing_ok=True)
        fail(f"{dest}: cannot write ({e.strerror or e})", code=1)
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
        return
    _print_stats(doc)
    typer.echo(f"wrote {dest}")


@contextlib.contextmanager
def stdout_to_stderr():
    """Everything written to standard output inside, by Python or by a library writing to file descriptor 1,
    goes to standard error: `data stats --json` prints one JSON document on stdout and nothing else."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True)
class _Measured:
    """What `data stats` measures with: from its options, or from a study's first run."""

    path: Path
    model: object  # as the document records it: the --model argument, or the study's trainer.model
    geometry: object  # mimo_jobs.model.tiling.ImageGeometry of the image module; None: no image module
    vocab_size: int | None  # None: an encoder without its LLM (scan.py)
    seq_length: int
    tokenizer: str | None
    tokenizer_field: str = "--tokenizer"
    stats: Path | None = None  # the study's trainer.data.stats
    audio: object = None  # mimo_jobs.data.audio.AudioSpec of the model's audio encoder, if it has one
    trust_code: bool = False  # the study's trainer.data.trust_dataset_code
    modules: dict | None = None  # encoder module name -> its modality, in the model's order


def _argument_settings(path, model, seq_length, tokenizer, max_tiles, thumbnail) -> _Measured:
    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import data_model
    from mimo_jobs.model.tiling import MAX_TILES
    from mimo_jobs.textsafe import visible

    if path is None:
        fail("give the dataset (a prepared energon folder or a blend YAML), or --study STUDY.yaml")
    if seq_length is None:
        fail("--seq-length is required without --study (the LLM sequence length packing is measured at)")
    if seq_length < 1:
        fail(f"--seq-length={seq_length}: must be >= 1")
    try:
        encoders, llm = data_model(model or "tiny", Path.cwd())
    except ArchError as e:
        fail(visible(e.describe()), where="--model")
    if not 1 <= max_tiles <= MAX_TILES:
        fail(f"--max-tiles={max_tiles}: must be between 1 and {MAX_TILES}")
    return _measured_modules(
        encoders,
        max_tiles,
        thumbnail,
        path=path,
        model=model or "tiny",
        vocab_size=llm.vocab_size if llm else None,
        seq_length=seq_length,
        tokenizer=tokenizer,
    )


def _measured_modules(encoders: dict, max_tiles: int, thumbnail: bool, **fields) -> _Measured:
    """What a model's encoder modules give the measurement: the image module's geometry (None without one),
    the audio module's token rule, each module's modality."""
    from mimo_jobs.data.audio import audio_spec_of
    from mimo_jobs.data.images import image_module_of
    from mimo_jobs.model.tiling import ImageGeometry

    holder = SimpleNamespace(encoders=encoders)
    image = image_module_of(holder)
    return _Measured(
        geometry=None if image is None else ImageGeometry.of(image, max_tiles, thumbnail),
        audio=audio_spec_of(holder),
        modules={n: e.modality for n, e in encoders.items()},
        **fields,
    )


def _study_settings(study: Path) -> _Measured:
    from mimo_jobs.model.resolve import arch_of

    diag, stats = _load_study(study)
    if not diag.runs:
        fail(f"{study}: the study has no run to measure for")
    trainer = diag.runs[0].trainer
    where = f"{study}: trainer"
    data = trainer.data
    if data.provider != "energon":
        fail(
            f"{where}.data.provider is {data.provider!r}: the mock provider's images are priced exactly, "
            "there is no dataset to measure (set provider: energon and data.path)"
        )
    arch = arch_of(trainer.model)
    if not arch.encoders:
        fail(
            f"{where}.model is text-only (no encoder module): a dataset's image or audio tokens mean nothing to it"
        )
    return _measured_modules(
        arch.encoders,
        data.max_tiles,
        data.thumbnail,
        path=Path(data.path),
        model=trainer.model,
        vocab_size=arch.llm.vocab_size,
        seq_length=trainer.seq_length,
        tokenizer=data.tokenizer,
        tokenizer_field=f"{where}.data.tokenizer",
        stats=stats,
        trust_code=data.trust_dataset_code,
    )


def _load_study(study: Path):
    """(the study's diagnosis, its trainer.data.stats path): read as `validate` reads it but for
    trainer.data.stats, the file this command writes; a missing one, or one measured for another geometry,
    is what it is run to replace. Every other problem is printed, exit 2."""
    import os

    from mimo_jobs.errors import MimoJobsError
    from mimo_jobs.study.diagnose import diagnose_data
    from mimo_jobs.study.load import interpolate, read_yaml
    from mimo_jobs.study.spec import absolute_path

    from .output import fail_problems, fail_with

    try:
        doc = read_yaml(study)
    except MimoJobsError as e:
        fail_with(e)
    data = (
        doc.get("trainer", {}).get("data")
        if isinstance(doc, dict) and isinstance(doc.get("trainer"), dict)
        else None
    )
    named = data.pop("stats", None) if isinstance(data, dict) else None
    diag = diagnose_data(doc, str(study))
    if not diag.ok or diag.study is None:
        fail_problems(diag.source, diag.problems)
    if named is None:
        return diag, None
    problems: list = []
    value = interpolate(named, ("trainer", "data", "stats"), dict(os.environ), problems)
    if problems:
        fail(f"{study}: {problems[0][0]}: {problems[0][1]}")
    try:
        return diag, Path(absolute_path(str(value), study.parent))
    except ValueError as e:
        fail(f"{study}: trainer.data.stats: {e}")


def _print_stats(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    t = Table(title=f"{doc['samples']} samples ({doc['skipped']} skipped), seq_length {doc['seq_length']}")
    for col in ("", "mean", "p50", "p95", "p99", "max"):
        t.add_column(col, justify="right")
    audio = doc["audio_tokens"]["max"] > 0
    rows = ("image_tokens", "audio_tokens", "text_tokens", "tokens", "tiles") if audio else None
    for name in rows or ("image_tokens", "text_tokens", "tokens", "tiles"):
        d = doc[name]
        t.add_row(name, f"{d['mean']:.1f}", *(str(d[k]) for k in ("p50", "p95", "p99", "max")))
    con.print(t)
    per = ", ".join(f"{k}: {v}" for k, v in doc["images_per_sample"].items())
    con.print(f"images per sample: {per}")
    if audio:
        con.print(
            "audio clips per sample: "
            + ", ".join(f"{k}: {v}" for k, v in doc["audio_clips_per_sample"].items())
        )
    if "video_tokens" in doc:
        v = doc["video_tokens"]
        con.print(
            "videos per sample: "
            + ", ".join(f"{k}: {n}" for k, n in doc["videos_per_sample"].items())
            + f"; video tokens per sample mean {v['mean']:.1f}, max {v['max']} (part of image_tokens)"
        )
    g = doc.get("geometry")
    if g is not None:
        tiling = f"up to {g['max_tiles']} tiles" + (" + thumbnail" if g["thumbnail"] else "")
        con.print(
            f"image geometry: {g['image_size']} px pieces of {g['patch_size']} px patches, downsample "
            f"{g['downsample']}, {tiling}; tokens per encoder sample E[n^2]/E[n] {doc['tokens_per_tile']:.1f}"
        )
    for name, m in doc.get("modules", {}).items():
        if "items_go_to" in m:
            con.print(f"module {name} ({m['modality']}): its items go to module {m['items_go_to']}")
            continue
        item = (
            "clip(s)"
            if m["modality"] != "image"
            else "image(s)" + (" and video(s)" * ("video_tokens" in doc))
        )
        con.print(
            f"module {name} ({m['modality']}): {m['items']} {item} in {m['samples_with']} sample(s); tokens "
            f"per sample mean {m['tokens']['mean']:.1f}, max {m['tokens']['max']}; "
            f"{m['token_share']:.1%} of the LLM's real tokens"
        )
    width = max((b["count"] for b in doc["tokens_histogram"]), default=1)
    for b in doc["tokens_histogram"]:
        bar = "#" * max(1 if b["count"] else 0, round(40 * b["count"] / width))
        con.print(f"  tokens {b['lo']:>6}-{b['hi']:<6} {b['count']:>7}  {bar}")
    p = doc["packing"]
    con.print(
        f"packing at {doc['seq_length']}: padded {p['padded_efficiency']:.1%} of token slots used, packed "
        f"{p['packed_efficiency']:.1%} ({p['packed_sequences']} sequences); "
        f"{doc['over_seq_length']} sample(s) longer than seq_length"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
