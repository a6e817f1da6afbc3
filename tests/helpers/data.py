"""Helpers for the data tests: run specs for an energon study point, and a role runner used as a separate
process (`python -m helpers.data '<json>'`), so each simulated rank builds its loaders in its own process."""

from __future__ import annotations

import json
import sys


def run_spec(
    path,
    *,
    gpus_per_node: int,
    enc_dp: int,
    llm_dp: int,
    mbs: int,
    gbs: int,
    seq_length: int = 64,
    num_workers: int = 0,
    seed: int = 1234,
    model: str = "tiny",
    **data,
):
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study

    doc = {
        "name": "datatest",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": gpus_per_node},
        "trainer": {
            "model": model,
            "seq_length": seq_length,
            "train_iters": 4,
            "seed": seed,
            "data": {"provider": "energon", "path": str(path), "num_workers": num_workers, **data},
        },
        "matrix": {
            "points": [{"nodes": 1, "encoder": {"dp": enc_dp}, "llm": {"dp": llm_dp}, "gbs": gbs, "mbs": mbs}]
        },
    }
    (spec,) = runs_of(parse_study(doc, env={}))
    return spec


def draw(provider, lanes, n):
    """n microbatches per lane (lanes interleaved as the trainer does) -> {lane: [record per microbatch]}."""
    out = {lane: [] for lane in lanes}
    for _ in range(n):
        for lane in lanes:
            b = provider.next(lane)
            out[lane].append(
                {
                    "keys": b.sample_keys,
                    "counts": b.counts("vision"),
                    "tokens": b.tokens.tolist(),
                    "labels": b.labels.tolist(),
                    "loss_mask": b.loss_mask.tolist(),
                    "images": None
                    if b.inputs["vision"].items is None
                    else [None if im is None else list(im.shape) for im in b.inputs["vision"].items],
                    "events": b.meta["events"],
                    "step": b.step,
                    "microbatch": b.microbatch,
                }
            )
    return out


def role_main(req: dict) -> dict:
    """Build the provider a rank with this role builds (lanes from the topology plan) and draw from it."""
    from mimo_jobs.data.energon_provider import make_energon_provider

    spec = run_spec(**req["spec"])
    plan = spec.rank_layout()
    role, rank = req["role"], req.get("rank", 0)
    image_slice = None
    if role == "llm":
        lanes, need_images = [rank], False
    elif role == "encoder":
        lanes, need_images = plan.lanes_of_encoder(rank), True
        if plan.fan == "in":  # this replica embeds its share of the lane's microbatch
            s = plan.samples_per_encoder_microbatch
            j = rank % plan.encoders_per_lane
            image_slice = (j * s, (j + 1) * s)
    else:
        lanes, need_images = list(range(plan.layout.llm_dp)), True
    prov = make_energon_provider(spec, plan, lanes, need_images, True, image_slice=image_slice)
    try:
        return {"lanes": lanes, "draw": draw(prov, lanes, req["n"])}
    finally:
        prov.close()


if __name__ == "__main__":
    res = role_main(json.loads(sys.argv[1]))
    sys.stdout.write("\n@@RESULT@@" + json.dumps(res) + "\n")
