"""One process (gloo world of 1): the checkpoint library on real megatron-core modules, scenario by scenario.
Run by test_checkpoint_library.py as `python ckpt_lib_worker.py OUT_DIR`; prints one JSON line of findings.

Modules: "language" = GPTModel + mcore DDP + distributed optimizer (Adam), dropout 0.1 (so the megatron RNG
tracker state matters); "encoder" = a second GPTModel, frozen (no optimizer) but with weights that differ
from any fresh init, so only a real restore brings them back.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


class CountingProvider:
    """A deterministic per-lane stream whose position is its whole state (like the trainer's providers)."""

    def __init__(self, seed: int):
        self.seed, self.pos = seed, 0

    def next(self):
        import torch

        g = torch.Generator().manual_seed(self.seed * 1000 + self.pos)
        self.pos += 1
        return torch.randint(0, 128, (2, 16), generator=g)

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, s):
        self.pos = int(s["pos"])


class FusedNormOf:
    """Stand-in for Transformer Engine's TELayerNormColumnParallelLinear naming: the norm before a linear
    computed with parameters the linear holds (`layer_norm_weight`, `layer_norm_bias`), so the layer's own
    norm slot holds none; the function is the local layer's."""

    def __new__(cls, norm, linear):
        import torch
        import torch.nn.functional as F

        class _Norm(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.shape, self.eps = norm.normalized_shape, norm.eps
                self._linear = [linear]  # not a child: its parameters are the linear's

            def forward(self, x):
                lin = self._linear[0]
                return F.layer_norm(x, self.shape, lin.layer_norm_weight, lin.layer_norm_bias, self.eps)

        linear.layer_norm_weight, linear.layer_norm_bias = norm.weight, norm.bias
        return _Norm()


def te_named(gpt) -> None:
    """Rename `gpt`'s norms as Transformer Engine's layers hold them (same function, other parameter names
    and optimizer order)."""
    for layer in gpt.decoder.layers:
        layer.input_layernorm = FusedNormOf(layer.input_layernorm, layer.self_attention.linear_qkv)
        layer.pre_mlp_layernorm = FusedNormOf(layer.pre_mlp_layernorm, layer.mlp.linear_fc1)


def fused_adam_class():
    """Stand-in for Transformer Engine's FusedAdam as megatron-core sees it: not a torch Adam, its step count
    kept in each param group (group["step"]), the update torch's Adam math."""
    import torch
    from torch.optim.adam import adam

    class FusedAdam(torch.optim.Optimizer):
        def __init__(self, params, lr, weight_decay, betas, eps, capturable=False, adam_w_mode=True):
            super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))
            self.adam_w_mode = adam_w_mode

        @torch.no_grad()
        def step(self, closure=None):
            for g in self.param_groups:
                ps = [p for p in g["params"] if p.grad is not None]
                if not ps:
                    continue
                st = [self.state[p] for p in ps]
                for p, s in zip(ps, st):
                    s.setdefault("exp_avg", torch.zeros_like(p))
                    s.setdefault("exp_avg_sq", torch.zeros_like(p))
                steps = [torch.tensor(float(g.get("step", 0))) for _ in ps]
                adam(
                    ps,
                    [p.grad for p in ps],
                    [s["exp_avg"] for s in st],
                    [s["exp_avg_sq"] for s in st],
                    [],
                    steps,
                    decoupled_weight_decay=self.adam_w_mode,
                    amsgrad=False,
                    beta1=g["betas"][0],
                    beta2=g["betas"][1],
                    lr=g["lr"],
                    weight_decay=g["weight_decay"],
                    eps=g["eps"],
                    maximize=False,
                )
                g["step"] = g.get("step", 0) + 1

    return FusedAdam


@contextlib.contextmanager
def optimizer_as_with_te():
    """megatron-core picks its Adam, and reads and writes the step, by module flags set at import from what
    is installed: set them as with Transformer Engine installed (the FusedAdam stand-in), then put them
    back."""
    import megatron.core.optimizer as mopt
    import megatron.core.optimizer.distrib_optimizer as mdist

    cls = fused_adam_class()
    want = {
        mopt: {"USING_PYTORCH_OPTIMIZER": False, "Adam": cls},
        mdist: {"HAVE_APEX_OR_TE": True, "USING_TE_OPTIMIZER": True, "Adam": cls},
    }
    saved = {m: {k: getattr(m, k) for k in kv} for m, kv in want.items()}
    for m, kv in want.items():
        for k, v in kv.items():
            setattr(m, k, v)
    try:
        yield cls
    finally:
        for m, kv in saved.items():
            for k, v in kv.items():
                setattr(m, k, v)


