"""Worker of the HF-loading tests (one process, or one rank under torchrun): builds the trainer's module the
way the trainer does (build._build_language / _build_encoder with trainer.init naming the HF directory),
runs a forward pass and compares it with transformers' own model loaded from the same directory.

    python hf_worker.py SPEC_JSON     prints `RESULT {...}` per rank that holds the output
SPEC: {"side": "llm"|"encoder", "dir": HF directory, "tp": 1, "pp": 1, "ep": 1, "seq": 16}, or a list of
them (one process runs each in turn); an encoder's "image_size" trains it at another size than its weights'
(transformers then runs with interpolate_pos_encoding, and the result holds how far the loaded position
table is from transformers' own interpolation)
"""

from __future__ import annotations

import datetime
import json
import os
import sys

SEED = 7


def _grids(tp: int, pp: int, ep: int):
    import torch.distributed as dist

    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.trainer.build import _seed_megatron

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update(WORLD_SIZE="1", RANK="0")
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group("gloo")
    world = dist.get_world_size()
    dp = world // (tp * pp)
    enc_s = G.ModuleShape(G.ENCODER, 0, tp, 1, world // tp)
    llm_s = G.ModuleShape(G.LANGUAGE, 0, tp, pp, dp, ep, 1)
    grids = G.build_grids({"vision": enc_s}, llm_s, "gloo", datetime.timedelta(seconds=120))
    _seed_megatron(grids, SEED)
    return grids, enc_s, llm_s


def _trainer_spec(spec: dict):
    from mimo_jobs.study.spec import TrainerSpec

    side = spec["side"]
    cfg = os.path.join(spec["dir"], "config.json")
    model = {"encoder": "tiny" if side == "llm" else {"hf_config": cfg}, "llm": "tiny"}
    if spec.get("image_size"):
        model["encoder"]["image_size"] = spec["image_size"]
    if side == "llm":
        model["llm"] = {"hf_config": cfg}
    return TrainerSpec(
        model=model,
        seq_length=max(8, spec.get("seq", 16)),
        train_iters=1,
        seed=SEED,
        init={side: spec["dir"]},
        freeze={"encoder": side == "encoder", "llm": side == "llm"},
    )


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def run_llm(spec: dict) -> dict | None:
    import torch
    import torch.distributed as dist
    import transformers

    import mimo_jobs.trainer.model.models as M
    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.trainer.build import _build_language
    from mimo_jobs.trainer.step.common import _causal_mask

    tp, pp, ep, seq = spec.get("tp", 1), spec.get("pp", 1), spec.get("ep", 1), spec.get("seq", 16)
    grids, _, llm_s = _grids(tp, pp, ep)
    t = _trainer_spec(spec)
    arch = arch_of(t.model)
    prec = M.Precision(use_gpu=False, bf16=False)
    pgc = grids.language.pgc
    mod = _build_language(arch, t, pgc, llm_s, prec, grids.role)
    gpt = mod.core.eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, arch.llm.vocab_size, (2, seq), generator=g)
    pos = torch.arange(seq)[None].expand(2, -1)
    mask = _causal_mask(seq, "cpu")
    with torch.no_grad():
        if pp > 1 and not grids.role.is_first_stage:
            hidden = torch.empty(seq, 2, arch.llm.hidden_size)
            dist.recv(hidden, src=G.ModuleShape.rank_of(llm_s, grids.role.tp_rank, pgc.pp.rank() - 1, 0))
            gpt.set_input_tensor(hidden)
        out = gpt(input_ids=tokens, position_ids=pos, attention_mask=mask)
        if not grids.role.is_last_stage:
            dist.send(out.contiguous(), dst=llm_s.rank_of(grids.role.tp_rank, pgc.pp.rank() + 1, 0))
            return None
        if tp > 1:
            parts = [torch.empty_like(out) for _ in range(tp)]
            dist.all_gather(parts, out.contiguous(), group=pgc.tp)
            out = torch.cat(parts, dim=-1)
        got = out[..., : arch.llm.vocab_size]
        hf = transformers.AutoModelForCausalLM.from_pretrained(spec["dir"], dtype=torch.float32).eval()
        want = hf(input_ids=tokens).logits
    from mimo_jobs.model.hf import llm_layout

    fam = json.loads(open(os.path.join(spec["dir"], "config.json")).read())["model_type"]
    layout = llm_layout(arch.llm, fam, tp)
    res = {"rel": _rel(got, want), "shape": list(got.shape), "padded": out.shape[-1]}
    return res | {"split_disagrees": _split_disagreements(gpt, layout, mod.shard_args)}


