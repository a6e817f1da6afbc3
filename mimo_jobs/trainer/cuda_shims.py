"""Every torch.cuda monkeypatch megatron-core 0.19 needs to train on the CPU (a CPU or a CUDA torch build).

Installed by the trainer for a CPU run only (trainer.device.runs_on_cpu), whether or not CUDA is visible:
these are process-global patches that move every megatron-core device placement to the CPU. Each shim
names the megatron-core call sites that fail without it:
  devices and RNG      torch.cuda.current_device() as a device, "CUDA" RNG states on the CPU generator
  streams              torch.cuda.Stream/Event and synchronize as synchronous no-ops
  MoE without TE       the router and the alltoall token dispatcher on a CPU build
  tensor factories     device='cuda' literals in megatron modules become 'cpu'
  tensor methods       Tensor.cuda() is the identity, Tensor.type() names CPU tensors as CUDA ones
  process groups       groups and subgroups asked for with backend='nccl' use gloo
  uneven collectives   all_gather / reduce_scatter of differently sized splits (MoE at expert-TP > 1)
  optimizers           torch's AdamW/SGD, even where Transformer Engine is installed (megatron-core picks
                       TE's FusedAdam at import, whose constructor allocates on CUDA)
"""

from __future__ import annotations

import types

import megatron.core.tensor_parallel.random as R
import megatron.core.transformer.moe.moe_utils as mu
import megatron.core.transformer.moe.token_dispatcher as td
import torch
import torch.distributed as dist

_INSTALLED = False


