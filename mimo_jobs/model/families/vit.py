"""The vision families' common part: a ViT as the trainer builds it (megatron-core's RADIO ViT, see
trainer/model/models.py VarResViT) and its HuggingFace names, generated from each family's `hf` table.

A family's `hf` table names its tensors by role (None: the family has no such tensor):

  patch          the patch conv (.weight [h, C, p, p], .bias when patch_bias)
  class_token    the learned class token ([h], or [1, 1, h] when `batched`)
  positions      the position table ([positions, h], or [1, positions, h]); the class row first
  ln_pre, ln_post  the norms before the first and after the last layer
  layer          a layer's prefix, "{i}" its index; the rest are under it:
  norm1, q, k, v, proj, norm2, fc1, fc2, scale1, scale2 (layer scale of the attention and the MLP output)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from mimo_jobs.model.arch import ArchError, EncoderArch
from mimo_jobs.model.families.base import Family, Pixels, req
from mimo_jobs.model.hf_weights import Builder, HFLayout, Piece

LAYER = "vit.decoder.layers.{i}."
# encoder activation: HF hidden_act <-> EncoderArch.activation
ACT_IN = {"quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACT_OUT = {v: k for k, v in ACT_IN.items()}


def _activation(value) -> str:
    if value not in ACT_IN:
        raise ArchError("hidden_act", f"{value!r} is not one of {', '.join(ACT_IN)}")
    return ACT_IN[value]


def square(key: str) -> Callable:
    """A reader of a size that a config.json writes as one number or as [h, w] (square only)."""

    def read(v) -> int:
        if isinstance(v, (list, tuple)):
            if len(v) != 2 or v[0] != v[1]:
                raise ArchError(key, f"{list(v)}: the trainer's ViT takes square sizes only")
            v = v[0]
        return int(v)

    return read


@dataclass(frozen=True)
class ConfigKey:
    """One row of a family's two-way config table: the description's `field` is config.json's `hf` key, read
    with `read` (a missing key: `default`, or an error when there is none) and written back with `write` (the
    idea of Megatron-Bridge's CONFIG_MAPPING: one table serves both directions)."""

    field: str
    hf: str
    read: Callable = int
    write: Callable = lambda v: v
    default: object = None


def key(field: str, **changes) -> ConfigKey:
    """VIT_KEYS' row of `field` with a family's changes (its default, its reader and writer)."""
    return replace(next(k for k in VIT_KEYS if k.field == field), **changes)


# The rows every ViT family shares; a family replaces a row by its field (its own default, its own reader).
VIT_KEYS = (
    ConfigKey("num_layers", "num_hidden_layers"),
    ConfigKey("hidden_size", "hidden_size"),
    ConfigKey("num_attention_heads", "num_attention_heads"),
    ConfigKey("ffn_hidden_size", "intermediate_size"),
    ConfigKey("patch_size", "patch_size"),
    ConfigKey("image_size", "image_size"),
    ConfigKey("channels", "num_channels", default=3),
    ConfigKey("activation", "hidden_act", _activation, ACT_OUT.__getitem__),
    ConfigKey("norm_epsilon", "layer_norm_eps", float),
)


class VisionFamily(Family):
    """A ViT family: config fields, names (`hf`), pixels' preprocessing and the token rule."""

    modality: ClassVar[str] = "image"
    pixels: ClassVar[Pixels]
    hf: ClassVar[dict[str, str | None]]
    batched: ClassVar[bool] = False  # class token and position table carry a leading batch axis of 1
    vision_architecture: ClassVar[str]  # the vision model's `architectures` entry an export writes
    vision_model_type: ClassVar[str]  # its `model_type`
    full_model_types: ClassVar[tuple[str, ...]] = ()  # model_types whose config holds a vision_config

    # ------------------------------------------------------------------------------------ config.json

    def vision_config(self, cfg: dict) -> dict:
        """The vision tower's config of a vision or full (vision + text) config.json."""
        if cfg.get("model_type") in self.full_model_types or self._full_architecture(cfg):
            vc = cfg.get("vision_config")
            if not isinstance(vc, dict):
                raise ArchError("vision_config", f"missing from the {self.title} config")
            return vc
        return cfg

    def _full_architecture(self, cfg: dict) -> bool:
        archs = cfg.get("architectures") or []
        return bool(archs) and archs[0] in self.architectures and archs[0] != self.vision_architecture

    # The family's config table: its rows (VIT_KEYS with the family's own `overrides`), the structure every
    # model of the family has (`fixed`: description fields, set on reading and required on export) and the
    # constant keys an export writes (`constants`).
    overrides: ClassVar[tuple[ConfigKey, ...]] = ()
    fixed: ClassVar[dict] = {}
    constants: ClassVar[dict] = {}

    def config_keys(self) -> tuple[ConfigKey, ...]:
        mine = {k.field: k for k in self.overrides}
        return tuple(mine.pop(k.field, k) for k in VIT_KEYS) + tuple(mine.values())

    def fields(self, cfg: dict) -> dict:
        cfg = self.vision_config(cfg)
        self.refuse(cfg)
        out = {"kind": self.name}
        for k in self.config_keys():
            v = cfg.get(k.hf)
            if v is None:
                v = req(cfg, k.hf) if k.default is None else k.default
            out[k.field] = k.read(v)
        return out | dict(self.fixed) | self.read_more(cfg)

    def hf_config(self, e: EncoderArch, dtype: str = "float32") -> dict:
        # a 2-D family's config has no temporal patch: a 3-D patch embedding would be written as a 2-D one
        self.check_exportable(e, dict(self.fixed) | {"temporal_patch_size": 1})
        out = {"architectures": [self.vision_architecture], "model_type": self.vision_model_type}
        out |= {k.hf: k.write(getattr(e, k.field)) for k in self.config_keys()}
        return out | self.write_more(e) | dict(self.constants) | {"torch_dtype": dtype}

    def refuse(self, cfg: dict) -> None:
        """Refuse, by the key that names it, what the trainer cannot build (none by default)."""

    def read_more(self, cfg: dict) -> dict:
        """Description fields a family reads beyond its table (none by default)."""
        return {}

    def write_more(self, e: EncoderArch) -> dict:
        """config.json keys a family writes beyond its table (none by default)."""
        return {}

    def check_exportable(self, e: EncoderArch, want: dict) -> None:
        for f, v in want.items():
            if getattr(e, f) != v:
                raise ArchError(
                    f,
                    f"a HuggingFace {self.title} vision model has {f}={v}, this description {getattr(e, f)}",
                )

    # --------------------------------------------------------------------------------------- tokens

    def tokens_for(self, e, h_px: int, w_px: int) -> int:
        """The one rule of how many tokens an encoder sample (an image or one tile of it) of h x w pixels
        hands the LLM: its patch grid, s x s patches per token after the pixel shuffle (s = downsample), the
        class token (which attends inside the ViT) dropped. `e` carries the encoder's patch_size and
        downsample: its EncoderArch, or what holds its geometry (model/tiling.py ImageGeometry,
        data/mock.py MockTower). The description, both sides of the bridge, the data path, the mock
        provider and the planner all reach this through the family."""
        s = e.patch_size * e.downsample
        return (h_px // s) * (w_px // s)

    # ---------------------------------------------------------------------------------------- names

    def patch_tensor(self) -> str:
        """The patch conv's weight: where a checkpoint's vision tower is found (its prefix before it)."""
        return f"{self.hf['patch']}.weight"

    def layout(self, e: EncoderArch, prefix: str = "") -> HFLayout:
        """The ViT's targets for the vision tower whose tensor names start with `prefix` ("" for a vision
        model, e.g. "vision_model." inside a full model). The projector has no HF counterpart."""
        n = self.hf
        b = Builder(self.vision_model_type)
        h, c, ps = e.hidden_size, e.channels, e.patch_size
        one = (1,) if self.batched else ()
        patch = b.tensor(f"{prefix}{n['patch']}.weight", (h, c, ps, ps))
        b.add("vit.embedder.weight", (h, c * ps * ps), [Piece(patch, h)], split=0)
        if e.patch_bias:
            b.same("vit.embedder.bias", f"{prefix}{n['patch']}.bias", (h,), split=0)
        grid, cls = e.grid**2, int(e.class_token)
        pos = b.tensor(prefix + n["positions"], (*one, grid + cls, h))
        if e.class_token:
            tok = b.tensor(prefix + n["class_token"], (*one, *one, h))
            b.add("vit.class_token", (1, h), [Piece(tok, 1, whole=True)])
            b.add("vit.class_position", (1, h), [Piece(pos, 1, 0, whole=self.batched)])
        b.add(
            "vit.position_embeddings",
            (1, grid, h),
            [Piece(pos, grid, cls, whole=self.batched)],
            view=(grid, h),
        )
        for role, on in (("ln_pre", e.pre_norm), ("ln_post", e.final_norm)):
            if on:
                self._norm(b, e, f"vit.{role}.", prefix + n[role] + ".")
        for i in range(e.num_layers):
            self._layer(b, e, prefix + n["layer"].format(i=i), LAYER.format(i=i))
        return b.layout()

    @staticmethod
    def _norm(b: Builder, e: EncoderArch, mc: str, hf: str) -> None:
        b.same(mc + "weight", hf + "weight", (e.hidden_size,))
        if e.normalization == "LayerNorm":
            b.same(mc + "bias", hf + "bias", (e.hidden_size,))

    def _layer(self, b: Builder, e: EncoderArch, hf: str, mc: str) -> None:
        n = self.hf
        h, heads = e.hidden_size, e.num_attention_heads
        hd = h // heads
        self._norm(b, e, mc + "input_layernorm.", f"{hf}{n['norm1']}.")
        for kind in ("weight", "bias"):
            cols = (h,) if kind == "weight" else ()
            q, k, v = (b.tensor(f"{hf}{n[x]}.{kind}", (h, *cols)) for x in "qkv")
            pieces = [Piece(t, hd, a * hd) for a in range(heads) for t in (q, k, v)]
            b.add(f"{mc}self_attention.linear_qkv.{kind}", (3 * h, *cols), pieces, split=0)
        b.same(mc + "self_attention.linear_proj.weight", f"{hf}{n['proj']}.weight", (h, h), split=1)
        b.same(mc + "self_attention.linear_proj.bias", f"{hf}{n['proj']}.bias", (h,))
        self._norm(b, e, mc + "pre_mlp_layernorm.", f"{hf}{n['norm2']}.")
        f = e.ffn_hidden_size
        b.same(mc + "mlp.linear_fc1.weight", f"{hf}{n['fc1']}.weight", (f, h), split=0)
        b.same(mc + "mlp.linear_fc1.bias", f"{hf}{n['fc1']}.bias", (f,), split=0)
        b.same(mc + "mlp.linear_fc2.weight", f"{hf}{n['fc2']}.weight", (h, f), split=1)
        b.same(mc + "mlp.linear_fc2.bias", f"{hf}{n['fc2']}.bias", (h,))
        if e.layer_scale:
            b.same(mc + "self_attention.layer_scale", hf + n["scale1"], (h,))
            b.same(mc + "mlp.layer_scale", hf + n["scale2"], (h,))

    def doc_rows(self) -> list[tuple[str, str, str]]:
        """(trainer parameter, HuggingFace tensor, layout) of each name of the `hf` table (docs/weights.md)."""
        n, rows = self.hf, []
        lead = "[1, 1, h] " if self.batched else "[h] "
        table = "[1, rows, h]" if self.batched else "[rows, h]"
        notes = {
            "patch": ("`vit.embedder.weight` / `.bias`", "the conv's `[h, C, p, p]` as `[h, C*p*p]`"),
            "class_token": ("`vit.class_token`", f"`{lead.strip()}` as `[1, h]`"),
            "positions": (
                "`vit.class_position`, `vit.position_embeddings`",
                f"`{table}`: the class token's row first, when there is one",
            ),
            "ln_pre": ("`vit.ln_pre`", "as is"),
            "ln_post": ("`vit.ln_post`", "as is"),
        }
        for role, (trainer, how) in notes.items():
            if n.get(role):
                hf_name = n[role] + (".weight` / `.bias" if role == "patch" else "")
                rows.append((trainer, f"`{hf_name}`", how))
        layer, lay = n["layer"].replace("{i}", "i"), "vit.decoder.layers.i."
        rows.append((f"`{lay}input_layernorm`", f"`{layer}{n['norm1']}`", "as is"))
        rows.append(
            (
                f"`{lay}self_attention.linear_qkv`",
                f"`{layer}{n['q']}`, `{n['k']}`, `{n['v']}`",
                "per head: [q; k; v] rows",
            )
        )
        rows.append(
            (f"`{lay}self_attention.linear_proj`", f"`{layer}{n['proj']}`", "as is (TP splits columns)")
        )
        rows.append((f"`{lay}pre_mlp_layernorm`", f"`{layer}{n['norm2']}`", "as is"))
        rows.append((f"`{lay}mlp.linear_fc1`, `linear_fc2`", f"`{layer}{n['fc1']}`, `{n['fc2']}`", "as is"))
        if n.get("scale1"):
            rows.append(
                (
                    f"`{lay}self_attention.layer_scale`, `mlp.layer_scale`",
                    f"`{layer}{n['scale1']}`, `{n['scale2']}`",
                    "as is: scales the attention's and the MLP's output",
                )
            )
        return rows
