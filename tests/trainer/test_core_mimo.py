"""megatron-core 0.19's own MIMO pieces on the inputs our trainer handles, measured against the exact answer
and against our own pieces (one torchrun launch of core_mimo_worker.py, 3 gloo ranks; docs/design.md's table
of core's pieces cites each test here), and core's MimoModel trained side by side with the packaged trainer
(core_yardstick_worker.py).

Each assertion on core's behaviour is what keeps our piece in the trainer: when a later megatron-core fixes
it, the test fails and says which piece of ours can go."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from helpers.launch import torchrun, worker_env
from helpers.trainer import assert_ok, iterations, make_run_yaml, run_torchrun

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("core_mimo_worker.py")
YARDSTICK = Path(__file__).with_name("core_yardstick_worker.py")


def _torchrun(script: Path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = torchrun(nproc, script, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=worker_env(), check=False)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("core_mimo")
    p = _torchrun(WORKER, 3, str(out))
    assert p.returncode == 0, f"core_mimo_worker failed (rc={p.returncode}):\n{p.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


def test_core_rank_roles_agree_with_ours(found):
    # encoder on rank 0, LLM in two pipeline stages on ranks 1 and 2
    for rank, f in enumerate(found):
        core, ours = f["roles"]["core"], f["roles"]["ours"]
        assert core["mode"] == "NON_COLOCATED"
        got = (core["modules"], core["first"], core["last"])
        assert got == (ours["modules"], ours["first"], ours["last"]), f"rank {rank}: {core} != {ours}"
    assert [f["roles"]["ours"]["last"] for f in found] == [True, False, True]


def test_core_bridge_fan_in_returns_wrong_gradient_rows_for_uneven_image_tokens(found):
    # forward: the LLM replica gets both encoder replicas' rows, in order
    assert found[2]["fan_in"] == {"received_rows": 6, "received_exact": True}
    # backward: core splits the gradient into equal parts (3 + 3 rows) whatever each replica sent (4 and 2),
    # so neither replica can back-propagate it; our bridge splits by the per-sample token counts
    assert [found[r]["fan_in"]["sent_rows"] for r in (0, 1)] == [4, 2]
    assert [found[r]["fan_in"]["grad_rows"] for r in (0, 1)] == [3, 3]
    assert not found[0]["fan_in"]["grad_exact"] and not found[1]["fan_in"]["grad_exact"]


def test_core_bridge_fan_out_is_exact_with_per_sample_split_sizes(found):
    assert found[1]["fan_out"] == {"received_rows": 3, "received_exact": True}
    assert found[2]["fan_out"] == {"received_rows": 1, "received_exact": True}
    assert found[0]["fan_out"] == {"grad_rows": 4, "grad_exact": True}


def test_core_mimo_optimizer_agrees_on_a_finite_step_to_float32(found):
    for f in found:
        o = f["optimizer"]
        exact = o["exact_norm"]
        assert o["finite"]["ours"]["ok"] and o["finite"]["core"]["ok"]
        assert o["finite"]["ours"]["norm"] == pytest.approx(exact, rel=1e-12)
        # core's norm vector is float32: right to float32's precision, not to the reference's
        assert o["finite"]["core"]["norm"] == pytest.approx(exact, rel=1e-6)
        assert o["finite"]["core"]["norm"] != o["finite"]["ours"]["norm"]


def test_core_mimo_optimizer_steps_on_a_nan_gradient_where_ours_skips_everywhere(found):
    for rank, f in enumerate(found):
        core, ours = f["optimizer"]["nan"]["core"], f["optimizer"]["nan"]["ours"]
        assert math.isnan(core["norm"]) and core["ok"], f"rank {rank}: core reports success with a NaN norm"
        assert not ours["ok"] and ours["params_finite"], f"rank {rank}: ours skips the step on every rank"
    # core's clip coefficient is NaN, so nothing is clipped and the encoder's weights become NaN
    assert not found[0]["optimizer"]["nan"]["core"]["params_finite"]


def test_core_mimo_model_trains_the_packaged_trainers_losses_at_a_fan_out(tmp_path):
    """One encoder replica feeding two LLM replicas (the mock data's images of 8, 12 and 16 px and its
    text-only samples: per-sample token counts differ), Adam at a constant LR, three iterations: core's
    MimoModel in its documented non-colocated set-up and the packaged trainer, on the same modules, data and
    loss normalisation, give the same loss at every iteration (bitwise on this CPU)."""
    run_yaml = make_run_yaml(
        tmp_path,
        gpn=3,
        gbs=4,
        mbs=1,
        enc={"dp": 1},
        llm={"dp": 2},
        iters=3,
        trainer={
            "lr": {"schedule": "constant", "max": 1e-3},
            "optimizer": {"name": "adam", "clip_grad": 0.0},
        },
    )
    core = _torchrun(YARDSTICK, 3, str(run_yaml), str(tmp_path / "core.json"))
    assert core.returncode == 0, (
        f"core_yardstick_worker failed (rc={core.returncode}):\n{core.stderr[-6000:]}"
    )
    ours = run_torchrun(run_yaml, 3, tmp_path / "metrics.jsonl")
    assert_ok(ours, "the packaged trainer")
    want = [r["loss"] for r in iterations(tmp_path / "metrics.jsonl")]
    got = json.loads((tmp_path / "core.json").read_text())["losses"]
    assert len(want) == 3 and want[1] < want[0], want  # it trains
    assert got == pytest.approx(want, rel=1e-9, abs=0)
