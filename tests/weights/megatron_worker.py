"""Worker of the Megatron-checkpoint tests (one process, or one rank under torchrun).

    python megatron_worker.py SPEC_JSON

Phase "save": builds a GPT model with megatron-core directly, as Megatron-LM does (parallel_state's global
groups, megatron-core's local layer spec, a TransformerConfig written here from the tiny-swiglu or tiny-moe
preset's numbers, not from the trainer, Megatron-LM's vocabulary padding to 128 x TP rows), writes its
logits on fixed tokens to DIR/reference_logits.pt (the pipeline's stages hand their hidden states on) and
saves it with dist_checkpointing in torch_dist format the way Megatron-LM lays it out: DIR/iter_0000010/
with the model under "model" next to an optimizer tensor and Megatron-LM's common entries (its arguments as
a Namespace), and DIR/latest_checkpointed_iteration.txt. parallel_state is then torn down.

Phase "load": builds the trainer's LLM the way the trainer does (build._build_language with
trainer.init.llm: {megatron: DIR}, its own process groups) and prints `RESULT {"rel": ...}` (the relative
difference of its logits over the real vocabulary to the saved model's) from every rank that holds the
output, or `RESULT {"error": "..."}` when loading refuses the checkpoint.

SPEC: {"dir": D, "model": "tiny-swiglu" | "tiny-moe", "tp": 1, "pp": 1, "ep": 1, "per_layer": false,
       "phases": ["save", "load"], "llm": <the loading model; default: "model">, "load_dir": <default D>}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

SEQ = 16
ITERATION = 10


def _init_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(WORLD_SIZE="1", RANK="0")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")


def _tokens():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 128, (2, SEQ), generator=g)


def _causal_mask():
    import torch

    return torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)


def _gather_tp(out, group):
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    if n == 1:
        return out
    parts = [torch.empty_like(out) for _ in range(n)]
    dist.all_gather(parts, out.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def megatron_lm_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron-LM's padded vocabulary (its --make-vocab-size-divisible-by 128, times TP): the rows it
    saves, more than the trainer's own padding at TP > 1."""
    m = multiple * tp
    return -(-vocab // m) * m


def _config(spec: dict):
    """The saving model's TransformerConfig and layer spec, written here from the preset's numbers."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    tp, pp, ep = spec.get("tp", 1), spec.get("pp", 1), spec.get("ep", 1)
    common = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=False,
        add_qkv_bias=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        init_method_std=0.2,  # large enough that every weight moves the logits
    )
    if spec.get("model", "tiny-swiglu") == "tiny-moe":
        # tiny-moe's LLM: 4 experts of width 64, top-2 softmax router, GELU, LayerNorm, no biases
        cfg = TransformerConfig(
            **common,
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=64,
            expert_model_parallel_size=ep,
            moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="aux_loss",
        )
        return cfg, get_gpt_layer_local_spec(num_experts=4), 10000
    # tiny-swiglu's LLM: SwiGLU, RMSNorm, QK-norm, GQA (2 groups), head_dim 16 != 32 / 4, rope base 1e6
    cfg = TransformerConfig(
        **common,
        num_query_groups=2,
        kv_channels=16,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
    )
    return cfg, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"), 1000000


def _forward(gpt, pp_group, first: bool, last: bool):
    """The logits of a pipeline stage's model on the fixed tokens (None before the last stage): each
    stage hands its hidden states to the next one's input, as Megatron's pipeline schedule does."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(pp_group)
    me = ranks.index(dist.get_rank())
    if not first:
        h = torch.empty(SEQ, 2, 32)
        dist.recv(h, src=ranks[me - 1])
        gpt.set_input_tensor(h)
    out = gpt(_tokens() if first else None, torch.arange(SEQ)[None].expand(2, -1), _causal_mask())
    if not last:
        dist.send(out.contiguous(), dst=ranks[me + 1])
        return None
    return out


def _one(value):
    """The one value (the logits) that some ranks hold, on every rank."""
    import torch.distributed as dist

    parts = [value]
    if dist.get_world_size() > 1:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, value)
    return next(p for p in parts if p is not None)


