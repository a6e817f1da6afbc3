"""CLIP's vision tower (transformers' CLIPVisionModel, configuration_clip.py / modeling_clip.py): a class
token with its own position row, a norm before the first layer (`pre_layrnorm`) and after the last
(`post_layernorm`), an unbiased patch conv, QuickGELU. Pixels: CLIPImageProcessor's OpenAI mean/std."""

from __future__ import annotations

from mimo_jobs.model.families.base import Pixels, register
from mimo_jobs.model.families.vit import VisionFamily, key


@register
class CLIP(VisionFamily):
    name = "clip"
    title = "CLIP"
    features = "the vision tower (`vision_model.` inside a full model): class token, pre- and post-norm"
    architectures = ("CLIPVisionModel", "CLIPModel")
    model_types = ("clip_vision_model", "clip")
    full_model_types = ("clip",)
    vision_architecture = "CLIPVisionModel"
    vision_model_type = "clip_vision_model"
    # transformers' image_utils OPENAI_CLIP_MEAN / OPENAI_CLIP_STD
    pixels = Pixels(mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
    # CLIPVisionConfig's defaults
    overrides = (key("activation", default="quick_gelu"), key("norm_epsilon", default=1e-5))
    fixed = {
        "class_token": True,
        "normalization": "LayerNorm",
        "pre_norm": True,
        "final_norm": True,
        "patch_bias": False,
        "layer_scale": False,
    }
    hf = {
        "patch": "embeddings.patch_embedding",
        "class_token": "embeddings.class_embedding",
        "positions": "embeddings.position_embedding.weight",
        "ln_pre": "pre_layrnorm",
        "ln_post": "post_layernorm",
        "layer": "encoder.layers.{i}.",
        "norm1": "layer_norm1",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "proj": "self_attn.out_proj",
        "norm2": "layer_norm2",
        "fc1": "mlp.fc1",
        "fc2": "mlp.fc2",
    }
