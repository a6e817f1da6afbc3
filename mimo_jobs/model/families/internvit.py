"""InternViT (InternVL's vision encoder, e.g. InternViT-300M-448px) as transformers writes it:
InternVLVisionModel (models/internvl/configuration_internvl.py, modeling_internvl.py).

What the network has, read from that modeling code: a learned class token (`cls_token` [1, 1, h]) with its
own row in the position table (`position_embeddings` [1, 1 + grid^2, h], the class row first); a biased
patch conv; no norm before the first layer; pre-norm layers (`layernorm_before`, `layernorm_after`) whose
attention and MLP outputs are each multiplied by a learned per-channel layer scale (`lambda_1`,
`lambda_2`, [h]) before the residual add; q, k, v projections with biases (`attention_bias`) and a biased
output projection (`projection_layer`); GELU; no norm after the last layer when `use_mean_pooling` (the
default: `layernorm` is an Identity), a LayerNorm otherwise. `last_hidden_state` keeps the class token
first, as the trainer's ViT does (the LLM gets the patch tokens only).

Built by the trainer: layer scale (trainer/model/models.py adds it to megatron-core's layers), LayerNorm or
RMSNorm (`norm_type`). Refused by name: `use_qk_norm` (InternViT-6B's RMSNorm over all heads' q and k,
which megatron-core's per-head q/k norm is not), `attention_bias: false` (megatron-core biases linear_qkv
whenever the output projection is biased), `use_mask_token` (a masked-image-modeling parameter a VLM does
not use), `use_absolute_position_embeddings: false`, non-square image or patch sizes, and `rms_norm` layers
with a final LayerNorm (one normalization per ViT).

Pixels: InternVL's own preprocessing (OpenGVLab/InternVL, internvl_chat/internvl/train/dataset.py
`build_transform`: IMAGENET_MEAN (0.485, 0.456, 0.406), IMAGENET_STD (0.229, 0.224, 0.225); transformers'
IMAGENET_DEFAULT_MEAN/STD), which the published InternVL "-hf" checkpoints' preprocessor_config.json also
states. transformers' GotOcr2ImageProcessor, which its auto classes pair with internvl when no
preprocessor_config.json says otherwise, defaults to CLIP's constants instead.
"""

from __future__ import annotations

from mimo_jobs.model.arch import ArchError, EncoderArch
from mimo_jobs.model.families.base import Pixels, register
from mimo_jobs.model.families.vit import VisionFamily, key, square

_NORMS = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}


def _pair(v: int) -> list[int]:
    return [v, v]


@register
class InternViT(VisionFamily):
    name = "internvit"
    title = "InternViT"
    features = "the vision tower (`model.vision_tower.` inside a full model): class token, layer scale"
    architectures = ("InternVLVisionModel", "InternVLForConditionalGeneration", "InternVLModel")
    model_types = ("internvl_vision", "internvl")
    full_model_types = ("internvl",)
    vision_architecture = "InternVLVisionModel"
    vision_model_type = "internvl_vision"
    pixels = Pixels(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    batched = True
    # InternVLVisionConfig's defaults; sizes as [h, w] pairs
    overrides = (
        key("activation", default="gelu"),
        key("norm_epsilon", default=1e-6),
        key("patch_size", read=square("patch_size"), write=_pair),
        key("image_size", read=square("image_size"), write=_pair),
    )
    fixed = {"class_token": True, "pre_norm": False, "patch_bias": True, "layer_scale": True}
    constants = {"attention_bias": True, "use_qk_norm": False}
    hf = {
        "patch": "embeddings.patch_embeddings.projection",
        "class_token": "embeddings.cls_token",
        "positions": "embeddings.position_embeddings",
        "ln_post": "layernorm",
        "layer": "encoder.layer.{i}.",
        "norm1": "layernorm_before",
        "q": "attention.q_proj",
        "k": "attention.k_proj",
        "v": "attention.v_proj",
        "proj": "attention.projection_layer",
        "norm2": "layernorm_after",
        "fc1": "mlp.fc1",
        "fc2": "mlp.fc2",
        "scale1": "lambda_1",
        "scale2": "lambda_2",
    }

    def refuse(self, cfg: dict) -> None:
        refused = {
            "use_qk_norm": "an RMSNorm over all heads' queries and keys (InternViT-6B's qk_normalization), which "
            "megatron-core's per-head q/k norm is not",
            "use_mask_token": "a mask token for masked image modeling, which a VLM's ViT does not use",
        }
        for k, what in refused.items():
            if cfg.get(k):
                raise ArchError(k, f"true: {what}; the trainer cannot build it")
        if not cfg.get("attention_bias", False):
            raise ArchError(
                "attention_bias",
                "false: megatron-core biases the fused q/k/v projection whenever the output projection is "
                "biased (InternViT's always is), so unbiased q, k, v cannot be built; InternViT-300M has "
                "attention_bias true",
            )
        if not cfg.get("use_absolute_position_embeddings", True):
            raise ArchError(
                "use_absolute_position_embeddings", "false: the trainer's ViT has a position table"
            )

    def read_more(self, cfg: dict) -> dict:
        """The layers' norm (`norm_type`) and the final one (a LayerNorm unless `use_mean_pooling`)."""
        norm_type = cfg.get("norm_type", "layer_norm")
        if norm_type not in _NORMS:
            raise ArchError("norm_type", f"{norm_type!r} is not one of {', '.join(_NORMS)}")
        final = not cfg.get("use_mean_pooling", True)
        if final and norm_type != "layer_norm":
            raise ArchError(
                "use_mean_pooling",
                "false with norm_type rms_norm: the final norm is a LayerNorm and the layers' RMSNorm, and "
                "the trainer's ViT has one normalization",
            )
        return {"normalization": _NORMS[norm_type], "final_norm": final}

    def write_more(self, e: EncoderArch) -> dict:
        if e.final_norm and e.normalization != "LayerNorm":
            raise ArchError("final_norm", "InternViT's final norm is a LayerNorm")
        norm_type = "layer_norm" if e.normalization == "LayerNorm" else "rms_norm"
        return {"norm_type": norm_type, "use_mean_pooling": not e.final_norm}
