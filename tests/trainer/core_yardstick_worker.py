"""The run of a run.yaml trained with megatron-core's own MIMO stack instead of the packaged trainer: core's
`MimoModel` in its documented non-colocated set-up (one `HyperCommGrid` per module: one encoder replica on
rank 0, the LLM's DP replicas after it; `MultiModulePipelineCommunicator` over core's `BridgeCommunicator`;
the multi-module 1F1B schedule `forward_backward_pipelining_without_interleaving`; megatron DDP per module;
`get_mimo_optimizer`), as megatron-core's own test of it sets it up
(tests/unit_tests/models/mimo/test_mimo_1f1b_schedule.py in Megatron-LM).

    torchrun --nproc-per-node 1+LLM_DP core_yardstick_worker.py RUN_YAML OUT_JSON

What is the same as the packaged trainer, so that the losses can be compared: the modules themselves (the
trainer's encoder — ViT, pixel shuffle, projector — and GPT, built and initialised by the trainer's own
functions, handed to MimoModel as prebuilt submodules), the data (the trainer's provider, every lane drawn on
every rank: the encoder replica embeds all lanes' images in lane order, each LLM replica trains on its lane),
the loss (per-token loss times the mask, summed, divided by the iteration's loss tokens N over every lane;
the schedule divides what loss_func returns by the microbatch count, so it returns sum * M / N; DDP sums over
DP, as the trainer's per-token-loss configs make it), Adam at the run's constant learning rate, no clipping.
Writes {"losses": [loss of each iteration]} from the first LLM rank.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mimo_jobs.trainer import cuda_shims  # noqa: E402

IMAGES, LANGUAGE = "images", "language"


class Given:
    """A ModuleSpec `module` that hands over a module built beforehand (megatron's build_module calls it)."""

    def __new__(cls, module=None, config=None, **_):
        return module


def grid(offset: int, dp: int):
    """One module's grid (TP = PP = 1) with every group core's optimizer reads, and its expert view."""
    from megatron.core.hyper_comm_grid import HyperCommGrid

    g = HyperCommGrid([1, 1, 1, dp], ["tp", "cp", "pp", "dp"], rank_offset=offset, backend="gloo")
    g.register_view("expert", [1, 1, 1, dp], ["expt_tp", "ep", "pp", "expt_dp"], shared_dims=["pp"])
    for dims in (["tp"], ["cp"], ["pp"], ["dp"], ["dp", "cp"], ["tp", "pp"], ["tp", "cp", "dp", "pp"]):
        g.create_pg(dims)
    for dims in (["expt_tp"], ["ep"], ["expt_dp"], ["expt_tp", "ep"], ["expt_tp", "ep", "pp"]):
        g.create_pg(dims, view="expert")
    return g


def pg_collection(g):
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not g.is_current_rank_in_grid():
        return None
    pgc = ProcessGroupCollection(
        tp=g.get_pg("tp"),
        cp=g.get_pg("cp"),
        pp=g.get_pg("pp"),
        dp=g.get_pg("dp"),
        dp_cp=g.get_pg(["dp", "cp"]),
        mp=g.get_pg(["tp", "pp"]),
        tp_cp=g.get_pg("tp"),
        tp_dp_cp=g.get_pg(["tp", "cp", "dp", "pp"]),
        intra_dist_opt=g.get_pg(["tp", "cp", "dp", "pp"]),
        expt_tp=g.get_pg("expt_tp", view="expert"),
        ep=g.get_pg("ep", view="expert"),
        expt_dp=g.get_pg("expt_dp", view="expert"),
        tp_ep=g.get_pg(["expt_tp", "ep"], view="expert"),
        tp_ep_pp=g.get_pg(["expt_tp", "ep", "pp"], view="expert"),
    )
    pgc.embd = pgc.pos_embd = pgc.pp
    return pgc


def build(run, rank: int, image_token_id: int):
    """(MimoModel with DDP-wrapped submodules, grids, this rank's pgc): the trainer's modules inside."""
    from megatron.core.models.mimo.config.base_configs import MimoModelConfig
    from megatron.core.models.mimo.model.base import MimoModel
    from megatron.core.models.mimo.submodules.vision import VisionModalitySubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.trainer import build as B
    from mimo_jobs.trainer.model import models as M
    from mimo_jobs.trainer.model.kernels import installed, kernels_for

    t = run.trainer
    preset = arch_of(t.model)
    prec = M.Precision(use_gpu=False, bf16=False, kernels=kernels_for(False, installed(), t.attention))
    lay = run.layout
    enc_grid, llm_grid = grid(0, lay.single.dp), grid(lay.single.dp, lay.llm_dp)
    pgc = pg_collection(enc_grid) or pg_collection(llm_grid)
    llm_cfg = M.llm_config(preset, 1, 1, 1, prec, "none", 1)
    llm_cfg.variable_seq_lengths = True  # the multi-module schedule exchanges shapes every microbatch
    vit_cfg, proj_cfg = M.encoder_configs(preset, 1, prec, "none")
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    model_parallel_cuda_manual_seed(t.seed, tp_rank=0, ep_rank=0, etp_rank=0, force_reset_rng=True)
    cut = {"tp_rank": 0, "tp_size": 1}
    enc = gpt = None
    if rank < lay.single.dp:
        enc = M.build_encoder(preset, vit_cfg, proj_cfg, pgc, prec)
        M.canonical_init_(enc, t.seed, "encoder", **cut)
    else:
        gpt = M.build_llm(preset, llm_cfg, pgc, prec, t.seq_length, True, True, 0)
        gpt.embedding.word_embeddings.reduce_scatter_embeddings = False
        lm_cut = dict(cut, etp_rank=0, etp_size=1, ep_rank=0, num_local_experts=0, layer_offset=0)
        M.canonical_init_(gpt, t.seed, "language", **lm_cut)
    vision = ModuleSpec(
        module=VisionModalitySubmodules,
        params={"pg_collection": pgc if enc is not None else None},
        submodules={"encoders": {"ours": ModuleSpec(module=Given, params={"module": enc})}},
    )
    language = ModuleSpec(module=Given, params={"config": llm_cfg, "module": gpt})
    cfg = MimoModelConfig(
        language_model_spec=language,
        modality_submodules_spec={IMAGES: vision},
        special_token_ids={IMAGES: image_token_id},
        module_to_grid_map={IMAGES: enc_grid, LANGUAGE: llm_grid},
    )
    model = MimoModel(cfg)
    if enc is not None:
        model.modality_submodules[IMAGES] = B._ddp(model.modality_submodules[IMAGES], vit_cfg, pgc, t)
    else:
        model.language_model = B._ddp(model.language_model, llm_cfg, pgc, t)
    return model, {IMAGES: enc_grid, LANGUAGE: llm_grid}, pgc


def iteration_batches(provider, lanes: int, microbatches: int) -> tuple[list, float]:
    """The iteration's microbatches, each {lane: LaneBatch} over every lane, and N, their loss tokens."""
    batches = [{lane: provider.next(lane) for lane in range(lanes)} for _ in range(microbatches)]
    return batches, float(sum(b.loss_mask.sum() for mb in batches for b in mb.values()))


def as_core_batch(mb: dict, lane: int | None, image_token_id: int) -> dict:
    """A microbatch as MimoModel.forward's arguments: the encoder replica gets every lane's samples in lane
    order (their tokens say where its images go), an LLM replica (`lane`) the text of its own lane."""
    from mimo_jobs.data.batch import flatten

    if lane is None:
        tokens = torch.cat([mb[k].tokens for k in sorted(mb)])
        images = flatten([im for k in sorted(mb) for im in mb[k].items("vision")])
        return {
            "input_ids": tokens,
            "modality_inputs": {IMAGES: {"ours": {"images": images}}} if images else None,
        }
    b = mb[lane]
    s = b.tokens.shape[1]
    return {
        "input_ids": b.tokens,
        "position_ids": b.position_ids,
        "attention_mask": torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1),
        "labels": b.labels.clamp(min=0),
        "loss_mask": b.loss_mask,
    }