def _split_disagreements(module, layout, cut: dict) -> list[str]:
    """Parameters whose sharding (megatron-core's attributes) differs from what hf_weights restates."""
    from mimo_jobs.trainer.model.models import param_shards

    bad = []
    for name, p, sh in param_shards(module, **cut):
        t = layout.targets.get(sh.cname)
        if t is None:
            continue
        split = p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
        have = (split, getattr(p, "partition_stride", 1), sh.expert)
        if (t.split, t.parts, t.expert) != have:
            bad.append(f"{name}: {(t.split, t.parts, t.expert)} vs {have}")
    return bad


def run_encoder(spec: dict) -> dict:
    import torch
    import transformers

    import mimo_jobs.trainer.model.models as M
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.trainer.build import _build_encoder

    tp = spec.get("tp", 1)
    grids, enc_s, _ = _grids(tp, 1, 1)
    t = _trainer_spec(spec)
    arch = arch_of(t.model)
    prec = M.Precision(use_gpu=False, bf16=False)
    mod = _build_encoder("vision", arch, t, grids.encoders["vision"].pgc, enc_s, prec)
    enc = mod.core.eval()
    e = arch.encoder
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, e.channels, e.image_size, e.image_size, generator=g)
    hf = transformers.AutoModel.from_pretrained(spec["dir"], dtype=torch.float32).eval()
    other_size = bool(spec.get("image_size"))
    with torch.no_grad():
        got = enc.vit(x)
        want = hf(pixel_values=x, interpolate_pos_encoding=other_size).last_hidden_state
        if (
            e.kind == "clip"
        ):  # CLIP's last_hidden_state is before post_layernorm; the trainer's ViT ends with it
            post = next(m for n, m in hf.named_modules() if n.endswith("post_layernorm"))
            want = post(want)
    from mimo_jobs.model.hf import encoder_layout
    from mimo_jobs.model.hf_weights import HFLayout, projector_layout

    both = [encoder_layout(e), projector_layout(e, arch.llm.hidden_size)]
    layout = HFLayout({k: v for lay in both for k, v in lay.targets.items()}, {}, "")
    res = {"rel": _rel(got, want), "shape": list(got.shape)}
    if other_size:
        res["positions_max_abs"] = _positions_gap(enc.vit, hf, e)
    return res | {"split_disagrees": _split_disagreements(enc, layout, mod.shard_args)}


def _positions_gap(vit, hf, e) -> float:
    """Largest |difference| between the loaded ViT's position table (class row first for CLIP) and
    transformers' interpolate_pos_encoding of the same weights at e.image_size."""
    import torch

    emb = next(  # CLIP's and SigLIP's position_embedding module, InternViT's position_embeddings table
        m
        for n, m in hf.named_modules()
        if n.endswith("embeddings")
        and (hasattr(m, "position_embedding") or hasattr(m, "position_embeddings"))
    )
    n = e.grid**2 + int(e.class_token)
    with torch.no_grad():
        want = emb.interpolate_pos_encoding(torch.zeros(1, n, e.hidden_size), e.image_size, e.image_size)[0]
        got = vit.position_embeddings[0]
        if e.class_token:
            got = torch.cat([vit.class_position, got])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    return float((got - want).abs().max())


def main(path: str) -> None:
    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    specs = json.loads(open(path).read())
    for spec in specs if isinstance(specs, list) else [specs]:
        try:
            res = run_llm(spec) if spec["side"] == "llm" else run_encoder(spec)
        except Exception as e:  # noqa: BLE001 - the test reads the line
            import traceback

            traceback.print_exc()
            print(f"ERROR {type(e).__name__}: {e}", flush=True)
            os._exit(3)
        if res is not None:
            print("RESULT " + json.dumps(res | {"dir": spec["dir"]}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
