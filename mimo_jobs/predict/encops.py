"""One microbatch of an encoder module on one of its ranks, priced by the operator-term model
(operators.py): what optime.py composes with the LLM's stage by steptime.compose, the rule the FLOPs model
composes its module times by.

An image module (model/arch.py EncoderArch, built as trainer/model/models.py's Encoder):
  patch embedding  one GEMM (patches, hidden / TP, patch_inputs), the output gathered over TP
  layers           operators.layer_terms on each image's own tokens (patches + the class token) as one
                   sequence: the encoder runs images of one shape as a batch, each attending over its own
                   tokens only, bidirectionally (no causal mask, no rotary embedding); a video's frames
                   are one sequence of all its temporal groups' patches; images of n tokens each at the
                   module's E[n^2] / E[n] (modmix.ModuleMix.tokens_per_item), so the attention core's
                   FLOPs are the mix's
  projector        megatron-core's MultimodalProjector "mlp": fc1 (tokens, LLM hidden / TP, out_width),
                   the activation, fc2 (tokens, LLM hidden, LLM hidden / TP), one TP all-reduce forward
                   (fc2's output) and one backward (fc1's input gradient)
An audio module (model/audio_arch.py AudioArch, trainer/model/audio_encoder.py): conv1 and conv2 as GEMMs
over the time steps (kernel 3: K = 3 x input channels; whole on every TP rank), conv1 without a data
gradient (its input is the spectrogram), the layers over each clip's time steps as one sequence, then the
projector on the tokens after the pool.
The module's tokens per microbatch: its samples per encoder microbatch (topology.module_ranges) x its
tokens per sample (modmix.ModuleMix.tokens_mean). A frozen module (trainer.freeze) runs its forward
only: the trainer embeds under torch.no_grad and runs no backward for it (trainer/step/common.py embed,
encoder_rank.py), so no gradient GEMMs, no attention backward, no backward collectives, no DP transfers
and no optimizer step (optime.py). On ranks of its own its embeddings go over its bridge to the LLM's
first stage, their gradients come back unless it is frozen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mimo_jobs.model.arch import LLMArch
from mimo_jobs.model.audio_arch import CONVS, conv_frames
from mimo_jobs.study.topology import module_ranges

from . import operators as ops
from .opdata import OpGPU
from .run import RunShape


@dataclass(frozen=True)
class On:
    """Where and how a module runs: its TP, the GPU's figures, FP8, the residual, its recompute, what its
    backward computes (operators.GRADS), GPUs per node and the per-step latency of its collectives."""

    tp: int
    gpu: OpGPU
    fp8: bool = False
    res: ops.Residual = ops.Residual()
    recompute: str = "none"
    grads: str = "all"
    gpus_per_node: int = 8
    alpha_s: float = 0.0

    @property
    def backward(self) -> bool:
        return self.grads != "none"

    def linear(self, t: ops.Terms, m: float, n: float, k: float, input_grad: bool = True) -> None:
        """A linear layer (operators' terms) of the module, outside its recomputed layers."""
        ops._linear(t, m, n, k, self.gpu, self.fp8, self.res, 1.0, self.grads, input_grad)

    def collective(self, kind: str, nbytes: float) -> float:
        """One collective over the module's TP group (NVLink: TP stays inside a node)."""
        bw = ops.link_bytes_per_s(self.tp, self.gpus_per_node, self.gpu)
        return ops.collective_s(kind, nbytes, self.tp, bw, self.alpha_s) * self.res.comm


@functools.lru_cache(maxsize=256)
def layer_arch(a) -> LLMArch:
    """An encoder's transformer layer in the shape operators.layer_terms reads (an LLMArch of its widths:
    every head its own key and value, an ungated MLP)."""
    return LLMArch(
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        num_attention_heads=a.num_attention_heads,
        ffn_hidden_size=a.ffn_hidden_size,
        vocab_size=1,
        name=f"{a.kind} layer",
    )


def module_grads(rs: RunShape) -> str:
    """What an encoder module's backward computes (operators.GRADS): nothing when frozen (the planner's
    RunShape freezes every encoder module alike, as memory.py prices it)."""
    return "none" if rs.frozen_encoder else "all"


def module_mb(rs: RunShape, gpu: OpGPU, res: ops.Residual, i: int, alpha_s: float) -> tuple[ops.Terms, float]:
    """(the terms of one microbatch of encoder module `i` on one of its ranks, its bridge's seconds: 0
    colocated)."""
    _, a = rs.preset.named_encoders[i]
    mix, mr = rs.modules[i], module_ranges(rs.layout)[i]
    on = On(mr.tp, gpu, rs.fp8, res, rs.recompute.encoder, module_grads(rs), rs.layout.gpus_per_node, alpha_s)
    samples = mr.samples_per_encoder_microbatch
    if a.modality == "audio":
        t, tokens = audio_terms(a, samples * mix.items_mean, mix.frames, on)
    else:
        tokens = samples * mix.tokens_mean
        t = image_terms(a, tokens, mix.tokens_per_item, on)
    llm_hidden = rs.preset.llm.hidden_size
    projector_terms(t, tokens, a.out_width, llm_hidden, on)
    bridge = 0.0
    if not rs.layout.colocated and tokens > 0:
        sends = 2 if on.backward else 1  # the embeddings, and their gradients back
        nbytes = tokens * llm_hidden * ops.BF16
        bridge = sends * ops.collective_s("p2p", nbytes, 2, gpu.net_bytes_per_s, alpha_s) * res.comm
    return t, bridge


def _layers(t: ops.Terms, a, sequences: float, seq: float, on: On) -> None:
    """The module's transformer layers on `sequences` sequences (images, clips) of `seq` tokens each."""
    layer = ops.layer_terms(
        layer_arch(a), sequences, seq, ops.Split(tp=on.tp), on.gpu, False, on.recompute, on.fp8, on.res,
        on.gpus_per_node, on.alpha_s, causal=False, rotary=False, grads=on.grads,
    )  # fmt: skip
    t.add(layer, a.num_layers)


def image_terms(a, tokens: float, per_image: float, on: On) -> ops.Terms:
    """An image module on `tokens` LLM tokens in images of `per_image` tokens each (module docstring): the
    patch embedding and the layers (the projector apart: projector_terms)."""
    t = ops.Terms()
    if tokens <= 0 or per_image <= 0:
        return t
    h = a.hidden_size
    images = tokens / per_image
    patches = images * per_image * a.downsample**2
    # the patch embedding (megatron's ColumnParallelLinear: it computes its input's gradient too)
    on.linear(t, patches, h / on.tp, a.patch_inputs)
    if on.tp > 1:  # its output gathered forward, its input gradient reduced backward
        t.tp += on.collective("all_gather", patches * h * ops.BF16)
        if on.backward:
            t.tp += on.collective("all_reduce", patches * a.patch_inputs * ops.BF16)
    _layers(t, a, images, per_image * a.downsample**2 + int(a.class_token), on)
    return t


def audio_terms(a, clips: float, frames: int, on: On) -> tuple[ops.Terms, float]:
    """An audio module on `clips` clips of `frames` mel frames (module docstring): the two convolutions and
    the layers (the projector apart), and the tokens the clips hand the LLM."""
    t = ops.Terms()
    if clips <= 0 or frames <= 0:
        return t, 0.0
    h = a.hidden_size
    c1, c2 = CONVS
    steps1, steps = c1.out_frames(frames), conv_frames(frames)
    on.linear(t, clips * steps1, h, c1.kernel * a.num_mel_bins, input_grad=False)
    on.linear(t, clips * steps, h, c2.kernel * h)
    # a GELU after each convolution: read and write forward, twice backward
    gelu = ops.BF16 * 2 * clips * (steps1 + steps) * h
    t.elementwise += ops.bytes_s(gelu * (1 + 2 * on.backward), on.gpu)
    _layers(t, a, clips, steps, on)
    return t, clips * a.tokens_for_frames(frames)


def projector_terms(t: ops.Terms, tokens: float, width: int, llm_hidden: int, on: On) -> None:
    """The MLP projector on `tokens` tokens of `width` into `t` (module docstring)."""
    if tokens <= 0:
        return
    on.linear(t, tokens, llm_hidden / on.tp, width)
    on.linear(t, tokens, llm_hidden, llm_hidden / on.tp)
    t.elementwise += ops.bytes_s(ops.BF16 * 2 * tokens * llm_hidden / on.tp * (1 + 2 * on.backward), on.gpu)
    if on.tp > 1:  # fc2's output reduced forward, fc1's input gradient backward
        t.tp += on.collective("all_reduce", tokens * llm_hidden * ops.BF16)
        if on.backward:
            t.tp += on.collective("all_reduce", tokens * width * ops.BF16)