def train(run, rank: int) -> list[float]:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.mimo.optimizer import get_mimo_optimizer
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.multimodule_communicator import MultiModulePipelineCommunicator
    from megatron.core.process_groups_config import MultiModuleProcessGroupCollection

    from mimo_jobs.data.mock import make_provider

    t, plan, lay = run.trainer, run.rank_layout(), run.layout
    on_encoder = rank < lay.single.dp
    lane = None if on_encoder else rank - lay.single.dp
    lanes = list(range(lay.llm_dp))
    provider = make_provider(run, plan, lanes, need_images=on_encoder, need_text=True)
    model, grids, pgc = build(run, rank, provider.placeholders["vision"])
    own = model.modality_submodules[IMAGES] if on_encoder else model.language_model

    @contextmanager
    def no_sync():
        with ExitStack() as stack:
            stack.enter_context(own.no_sync())
            yield

    model.config.no_sync_func = no_sync
    model.config.finalize_model_grads_func = lambda *a, **k: finalize_model_grads([own], pg_collection=pgc)
    model.config.grad_scale_func = lambda loss: loss
    o = t.optimizer
    opt = get_mimo_optimizer(
        model,
        OptimizerConfig(
            optimizer=o.name,
            lr=t.lr.max,
            weight_decay=o.weight_decay,
            adam_beta1=o.beta1,
            adam_beta2=o.beta2,
            adam_eps=o.eps,
            clip_grad=0.0,
            bf16=False,
            params_dtype=torch.float32,
            use_distributed_optimizer=t.use_distributed_optimizer,
        ),
    )
    comm = MultiModulePipelineCommunicator(
        grids,
        {IMAGES: [LANGUAGE], LANGUAGE: []},
        model.config,
        dim_mapping={"s": 0, "h": 2, "b": 1},
        module_output_ndim={IMAGES: 2},
    )
    name = IMAGES if on_encoder else LANGUAGE
    pgs = MultiModuleProcessGroupCollection(
        module_pgs={name: pgc}, language_model_module_name=None if on_encoder else LANGUAGE
    )
    m = plan.num_microbatches

    def iteration(batches: list, n_tokens: float) -> float:
        sums = []

        def step(data_iterator, model):
            mb = next(data_iterator)
            out, _mask = model(**as_core_batch(mb, lane, provider.placeholders["vision"]))

            def loss_func(output):
                s = (output.float() * mb[lane].loss_mask).sum()
                sums.append(float(s.detach()))
                return s * m / n_tokens, {}

            return out, loss_func

        own.zero_grad_buffer()
        opt.zero_grad()
        schedules.forward_backward_pipelining_without_interleaving(
            forward_step_func=step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=m,
            seq_length=t.seq_length,
            micro_batch_size=run.layout.mbs,
            forward_only=False,
            p2p_communicator=comm,
            pg_collection=pgs,
        )
        ok, _norm, _ = opt.step()
        assert ok, "core's optimizer step failed"
        total = torch.tensor([sum(sums)], dtype=torch.float64)
        if not on_encoder:  # every lane's loss sum: the iteration's loss over N
            dist.all_reduce(total, group=pgc.dp)
        return float(total) / n_tokens

    return [iteration(*iteration_batches(provider, len(lanes), m)) for _ in range(t.train_iters)]


def main() -> None:
    from mimo_jobs.study.runspec import load_run_yaml

    run_yaml, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    cuda_shims.install()
    rank = dist.get_rank()
    run, _ = load_run_yaml(run_yaml)
    lay = run.layout
    assert (lay.single.tp, lay.single.dp, lay.llm_tp, lay.llm_pp) == (1, 1, 1, 1), (
        "one encoder replica, LLM DP only"
    )
    losses = train(run, rank)
    if rank == lay.single.dp:
        out.write_text(json.dumps({"losses": losses}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