def build(seed: int, te_names: bool = False):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    g = HyperCommGrid([1, 1, 1, 1], ["tp", "cp", "dp", "pp"], backend="gloo")
    eg = HyperCommGrid([1, 1, 1, 1], ["tp", "ep", "dp", "pp"], backend="gloo")
    pgc = ProcessGroupCollection(
        tp=g.create_pg("tp"),
        cp=g.create_pg("cp"),
        dp=g.create_pg("dp"),
        pp=g.create_pg("pp"),
        tp_cp=g.create_pg(["tp", "cp"]),
        dp_cp=g.create_pg(["cp", "dp"]),
        mp=g.create_pg(["tp", "pp"]),
        tp_dp_cp=g.create_pg(["tp", "cp", "dp"]),
        intra_dist_opt=g.create_pg(["tp", "cp", "dp", "pp"]),
        expt_tp=eg.create_pg("tp"),
        ep=eg.create_pg("ep"),
        expt_dp=eg.create_pg("dp"),
        tp_ep=eg.create_pg(["tp", "ep"]),
        tp_ep_pp=eg.create_pg(["tp", "ep", "pp"]),
    )
    pgc.embd = pgc.pos_embd = pgc.pp
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        use_cpu_initialization=True,
        tensor_model_parallel_size=1,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=True,
        cross_entropy_fusion_impl="native",
    )

    def gpt():
        return GPTModel(
            config=cfg,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=128,
            max_sequence_length=16,
            position_embedding_type="rope",
            pg_collection=pgc,
        )

    lm = gpt()
    if te_names:
        te_named(lm)
    ddp = DistributedDataParallel(
        cfg,
        DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
        lm,
        pg_collection=pgc,
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=3e-3, use_distributed_optimizer=True, clip_grad=1.0),
        [ddp],
        use_gloo_process_groups=False,
        pg_collection=pgc,
    )
    enc = gpt()
    if te_names:
        te_named(enc)
    for p in enc.parameters():
        p.requires_grad_(False)
    return {"pgc": pgc, "ddp": ddp, "lm": lm, "opt": opt, "enc": enc}


def step(m, prov):
    import torch
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    ddp, opt = m["ddp"], m["opt"]
    ddp.zero_grad_buffer()
    opt.zero_grad()
    tok = prov.next()
    pos = torch.arange(16).unsqueeze(0).expand(2, 16)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril().logical_not()
    with torch.no_grad():
        h = m["enc"](tok, pos, mask).float().mean()  # the frozen module takes part in the loss
    loss = ddp(tok, pos, mask, labels=tok).mean() + 0.0 * h
    loss.backward()
    finalize_model_grads([ddp], pg_collection=m["pgc"])
    _ok, gn, _ = opt.step()
    return [loss.item(), float(gn), h.item()]


ONE = {"tp_rank": 0, "tp_size": 1}  # how a tensor of this one-rank world is cut: whole


def parts(m):
    from mimo_jobs.trainer.checkpoint.files import ModuleParts

    return [
        ModuleParts("encoder", m["enc"], None, m["pgc"].dp, m["pgc"].expt_dp, frozen=True, shard_args=ONE),
        ModuleParts("language", m["lm"], m["opt"], m["pgc"].dp, m["pgc"].expt_dp, shard_args=ONE),
    ]


def scramble_rng():
    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    random.seed(999)
    np.random.seed(999)
    torch.manual_seed(999)
    model_parallel_cuda_manual_seed(999, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)


