"""Whether a HuggingFace directory of trainer.init can start this run's model, from files alone and without
torch: its config.json must describe the model (the first differing field is named with both values), the
index and the files it names must be there and whole, and every tensor the model needs must be there with
its shape and a floating-point dtype. The one owner of these rules: `validate` calls them before a job is
queued, the trainer's preflight (trainer/weights/hf_load.py) on every rank before its first collective.

Tensor shapes come from the safetensors headers, read as JSON by the format's own rule (huggingface/
safetensors' README: an 8-byte little-endian header length, the JSON header, then the data): no tensor data
is read and nothing is unpickled.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from mimo_jobs import strictread
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model import families, hf
from mimo_jobs.model.arch import VISION, ArchError, EncoderArch, LLMArch
from mimo_jobs.model.hf_weights import HFLayout

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# safetensors' dtype names of floating-point weights; integers, booleans and FP8 codes (which need their
# *_scale_inv tensors and a quantization_config) are not weights this trainer can start from
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
# bytes per element of safetensors' dtypes (its `Dtype::size`); the sub-byte ones are left out of the size check
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
MAX_HEADER = 100_000_000  # safetensors' own MAX_HEADER_SIZE: a larger length is a damaged or foreign file
# Fields that describe a model's name or origin, not its shape
_NOT_ARCH = {"name", "source"}


class HFInitError(MimoJobsError, ValueError):
    """A HuggingFace source of trainer.init that cannot be loaded into this run's model."""


@dataclass
class HFHeaders:
    """A HF directory as its files describe it: its config, which file holds each tensor, each tensor's
    shape and dtype."""

    path: Path
    config: dict
    files: dict[str, Path]  # tensor name -> the .safetensors file holding it
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str] = field(default_factory=dict)  # tensor name -> safetensors dtype ("BF16", ...)


def read_source(path: str | Path, where: str) -> HFHeaders:
    """The directory's config and tensor index, every file's header read (a missing or truncated file, an
    index naming a missing file, no config.json, quantized weights: HFInitError naming it)."""
    d = Path(path)
    if not d.is_dir():
        raise HFInitError(f"{d}: no such directory", where)
    config = _read_config(d, where)
    files, shapes, dtypes = {}, {}, {}
    for p in _tensor_files(d, where):
        for name, (dtype, shape) in safetensors_header(p, where).items():
            files[name], shapes[name], dtypes[name] = p, shape, dtype
    return HFHeaders(d, config, files, shapes, dtypes)


def _read_config(d: Path, where: str) -> dict:
    cfg_path = d / CONFIG
    if not cfg_path.is_file():
        raise HFInitError(
            f"{d}: no {CONFIG} (a HuggingFace directory holds config.json and *.safetensors)", where
        )
    try:
        config = strictread.json_text(cfg_path.read_bytes())
    except OSError as e:
        raise HFInitError(f"{cfg_path}: not a readable JSON file: {e.strerror or e}", where) from None
    except strictread.DocumentError as e:
        raise HFInitError(f"{cfg_path}: {e.describe()}", where) from None
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
        weight_map = strictread.json_text(index.read_bytes())["weight_map"]
    except strictread.DocumentError as e:
        raise HFInitError(f"{index}: not a safetensors index (a weight_map): {e.describe()}", where) from None
    except (OSError, KeyError, TypeError) as e:
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


def safetensors_header(p: Path, where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype, shape) from a .safetensors file's JSON header; HFInitError when the header is
    not one (read strictly: no key twice, bounded nesting), when a tensor reaches past the end of the file
    (a truncated copy), or when two tensors share bytes."""

    def bad(why: str) -> HFInitError:
        return HFInitError(f"{p}: unreadable safetensors file (truncated or damaged?): {why}", where)

    doc, size, n = _header_json(p, bad)
    out, spans = {}, []
    for name, t in doc.items():
        if name != "__metadata__":
            out[name], span = _tensor_entry(name, t, bad)
            spans.append((*span, name))
    far = max(spans, key=lambda s: s[1], default=None)
    if far is not None and far[1] > size - 8 - n:
        raise bad(
            f"tensor {far[2]!r} (data_offsets [{far[0]}, {far[1]}]) reaches past the {size - 8 - n} bytes of "
            f"data: its tensors need {8 + n + far[1]} bytes, the file has {size}"
        )
    shared = _shared_bytes(spans)
    if shared:
        (a, alo, ahi), (b, blo, bhi) = shared
        raise bad(
            f"tensors {a!r} (data_offsets [{alo}, {ahi}]) and {b!r} ([{blo}, {bhi}]) share bytes; each "
            "tensor's bytes are its own"
        )
    return out


def _header_json(p: Path, bad) -> tuple[dict, int, int]:
    """(the JSON header, the file's size, the header's length) of a .safetensors file."""
    if not p.is_file():  # a pipe or device would block the read or never end
        raise bad("not a regular file")
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise bad(f"a header of {n} bytes in a file of {size}")
            doc = strictread.json_text(f.read(n))
    except OSError as e:
        raise bad(e.strerror or str(e)) from None
    except strictread.DocumentError as e:
        raise bad(f"its JSON header: {e.describe()}") from None
    if not isinstance(doc, dict):
        raise bad("the header is not a JSON object")
    return doc, size, n


def _tensor_entry(name: str, t, bad) -> tuple[tuple[str, tuple[int, ...]], tuple[int, int]]:
    """((dtype, shape), (lo, hi)) of one tensor's header entry, its byte count checked against its shape."""
    try:
        dtype, shape, (lo, hi) = t["dtype"], tuple(t["shape"]), t["data_offsets"]
        ok = isinstance(dtype, str) and all(type(x) is int and x >= 0 for x in (*shape, lo, hi))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok or hi < lo:
        raise bad(f"tensor {name!r} is not described by dtype, shape and data_offsets")
    numel = 1
    for s in shape:
        numel *= s
    if dtype in DTYPE_BYTES and hi - lo != numel * DTYPE_BYTES[dtype]:
        raise bad(f"tensor {name} holds {hi - lo} bytes, its {dtype} shape {list(shape)} needs more or less")
    return (dtype, shape), (lo, hi)


