"""Worker of the Megatron-checkpoint tests (one process, or one rank under torchrun).

    python megatron_worker.py SPEC_JSON

Phase "save": builds a GPT model with megatron-core directly, as Megatron-LM does (parallel_state's global
groups, megatron-core's local layer spec, a TransformerConfig written here from the tiny-swiglu preset's
numbers, not from the trainer), writes its logits on fixed tokens to DIR/reference_logits.pt and saves it
with dist_checkpointing in torch_dist format the way Megatron-LM lays it out: DIR/iter_0000010/ with the model
under "model" next to an optimizer tensor and Megatron-LM's common entries (its arguments as a Namespace),
and DIR/latest_checkpointed_iteration.txt. parallel_state is then torn down.

Phase "load": builds the trainer's LLM the way the trainer does (build._build_language with
trainer.init.llm: {megatron: DIR}, its own process groups) and prints `RESULT {"rel": ...}` (the relative
difference of its logits to the saved model's) from every rank that holds the output, or
`RESULT {"error": "..."}` when loading refuses the checkpoint.

SPEC: {"dir": D, "tp": 1, "per_layer": false, "phases": ["save", "load"], "llm": "tiny-swiglu"}
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


def save(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    tp = spec.get("tp", 1)
    parallel_state.destroy_global_memory_buffer()  # a previous spec's trainer set it up (_seed_megatron)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1234)
    # tiny-swiglu's LLM: SwiGLU, RMSNorm, QK-norm, GQA (2 groups), head_dim 16 != 32 / 4, rope base 1e6
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=64,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        use_cpu_initialization=True,
        init_method_std=0.2,  # large enough that every weight moves the logits
    )
    layer = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    gpt = GPTModel(cfg, layer, 128, SEQ, position_embedding_type="rope", rotary_base=1000000).eval()
    g = torch.Generator().manual_seed(5)  # the same on every TP rank: norms are replicated
    with torch.no_grad():  # norms start at ones: make them count too
        for name, p in gpt.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        tp_group = parallel_state.get_tensor_model_parallel_group()
        logits = _gather_tp(gpt(_tokens(), torch.arange(SEQ)[None].expand(2, -1), _causal_mask()), tp_group)
    d = spec["dir"]
    it = os.path.join(d, f"iter_{ITERATION:07d}")
    per_layer = spec.get("per_layer", False)
    md = {"non_homogeneous_layers": per_layer, "singleton_local_shards": False}
    model_sd = gpt.sharded_state_dict(metadata=md)
    # an optimizer tensor of the kind Megatron-LM saves next to the model: a weights-only load ignores it
    emb = model_sd["embedding.word_embeddings.weight"]
    moment = ShardedTensor.from_rank_offsets(
        "optimizer.state.exp_avg.embedding.word_embeddings.weight",
        torch.zeros_like(emb.data),
        (0, parallel_state.get_tensor_model_parallel_rank(), tp),
        replica_id=emb.replica_id,
    )
    state = {
        "model": model_sd,
        "optimizer": {"exp_avg": moment},
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
    from mimo_jobs.trainer.checkpoint.megatron_load import MegatronInitError

    tp = spec.get("tp", 1)
    world = dist.get_world_size()
    enc_s = G.ModuleShape(G.ENCODER, 0, tp, 1, world // tp)
    llm_s = G.ModuleShape(G.LANGUAGE, 0, tp, 1, world // tp, 1, 1)
    grids = G.build_grids(enc_s, llm_s, "gloo", datetime.timedelta(seconds=120))
    _seed_megatron(grids, 7)
    t = TrainerSpec(
        model={"encoder": "tiny", "llm": spec.get("llm", "tiny-swiglu")},
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
        out = gpt(
            input_ids=_tokens(),
            position_ids=torch.arange(SEQ)[None].expand(2, -1),
            attention_mask=_causal_mask(),
        )
        got = _gather_tp(out, pgc.tp)
    want = torch.load(os.path.join(spec["dir"], "reference_logits.pt"))
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
