"""trainer.init.llm / trainer.init.encoder from a HuggingFace directory (config.json + *.safetensors, with or
without model.safetensors.index.json): checked before the first collective, then read slice by slice.

`check_init` runs on every rank in the trainer's preflight: the directory, its config (which must describe
the run's model: the first differing field is named with both values), the index and the files it names
(missing, truncated) and every tensor the model needs with its shape (from the safetensors headers; no
tensor data is read). It raises HFInitError, one line naming the file and the field or tensor.

`load_into` then overwrites the parameters of a built module: each rank reads only the rows and columns of
its own TP/EP/PP shard through safetensors' lazy `get_slice`, one piece at a time, so the host memory a rank
needs beyond its model is about its largest shard of one parameter. Names and layouts: model/hf_weights.py.

An encoder may be trained at another `image_size` than its weights' config.json (same patch size): its
position table is then resampled to the new patch grid as it loads (positions.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model import hf
from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch
from mimo_jobs.model.hf_weights import (
    HFLayout,
    encoder_layout,
    llm_layout,
    piece_reads,
    shard_rows,
)

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# safetensors' dtype names of floating-point weights; integers, booleans and FP8 codes (which need their
# *_scale_inv tensors and a quantization_config) are not weights this trainer can start from
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
# Fields that describe a model's name or origin, not its shape
_NOT_ARCH = {"name", "source"}


class HFInitError(MimoJobsError, ValueError):
    """A HuggingFace source of trainer.init that cannot be loaded into this run's model."""