def _shared_bytes(spans: list[tuple[int, int, str]]) -> tuple[tuple, tuple] | None:
    """Two tensors whose data_offsets [lo, hi) share a byte, or None. The safetensors format gives every
    tensor its own bytes (huggingface/safetensors' README: the byte buffer is entirely indexed and has no
    holes; its loader refuses offsets that do not follow one another); two views of one span would load as
    two tensors from the same numbers, and a shard written so is damaged or crafted."""
    last: tuple[str, int, int] | None = None  # the tensor reaching furthest so far
    for lo, hi, name in sorted(s for s in spans if s[1] > s[0]):  # an empty tensor holds no byte
        if last is not None and lo < last[2]:
            return last, (name, lo, hi)
        if last is None or hi > last[2]:
            last = (name, lo, hi)
    return None


def _first_difference(got: dict, want: dict) -> tuple[str, object, object] | None:
    for k in sorted(set(got) - _NOT_ARCH):
        g, w = got.get(k), want.get(k)
        if isinstance(g, (list, tuple)) or isinstance(w, (list, tuple)):
            g, w = (list(x) if x is not None else None for x in (g, w))
        if g != w:
            return k, g, w
    return None


def _check_arch(src: HFHeaders, got: dict, want: dict, where: str, model_field: str) -> None:
    diff = _first_difference(got, want)
    if diff:
        k, g, w = diff
        raise HFInitError(
            f"{src.path / CONFIG} describes another model: {k}={g!r}, {model_field} has {k}={w!r} (describe "
            f"the model with {{hf_config: {src.path / CONFIG}}} to train this checkpoint)",
            where,
        )


def _check_tensors(src: HFHeaders, layout: HFLayout, where: str) -> None:
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


def vision_prefix(src: HFHeaders, where: str, tail: str) -> str:
    """Where the vision tower's tensors are: "" (a vision model) or e.g. "vision_model." (a full model);
    `tail` is the family's patch-conv weight (families' VisionFamily.patch_tensor)."""
    found = sorted(n[: -len(tail)] for n in src.shapes if n.endswith(tail))
    vision = [p for p in found if "text" not in p]
    if len(vision) != 1:
        raise HFInitError(
            f"{src.path}: {len(vision)} vision towers ({tail} under {vision or 'no prefix'})", where
        )
    return vision[0]


def check_llm(path, p: LLMArch, tp: int) -> tuple[HFHeaders, str]:
    """trainer.init.llm against the run's LLM at LLM TP `tp`: (its headers, its family)."""
    where = "trainer.init.llm"
    src = read_source(path, where)
    try:
        got, fam = hf.llm_fields(src.config), hf.llm_family(src.config)
    except ArchError as e:
        raise HFInitError(f"{src.path / CONFIG}: {e.describe()}", where) from None
    want = LLMArch.from_dict(got | {"name": p.name}).to_dict()
    _check_arch(src, want, p.to_dict(), where, "trainer.model.llm")
    _check_tensors(src, hf.llm_layout(p, fam, tp), where)
    return src, fam


