"""The dense SwiGLU decoders: Llama, Mistral, Qwen2, Qwen3 (transformers' configuration_llama.py,
configuration_mistral.py, configuration_qwen2.py, configuration_qwen3.py). One network with per-family
differences: Llama's attention/MLP biases, Mistral's sliding window (refused unless turned off), Qwen2's
biased q/k/v only, Qwen3's per-head q/k norm. Their tensor names are decoder.py's NAMES."""

from __future__ import annotations

from mimo_jobs.model.families.base import register
from mimo_jobs.model.families.decoder import DecoderFamily

_QWEN_FULL_ATTENTION = {"use_sliding_window": False}


@register
class Llama(DecoderFamily):
    name = "llama"
    title = "Llama"
    features = "GQA, `head_dim`, attention/MLP biases, tied embeddings"
    architecture = "LlamaForCausalLM"
    bias_fields = ("attention_bias", "mlp_bias")


@register
class Mistral(DecoderFamily):
    name = "mistral"
    title = "Mistral"
    features = "GQA, `head_dim`; a sliding window is refused unless turned off"
    architecture = "MistralForCausalLM"
    sliding_default = True


@register
class Qwen2(DecoderFamily):
    name = "qwen2"
    title = "Qwen2"
    features = "GQA, q/k/v biases"
    architecture = "Qwen2ForCausalLM"
    qkv_bias_only = True
    bias_fields = ()
    full_attention = _QWEN_FULL_ATTENTION


@register
class Qwen3(DecoderFamily):
    name = "qwen3"
    title = "Qwen3"
    features = "GQA, QK-norm, `head_dim`"
    architecture = "Qwen3ForCausalLM"
    qk_norm = True
    full_attention = _QWEN_FULL_ATTENTION