@dataclass
class HFSource:
    """A checked HF directory: its config, which file holds each tensor and each tensor's shape."""

    path: Path
    config: dict
    files: dict[str, Path]  # tensor name -> the .safetensors file holding it
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str] = field(default_factory=dict)  # tensor name -> safetensors dtype ("BF16", ...)
    nonfinite: set[str] = field(default_factory=set)  # tensors read that hold NaN/Inf (warned once each)
    _open: dict = field(default_factory=dict)

    def slice(self, name: str):
        """The lazy safetensors slice of one tensor (indexing it reads only what is indexed)."""
        from safetensors import safe_open

        f = self.files[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt")
        return self._open[f].get_slice(name)

    def close(self) -> None:
        self._open.clear()


def open_source(path: str | Path, where: str) -> HFSource:
    """The directory's config and tensor index, every file's header read (a missing or truncated file, an
    index naming a missing file, no config.json, quantized weights: HFInitError naming it)."""
    d = Path(path)
    if not d.is_dir():
        raise HFInitError(f"{d}: no such directory", where)
    config = _read_config(d, where)
    files, shapes, dtypes = _read_headers(_tensor_files(d, where), where)
    return HFSource(d, config, files, shapes, dtypes)


def _read_config(d: Path, where: str) -> dict:
    cfg_path = d / CONFIG
    if not cfg_path.is_file():
        raise HFInitError(
            f"{d}: no {CONFIG} (a HuggingFace directory holds config.json and *.safetensors)", where
        )
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise HFInitError(f"{cfg_path}: not a readable JSON file: {e}", where) from None
    if not isinstance(config, dict):
        raise HFInitError(
            f"{cfg_path}: a JSON {type(config).__name__}, not a model config (an object)", where
        )
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise HFInitError(
            f"{cfg_path}: quantized weights (quantization_config, quant_method {method!r}); trainer.init "
            "starts from floating-point weights only: use the model's unquantized (BF16/FP16/FP32) release",
            where,
        )
    return config


def _tensor_files(d: Path, where: str) -> list[Path]:
    """The .safetensors files: those the index names (each checked to exist), else every one in `d`."""
    index = d / INDEX
    if not index.is_file():
        paths = sorted(d.glob("*.safetensors"))
        if not paths:
            raise HFInitError(f"{d}: no *.safetensors files (and no {INDEX})", where)
        return paths
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HFInitError(f"{index}: not a safetensors index (a weight_map): {e}", where) from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise HFInitError(f"{index}: weight_map is not an object of tensor names to file names", where)
    by_file: dict[str, list[str]] = {}
    for name, f in weight_map.items():
        by_file.setdefault(f, []).append(name)
    for f, names in sorted(by_file.items()):
        if not (d / f).is_file():
            raise HFInitError(f"{index}: names {f} (for {names[0]}), which is missing", where)
    return [d / f for f in sorted(by_file)]


def _read_headers(paths: list[Path], where: str) -> tuple[dict, dict, dict]:
    """Each tensor's file, shape and dtype, from the files' headers alone."""
    from safetensors import SafetensorError, safe_open

    files, shapes, dtypes = {}, {}, {}
    for p in paths:
        try:
            with safe_open(str(p), framework="pt") as f:
                for name in f.keys():
                    files[name] = p
                    sl = f.get_slice(name)
                    shapes[name], dtypes[name] = tuple(sl.get_shape()), sl.get_dtype()
        except (SafetensorError, OSError) as e:
            raise HFInitError(
                f"{p}: unreadable safetensors file (truncated or damaged?): {e}", where
            ) from None
    return files, shapes, dtypes


def _first_difference(got: dict, want: dict) -> tuple[str, object, object] | None:
    for k in sorted(set(got) - _NOT_ARCH):
        g, w = got.get(k), want.get(k)
        if isinstance(g, (list, tuple)) or isinstance(w, (list, tuple)):
            g, w = (list(x) if x is not None else None for x in (g, w))
        if g != w:
            return k, g, w
    return None


def _check_arch(src: HFSource, got: dict, want: dict, where: str, model_field: str) -> None:
    diff = _first_difference(got, want)
    if diff:
        k, g, w = diff
        raise HFInitError(
            f"{src.path / CONFIG} describes another model: {k}={g!r}, {model_field} has {k}={w!r} (describe "
            f"the model with {{hf_config: {src.path / CONFIG}}} to train this checkpoint)",
            where,
        )


def _check_tensors(src: HFSource, layout: HFLayout, where: str) -> None:
    for name, shape in layout.hf_shapes.items():
        if name not in src.shapes:
            raise HFInitError(f"{src.path}: no tensor {name} (shape {list(shape)} expected)", where)
        if src.shapes[name] != shape:
            raise HFInitError(
                f"{src.files[name]}: tensor {name} has shape {list(src.shapes[name])}, this model needs "
                f"{list(shape)}",
                where,
            )
        dtype = src.dtypes.get(name)
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise HFInitError(
                f"{src.files[name]}: tensor {name} is {dtype}, not floating-point weights "
                f"({', '.join(sorted(FLOAT_DTYPES))}); quantized or integer tensors cannot start a run",
                where,
            )


def vision_prefix(src: HFSource, where: str) -> str:
    """Where the vision tower's tensors are: "" (a vision model) or e.g. "vision_model." (a full model)."""
    tail = "embeddings.patch_embedding.weight"
    found = sorted(n[: -len(tail)] for n in src.shapes if n.endswith(tail))
    vision = [p for p in found if "text" not in p]
    if len(vision) != 1:
        raise HFInitError(
            f"{src.path}: {len(vision)} vision towers ({tail} under {vision or 'no prefix'})", where
        )
    return vision[0]


@dataclass
class Checked:
    """What check_init found: each side's source and layout (None: that side is not loaded from HF)."""

    llm: tuple[HFSource, str] | None = None  # (source, family)
    encoder: EncoderSource | None = None

    def notes(self, arch) -> list[str]:
        """What loading changes in the weights (said in the trainer's first line)."""
        why = self.encoder.resampled(arch.encoder) if self.encoder is not None else None
        return [f"trainer.init.encoder: {why}"] if why else []


def check_llm(path, p: LLMArch, tp: int) -> tuple[HFSource, str]:
    where = "trainer.init.llm"
    src = open_source(path, where)
    try:
        got, fam = hf.llm_fields(src.config), hf.family(src.config, hf.LLM_FAMILIES)
    except ArchError as e:
        raise HFInitError(f"{src.path / CONFIG}: {e.describe()}", where) from None
    want = LLMArch.from_dict(got | {"name": p.name}).to_dict()
    _check_arch(src, want, p.to_dict(), where, "trainer.model.llm")
    _check_tensors(src, llm_layout(p, fam, tp), where)
    return src, fam


@dataclass(frozen=True)
class EncoderSource:
    """A checked encoder directory: its source, the vision tower's tensor-name prefix and the encoder its
    weights describe (the run's, at the weights' image_size)."""

    src: HFSource
    prefix: str
    weights: EncoderArch

    def resampled(self, e: EncoderArch) -> str | None:
        """What loading into `e` does to the position table, when its patch grid differs from the weights'."""
        if self.weights.grid == e.grid:
            return None
        g, n = self.weights.grid, e.grid
        return f"position embeddings resampled from {g}x{g} to {n}x{n} (bicubic)"


def check_encoder(path, e: EncoderArch) -> EncoderSource:
    """The directory checked against `e`: every field equal but image_size, which may differ (the position
    table is resampled as it loads); the patch size must be the weights' own."""
    where = "trainer.init.encoder"
    src = open_source(path, where)
    try:
        got = hf.encoder_fields(src.config)
    except ArchError as err:
        raise HFInitError(f"{src.path / CONFIG}: {err.describe()}", where) from None
    if got["patch_size"] != e.patch_size:
        raise HFInitError(
            f"{src.path / CONFIG} has patch_size={got['patch_size']}, trainer.model.encoder has "
            f"patch_size={e.patch_size}: the patch embedding is learned for its own patch size (only the "
            f"position table is resampled to another image_size); keep patch_size {got['patch_size']}",
            where,
        )
    _check_arch(src, got | {"image_size": e.image_size}, e.to_dict(), where, "trainer.model.encoder")
    try:  # downsample changes no weight shape; the weights' grid need not be a multiple of it
        weights = EncoderArch.from_dict(e.to_dict() | {"image_size": got["image_size"], "downsample": 1})
    except ArchError as err:
        raise HFInitError(f"{src.path / CONFIG}: {err.describe()}", where) from None
    prefix = vision_prefix(src, where)
    _check_tensors(src, encoder_layout(weights, prefix), where)
    return EncoderSource(src, prefix, weights)


def check_init(init, arch, llm_tp: int) -> Checked:
    """Every check of trainer.init's HF sources that needs no collective (run on every rank)."""
    out = Checked()
    if init is None:
        return out
    if isinstance(init.llm, str):
        out.llm = check_llm(init.llm, arch.llm, llm_tp)
    elif init.llm is not None:  # {megatron: DIR}: its directory, backend and tensor index
        from mimo_jobs.trainer.checkpoint.megatron_load import check_source

        check_source(init.llm.megatron)
    if init.encoder is not None:
        out.encoder = check_encoder(init.encoder, arch.encoder)
    return out


# ---------------------------------------------------------------------------------------------- load


def read_shard(src: HFSource, t, dim, rank: int, size: int, parts: int):
    """The rows/columns of target `t` that TP rank `rank` of `size` holds, read piece by piece."""
    import torch

    row_ranges, cols = shard_rows(t, dim, rank, size, parts)
    view = t.rows_shape
    rest = list(view[1:])
    if cols is not None:
        rest[0] = cols[1] - cols[0]
    out = []
    for lo, hi in row_ranges:
        for pc, a, b in piece_reads(t, lo, hi):
            if pc.hf is None:
                out.append(torch.zeros(b - a, *rest))
                continue
            sl = src.slice(pc.hf)
            if pc.whole:
                x = sl[:].reshape(pc.rows, *view[1:])[a:b]
                x = x if cols is None else x[:, cols[0] : cols[1]]
            elif cols is None:
                x = sl[pc.start + a : pc.start + b]
            else:
                x = sl[pc.start + a : pc.start + b, cols[0] : cols[1]]
            if pc.hf not in src.nonfinite and not bool(torch.isfinite(x).all()):
                _warn_nonfinite(src, pc.hf)
            out.append(x.reshape(b - a, *rest))
    return out[0] if len(out) == 1 else torch.cat(out)


def _warn_nonfinite(src: HFSource, name: str) -> None:
    """Named by the ranks that read it (once each); the run then stops world-wide when its iterations are all
    NaN (main.NAN_STOP), which every rank decides alike."""
    src.nonfinite.add(name)
    print(
        f"mimo-jobs trainer: warning: {src.files[name]}: tensor {name} holds NaN or Inf values",
        file=sys.stderr,
        flush=True,
    )


def load_into(module, layout: HFLayout, src: HFSource, shards, skip=("projector.",)) -> int:
    """Overwrite every parameter of `module` from `src`; `shards` is models.param_shards(module, ...)
    (this rank's canonical names and cuts). Parameters under `skip` (the projector) keep their init.
    Returns the number of parameters loaded."""
    import torch

    n = 0
    for name, p, sh in shards:
        cname = sh.cname  # canonical: TE's fused norms already carry the local name
        if cname.startswith(skip):
            continue
        t = layout.targets.get(cname)
        if t is None:
            raise HFInitError(f"{src.path}: the model's parameter {name} has no HuggingFace tensor here")
        full = list(p.shape)
        if sh.dim is not None:
            full[sh.dim] *= sh.size
        if tuple(full) != t.shape:
            raise HFInitError(
                f"{src.path}: parameter {name} is {full} in full, the layout says {list(t.shape)}"
            )
        x = read_shard(src, t, sh.dim, sh.rank, sh.size, sh.parts)
        with torch.no_grad():
            p.copy_(x.reshape(p.shape).to(device=p.device, dtype=p.dtype))
        n += 1
    return n


def load_llm(init, p: LLMArch, gpt, cut: dict) -> int:
    """trainer.init.llm into this rank's LLM stage, after canonical_init_ with the same cut (param_shards'
    keyword arguments); 0 when the LLM does not start from HF."""
    if init is None or not isinstance(init.llm, str):
        return 0
    from mimo_jobs.trainer.model.models import param_shards

    tp = cut.get("tp_size", 1)
    src, fam = check_llm(init.llm, p, tp)
    try:
        return load_into(gpt, llm_layout(p, fam, tp), src, param_shards(gpt, **cut))
    finally:
        src.close()


def load_encoder(init, e: EncoderArch, enc, cut: dict) -> int:
    """trainer.init.encoder into this rank's encoder (the ViT; the projector keeps its init)."""
    if init is None or init.encoder is None:
        return 0
    from mimo_jobs.trainer.model.models import param_shards

    es = check_encoder(init.encoder, e)
    src, shards = es.src, list(param_shards(enc, **cut))
    try:
        if es.resampled(e) is None:
            return load_into(enc, encoder_layout(e, es.prefix), src, shards)
        # every tensor but the position table as the weights have it; the table resampled to e's grid
        pos = [s for s in shards if s[2].cname == POSITIONS]
        rest = [s for s in shards if s[2].cname != POSITIONS]
        n = load_into(enc, encoder_layout(es.weights, es.prefix), src, rest)
        return n + _load_positions(es, e, pos)
    finally:
        src.close()


POSITIONS = "vit.position_embeddings"


def _load_positions(es: EncoderSource, e: EncoderArch, shards) -> int:
    """The weights' whole position table (class row included: it is not resampled) read, resampled to `e`'s
    patch grid, and its patch rows copied into the ViT's position_embeddings ([1, grid^2, h], whole on every
    TP rank)."""
    import torch

    from mimo_jobs.trainer.checkpoint.positions import resample_positions

    name = encoder_layout(es.weights, es.prefix).targets[POSITIONS].pieces[0].hf  # the HF table's name
    table = es.src.slice(name)[:]
    if name not in es.src.nonfinite and not bool(torch.isfinite(table).all()):
        _warn_nonfinite(es.src, name)
    cls = int(e.class_token)
    rows = resample_positions(table, e.grid, class_rows=cls)[cls:]
    for pname, p, _ in shards:
        if tuple(p.shape) != (1, *rows.shape):
            raise HFInitError(
                f"{es.src.path}: parameter {pname} is {list(p.shape)}, resampled {list(rows.shape)}"
            )
        with torch.no_grad():
            p.copy_(rows.reshape(p.shape).to(device=p.device, dtype=p.dtype))
    return len(shards)