def main(out: Path) -> dict:
    import torch
    import torch.distributed as dist

    import mimo_jobs.contract.manifest as MF
    import mimo_jobs.trainer.checkpoint.files as C
    from mimo_jobs.trainer.cuda_shims import install

    install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state._set_global_memory_buffer()
    layout = {
        "nodes": 1,
        "gpus_per_node": 1,
        "enc_tp": 1,
        "enc_pp": 1,
        "enc_dp": 1,
        "llm_tp": 1,
        "llm_pp": 1,
        "llm_dp": 1,
        "llm_ep": 1,
        "llm_etp": 1,
        "llm_cp": 1,
        "num_experts": 0,
        "gbs": 2,
        "mbs": 1,
    }
    prov0 = MF.Provenance(run_id="run-a", study="s", run_name="r", layout=layout, world=1, git_sha="abc")
    res: dict = {}
    ck = out / "ckpt"

    # 1. reference: 3 steps, save, 3 more steps (random extra state everywhere that must come back)
    m = build(seed=1)
    with torch.no_grad():
        for p in m["enc"].parameters():  # frozen weights no fresh init reproduces
            p.add_(0.5)
    prov = CountingProvider(seed=5)
    random.random()
    for _ in range(3):
        step(m, prov)
    path = C.save(
        ck,
        iteration=3,
        consumed_samples=6,
        modules=parts(m),
        provider=prov,
        provenance=prov0,
        keep=2,
        run_doc={"run": {"run_id": "run-a"}},
        extra={"note": "x"},
    )
    py_after_save = random.random()
    res["ref"] = [step(m, prov) for _ in range(3)]
    res["saved_path"] = str(path)
    res["files"] = sorted(MF.latest_checkpoint(ck).files)

    # 2. fresh process state (other init seed, scrambled RNGs, fresh provider), load, continue
    m2 = build(seed=2)
    scramble_rng()
    prov2 = CountingProvider(seed=5)
    r = C.load(ck, modules=parts(m2), provider=prov2, provenance=prov0)
    res["resumed"] = [r.iteration, r.consumed_samples, r.extra, prov2.pos]
    res["python_rng_restored"] = random.random() == py_after_save
    res["cont"] = [step(m2, prov2) for _ in range(3)]

    # 2b. the same checkpoint into layers named as Transformer Engine names them (fused norms) with its
    # FusedAdam (the step in the param groups): a same-layout resume that must take every tensor by its
    # canonical name, and continue exactly; then the way back, a checkpoint of those layers into local ones
    with optimizer_as_with_te():
        mt = build(seed=3, te_names=True)
        res["te_names"] = [n for n, _ in mt["lm"].named_parameters() if "norm" in n][:2]
        scramble_rng()
        provt = CountingProvider(seed=5)
        r = C.load(ck, modules=parts(mt), provider=provt, provenance=prov0)
        res["te_resumed"] = [r.iteration, r.consumed_samples, provt.pos]
        res["te_group_steps"] = sorted(
            {g.get("step") for g in mt["opt"].optimizer.param_groups if g["params"]}
        )
        res["te_cont"] = [step(mt, provt) for _ in range(3)]
        ck_te = out / "ckpt_te"
        C.save(
            ck_te,
            iteration=6,
            consumed_samples=12,
            modules=parts(mt),
            provider=provt,
            provenance=prov0,
            keep=1,
        )
        res["te_more"] = [step(mt, provt) for _ in range(2)]
    from mimo_jobs.trainer.checkpoint.reshard import SavedModule

    # what export and resharding look tensors up by: the local layers' names
    res["te_table_norms"] = sorted(
        n
        for n in SavedModule(MF.latest_checkpoint(ck_te), "language").pieces
        if "layers.0." in n and "norm" in n
    )
    res["te_manifest_layers"] = MF.latest_checkpoint(ck_te).layers
    res["local_manifest_layers"] = MF.latest_checkpoint(ck).layers
    m4 = build(seed=4)
    scramble_rng()
    prov4 = CountingProvider(seed=5)
    C.load(ck_te, modules=parts(m4), provider=prov4, provenance=prov0)
    res["local_from_te"] = [step(m4, prov4) for _ in range(2)]

    # 3. negative control: weights and data restored, optimizer/RNG NOT restored -> must differ
    m3 = build(seed=2)
    scramble_rng()
    d = Path(path)
    m3["lm"].load_state_dict(torch.load(d / "language/model-00000.pt", weights_only=False))
    m3["enc"].load_state_dict(torch.load(d / "encoder/model-00000.pt", weights_only=False))
    prov3 = CountingProvider(seed=5)
    prov3.pos = 3
    res["weights_only"] = [step(m3, prov3) for _ in range(3)]

    # 4. refusals: another run, another layout (checked before any state is touched)
    for key, prov_x in (
        ("other_run", MF.Provenance(**{**prov0.__dict__, "run_id": "run-b"})),
        ("other_layout", MF.Provenance(**{**prov0.__dict__, "layout": {**layout, "llm_tp": 2}})),
    ):
        try:
            C.load(ck, modules=parts(m2), provider=prov2, provenance=prov_x)
            res[key] = None
        except MF.CheckpointMismatch as e:
            res[key] = str(e)

    # 5. keep-K: saves at 4, 5, 6 with keep=2 leave 5 and 6; latest -> 6
    for it in (4, 5, 6):
        C.save(
            ck,
            iteration=it,
            consumed_samples=2 * it,
            modules=parts(m2),
            provider=prov2,
            provenance=prov0,
            keep=2,
        )
    res["kept"] = sorted(p.name for p in ck.iterdir())

    # 6. a damaged part is named, not silently loaded
    f = ck / "iter_0000006" / "language" / "optim-00000.pt"
    f.write_bytes(f.read_bytes()[:100])
    try:
        C.load(ck, modules=parts(m2), provider=prov2, provenance=prov0)
        res["damaged"] = None
    except MF.CheckpointError as e:
        res["damaged"] = str(e)
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    sys.stdout.flush()
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))), flush=True)
