"""trainer.init.llm: {megatron: DIR}: the trainer's LLM loaded from a torch_dist checkpoint that megatron-core
wrote for a GPT model built outside the trainer (megatron_worker.py, Megatron-LM's directory layout and its
vocabulary padding) computes the logits of the model that saved it (fp32, relative difference <= 1e-5), with
the layers stacked (Megatron-LM's older default) or one key per layer, dense and MoE, in one process and
across TP, EP and PP layouts (torchrun), and from a checkpoint that megatron-core 0.16.1 wrote (a fixture of
the stack before 0.19). A checkpoint of another shape or a directory that is not one is one
line naming the file, the key and both shapes; the trainer exits 2 before training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env
from mimo_jobs.trainer.weights.megatron_load import (
    MegatronInitError,
    Source,
    check_source,
    first_problem,
    iteration_dir,
)

HERE = Path(__file__).parent
WORKER = HERE / "megatron_worker.py"
TOL = 1e-5
ITER = "iter_0000010"


def _results(p: subprocess.CompletedProcess) -> list[dict]:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]


def _worker(specs: list[dict], tmp_path: Path, nproc: int = 1) -> list[dict]:
    f = tmp_path / "specs.json"
    f.write_text(json.dumps(specs))
    cmd = [sys.executable, str(WORKER), str(f)]
    if nproc > 1:
        from helpers.launch import torchrun

        cmd = torchrun(nproc, WORKER, f)
    return _results(subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=worker_env()))


def _equal(r: dict) -> None:
    assert "error" not in r, r
    assert r["rel"] <= TOL and r["std"] > 0.1, r  # the saved model's logits are far from zero


def test_logits_equal_the_saving_models_and_another_shape_is_named(tmp_path):
    stacked, per_layer = str(tmp_path / "stacked"), str(tmp_path / "per_layer")
    moe = str(tmp_path / "moe")
    wider = {"preset": "tiny-swiglu", "ffn_hidden_size": 96}
    deeper = {"preset": "tiny-swiglu", "num_layers": 3}
    shallower = {"preset": "tiny-swiglu", "num_layers": 1}
    more_tokens = {"preset": "tiny-swiglu", "vocab_size": 200}  # 256 rows in the trainer, 128 saved
    more_experts = {"preset": "tiny-moe", "num_experts": 8}
    old_stack = str(tmp_path / "old_stack")
    shutil.copytree(HERE / "fixtures" / "megatron_core_0.16.1_torch_dist", old_stack)
    specs = [
        {"dir": stacked},  # the parent with latest_checkpointed_iteration.txt
        {"dir": per_layer, "per_layer": True},
        {"dir": stacked, "load_dir": f"{stacked}/{ITER}", "phases": ["load"]},  # the iter_N directory
        {"dir": moe, "model": "tiny-moe"},  # the routed experts' keys, stacked
        {"dir": stacked, "llm": wider, "phases": ["load"]},
        {"dir": per_layer, "llm": deeper, "phases": ["load"]},
        {"dir": per_layer, "llm": shallower, "phases": ["load"]},
        {"dir": stacked, "llm": more_tokens, "phases": ["load"]},
        {"dir": moe, "llm": more_experts, "phases": ["load"]},
        {"dir": old_stack, "model": "tiny-swiglu", "phases": ["load"]},  # saved by megatron-core 0.16.1
    ]
    r = _worker(specs, tmp_path)
    assert len(r) == 10, r
    _equal(r[9])
    for ok in r[:4]:
        _equal(ok)
    for bad in r[4:9]:
        assert "\n" not in bad["error"] and bad["error"].startswith("trainer.init.llm.megatron: "), bad
    assert (
        f"{stacked}/{ITER}: tensor decoder.layers.mlp.linear_fc1.weight has shape [2, 128, 32], "
        in (r[4]["error"])
    )
    assert "this model needs [2, 192, 32]" in r[4]["error"]
    assert f"{per_layer}/{ITER}: no tensor decoder.layers.2." in r[5]["error"], r[5]
    assert "tensor decoder.layers.1." in r[6]["error"] and "is not part of this model" in r[6]["error"]
    assert r[7]["error"].endswith(
        f"{stacked}/{ITER}: tensor embedding.word_embeddings.weight has shape [128, 32]: 128 rows, fewer "
        "than this model's vocabulary of 200 tokens (this model needs [256, 32])"
    ), r[7]
    assert r[8]["error"].endswith(
        f"{moe}/{ITER}: tensor decoder.layers.mlp.experts.experts.linear_fc1.weight has shape "
        "[2, 4, 64, 32], this model needs [2, 8, 64, 32]"
    ), r[8]


@pytest.mark.slow
def test_tp_layouts_load_each_others_checkpoints(tmp_path):
    # saved at TP2 and loaded at TP2 and TP1 (two DP replicas); saved at TP1 (DP2) and loaded at TP2
    a, b = str(tmp_path / "tp2"), str(tmp_path / "tp1")
    specs = [
        {"dir": a, "tp": 2},
        {"dir": a, "tp": 1, "phases": ["load"]},
        {"dir": b, "tp": 1, "phases": ["save"]},
        {"dir": b, "tp": 2, "phases": ["load"]},
    ]
    r = _worker(specs, tmp_path, nproc=2)
    assert len(r) == 6, r  # both ranks hold the gathered logits of the three loads
    for ok in r:
        _equal(ok)
    # Megatron-LM padded the 128 tokens to 128 x TP rows at TP2; the trainer's tables hold 128 at both
    assert check_source(a).shapes["embedding.word_embeddings.weight"] == (256, 32)
    assert check_source(a).shapes["output_layer.weight"] == (256, 32)
    assert check_source(b).shapes["output_layer.weight"] == (128, 32)


@pytest.mark.slow
def test_ep_layouts_load_each_others_moe_checkpoints(tmp_path):
    # tiny-moe's 4 experts saved at EP2 (two per rank) and loaded at EP2 and EP1 (all four on each DP
    # replica); saved at EP1 (DP2) and loaded at EP2
    a, b = str(tmp_path / "ep2"), str(tmp_path / "ep1")
    specs = [
        {"dir": a, "model": "tiny-moe", "ep": 2},
        {"dir": a, "model": "tiny-moe", "ep": 1, "phases": ["load"]},
        {"dir": b, "model": "tiny-moe", "ep": 1, "phases": ["save"]},
        {"dir": b, "model": "tiny-moe", "ep": 2, "phases": ["load"]},
    ]
    r = _worker(specs, tmp_path, nproc=2)
    assert len(r) == 6, r  # every rank holds the logits of its own replica
    for ok in r:
        _equal(ok)
    assert check_source(a).shapes["decoder.layers.mlp.experts.experts.linear_fc1.weight"] == (2, 4, 64, 32)


@pytest.mark.slow
def test_pp_layouts_load_each_others_checkpoints(tmp_path):
    # saved at PP2 (each stage its own layer, stacked or one key per global layer number) and loaded at
    # PP2 and PP1 (DP2); saved at PP1 (DP2) and loaded at PP2, whose second stage takes layer 1
    a, b, c = str(tmp_path / "pp2"), str(tmp_path / "pp2_per_layer"), str(tmp_path / "pp1")
    specs = [
        {"dir": a, "pp": 2},
        {"dir": a, "pp": 1, "phases": ["load"]},
        {"dir": b, "pp": 2, "per_layer": True},
        {"dir": b, "pp": 1, "phases": ["load"]},
        {"dir": c, "pp": 1, "phases": ["save"]},
        {"dir": c, "pp": 2, "phases": ["load"]},
    ]
    r = _worker(specs, tmp_path, nproc=2)
    # at PP2 only the last stage holds logits: one line per PP2 load, two per PP1 load
    assert [x["dir"] for x in r] == [a, a, a, b, b, b, c], r
    for ok in r:
        _equal(ok)
    assert "decoder.layers.1.mlp.linear_fc2.weight" in check_source(b).shapes


# ------------------------------------------------------------------------------- files, no model


def test_the_iteration_directory_comes_from_megatron_lms_tracker_file(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10\n")
    assert iteration_dir(tmp_path) == tmp_path / ITER
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    assert iteration_dir(tmp_path) == tmp_path / "release"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("ten")
    with pytest.raises(MegatronInitError, match="'ten' is not an iteration number"):
        iteration_dir(tmp_path)


def _err(path) -> str:
    with pytest.raises(MegatronInitError) as e:
        check_source(path)
    msg = e.value.describe()
    assert "\n" not in msg and msg.startswith("trainer.init.llm.megatron: ")
    return msg


def test_directories_that_are_not_torch_dist_checkpoints(tmp_path):
    assert f"{tmp_path / 'nope'}: no such directory" in _err(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")  # a HuggingFace directory, say
    assert "not a Megatron distributed checkpoint (no metadata.json" in _err(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10")
    assert f"{tmp_path / ITER}: no such directory" in _err(tmp_path)
    it = tmp_path / ITER
    it.mkdir()
    (it / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    assert "sharded_backend is 'zarr'; only 'torch_dist'" in _err(tmp_path)
    (it / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    assert f"{it}: no .metadata" in _err(tmp_path)
    (it / ".metadata").write_bytes(b"not a pickle")
    assert f"{it / '.metadata'}: unreadable" in _err(tmp_path)
    # a metadata.json of another shape: one line naming it, never a traceback on every rank
    for wrong in (["torch_dist"], {"sharded_backend": "torch_dist", "sharded_backend_version": [1]}, "x"):
        (it / "metadata.json").write_text(json.dumps(wrong))
        msg = _err(tmp_path)
        assert f"{it / 'metadata.json'}: " in msg and "\n" not in msg, msg


def test_the_first_mismatch_names_the_key_and_both_shapes():
    src = Source(
        Path("/c/iter_0000010"),
        {
            "embedding.word_embeddings.weight": (256, 32),
            "decoder.final_layernorm.weight": (32,),
            "optimizer.state.exp_avg.decoder.final_layernorm.weight": (32,),
        },
    )
    want = {
        "embedding.word_embeddings.weight": ((128, 32), True),
        "decoder.final_layernorm.weight": ((32,), False),
    }
    assert first_problem(src, want) is None  # padded vocabulary rows may differ; optimizer keys are ignored
    assert first_problem(src, want, vocab_size=128) is None
    # a model of 257 tokens (384 rows): the checkpoint's 256 rows would leave its last token at zero
    more = dict(want, **{"embedding.word_embeddings.weight": ((384, 32), True)})
    assert first_problem(src, more, vocab_size=256) is None
    assert first_problem(src, more, vocab_size=257) == (
        "/c/iter_0000010: tensor embedding.word_embeddings.weight has shape [256, 32]: 256 rows, fewer than "
        "this model's vocabulary of 257 tokens (this model needs [384, 32])"
    )
    want["embedding.word_embeddings.weight"] = ((128, 64), True)
    assert first_problem(src, want) == (
        "/c/iter_0000010: tensor embedding.word_embeddings.weight has shape [256, 32], this model needs [128, 64]"
    )
    want = {"decoder.final_layernorm.weight": ((32,), False), "output_layer.weight": ((128, 32), True)}
    assert (
        first_problem(src, want)
        == "/c/iter_0000010: no tensor output_layer.weight (this model needs shape [128, 32])"
    )
    want = {"decoder.final_layernorm.weight": ((32,), False)}
    assert (
        "tensor embedding.word_embeddings.weight (shape [256, 32]) is not part of this model"
        in first_problem(src, want)
    )


def test_the_trainer_refuses_a_directory_that_is_not_a_checkpoint_with_exit_2(tmp_path):
    from helpers.trainer import make_run_yaml, run_reference

    run_yaml = make_run_yaml(
        tmp_path / "run",
        gpn=2,
        gbs=2,
        model="tiny-swiglu",
        # image sides the tiny-swiglu encoder takes (patch 8): the run is sound but for its init source
        data={"image_sizes": [8, 16]},
        trainer={"init": {"llm": {"megatron": str(tmp_path)}}},
    )
    p = run_reference(run_yaml, tmp_path / "m.jsonl")
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert lines == [
        f"mimo-jobs trainer: error: trainer.init.llm.megatron: {tmp_path}: not a Megatron distributed "
        "checkpoint (no metadata.json, and no latest_checkpointed_iteration.txt naming an iter_N directory)"
    ], p.stderr[-3000:]
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.slow
def test_the_trainer_refuses_a_checkpoint_of_another_shape_with_exit_2_before_training(tmp_path):
    from helpers.trainer import make_run_yaml, run_reference

    ckpt = tmp_path / "ckpt"
    _worker([{"dir": str(ckpt), "phases": ["save"]}], tmp_path)
    model = {"encoder": "tiny", "llm": {"preset": "tiny-swiglu", "ffn_hidden_size": 96}}
    run_yaml = make_run_yaml(
        tmp_path / "run", gpn=2, gbs=2, trainer={"model": model, "init": {"llm": {"megatron": str(ckpt)}}}
    )
    p = run_reference(run_yaml, tmp_path / "m.jsonl")
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert lines == [
        f"mimo-jobs trainer: error: trainer.init.llm.megatron: {ckpt / ITER}: tensor "
        "decoder.layers.mlp.linear_fc1.weight has shape [2, 128, 32], this model needs [2, 192, 32]"
    ], p.stderr[-3000:]
    assert not (tmp_path / "m.jsonl").exists()
