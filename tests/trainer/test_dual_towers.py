"""Two encoder modules of one input kind: a CLIP-style tower (patch 4, a temporal patch of 2 frames) and a
SigLIP-style tower (patch 8) both embed every picture, each into placeholders of its own (the batch contract
keys inputs and placeholders by module), as dual-encoder VLMs do. Half the pictures are videos of 3 or 4
frames, which each tower embeds by its own token rule (tests/trainer/test_video.py holds the video rule
itself). Colocated and with each tower on ranks of its own, exact against the one-process reference; and the
second tower's embeddings reach the loss."""

import json

import pytest

from helpers.trainer import make_run_yaml
from mimo_jobs.contract.memory import facts_path
from mimo_jobs.data.mock import MockProvider, mock_config
from mimo_jobs.study.runspec import load_run_yaml

RTOL = 1e-5
DUAL = {
    "name": "tiny-dual",
    "encoders": {
        "vision": {"preset": "tiny", "temporal_patch_size": 2},
        "siglip": {"preset": "tiny", "kind": "siglip", "patch_size": 8, "num_layers": 1},
    },
    "llm": "tiny",
}
DATA = {"text_only_fraction": 0.25, "image_sizes": [8, 16], "video_fraction": 0.5, "video_frames": [3, 4]}
LAYOUTS = {
    "colocated-dp2": ({"gpn": 2, "llm": {"dp": 2}, "colocated": True}, 2),
    "own-ranks": ({"gpn": 3, "enc": {"vision": {"dp": 1}, "siglip": {"dp": 1}}, "llm": {"dp": 1}}, 3),
}


def _run_yaml(tmp_path, kw: dict, **extra):
    trainer = {"seq_length": 64, **extra.pop("trainer", {})}
    return make_run_yaml(tmp_path, gbs=4, model=DUAL, data=DATA, trainer=trainer, **kw, **extra)


def _tower_tokens(ry) -> dict[str, int]:
    """Each tower's placeholders over the run's 3 iterations, drawn from the mock provider itself."""
    run, _ = load_run_yaml(ry)
    plan = run.rank_layout()
    lanes = list(range(plan.layout.llm_dp))
    prov = MockProvider(mock_config(run, plan), lanes, need_images=False, need_text=True)
    out = {"vision": 0, "siglip": 0}
    for _ in range(3 * plan.num_microbatches):
        for lane in lanes:
            b = prov.next(lane)
            for name in out:
                out[name] += sum(b.counts(name))
            assert b.inputs["vision"].token_id != b.inputs["siglip"].token_id
    return out


def test_each_tower_has_its_own_placeholders_and_token_rule(tmp_path):
    kw, _ = LAYOUTS["colocated-dp2"]
    run, _ = load_run_yaml(_run_yaml(tmp_path / "run", kw))
    plan = run.rank_layout()
    prov = MockProvider(mock_config(run, plan), [0], need_images=True, need_text=True)
    seen = set()
    for _ in range(24):
        b = prov.next(0)
        for i, image in enumerate(b.items("vision")):
            side = 0 if image is None else image.shape[-1]
            frames = image.shape[1] if image is not None and image.dim() == 5 else 1
            # the CLIP tower's patch 4 over 2-frame groups and the SigLIP tower's patch 8 over single frames,
            # over the same picture
            assert b.counts("vision")[i] == -(-frames // 2) * (side // 4) ** 2
            assert b.counts("siglip")[i] == frames * (side // 8) ** 2
            assert b.items("siglip")[i] is image  # the same picture reaches both towers
            for name in ("vision", "siglip"):
                assert int((b.tokens[i] == b.inputs[name].token_id).sum()) == b.counts(name)[i]
            seen.add((side, frames))
    assert {0, 8, 16} == {side for side, _ in seen} and {1, 3, 4} <= {f for _, f in seen}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dual_towers_match_the_reference(shared_runs, tmp_path, layout):
    kw, nproc = LAYOUTS[layout]
    ry = _run_yaml(tmp_path / "run", kw)
    r = shared_runs.reference(ry).ok("reference").iterations()
    p = shared_runs.world(ry, nproc).ok(layout)
    h = p.iterations()
    assert [x["iteration"] for x in h] == [1, 2, 3] == [x["iteration"] for x in r]
    for a, b in zip(r, h):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
        assert b["tokens"] == a["tokens"]
    # the LLM consumed every placeholder of both towers
    towers = _tower_tokens(ry)
    assert towers["vision"] > towers["siglip"] > 0
    assert sum(x["extras"]["image_tokens"] for x in h) == sum(towers.values())
    if layout == "own-ranks":  # each tower on its rank, timing its own phases
        for rank, name in ((0, "vision"), (1, "siglip")):
            phases = json.loads(facts_path(p.run_dir, rank).read_text())["phases_s"]
            assert {f"{name}_fwd", f"{name}_bwd"} <= set(phases) and "enc_fwd" not in phases, phases
            other = "siglip" if name == "vision" else "vision"
            assert f"{other}_fwd" not in phases, phases


@pytest.mark.slow
def test_the_second_tower_reaches_the_loss(shared_runs, tmp_path):
    """With the SigLIP tower frozen the first loss is the same and the global grad norm strictly smaller:
    its embeddings carry gradient from the loss (a tower built but never run would change neither)."""
    kw, _ = LAYOUTS["colocated-dp2"]
    r = shared_runs.reference(_run_yaml(tmp_path / "run", kw)).ok("reference").iterations()
    frozen = {"freeze": {"encoders": {"siglip": True}}}
    f = shared_runs.reference(_run_yaml(tmp_path / "frozen", kw, trainer=frozen)).ok("frozen").iterations()
    assert f[0]["loss"] == pytest.approx(r[0]["loss"], rel=1e-9)
    assert f[0]["grad_norm"] < r[0]["grad_norm"] * (1 - 1e-3)
