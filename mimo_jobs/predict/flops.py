"""Training FLOPs of the MIMO model: the one FLOPs model of the package (MFU in reports and the trainer's
log line, and the planner's compute time).

Megatron-LM's `num_floating_point_operations` (megatron/training/training.py; Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", appendix): 2 FLOPs per
multiply-add, forward + backward = 3x forward; norms, activations and softmax are not counted. Per LLM
token and layer, forward, with a heads of d channels (kv_channels) and g query groups:
  attention projections 2h(a d + 2 g d) + 2 a d h   (q, k, v, and o)
  causal attention core 2 * 2 s a d / 2            (QK^T and AV over the s keys, half of them under the mask)
  MLP                   2 * m * h f                (m = 3 matrices for a gated MLP (SwiGLU), else 2)
  MoE                   2 h E (router) + k * 2 * m * h f_e (routed experts) + 2 * m * h f_s (shared experts)
                        + 2 h (the shared experts' gate)
dense and MoE layers as moe_layer_pattern says, plus the logits 2 h V per token (V the padded vocabulary
the output layer computes). The encoder, per image: its ViT layers over the image's patches plus its class
token (bidirectional: the core is not halved), the patch embedding 2 C p^2 h_e per patch, and the projector
2 (s^2 h_e h_l + h_l^2) per token it hands the LLM (s x s patches per token after the pixel shuffle).
The audio encoder (model/audio_arch.py), per clip of F mel frames: conv1 2 * 3 m h per frame (m mel bins),
conv2 2 * 3 h^2 per output step (T = ceil(F / 2) steps), its transformer layers over the T steps
(bidirectional), and the projector per token it hands the LLM (T / pooling). Backward is 2x forward, but
conv1's input (the spectrogram) needs no gradient, so conv1 costs 2x its forward in all (torch's
FlopCounterMode counts the same).
A model of several encoder modules (a vision tower and an audio encoder) sums them; a text-only model (no
encoder) has the LLM's FLOPs alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.arch import EncoderArch, LLMArch, ModelArch, padded_vocab
from mimo_jobs.model.audio_arch import CONVS, AudioArch, conv_frames


def mlp_matrices(gated: bool) -> int:
    """Weight matrices a token passes through in one MLP: fc1 (gate and up when gated) and fc2."""
    return 3 if gated else 2


@dataclass(frozen=True)
class SampleFlops:
    """Training FLOPs (forward + backward) of one sample, per module."""

    encoder: float
    llm: float

    @property
    def total(self) -> float:
        return self.encoder + self.llm


def llm_layer_forward_flops(
    p: LLMArch, seq: int, causal_halved: bool = True, moe: bool | None = None
) -> float:
    """Forward FLOPs of one LLM transformer layer for one token of a `seq`-token sequence (`moe`: whether
    it is an MoE layer; None: as the model's first MoE layer, if any)."""
    h, q, kv = p.hidden_size, p.num_attention_heads * p.head_dim, p.query_groups * p.head_dim
    proj = 2 * h * (q + 2 * kv) + 2 * q * h
    core = 4 * seq * q / (2 if causal_halved else 1)
    m = mlp_matrices(p.gated_linear_unit)
    if moe if moe is not None else bool(p.num_experts):
        mlp = 2 * h * p.num_experts + p.moe_router_topk * 2 * m * h * p.expert_ffn
        if p.moe_shared_expert_intermediate_size:
            mlp += 2 * m * h * p.moe_shared_expert_intermediate_size + (
                2 * h if p.moe_shared_expert_gate else 0
            )
    else:
        mlp = 2 * m * h * p.ffn_hidden_size
    return proj + core + mlp


def llm_flops_per_token(p: LLMArch, seq: int, causal_halved: bool = True) -> float:
    """Training FLOPs per LLM token: 3 x (layers + logits)."""
    moe = p.moe_layers
    layers = moe * llm_layer_forward_flops(p, seq, causal_halved, True) if moe else 0.0
    if moe < p.num_layers:
        layers += (p.num_layers - moe) * llm_layer_forward_flops(p, seq, causal_halved, False)
    return 3 * (layers + 2 * p.hidden_size * padded_vocab(p.vocab_size, 1))


def encoder_flops_per_token(e: EncoderArch, llm_hidden: int, tokens_per_image: float) -> float:
    """Training FLOPs per image token handed to the LLM, of the ViT + projector, the image giving the LLM
    `tokens_per_image` tokens (downsample^2 patches each, plus the class token inside the ViT)."""
    h, s2 = e.hidden_size, e.downsample**2
    patches = tokens_per_image * s2
    n = patches + int(e.class_token)
    layer = n * (2 * h * 3 * h + 2 * h * h + 2 * mlp_matrices(False) * h * e.ffn_hidden_size) + 4 * n * n * h
    patch = patches * 2 * e.patch_inputs * h
    projector = tokens_per_image * 2 * (s2 * h * llm_hidden + llm_hidden * llm_hidden)
    return 3 * (e.num_layers * layer + patch + projector) / tokens_per_image if tokens_per_image else 0.0


def projector_flops_per_token(width: int, llm_hidden: int) -> float:
    """Forward FLOPs of the MLP projector (width -> LLM width -> LLM width) per token it hands the LLM."""
    return 2 * (width * llm_hidden + llm_hidden * llm_hidden)


def audio_clip_flops(a: AudioArch, llm_hidden: int, mel_frames: int) -> float:
    """Training FLOPs of one clip of `mel_frames` log-mel frames through the audio encoder and its
    projector (module docstring)."""
    h, f = a.hidden_size, a.ffn_hidden_size
    c1, c2 = CONVS
    steps1 = c1.out_frames(mel_frames)
    n = conv_frames(mel_frames)
    conv1 = steps1 * 2 * c1.kernel * a.num_mel_bins * h
    conv2 = n * 2 * c2.kernel * h * h
    layer = n * (2 * h * 3 * h + 2 * h * h + 2 * mlp_matrices(False) * h * f) + 4 * n * n * h
    tokens = a.tokens_for_frames(mel_frames)
    projector = tokens * projector_flops_per_token(a.out_width, llm_hidden)
    return 2 * conv1 + 3 * (conv2 + a.num_layers * layer + projector)


def llm_flops_per_sample(p: LLMArch, seq_length: int, causal_halved: bool = True) -> float:
    """Training FLOPs of one sample's `seq_length` tokens through the LLM."""
    return seq_length * llm_flops_per_token(p, seq_length, causal_halved)


def full_image_tokens(e: EncoderArch) -> int:
    return e.tokens_per_image


def module_flops_per_sample(
    a: EncoderArch | AudioArch,
    llm_hidden: int,
    tokens: float,
    tokens_per_image: float,
    clip_frames: int | None = None,
) -> float:
    """Training FLOPs of the `tokens` tokens one encoder module hands the LLM per sample, with its projector:
    an image module's in images of `tokens_per_image` tokens each, an audio module's in clips of
    `clip_frames` mel frames (None: full-length clips, max_frames), as many clips as hold the tokens."""
    if a.modality == "audio":
        frames = clip_frames or a.max_frames
        per_clip = a.tokens_for_frames(frames)
        return tokens / per_clip * audio_clip_flops(a, llm_hidden, frames) if tokens else 0.0
    return tokens * encoder_flops_per_token(a, llm_hidden, tokens_per_image)


def one_module_per_kind(preset: ModelArch) -> bool:
    """Whether no two encoder modules of the model embed one kind of input: what flops_per_sample needs,
    since its token counts are per kind (the trainer counts image and audio embeddings, not modules)."""
    kinds = [a.modality for _, a in preset.named_encoders]
    return len(kinds) == len(set(kinds))


def flops_per_sample(
    preset: ModelArch,
    seq_length: int,
    image_tokens: float,
    tokens_per_image: float | None = None,
    causal_halved: bool = True,
    audio_tokens: float = 0.0,
    clip_frames: int | None = None,
) -> SampleFlops:
    """One sample of a model (every encoder module of it, or none): `seq_length` LLM tokens; through its
    image module `image_tokens` tokens in images of `tokens_per_image` tokens each (default: one image
    holding them all), through its audio module `audio_tokens` tokens in clips of `clip_frames` mel frames
    (module_flops_per_sample). The counts are per kind of input: a model with two modules of one kind is a
    ValueError (one_module_per_kind). The planner prices each module from the data's mix
    (modmix.sample_flops_by_module); this is the figure of a run's log line and of the report's MFU."""
    if not one_module_per_kind(preset):
        raise ValueError(
            f"{preset.name}: two encoder modules of one kind ({', '.join(preset.encoders)}): the image and "
            "audio token counts do not say which module's tokens they are"
        )
    per_image = image_tokens if tokens_per_image is None else tokens_per_image
    hl = preset.llm.hidden_size
    tokens = {"image": image_tokens, "audio": audio_tokens}
    enc = sum(
        (
            module_flops_per_sample(a, hl, tokens[a.modality], per_image, clip_frames)
            for _, a in preset.named_encoders
        ),
        0.0,
    )
    return SampleFlops(enc, llm_flops_per_sample(preset.llm, seq_length, causal_halved))