def check_encoder(
    path, e: EncoderArch, where: str = "trainer.init.encoder", model_field: str = "trainer.model.encoder"
) -> tuple[HFHeaders, str, EncoderArch]:
    """trainer.init.encoder against the run's encoder: (its headers, the vision tower's tensor prefix, the
    encoder its weights describe). Every field must equal the run's but image_size, which may differ (the
    trainer resamples the position table as it loads); the patch size must be the weights' own."""
    src = read_source(path, where)
    try:
        got = hf.encoder_fields(src.config)
    except ArchError as err:
        raise HFInitError(f"{src.path / CONFIG}: {err.describe()}", where) from None
    if got["patch_size"] != e.patch_size:
        raise HFInitError(
            f"{src.path / CONFIG} has patch_size={got['patch_size']}, {model_field} has "
            f"patch_size={e.patch_size}: the patch embedding is learned for its own patch size (only the "
            f"position table is resampled to another image_size); keep patch_size {got['patch_size']}",
            where,
        )
    _check_arch(src, got | {"image_size": e.image_size}, e.to_dict(), where, model_field)
    try:  # downsample changes no weight shape; the weights' grid need not be a multiple of it
        weights = EncoderArch.from_dict(e.to_dict() | {"image_size": got["image_size"], "downsample": 1})
    except ArchError as err:
        raise HFInitError(f"{src.path / CONFIG}: {err.describe()}", where) from None
    prefix = vision_prefix(src, where, families.vision(weights.kind).patch_tensor())
    _check_tensors(src, hf.encoder_layout(weights, prefix), where)
    return src, prefix, weights


def check_audio(path, a, where: str) -> tuple[HFHeaders, str]:
    """A Whisper HF directory (a WhisperModel, WhisperForConditionalGeneration or WhisperEncoder save) against
    the run's audio encoder `a` (an AudioArch): (its headers, the encoder's tensor prefix). Its config must
    describe `a` (the first differing field is named) and every tensor must be there with its shape, in
    floating point."""
    family = families.audio(a.kind)
    h = read_source(path, where)
    try:
        got = family.arch(h.config, a.name, a.source, a.pooling)
        prefix = family.encoder_prefix(h.shapes)
    except ArchError as err:
        raise HFInitError(f"{h.path / CONFIG}: {err}", where) from None
    for k, want in a.to_dict().items():
        if getattr(got, k) != want:
            raise HFInitError(
                f"{h.path / CONFIG} describes another encoder: {k}={getattr(got, k)!r}, the model has "
                f"{k}={want!r}",
                where,
            )
    layout = family.layout(a, prefix)
    for name, shape in layout.hf_shapes.items():
        if h.shapes.get(name) != shape:
            have = list(h.shapes[name]) if name in h.shapes else "no such tensor"
            raise HFInitError(f"{h.path}: tensor {name}: {have}, the encoder needs {list(shape)}", where)
        dtype = h.dtypes.get(name)
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise HFInitError(
                f"{h.files[name]}: tensor {name} is {dtype}, not floating-point weights "
                f"({', '.join(sorted(FLOAT_DTYPES))})",
                where,
            )
    return h, prefix


def encoder_sources(init, arch) -> dict[str, tuple[str, str]]:
    """Module name -> (its HuggingFace directory, where trainer.init names it) of `init` (a spec.InitSpec or
    None) for `arch`'s encoder modules: `encoder:` is the module `vision`, `encoders:` names each. A name
    the model has no module of, or `vision` given both ways, is HFInitError."""
    if init is None:
        return {}
    have = [n for n, _ in arch.named_encoders]
    out: dict[str, tuple[str, str]] = {}
    if init.encoder is not None:
        out[VISION] = (init.encoder, "trainer.init.encoder")
    for name, d in (init.encoders or {}).items():
        where = f"trainer.init.encoders.{name}"
        if name not in have:
            modules = ", ".join(have) or "none: a text-only model"
            raise HFInitError(f"the model has no encoder module {name!r} (its modules: {modules})", where)
        if name in out:
            raise HFInitError(
                f"the module {name!r} is given twice: trainer.init.encoder is the module {VISION!r}; "
                "give it once",
                where,
            )
        out[name] = (d, where)
    if VISION in out and out[VISION][1] == "trainer.init.encoder" and VISION not in have:
        modules = ", ".join(have) or "none: a text-only model"
        raise HFInitError(
            f"the model has no encoder module {VISION!r} (its modules: {modules}); name the module in "
            "trainer.init.encoders",
            "trainer.init.encoder",
        )
    return out


def check_module(path, name: str, e, where: str):
    """One encoder module's HuggingFace directory against its architecture, by its modality: an image
    module's is check_encoder's (headers, prefix, the encoder its weights describe), an audio module's
    check_audio's (headers, prefix)."""
    if e.modality == "audio":
        return check_audio(path, e, where)
    model_field = (
        "trainer.model.encoder" if where == "trainer.init.encoder" else f"trainer.model.encoders.{name}"
    )
    return check_encoder(path, e, where, model_field)


def hf_init_problems(init, arch, llm_tp: int) -> list[HFInitError]:
    """Every HuggingFace source of trainer.init (`init`: a spec.InitSpec or None) checked against `arch`, one
    error per side that cannot start the run (a Megatron source of the LLM is not judged here)."""
    out = []
    if init is None:
        return out
    if isinstance(init.llm, str):
        try:
            check_llm(init.llm, arch.llm, llm_tp)
        except HFInitError as e:
            out.append(e)
    try:
        sources = encoder_sources(init, arch)
    except HFInitError as e:
        return [*out, e]
    mods = arch.encoders
    for name, (path, where) in sources.items():
        try:
            check_module(path, name, mods[name], where)
        except HFInitError as e:
            out.append(e)
    return out
