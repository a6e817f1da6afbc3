"""The local layers' core attention through torch's fused scaled-dot-product attention.

megatron-core 0.19.2's local `DotProductAttention` (transformer/dot_product_attention.py) computes the whole
[b, heads, s, s] score matrix, softmaxes it and keeps the probabilities for backward: memory and traffic
that grow with the sequence squared. `SDPAttention` takes its place in a local layer spec's `core_attention`
and computes the same function with `torch.nn.functional.scaled_dot_product_attention`, which picks a
flash / memory-efficient / cuDNN kernel on a GPU and its flash kernel on the CPU: it keeps the output and
the per-row log-sum-exp, not the scores.

What it keeps of DotProductAttention: the constructor (heads and query groups per TP rank, the softmax
scale, the dropout probability, the module's parameters and checkpoint names: none for the vanilla
softmax), the layout ([sq, b, np, hn] in, [sq, b, np * hn] out) and the mask's meaning (megatron-core's
boolean mask is True where attention is masked; an explicit mask is applied whatever the layer's mask
type, and with none a causal layer is causal). The plain causal mask becomes `is_causal`, an all-False
mask no mask, any other mask (packed rows' block-diagonal causal mask) an additive mask (-inf where
masked). One difference: a row masked everywhere gets megatron-core's uniform attention (scores filled with
-10000) in DotProductAttention and no finite value here; the trainer's masks never mask a whole row (a
position always sees itself, the encoders see everything).
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import is_layer_window_attention


class SDPAttention(DotProductAttention):
    """DotProductAttention's interface and checkpoint, torch's fused attention inside."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **kw):
        super().__init__(config, layer_number, attn_mask_type, attention_type, **kw)
        if self.softmax_offset is not None or config.softmax_type != "vanilla":
            raise ValueError(
                f"softmax_type {config.softmax_type!r}: torch's scaled_dot_product_attention has no softmax "
                "offset; use trainer.attention: unfused"
            )
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
            raise ValueError(
                "window_size: torch's scaled_dot_product_attention takes no sliding window here; use "
                "trainer.attention: unfused"
            )
        # DotProductAttention divides its scale by the layer number under apply_query_key_layer_scaling and
        # its softmax multiplies the scores by it again: the product is the scale attention applies
        coeff = self.layer_number if config.apply_query_key_layer_scaling else 1
        self.sdpa_scale = self.softmax_scale * coeff
        self.dropout_p = self.attention_dropout.p

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        """[sq, b, np, hn] query, [sk, b, ng, hn] key and value -> [sq, b, np * hn]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention takes neither packed_seq_params (THD) nor an attention bias")
        sq, b, np_, hn = query.shape
        mask, causal = sdpa_mask(attention_mask, self.attn_mask_type, sq, key.shape[0], query.dtype)
        # [s, b, n, hn] -> [b, n, s, hn]: views, no copies
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        p = self.dropout_p if self.training else 0.0
        with self._rng():
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=p,
                is_causal=causal,
                scale=self.sdpa_scale,
                enable_gqa=k.shape[1] != np_,
            )
        return out.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)

    def _rng(self):
        """The model-parallel RNG fork DotProductAttention draws its dropout from (without sequence
        parallelism), so dropout differs across TP ranks as it does there."""
        if self.dropout_p and self.training and not self.config.sequence_parallel:
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()


def sdpa_mask(mask, mask_type, sq: int, sk: int, dtype=torch.float32) -> tuple[torch.Tensor | None, bool]:
    """(attn_mask, is_causal) for scaled_dot_product_attention from megatron-core's mask (True = masked)
    and the layer's mask type, as DotProductAttention's unfused softmax reads them. An explicit mask other
    than the plain causal or an all-False one becomes an additive mask in `dtype` (-inf where masked)."""
    if mask is None:
        # megatron-core builds the causal mask itself for a causal layer (sq > 1), else attends everywhere
        return None, mask_type == AttnMaskType.causal and sq > 1
    return _LAST.get(mask, dtype, lambda: _read(mask, sq, sk, dtype))


def _read(mask: torch.Tensor, sq: int, sk: int, dtype) -> tuple[torch.Tensor | None, bool]:
    if not bool(mask.any()):
        return None, False
    if sq == sk and mask.shape[0] == 1 and mask.shape[1] == 1 and torch.equal(mask[0, 0], _upper(sq, mask)):
        return None, True
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf")), False


def _upper(s: int, like: torch.Tensor) -> torch.Tensor:
    return torch.ones(s, s, dtype=torch.bool, device=like.device).triu(1)


class _LastMask:
    """The last mask read, and what it became. Every layer of a forward gets the same mask tensor: reading
    it once (not once per layer) saves a host-device synchronisation per layer, and every layer then passes
    the same additive mask, one storage autograd keeps for all of them rather than one each."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._ref = None
        self._value: tuple[torch.Tensor | None, bool] = (None, False)

    def get(self, mask: torch.Tensor, dtype, read):
        key = (mask._version, dtype, mask.device)
        if self._ref is not None and self._ref() is mask and self._key == key:
            return self._value
        self._value = read()
        self._ref, self._key = weakref.ref(mask), key
        return self._value


_LAST = _LastMask()
