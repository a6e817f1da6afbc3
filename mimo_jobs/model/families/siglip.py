"""SigLIP's vision tower (transformers' SiglipVisionModel, configuration_siglip.py / modeling_siglip.py): no
class token, no norm before the first layer, `post_layernorm` after the last, a biased patch conv, GELU
(tanh). The attention-pooling head (`head.*`) is not part of the trainer's ViT: a VLM takes the hidden
states. Pixels: SiglipImageProcessor's mean 0.5 / std 0.5 (transformers' IMAGENET_STANDARD_MEAN/STD)."""

from __future__ import annotations

from mimo_jobs.model.families.base import Pixels, register
from mimo_jobs.model.families.vit import VisionFamily, key


@register
class SigLIP(VisionFamily):
    name = "siglip"
    title = "SigLIP"
    features = (
        "the vision tower (`vision_model.` inside a full model); the attention-pooling head is not read"
    )
    architectures = ("SiglipVisionModel", "SiglipModel")
    model_types = ("siglip_vision_model", "siglip")
    full_model_types = ("siglip",)
    vision_architecture = "SiglipVisionModel"
    vision_model_type = "siglip_vision_model"
    pixels = Pixels(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    # SiglipVisionConfig's defaults
    overrides = (key("activation", default="gelu_pytorch_tanh"), key("norm_epsilon", default=1e-6))
    fixed = {
        "class_token": False,
        "normalization": "LayerNorm",
        "pre_norm": False,
        "final_norm": True,
        "patch_bias": True,
        "layer_scale": False,
    }
    constants = {"vision_use_head": False}  # the attention-pooling head is not part of the trainer's ViT
    hf = {
        "patch": "embeddings.patch_embedding",
        "positions": "embeddings.position_embedding.weight",
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