def save(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    tp, pp, ep = spec.get("tp", 1), spec.get("pp", 1), spec.get("ep", 1)
    parallel_state.destroy_global_memory_buffer()  # a previous spec's trainer set it up (_seed_megatron)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    torch.manual_seed(1234)  # the same replicated weights on every rank
    model_parallel_cuda_manual_seed(1234)
    cfg, layer, rope_base = _config(spec)
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    vocab = megatron_lm_vocab(128, tp)
    gpt = GPTModel(
        cfg,
        layer,
        vocab,
        SEQ,
        pre_process=first,
        post_process=last,
        position_embedding_type="rope",
        rotary_base=rope_base,
    ).eval()
    g = torch.Generator().manual_seed(5)  # the same on every TP rank: norms are replicated
    with torch.no_grad():  # norms start at ones: make them count too
        for name, p in gpt.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        out = _forward(gpt, parallel_state.get_pipeline_model_parallel_group(), first, last)
        tp_group = parallel_state.get_tensor_model_parallel_group()
        logits = _one(None if out is None else _gather_tp(out, tp_group))
    d = spec["dir"]
    it = os.path.join(d, f"iter_{ITERATION:07d}")
    per_layer = spec.get("per_layer", False)
    md = {"non_homogeneous_layers": per_layer, "singleton_local_shards": False}
    model_sd = gpt.sharded_state_dict(metadata=md)
    # an optimizer tensor of the kind Megatron-LM saves next to the model (on the last stage, which holds
    # the final norm): a weights-only load ignores it
    optimizer = {}
    if last:
        norm = model_sd["decoder.final_layernorm.weight"]
        optimizer["exp_avg"] = ShardedTensor.from_rank_offsets(
            "optimizer.state.exp_avg.decoder.final_layernorm.weight",
            torch.zeros_like(norm.data),
            replica_id=norm.replica_id,
        )
    state = {
        "model": model_sd,
        "optimizer": optimizer,
        "args": argparse.Namespace(tensor_model_parallel_size=tp, num_layers=2, hidden_size=32),
        "checkpoint_version": 3.0,
        "iteration": ITERATION,
    }
    if dist.get_rank() == 0:
        os.makedirs(it, exist_ok=True)
        torch.save(logits, os.path.join(d, "reference_logits.pt"))
    dist.barrier()
    dist_checkpointing.save(state, it, content_metadata=md if per_layer else None)
    if dist.get_rank() == 0:
        with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
    dist.barrier()
    parallel_state.destroy_model_parallel()


def load(spec: dict) -> dict | None:
    import torch
    import torch.distributed as dist

    import mimo_jobs.trainer.model.models as M
    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.spec import TrainerSpec
    from mimo_jobs.trainer.build import _build_language, _seed_megatron
    from mimo_jobs.trainer.weights.megatron_load import MegatronInitError

    tp, pp, ep = spec.get("tp", 1), spec.get("pp", 1), spec.get("ep", 1)
    world = dist.get_world_size()
    enc_s = G.ModuleShape(G.ENCODER, 0, tp, 1, world // tp)
    llm_s = G.ModuleShape(G.LANGUAGE, 0, tp, pp, world // (tp * pp), ep, 1)
    grids = G.build_grids({"vision": enc_s}, llm_s, "gloo", datetime.timedelta(seconds=120))
    _seed_megatron(grids, 7)
    t = TrainerSpec(
        model={"encoder": "tiny", "llm": spec.get("llm", spec.get("model", "tiny-swiglu"))},
        seq_length=SEQ,
        train_iters=1,
        seed=7,
        init={"llm": {"megatron": spec.get("load_dir", spec["dir"])}},
        freeze={"encoder": True, "llm": True},
    )
    arch = arch_of(t.model)
    pgc = grids.language.pgc
    try:
        mod = _build_language(arch, t, pgc, llm_s, M.Precision(use_gpu=False, bf16=False), grids.role)
    except MegatronInitError as e:
        return {"error": e.describe()}
    gpt = mod.core.eval()
    with torch.no_grad():
        out = _forward(gpt, pgc.pp, grids.role.is_first_stage, grids.role.is_last_stage)
    if out is None:
        return None
    got = _gather_tp(out, pgc.tp)
    # the saving model's logits over the real vocabulary: Megatron-LM pads it further than the trainer
    want = torch.load(os.path.join(spec["dir"], "reference_logits.pt"))[..., : arch.llm.vocab_size]
    got = got[..., : arch.llm.vocab_size]
    rel = float((got - want).abs().max() / want.abs().max())
    return {"rel": rel, "shape": list(got.shape), "std": float(want.std())}


def _exit(code: int) -> None:
    """os._exit, after ending the multiprocessing manager dist_checkpointing's save started (it would
    outlive this process and hold the test's output pipe open)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    os._exit(code)


def main(path: str) -> None:
    import torch.distributed as dist

    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    _init_world()
    specs = json.loads(open(path).read())
    for spec in specs if isinstance(specs, list) else [specs]:
        try:
            res = None
            if "save" in spec.get("phases", ["save", "load"]):
                save(spec)
            if "load" in spec.get("phases", ["save", "load"]):
                res = load(spec)
        except Exception as e:  # noqa: BLE001 - the test reads the line
            import traceback

            traceback.print_exc()
            print(f"ERROR {type(e).__name__}: {e}", flush=True)
            _exit(3)
        # one writer: the ranks' lines would interleave on the shared output
        parts = [res]
        if dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, res)
        for r in parts if dist.get_rank() == 0 else []:
            if r is not None:
                print("RESULT " + json.dumps(r | {"dir": spec["dir"]}), flush=True)
    _exit(0)


if __name__ == "__main__":  # dist_checkpointing's save starts a spawned helper process, which imports this
    main(sys.argv[1])
