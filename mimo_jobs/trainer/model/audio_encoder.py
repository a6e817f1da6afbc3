"""The Whisper-class audio encoder (mimo_jobs/model/audio_arch.py: AudioArch) on megatron-core 0.19.

conv1 and conv2 are plain torch Conv1d, whole on every TP rank (like the ViT's position table: every TP
rank computes them on the same input, so their gradients agree); the sinusoidal position table is the
parameter `embed_positions`, frozen as transformers' WhisperEncoder freezes it; the layers are a
megatron-core TransformerBlock of the ViT's layer spec (models.encoder_layer_specs: pre-norm LayerNorm,
attention with biases and no causal mask, a GELU MLP with biases), split over the TP group the caller's
ProcessGroupCollection names; then the optional average pool and the final LayerNorm (`ln_post`).

Clips of different lengths are not padded: clips of one length run as one batch, each over the first rows
of the position table, so a clip's output is exactly AudioArch.tokens_for_frames rows and no attention
mask is needed (transformers' WhisperEncoder takes only full 3000-frame clips; a full clip gives the same
rows here). Names and layouts against HuggingFace: mimo_jobs/model/families/whisper.py; its HuggingFace
weights are loaded and exported by mimo_jobs/trainer/weights/ (audio_hf.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig

from mimo_jobs.model.audio_arch import CONVS, AudioArch
from mimo_jobs.trainer.model.models import Precision, _base_kwargs, encoder_layer_specs, recompute_kwargs


def audio_config(a: AudioArch, tp: int, prec: Precision, recompute: str = "none") -> TransformerConfig:
    """The TransformerConfig of the encoder's layers on a TP group of `tp` ranks."""
    return TransformerConfig(
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        num_attention_heads=a.num_attention_heads,
        ffn_hidden_size=a.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        normalization="LayerNorm",
        layernorm_epsilon=a.norm_epsilon,
        **(_base_kwargs(prec, True, a.activation) | recompute_kwargs(recompute)),
    )


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's position table [length, channels]: sin then cos of `channels / 2` geometric timescales
    (transformers' modeling_whisper.py `sinusoids`, which WhisperEncoder's init writes)."""
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-step * torch.arange(channels // 2))
    t = torch.arange(length).view(-1, 1) * inv.view(1, -1)
    return torch.cat([t.sin(), t.cos()], dim=1)


class AudioEncoder(MegatronModule):
    """Log-mel clips -> their audio tokens [sum_i T_i, hidden_size], T_i = AudioArch.tokens_for_frames."""

    def __init__(self, a: AudioArch, cfg: TransformerConfig, pgc, prec: Precision):
        super().__init__(config=cfg)
        spec, _, norm = encoder_layer_specs(prec)
        h, dt = a.hidden_size, cfg.params_dtype
        self.arch = a
        self.dtype = prec.dtype
        (c1, c2) = CONVS
        self.conv1 = torch.nn.Conv1d(a.num_mel_bins, h, c1.kernel, c1.stride, c1.padding, dtype=dt)
        self.conv2 = torch.nn.Conv1d(h, h, c2.kernel, c2.stride, c2.padding, dtype=dt)
        self.embed_positions = torch.nn.Parameter(
            sinusoids(a.max_source_positions, h).to(dt), requires_grad=False
        )
        self.decoder = TransformerBlock(
            config=cfg,
            spec=spec,
            post_layer_norm=False,
            pre_process=True,
            post_process=False,
            pg_collection=pgc,
        )
        self.ln_post = norm(config=cfg, hidden_size=h, eps=a.norm_epsilon)

    def reset_positions_(self) -> None:
        """Write the sinusoidal table again, as transformers' WhisperEncoder init writes it: models.
        canonical_init_ draws every parameter but norms and biases at random, and the table is frozen, so a
        run that does not start from HF weights calls this after it."""
        with torch.no_grad():
            self.embed_positions.copy_(sinusoids(*self.embed_positions.shape).to(self.embed_positions.dtype))

    def forward(self, clips) -> torch.Tensor:
        """clips: a list of [num_mel_bins, frames_i] tensors, or one [b, num_mel_bins, frames] batch. Returns
        [sum_i T_i, hidden_size] in clip order. Clips of one length run as one batch."""
        clips = list(clips)
        if not clips:
            raise ValueError("the audio encoder was given no clip")
        order: dict[int, list[int]] = {}
        for i, c in enumerate(clips):
            if c.dim() != 2 or c.shape[0] != self.arch.num_mel_bins:
                raise ValueError(
                    f"audio clip {i} has shape {list(c.shape)}; the encoder takes "
                    f"[{self.arch.num_mel_bins} mel bins, frames]"
                )
            self.arch.tokens_for_frames(int(c.shape[1]))  # refuses a clip too long or too short, by name
            order.setdefault(int(c.shape[1]), []).append(i)
        outs: list = [None] * len(clips)
        for _, idx in order.items():
            y = self._encode(torch.stack([clips[i] for i in idx]).to(self.dtype))
            for j, i in enumerate(idx):
                outs[i] = y[j]
        return torch.cat(outs, dim=0)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """[b, mels, frames] of one length -> [b, tokens, h]."""
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))  # [b, h, n]
        n = x.shape[-1]
        x = x.transpose(1, 2) + self.embed_positions[:n]
        # bidirectional attention; an explicit mask also avoids megatron-core's device="cuda" default mask
        mask = torch.zeros(1, 1, n, n, dtype=torch.bool, device=x.device)
        y = self.decoder(x.transpose(0, 1).contiguous(), attention_mask=mask).transpose(0, 1)
        p = self.arch.pooling
        if p > 1:  # Qwen2-Audio's AvgPool1d(p, stride=p), before the final norm
            y = F.avg_pool1d(y.transpose(1, 2), kernel_size=p, stride=p).transpose(1, 2)
        return self.ln_post(y.contiguous())


def build_audio_encoder(a: AudioArch, cfg: TransformerConfig, pgc, prec: Precision) -> AudioEncoder:
    from mimo_jobs.trainer.model.models import in_params_dtype

    return in_params_dtype(AudioEncoder(a, cfg, pgc, prec), prec)


class AudioTower(MegatronModule):
    """The trainer's audio module: the encoder (`encoder`) and its MLP projector (`projector`, the image
    encoder's kind: models.projector_config) into the LLM's width. Clips -> [sum_i T_i, LLM hidden]."""

    def __init__(
        self, a: AudioArch, cfg: TransformerConfig, proj_cfg: TransformerConfig, pgc, prec: Precision
    ):
        from megatron.core.models.vision.multimodal_projector import MultimodalProjector

        super().__init__(config=cfg)
        _, proj_sub, _ = encoder_layer_specs(prec)
        self.encoder = AudioEncoder(a, cfg, pgc, prec)
        self.projector = MultimodalProjector(
            proj_cfg, proj_sub, "mlp", input_size=a.out_width, tp_group=pgc.tp
        )

    def forward(self, clips) -> torch.Tensor:
        y = self.encoder(clips).unsqueeze(1)  # [sum T, 1, h]: the MLP works on [s, b, h]
        return self.projector(y).squeeze(1)


def build_audio_tower(
    a: AudioArch, cfg: TransformerConfig, proj_cfg: TransformerConfig, pgc, prec: Precision
):
    from mimo_jobs.trainer.model.models import in_params_dtype

    return in_params_dtype(AudioTower(a, cfg, proj_cfg, pgc, prec), prec)