class _FakeStream:
    """Stand-in for torch.cuda.Stream/Event: CPU work is synchronous, so every wait/sync is a no-op."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _FakeStream()

    def record(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def _cpu_device(kw: dict) -> dict:
    d = kw.get("device")
    if d is not None and "cuda" in str(d):
        kw = dict(kw, device="cpu")
    return kw


def _torch_proxy(torch):
    """A `torch` look-alike whose tensor factories turn device='cuda' into 'cpu'. Installed as the `torch`
    global of the megatron modules that hard-code device='cuda' (optimizer scale/found_inf buffers,
    clip_grads norm buffers, grad_scaler, param_and_grad_buffer warm-up, utils l2-norm, schedules)."""
    proxy = types.ModuleType("torch_cpu_proxy")
    proxy.__dict__.update({k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    for name in (
        "tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "randn",
        "rand",
    ):
        orig = getattr(torch, name)

        def make(orig):
            def f(*a, **k):
                return orig(*a, **_cpu_device(k))

            return f

        setattr(proxy, name, make(orig))
    return proxy


def install() -> None:
    """Install all shims once, before any megatron model/optimizer is built."""
    global _INSTALLED
    if _INSTALLED:
        return
    _devices_and_rng(torch)
    _streams(torch)
    _moe_without_te(torch)
    _tensor_factories(torch)
    _tensor_methods(torch)
    _process_groups()
    _uneven_collectives()
    _torch_optimizers()
    _INSTALLED = True


def _devices_and_rng(torch) -> None:
    # rope (rotary_pos_embedding.py), GlobalMemoryBuffer (utils.py), param buffers and schedules all do
    # torch.empty(..., device=torch.cuda.current_device()); "cpu" is a valid device string for all of them.
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.device_count = lambda: 0
    # The model-parallel RNG tracker (attention dropout fork, model_parallel_cuda_manual_seed) keeps "CUDA"
    # RNG states; redirect them to the CPU generator.
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    R._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    R._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)


def _streams(torch) -> None:
    # MoE alltoall dispatcher __init__, DDP overlap communication stream: synchronous stand-ins;
    # synchronize/empty_cache become no-ops.
    torch.cuda.Stream = _FakeStream
    torch.cuda.Event = _FakeStream
    torch.cuda.current_stream = lambda *a, **k: _FakeStream()
    torch.cuda.default_stream = lambda *a, **k: _FakeStream()
    torch.cuda.stream = lambda *a, **k: _FakeStream()
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None


def _moe_without_te(torch) -> None:
    # moe_utils references te_general_gemm although TE is absent (NameError in the router); the alltoall
    # dispatcher passes split sizes as CPU tensors to all_to_all_single (TypeError in mappings.py) unless
    # converted to numpy like the GPU path does.
    if not hasattr(mu, "te_general_gemm"):
        mu.te_general_gemm = None
    orig_move = td.maybe_move_tensor_to_cpu

    def _move(t, as_numpy=False, record_stream=False):
        if torch.is_tensor(t) and not t.is_cuda and as_numpy:
            return t.numpy()
        return orig_move(t, as_numpy=as_numpy, record_stream=record_stream)

    td.maybe_move_tensor_to_cpu = _move


def _tensor_factories(torch) -> None:
    # optimizer, clip-grad, grad scaler, DDP buffers, utils and schedules create tensors with device='cuda'
    # literals: give those modules a torch whose factories map 'cuda' -> 'cpu'.
    import importlib

    proxy = _torch_proxy(torch)
    for modname in (
        "megatron.core.optimizer.optimizer",
        "megatron.core.optimizer.clip_grads",
        "megatron.core.optimizer.grad_scaler",
        "megatron.core.optimizer.distrib_optimizer",
        "megatron.core.distributed.param_and_grad_buffer",
        "megatron.core.utils",
        "megatron.core.pipeline_parallel.schedules",
        "megatron.core.models.mimo.optimizer",  # MimoOptimizer's norm/found-inf/success buffers
    ):
        try:
            m = importlib.import_module(modname)
        except ImportError:  # pragma: no cover - optional module
            continue
        m.torch = proxy


def _tensor_methods(torch) -> None:
    # `.cuda()` calls (CLIPViT __init__, optimizer state reload) become identity on CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    # clip_grads asserts param.grad.type() == 'torch.cuda.FloatTensor' and the distributed optimizer accepts
    # only torch.cuda.* types: report CPU float tensors under their CUDA type name (no-arg call only).
    orig_type = torch.Tensor.type

    def _type(self, *a, **k):
        if a or k:
            return orig_type(self, *a, **k)
        t = orig_type(self)
        return t.replace("torch.", "torch.cuda.", 1) if t.startswith("torch.") and ".cuda." not in t else t

    torch.Tensor.type = _type


def _process_groups() -> None:
    # megatron-core's BridgeCommunicator asks for its broadcast subgroups and its leaders' bridge group with
    # backend='nccl' (this trainer does not use it, tests/trainer/test_core_mimo.py does): keep any nccl
    # request on gloo so it cannot fail without a GPU.
    orig_nsbe = dist.new_subgroups_by_enumeration
    orig_new_group = dist.new_group

    def _nsbe(ranks_per_subgroup_list, timeout=None, backend=None, pg_options=None, group_desc=None):
        return orig_nsbe(
            ranks_per_subgroup_list,
            timeout=timeout,
            backend="gloo" if backend == "nccl" else backend,
            pg_options=pg_options,
            group_desc=group_desc,
        )

    def _new_group(ranks=None, timeout=None, backend=None, *a, **k):
        return orig_new_group(ranks, timeout, "gloo" if backend == "nccl" else backend, *a, **k)

    dist.new_subgroups_by_enumeration = _nsbe
    dist.new_group = _new_group


def _pad_rows(t, n: int):
    """`t` with zero rows appended along dim 0 up to `n` rows."""
    return t if t.shape[0] == n else torch.cat([t, t.new_zeros((n - t.shape[0], *t.shape[1:]))])


def _uneven_collectives() -> None:
    """megatron-core's alltoall token dispatcher at expert-TP > 1 gathers and reduce-scatters splits of
    different sizes over the expert-TP group (tensor_parallel/mappings.py, output_split_sizes /
    input_split_sizes: each rank routes its own token count); gloo's all_gather wants equal sizes and gloo has
    no reduce_scatter. Uneven splits go through even collectives: padded to the largest split, then sliced
    (the reduce-scatter as an all-reduce of every rank's padded splits, of which each keeps its own)."""
    orig_all_gather, orig_reduce_scatter = dist.all_gather, dist.reduce_scatter

    def _all_gather(tensor_list, tensor, group=None, async_op=False):
        if async_op or all(t.shape == tensor.shape for t in tensor_list):
            return orig_all_gather(tensor_list, tensor, group=group, async_op=async_op)
        n = max(t.shape[0] for t in tensor_list)
        padded = [tensor.new_empty((n, *tensor.shape[1:])) for _ in tensor_list]
        orig_all_gather(padded, _pad_rows(tensor.contiguous(), n), group=group)
        for out, got in zip(tensor_list, padded):
            out.copy_(got[: out.shape[0]])
        return None

    def _reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if async_op or all(t.shape == output.shape for t in input_list):
            return orig_reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        n = max(t.shape[0] for t in input_list)
        stacked = torch.stack([_pad_rows(t, n) for t in input_list])
        dist.all_reduce(stacked, op=op, group=group)
        output.copy_(stacked[dist.get_rank(group)][: output.shape[0]])
        return None

    dist.all_gather, dist.reduce_scatter = _all_gather, _reduce_scatter


def _torch_optimizers() -> None:
    """megatron-core 0.19 chooses its optimizer classes when it is imported: Transformer Engine's FusedAdam and
    FusedSGD whenever TE imports (megatron/core/optimizer/__init__.py), built in get_megatron_optimizer; TE's
    constructor allocates on "cuda" and its kernels are CUDA-only. Put back the choice megatron makes without TE
    and apex, torch's AdamW and SGD, with the flags that decide the distributed optimizer's step bookkeeping
    (per-parameter "step" tensors for torch's Adam: megatron/core/optimizer/distrib_optimizer.py)."""
    import megatron.core.optimizer as mopt
    import megatron.core.optimizer.distrib_optimizer as mdist

    mopt.Adam, mopt.SGD, mopt.USING_PYTORCH_OPTIMIZER = torch.optim.AdamW, torch.optim.SGD, True
    mdist.Adam, mdist.HAVE_APEX_OR_TE = torch.optim.Adam, False
    mdist.USING_TE_OPTIMIZER = mdist.USING_APEX_OPTIMIZER = False
