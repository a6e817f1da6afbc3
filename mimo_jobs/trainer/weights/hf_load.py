"""trainer.init.llm / trainer.init.encoder from a HuggingFace directory (config.json + *.safetensors, with or
without model.safetensors.index.json): checked before the first collective, then read slice by slice.

`check_init` runs on every rank in the trainer's preflight: the directory, its config (which must describe
the run's model: the first differing field is named with both values), the index and the files it names
(missing, truncated) and every tensor the model needs with its shape (from the safetensors headers; no
tensor data is read). It raises HFInitError, one line naming the file and the field or tensor. Those rules
are model/hf_check.py's (torch-free), which `validate` applies before the job is queued.

`load_into` then overwrites the parameters of a built module: each rank reads only the rows and columns of
its own TP/EP/PP shard through safetensors' lazy `get_slice`, one piece at a time, so the host memory a rank
needs beyond its model is about its largest shard of one parameter. Names and layouts: model/hf_weights.py.

An encoder may be trained at another `image_size` than its weights' config.json (same patch size): its
position table is then resampled to the new patch grid as it loads (positions.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from mimo_jobs.model import hf_check
from mimo_jobs.model.arch import VISION, EncoderArch, LLMArch
from mimo_jobs.model.hf import encoder_layout, llm_layout
from mimo_jobs.model.hf_check import HFHeaders, HFInitError
from mimo_jobs.model.hf_weights import HFLayout, piece_reads, shard_rows

__all__ = [
    "HFInitError",
    "HFSource",
    "check_encoder",
    "check_init",
    "check_llm",
    "load_audio",
    "load_encoder",
    "load_llm",
]


@dataclass
class HFSource(HFHeaders):
    """A checked HF directory (model/hf_check.py) opened for reading its tensors slice by slice."""

    nonfinite: set[str] = field(default_factory=set)  # tensors read that hold NaN/Inf (warned once each)
    _open: dict = field(default_factory=dict)

    @classmethod
    def of(cls, h: HFHeaders) -> HFSource:
        return cls(h.path, h.config, h.files, h.shapes, h.dtypes)

    def slice(self, name: str):
        """The lazy safetensors slice of one tensor (indexing it reads only what is indexed)."""
        from safetensors import safe_open

        f = self.files[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt")
        return self._open[f].get_slice(name)

    def close(self) -> None:
        self._open.clear()


@dataclass
class Checked:
    """What check_init found: the LLM's source and family, and each encoder module's checked source by its
    name (a side absent: not loaded from HF)."""

    llm: tuple[HFSource, str] | None = None  # (source, family)
    encoders: dict[str, ModuleSource] = field(default_factory=dict)

    def notes(self, arch) -> list[str]:
        """What loading changes in the weights (said in the trainer's first line)."""
        out = []
        mods = arch.encoders
        for name, ms in self.encoders.items():
            why = ms.source.resampled(mods[name]) if isinstance(ms.source, EncoderSource) else None
            if why:
                out.append(f"{ms.where}: {why}")
        return out


def check_llm(path, p: LLMArch, tp: int) -> tuple[HFSource, str]:
    h, fam = hf_check.check_llm(path, p, tp)
    return HFSource.of(h), fam


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


def check_encoder(
    path, e: EncoderArch, where: str = "trainer.init.encoder", model_field=None
) -> EncoderSource:
    h, prefix, weights = hf_check.check_encoder(path, e, where, *([model_field] if model_field else []))
    return EncoderSource(HFSource.of(h), prefix, weights)


@dataclass(frozen=True)
class AudioSource:
    """A checked Whisper directory: its source and the encoder's tensor-name prefix."""

    src: HFSource
    prefix: str


@dataclass(frozen=True)
class ModuleSource:
    """One encoder module's checked HF source and where trainer.init names it."""

    where: str
    source: EncoderSource | AudioSource


def check_module(path, name: str, e, where: str) -> ModuleSource:
    """One encoder module's directory against its architecture, by modality (model/hf_check.py's rules)."""
    got = hf_check.check_module(path, name, e, where)
    if e.modality == "audio":
        h, prefix = got
        return ModuleSource(where, AudioSource(HFSource.of(h), prefix))
    h, prefix, weights = got
    return ModuleSource(where, EncoderSource(HFSource.of(h), prefix, weights))


def check_init(init, arch, llm_tp: int) -> Checked:
    """Every check of trainer.init's sources that needs no collective (run on every rank): the HF ones are
    model/hf_check.py's, which `validate` makes too."""
    out = Checked()
    if init is None:
        return out
    if isinstance(init.llm, str):
        out.llm = check_llm(init.llm, arch.llm, llm_tp)
    elif init.llm is not None:  # {megatron: DIR}: its directory, backend and tensor index
        from mimo_jobs.trainer.weights.megatron_load import check_source

        check_source(init.llm.megatron)
    mods = arch.encoders
    for name, (path, where) in hf_check.encoder_sources(init, arch).items():
        out.encoders[name] = check_module(path, name, mods[name], where)
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
                x = sl[:].reshape(-1, *view[1:])[pc.start + a : pc.start + b]
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


def module_source(init, arch, name: str) -> tuple[str, str] | None:
    """(HF directory, where trainer.init names it) of encoder module `name`, or None: it does not start from
    HF weights."""
    if init is None:
        return None
    return hf_check.encoder_sources(init, arch).get(name)


def load_encoder(init, e: EncoderArch, enc, cut: dict, arch=None, name: str = VISION) -> int:
    """trainer.init's weights of the image module `name` (`encoder:` is `vision`) into this rank's encoder
    (the ViT; the projector keeps its init). `arch`: the whole model (default: `e` as its one encoder)."""
    found = module_source(init, arch, name) if arch is not None else _single(init)
    if found is None:
        return 0
    from mimo_jobs.trainer.model.models import param_shards

    path, where = found
    model_field = (
        "trainer.model.encoder" if where == "trainer.init.encoder" else f"trainer.model.encoders.{name}"
    )
    es = check_encoder(path, e, where, model_field)
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


def _single(init) -> tuple[str, str] | None:
    return None if init is None or init.encoder is None else (init.encoder, "trainer.init.encoder")


def load_audio(init, arch, name: str, encoder, cut: dict) -> int:
    """trainer.init's weights of the audio module `name` into this rank's audio encoder (audio_encoder.
    AudioEncoder; its projector keeps its init)."""
    found = module_source(init, arch, name)
    if found is None:
        return 0
    path, where = found
    return load_audio_dir(encoder, path, cut, where)


def load_audio_dir(encoder, path, cut: dict, where: str) -> int:
    """A Whisper directory (model/hf_check.py's check_audio against `encoder.arch`) into this rank's shard
    of the audio encoder, slice by slice (names and layouts: model/families/whisper.py)."""
    from mimo_jobs.model import families
    from mimo_jobs.trainer.model.models import param_shards

    h, prefix = hf_check.check_audio(path, encoder.arch, where)
    src = HFSource.of(h)
    try:
        layout = families.audio(encoder.arch.kind).layout(encoder.arch, prefix)
        return load_into(encoder, layout, src, param_shards(encoder, **cut), skip=())
    finally:
        src.close()


POSITIONS = "vit.position_embeddings"


def _load_positions(es: EncoderSource, e: EncoderArch, shards) -> int:
    """The weights' whole position table (class row included: it is not resampled) read, resampled to `e`'s
    patch grid, and its patch rows copied into the ViT's position_embeddings ([1, grid^2, h], whole on every
    TP rank)."""
    import torch

    from mimo_jobs.trainer.weights.positions import resample_positions

    name = encoder_layout(es.weights, es.prefix).targets[POSITIONS].pieces[0].hf  # the HF table's name
    table = es.src.slice(name)[:]
    table = table.reshape(-1, table.shape[-1])  # InternViT's [1, rows, h]: the rows
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
