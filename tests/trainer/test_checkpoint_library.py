"""The checkpoint library on real megatron-core modules in one gloo process (ckpt_lib_worker.py): exact
continuation after a restore into a differently initialised model with scrambled RNGs, a negative control
(weights alone are not enough), refusals, keep-K and a damaged file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("libckpt")
    # One thread (worker_env) is not all a bitwise claim needs: MKL's BLAS may round a product differently
    # with the alignment of its arrays in memory, which varies from run to run; its conditional numerical
    # reproducibility in strict mode fixes the arithmetic for a fixed thread count ("Obtaining Numerically
    # Reproducible Results", Intel oneMKL Developer Guide; MKL_CBWR=AUTO,STRICT).
    env = worker_env({"MKL_CBWR": "AUTO,STRICT"})
    r = subprocess.run(
        [sys.executable, str(HERE / "ckpt_lib_worker.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :]), out


def test_resume_is_bitwise_exact_with_distributed_optimizer_and_dropout(worker):
    res, _ = worker
    # loss, grad norm and the frozen module's output for 3 steps after the save, straight vs restored
    assert res["cont"] == res["ref"]
    assert res["resumed"] == [
        3,
        6,
        {"note": "x"},
        3,
    ]  # iteration, consumed samples, extras, provider position
    assert res["python_rng_restored"] is True


def test_negative_control_weights_alone_do_not_reproduce(worker):
    res, _ = worker
    # same weights and data position but fresh optimizer state and RNG: the sequence must differ, which
    # shows the comparison above is sensitive to what the checkpoint restores
    assert res["weights_only"] != res["ref"]
    assert res["weights_only"][0][0] != res["ref"][0][0]  # dropout RNG differs at once


def test_every_part_is_its_own_file(worker):
    res, _ = worker
    assert res["files"] == [
        "encoder/model-00000.pt",
        "encoder/optim-00000.pt",
        "language/model-00000.pt",
        "language/optim-00000.pt",
        "rank/rank-00000.pt",
    ]


def test_refuses_other_run_and_other_layout(worker):
    res, _ = worker
    assert (
        res["other_run"] is not None
        and "belongs to run run-a" in res["other_run"]
        and "run-b" in res["other_run"]
    )
    assert res["other_layout"] is not None and "llm_tp=1 vs now 2" in res["other_layout"]
    assert "trainer.init.checkpoint" in res["other_layout"]


def test_keep_k_and_damaged_file(worker):
    res, out = worker
    assert res["kept"] == ["iter_0000005", "iter_0000006", "latest"]
    assert (out / "ckpt" / "latest").read_text().strip() == "iter_0000006"
    assert res["damaged"] is not None
    assert "language/optim-00000.pt: 100 bytes" in res["damaged"] and "damaged" in res["damaged"]


def _same_steps(got: list, want: list) -> bool:
    """[loss, grad norm, frozen output] per step: the loss and the frozen module's output bitwise, the grad
    norm to float32's rounding. Megatron's grad norm is float32 arithmetic over the gradient buffer's pieces
    (a norm per piece, then the norm of those: megatron.core.utils.local_multi_tensor_l2_norm on the CPU),
    and the two layer backends lay the buffer out differently, so its last bit (1.2e-7 relative) is not
    fixed by the weights; a tensor not restored moves the loss itself, far above that."""
    return len(got) == len(want) and all(
        g[0] == w[0] and g[2] == w[2] and g[1] == pytest.approx(w[1], rel=1e-6) for g, w in zip(got, want)
    )


def test_a_checkpoint_moves_between_layer_backends_and_optimizers(worker):
    """Layers that name their norms as Transformer Engine does (linear_qkv.layer_norm_weight) and an Adam that
    keeps its step in its param groups (TE's FusedAdam) resume the local layers' checkpoint of the same layout
    and continue exactly; their own checkpoint resumes under local layers and torch's Adam (its first step
    exact; the next ones within float rounding, as a resharded continuation; a step count that restarted
    would double the first updates)."""
    res, _ = worker
    assert res["te_names"][0].endswith("self_attention.linear_qkv.layer_norm_weight")
    assert res["te_resumed"] == [3, 6, 3]
    assert res["te_group_steps"] == [3]
    assert _same_steps(res["te_cont"], res["ref"])
    assert res["te_manifest_layers"] == "te" and res["local_manifest_layers"] == "local"
    # export and resharding find the fused norms under the local names
    assert res["te_table_norms"] == [
        f"decoder.layers.0.{n}.{w}"
        for n in ("input_layernorm", "pre_mlp_layernorm")
        for w in ("bias", "weight")
    ]
    first, then = res["local_from_te"], res["te_more"]
    assert _same_steps(first[:1], then[:1])
    for got, want in zip(first[1], then[1]):
        assert got == pytest.approx(want, rel=1e-6)
