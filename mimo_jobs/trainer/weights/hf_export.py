"""A mimo-jobs checkpoint (any layout) -> HuggingFace directories that transformers loads:

    OUT/llm/        config.json + model.safetensors (or model-0000k-of-0000n.safetensors + index)
    OUT/encoder/    the vision tower (the module `vision`, or the one encoder of `encoder:`) as a
                    CLIPVisionModel / SiglipVisionModel directory
    OUT/projector/  its MLP projector under its megatron-core names after its module's (`encoder.`;
                    no HF model has it)
    OUT/<name>/     every other encoder module: an audio module as a WhisperEncoder directory, an image
                    module as the vision tower's; OUT/<name>-projector/ its projector (`encoder.<name>.`)

When the run names a HuggingFace tokenizer (trainer.data.tokenizer), its tokenizer files are copied into
OUT/llm, so `AutoTokenizer.from_pretrained(OUT/llm)` gives the tokenizer the model was trained with.

The checkpoint is read through its manifest and the per-rank files (the shard table every save records,
trainer/checkpoint/reshard.py assembles full tensors from it, memory-mapped); names, layouts and config.json
come from model/families (through model/hf.py). One full parameter is held at a time, and the output is
written in shards of at most `max_shard_bytes`, so memory stays near one output shard. Everything is written into OUT.tmp-<pid> and
renamed to OUT at the end: a failure leaves nothing at OUT. Files get the mode a new file of the user has
(0644 under umask 022): safetensors writes its files private (0600), which would hide an export from the
group it is written for.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.contract.manifest import CheckpointError, resolve_source
from mimo_jobs.model.arch import VISION
from mimo_jobs.model.hf import encoder_config, encoder_layout, export_llm_family, llm_config, llm_layout
from mimo_jobs.model.hf_weights import HFLayout, projector_layout

DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_SHARD_BYTES = 5 * 2**30  # HF's own default shard size (5 GB)
# The files a HuggingFace tokenizer directory is made of (transformers' tokenization_utils_base.py and its
# tokenizers' `vocab_files_names`); a model's weights and config.json beside them are not copied.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
)


class ExportError(CheckpointError):
    """A checkpoint that cannot be written as HuggingFace directories (nothing was written): bad input."""

    exit_code = 2


@dataclass
class Exported:
    out: Path
    iteration: int
    dirs: dict[str, list[str]]  # "llm"/"encoder"/"projector"/<module>/<module>-projector -> files written


def export_hf(
    checkpoint: str | Path,
    out: str | Path,
    dtype: str | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Exported:
    """Write `checkpoint` (a checkpoints directory: its latest; or one iter_N) as HF directories under
    `out` (which must not exist yet, or be an empty directory)."""
    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.runspec import load_run_yaml

    out = Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: the dtypes are {', '.join(DTYPES)}")
    out = _output_dir(out)
    info = resolve_source(checkpoint)
    ckpts = info.path.resolve().parent
    if out.resolve().is_relative_to(ckpts):
        raise ExportError(
            f"{out}: inside the checkpoint directory {ckpts}, where saving and pruning (keep_checkpoints) "
            "manage what is kept; choose a directory outside it"
        )
    run_yaml = info.path / "run.yaml"
    if not run_yaml.is_file():
        raise ExportError(f"{run_yaml}: missing (the checkpoint does not say which model it holds)")
    run, doc = load_run_yaml(run_yaml)
    tokenizer = _tokenizer_files(run.trainer.data.tokenizer, doc, run_yaml)
    arch = arch_of(run.trainer.model)
    dtype = dtype or ("bfloat16" if run.trainer.precision == "bf16" else "float32")
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tp = int(info.layout.get("llm_tp", 1))
    try:
        sides = {
            "llm": (
                "language",
                llm_layout(arch.llm, export_llm_family(arch.llm), tp),
                llm_config(arch.llm, dtype),
            )
        }
        for name, e in arch.named_encoders:
            sides |= encoder_sides(name, e, arch.llm.hidden_size, dtype)
    except ArchError as e:
        raise ExportError(f"{run_yaml}: trainer.model.{e.describe()}") from None
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    written: dict[str, list[str]] = {}
    try:
        for side, (module, layout, cfg) in sides.items():
            d = tmp / side
            d.mkdir(parents=True)
            written[side] = _write_side(info, module, layout, d, dtype, max_shard_bytes)
            if cfg is not None:
                (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
                written[side].append("config.json")
        for f in tokenizer:
            shutil.copyfile(f, tmp / "llm" / f.name)
            written["llm"].append(f.name)
        _user_modes(tmp)
        for f in tokenizer:  # never more readable than the user kept the original
            os.chmod(
                tmp / "llm" / f.name, stat.S_IMODE(os.stat(tmp / "llm" / f.name).st_mode) & f.stat().st_mode
            )
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, info.iteration, written)


def encoder_dirs(name: str) -> tuple[str, str]:
    """(module directory, projector directory) of encoder module `name` under OUT: `encoder` and `projector`
    for `vision` (what every one-encoder export has written), `<name>` and `<name>-projector` for another
    (module names are letters, digits and `_`, so neither meets another module's)."""
    return ("encoder", "projector") if name == VISION else (name, f"{name}-projector")


def encoder_sides(name: str, e, llm_hidden: int, dtype: str) -> dict:
    """OUT directory -> (checkpoint module, HF layout, config.json or None) of one encoder module, by its
    modality: an audio encoder as a WhisperEncoder save (model/families/whisper.py), an image encoder as its
    vision family's model."""
    from mimo_jobs.trainer.parallel.grids import encoder_module

    module = encoder_module(name)
    enc, proj = encoder_dirs(name)
    if e.modality == "audio":
        from mimo_jobs.model import families

        # the audio module holds the encoder under `encoder.` beside its projector (audio_encoder.AudioTower)
        family = families.audio(e.kind)
        body = (module, family.layout(e, "", into="encoder."), family.hf_config(e, dtype))
    else:
        body = (module, encoder_layout(e), encoder_config(e, dtype))
    return {enc: body, proj: (module, projector_layout(e, llm_hidden, module), None)}


def _output_dir(out: Path) -> Path:
    """Where the export goes: `out`, new or an empty directory; through a link to one, where it points."""
    if out.is_symlink() and not out.exists():
        raise ExportError(
            f"{out}: a symbolic link to {os.readlink(out)}, which does not exist; choose a directory"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: already exists and is not empty; choose a new directory")
    return out.resolve() if out.is_symlink() else out


def _tokenizer_files(configured: str | None, doc: dict, run_yaml: Path) -> list[Path]:
    """The tokenizer files of the run's trainer.data.tokenizer (none without one). A relative path, which only
    a run.yaml of an older release records, is taken from the run directory, where the trainer ran."""
    if not configured:
        return []
    where = Path((doc.get("paths") or {}).get("run_dir") or run_yaml.parent)
    p = where / Path(configured).expanduser()
    named = f"{run_yaml}: trainer.data.tokenizer {str(p)!r}"
    if p.is_file():
        # a run.yaml is handed over with its checkpoint: it names what it likes, and only a tokenizer file
        # travels with the weights (never, say, a private key named as the tokenizer)
        if p.name not in TOKENIZER_FILES:
            raise ExportError(
                f"{named} is a file that no HuggingFace tokenizer is made of (its files are "
                f"{', '.join(TOKENIZER_FILES[:3])}, ...); the export copies tokenizer files only"
            )
        return [p]
    if not p.is_dir():
        raise ExportError(
            f"{run_yaml}: trainer.data.tokenizer {str(p)!r} does not exist any more; the export copies the "
            "run's tokenizer: put it back there (or export from a run.yaml naming where it is now)"
        )
    found = [p / n for n in TOKENIZER_FILES if (p / n).is_file()]
    outside = [f for f in found if f.resolve().parent != p.resolve()]
    if outside:  # a tokenizer file that is a link to somewhere else is not the tokenizer's to give
        raise ExportError(
            f"{named}: {outside[0].name} is a link to {outside[0].resolve()}, outside the tokenizer's "
            "directory; the export copies the directory's own files only"
        )
    if not found:
        raise ExportError(
            f"{run_yaml}: trainer.data.tokenizer {str(p)!r} holds none of the files of a HuggingFace "
            f"tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...)"
        )
    return found


def _umask() -> int:
    """This process's umask, read without changing it where Linux tells it (/proc/self/status: Umask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore (no thread of this process creates files meanwhile)
    os.umask(old)
    return old


def _user_modes(root: Path) -> None:
    """Every file under `root` 0666 and every directory 0777, less the umask: what the user's own tools
    would have made."""
    mask = _umask()
    for d, _dirs, files in os.walk(root):
        os.chmod(d, 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(d, f), 0o666 & ~mask)


def _plan_shards(layout: HFLayout, dtype: str, max_bytes: int) -> list[list[str]]:
    """HF tensor names grouped into output files of at most max_bytes (one tensor may exceed it alone)."""
    files: list[list[str]] = [[]]
    size = 0
    for name, shape in layout.hf_shapes.items():
        n = _BYTES[dtype] * _numel(shape)
        if files[-1] and size + n > max_bytes:
            files.append([])
            size = 0
        files[-1].append(name)
        size += n
    return files


def _write_side(info, module: str, layout: HFLayout, d: Path, dtype: str, max_bytes: int) -> list[str]:
    import torch
    from safetensors.torch import save_file

    from mimo_jobs.trainer.checkpoint.reshard import SavedModule

    src = SavedModule(info, module)
    uses: dict[str, list] = {}  # HF tensor -> (target, piece, first row of the piece in the target)
    for t in layout.targets.values():
        at = 0
        for pc in t.pieces:
            if pc.hf is not None:
                uses.setdefault(pc.hf, []).append((t, pc, at))
            at += pc.rows
    cache: dict[str, torch.Tensor] = {}

    def full(cname: str, rows_shape) -> torch.Tensor:
        if cname not in cache:
            cache.clear()  # q, k and v come from one linear_qkv: keep the last target only
            cache[cname] = src.full(cname, None).reshape(rows_shape)
        return cache[cname]

    tdtype = getattr(torch, dtype)
    groups = _plan_shards(layout, dtype, max_bytes)
    names = (
        ["model.safetensors"]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    weight_map = {}
    for fname, group in zip(names, groups):
        tensors = {}
        for name in group:
            shape = layout.hf_shapes[name]
            x = torch.empty(shape, dtype=tdtype)
            for t, pc, at in uses[name]:
                rows = full(t.name, t.rows_shape)[at : at + pc.rows]
                if pc.whole:  # the tensor viewed as rows of the target's width
                    x.view(-1, *t.rows_shape[1:])[pc.start : pc.start + pc.rows] = rows
                else:
                    x[pc.start : pc.start + pc.rows] = rows.reshape(pc.rows, *shape[1:])
            tensors[name] = x
            weight_map[name] = fname
        save_file(tensors, str(d / fname), metadata={"format": "pt"})
    if len(groups) > 1:
        total = sum(_BYTES[dtype] * _numel(s) for s in layout.hf_shapes.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        names.append("model.safetensors.index.json")
    return names


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def main(argv: list[str] | None = None) -> int:
    """`python -m mimo_jobs.trainer.weights.hf_export CHECKPOINT OUT`: what `mimo-jobs export` runs (the
    CLI starts it as its own process: it imports torch). Prints the summary as one JSON line."""
    import argparse
    import sys

    from mimo_jobs.errors import MimoJobsError

    ap = argparse.ArgumentParser(prog="python -m mimo_jobs.trainer.weights.hf_export")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default=None)  # export_hf names the ones it writes
    ap.add_argument("--max-shard-bytes", type=int, default=MAX_SHARD_BYTES)
    a = ap.parse_args(argv)
    try:
        r = export_hf(a.checkpoint, a.out, a.dtype, a.max_shard_bytes)
    except MimoJobsError as e:
        print(f"error: {e.describe()}", file=sys.stderr, flush=True)
        return e.exit_code
    except OSError as e:  # a full or read-only target, a file that cannot be read: nothing was left at OUT
        where = e.filename or a.out
        print(
            f"error: {where}: {e.strerror or e} (nothing was written at {a.out})", file=sys.stderr, flush=True
        )
        return 1
    except Exception as e:  # noqa: BLE001 - a damaged part torch cannot read, ...: one line, not a traceback
        print(f"error: {a.checkpoint}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr, flush=True)
        return 1
    print(json.dumps({"out": str(r.out), "iteration": r.iteration, "files": r.dirs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
