"""SigLIP's vision tower (transformers' SiglipVisionModel, configuration_siglip.py / modeling_siglip.py): no
class token, no norm before the first layer, `post_layernorm` after the last, a biased patch conv, GELU
(tanh). The attention-pooling head (`head.*`) is not part of the trainer's ViT: a VLM takes the hidden
states. Pixels: SiglipImageProcessor's mean 0.5 / std 0.5 (transformers' IMAGENET_STANDARD_MEAN/STD)."""

from __future__ import annotations

from mimo_jobs.model.arch import EncoderArch
from mimo_jobs.model.families.base import Pixels, register, req
from mimo_jobs.model.families.vit import ACT_OUT, VisionFamily


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

    def fields(self, cfg: dict) -> dict:
        cfg = self.vision_config(cfg)
        return {
            "kind": self.name,
            "num_layers": int(req(cfg, "num_hidden_layers")),
            "hidden_size": int(req(cfg, "hidden_size")),
            "num_attention_heads": int(req(cfg, "num_attention_heads")),
            "ffn_hidden_size": int(req(cfg, "intermediate_size")),
            "patch_size": int(req(cfg, "patch_size")),
            "image_size": int(req(cfg, "image_size")),
            "channels": int(cfg.get("num_channels", 3)),
            "class_token": False,
            "activation": self.activation(cfg, "gelu_pytorch_tanh"),
            "normalization": "LayerNorm",
            "norm_epsilon": float(cfg.get("layer_norm_eps", 1e-6)),
            "pre_norm": False,
            "final_norm": True,
            "patch_bias": True,
        }

    def hf_config(self, e: EncoderArch, dtype: str = "float32") -> dict:
        want = dict(class_token=False, pre_norm=False, final_norm=True, patch_bias=True, layer_scale=False)
        self.check_exportable(e, want | {"normalization": "LayerNorm"})
        return {
            "architectures": [self.vision_architecture],
            "model_type": self.vision_model_type,
            "hidden_size": e.hidden_size,
            "intermediate_size": e.ffn_hidden_size,
            "num_hidden_layers": e.num_layers,
            "num_attention_heads": e.num_attention_heads,
            "patch_size": e.patch_size,
            "image_size": e.image_size,
            "num_channels": e.channels,
            "hidden_act": ACT_OUT[e.activation],
            "layer_norm_eps": e.norm_epsilon,
            "torch_dtype": dtype,
            "vision_use_head": False,  # the attention-pooling head is not part of the trainer's ViT
        }
