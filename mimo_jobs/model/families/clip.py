"""CLIP's vision tower (transformers' CLIPVisionModel, configuration_clip.py / modeling_clip.py): a class
token with its own position row, a norm before the first layer (`pre_layrnorm`) and after the last
(`post_layernorm`), an unbiased patch conv, QuickGELU. Pixels: CLIPImageProcessor's OpenAI mean/std."""

from __future__ import annotations

from mimo_jobs.model.arch import EncoderArch
from mimo_jobs.model.families.base import Pixels, register, req
from mimo_jobs.model.families.vit import ACT_OUT, VisionFamily


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
            "class_token": True,
            "activation": self.activation(cfg, "quick_gelu"),
            "normalization": "LayerNorm",
            "norm_epsilon": float(cfg.get("layer_norm_eps", 1e-5)),
            "pre_norm": True,
            "final_norm": True,
            "patch_bias": False,
        }

    def hf_config(self, e: EncoderArch, dtype: str = "float32") -> dict:
        want = dict(class_token=True, pre_norm=True, final_norm=True, patch_bias=False, layer_scale=False)
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
        }
