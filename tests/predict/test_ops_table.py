"""A measured operator table (`cluster.hardware.ops`, benchmarks/gpu/ops.py's YAML): read as data and checked
field by field (predict/opsfile.py), interpolated by shape (predict/optable.py), and what the operator model
prices from it (predict/operators.py): GEMMs and attention at the device's own rates, without the fitted
residual, communication as before; `predict` names the file it priced from."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.contract.opstable import AttentionRow, GemmRow, OpsFileError, OpsTable, parse_ops
from mimo_jobs.model.arch import LLMArch
from mimo_jobs.predict import operators as ops
from mimo_jobs.predict.opdata import OP_GPUS
from mimo_jobs.predict.optable import attention_rate, gemm_rate
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study
from mimo_jobs.study.opsfile import read_ops

H100 = OP_GPUS["H100"]
LLAMA_8B = LLMArch(32, 4096, 32, 14336, 128256, num_query_groups=8, activation="silu", gated_linear_unit=True)
GPT = REPO / "studies/megatron_gpt_mock.yaml"
runner = CliRunner()


def _gemm(m: int, n: int, k: int, tflops: float, dtype: str = "bf16") -> GemmRow:
    return GemmRow(m, n, k, dtype, 2 * m * n * k / (tflops * 1e12) * 1e3)


def _attention(s: int, d: int, causal: bool, tflops: float, b: int = 1, h: int = 16) -> AttentionRow:
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    return AttentionRow(b, h, s, d, causal, flops / (tflops * 1e12) * 1e3)


def _table(gemm, attention=()) -> OpsTable:
    return OpsTable("<test>", "test device", tuple(gemm), tuple(attention))


def test_a_table_at_one_rate_prices_a_layers_gemms_and_attention_at_that_rate():
    # every GEMM row at 500 TFLOP/s (shapes unlike the layer's), every attention row at 300
    rows = [_gemm(1024, 1024, 1024, 500), _gemm(8192, 8192, 8192, 500), _gemm(2048, 28672, 4096, 500)]
    att = [_attention(1024, 128, True, 300), _attention(8192, 64, True, 300)]
    gpu = replace(H100, measured=_table(rows, att))
    t = ops.layer_terms(LLAMA_8B, 1, 2048, ops.Split(), gpu, moe=False)
    # by hand: 2048 tokens; QKV n = 4096 + 2 x 8 x 128 = 6144, the projection 4096, the gated MLP 2 x 14336
    # and 14336 back, k = 4096 but the last (k = 14336, n = 4096); forward + two backward GEMMs = 3 x 2 T N K:
    # 6 x 2048 x 4096 x (6144 + 4096 + 28672 + 14336) = 2.6801e12 FLOPs / 500e12 = 5.3601 ms
    assert t.gemm == pytest.approx(5.360119e-3, rel=1e-6)
    # attention: 4 x 32 heads x 128 x 2048^2 / 2 (causal) = 34.36 GFLOPs forward, 3.5x with the backward,
    # at 300 TFLOP/s: 0.40087 ms
    assert t.attention == pytest.approx(3.5 * 4 * 32 * 128 * 2048**2 / 2 / 300e12, rel=1e-9)
    assert t.attention == pytest.approx(0.40087e-3, rel=1e-4)


def test_interpolation_between_two_measured_shapes_lies_between_them():
    table = _table([_gemm(1024, 1024, 1024, 100), _gemm(4096, 4096, 4096, 400)])
    at_measured = gemm_rate(table, 1024, 1024, 1024, "bf16")
    assert at_measured.rate == pytest.approx(100e12) and not at_measured.clamped
    mid = gemm_rate(table, 2048, 2048, 2048, "bf16")
    # 2048^3 sits halfway in log2 between them: equal weights, (100 + 400) / 2
    assert mid.rate == pytest.approx(250e12) and not mid.clamped
    nearer = gemm_rate(table, 3000, 3000, 3000, "bf16")
    assert 250e12 < nearer.rate < 400e12 and not nearer.clamped
    att = _table(table.gemm, [_attention(1024, 128, True, 200), _attention(8192, 128, True, 500)])
    got = attention_rate(att, 4096, 128, True)
    assert 200e12 < got.rate < 500e12 and not got.clamped


def test_a_shape_outside_the_table_clamps_to_the_nearest_and_says_so():
    table = _table([_gemm(1024, 1024, 1024, 100), _gemm(4096, 4096, 4096, 400)])
    big = gemm_rate(table, 65536, 65536, 65536, "bf16")
    assert big.rate == pytest.approx(400e12) and big.clamped
    small = gemm_rate(table, 16, 16, 16, "bf16")
    assert small.rate == pytest.approx(100e12) and small.clamped
    assert gemm_rate(table, 1024, 1024, 1024, "fp8") is None  # no fp8 row: the caller keeps the model
    # the layer records the shapes it priced outside the table
    gpu = replace(H100, measured=table)
    t = ops.layer_terms(LLAMA_8B, 1, 2048, ops.Split(), gpu, moe=False)
    assert ("gemm", 2048, 28672, 4096) in t.clamped  # n = 28672 is beyond the table's 4096
    assert not any(c[0] == "attention" for c in t.clamped)  # no attention rows: the model priced it
    only_noncausal = _table(table.gemm, [_attention(2048, 128, False, 300)])
    assert attention_rate(only_noncausal, 2048, 128, True).clamped  # the other mask's rows: said


def test_measured_times_take_no_residual_and_communication_keeps_its_model():
    table = _table([_gemm(1024, 1024, 1024, 100), _gemm(8192, 8192, 8192, 600)])
    gpu = replace(H100, measured=table)
    half = ops.Residual(gemm=0.5, comm=1.0)
    assert ops.gemm_s(4096, 4096, 4096, gpu, res=half) == ops.gemm_s(4096, 4096, 4096, gpu)
    assert ops.gemm_s(4096, 4096, 4096, H100, res=half) == pytest.approx(
        2 * ops.gemm_s(4096, 4096, 4096, H100)
    )
    split = ops.Split(tp=4, sp=True)
    measured = ops.layer_terms(LLAMA_8B, 1, 4096, split, gpu, moe=False)
    published = ops.layer_terms(LLAMA_8B, 1, 4096, split, H100, moe=False)
    assert measured.tp == published.tp > 0 and measured.elementwise == published.elementwise
    assert measured.gemm != published.gemm


def _ops_doc(**over) -> dict:
    doc = {
        "device": "NVIDIA H200",
        "torch": "2.8.0",
        "gemm": [{"m": 2048, "n": 2048, "k": 2048, "dtype": "bf16", "ms": 0.05}],
        "attention": [{"b": 1, "h": 16, "s": 4096, "d": 128, "causal": True, "ms": 0.5}],
        "skipped": [],
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"gpu": "H200"}, ["unknown key 'gpu'", "device, torch, gemm, attention, skipped"]),
        ({"device": ""}, ["device: ''", "non-empty string"]),
        ({"gemm": []}, ["gemm: no rows"]),
        ({"gemm": [{"m": 1, "n": 2, "k": 3, "ms": 1.0}]}, ["gemm[0]", "no 'dtype'", "m, n, k, dtype, ms"]),
        ({"gemm": [{"m": 1, "n": 2, "k": 3, "dtype": "int4", "ms": 1.0}]}, ["gemm[0].dtype", "bf16, fp8"]),
        ({"gemm": [{"m": 1.5, "n": 2, "k": 3, "dtype": "bf16", "ms": 1.0}]}, ["gemm[0].m: 1.5", "integer"]),
        ({"gemm": [{"m": 1, "n": 2, "k": 3, "dtype": "bf16", "ms": 0}]}, ["gemm[0].ms: 0", "positive"]),
        ({"gemm": [{"m": 1, "n": 2, "k": 3, "dtype": "bf16", "ms": 1.0, "cmd": "x"}]}, ["unknown field 'cmd'"]),
        ({"gemm": [{"m": 1000, "n": 1000, "k": 1000, "dtype": "bf16", "ms": 1.0, "tflops": 9}]},
         ["gemm[0].tflops: 9", "2 TFLOP/s"]),
        ({"attention": [{"b": 1, "h": 1, "s": 8, "d": 8, "causal": "yes", "ms": 1.0}]},
         ["attention[0].causal", "true or false"]),
        ({"attention": {"b": 1}}, ["attention: a list of rows"]),
    ],
)  # fmt: skip
def test_a_malformed_table_names_the_entry_and_field_and_what_fits(over, words):
    with pytest.raises(OpsFileError) as e:
        parse_ops(_ops_doc(**over), "ops.yaml")
    assert str(e.value).startswith("ops.yaml: ")
    for w in words:
        assert w in str(e.value)


def test_a_table_file_is_read_as_data_within_its_size(tmp_path):
    good = tmp_path / "ops.yaml"
    good.write_text(yaml.safe_dump(_ops_doc()))
    t = read_ops(good)
    assert t.device == "NVIDIA H200" and t.gemm[0].rate == pytest.approx(2 * 2048**3 / 0.05e-3)
    code = tmp_path / "code.yaml"
    code.write_text("device: !!python/object/apply:os.system ['true']\ngemm: []\n")
    with pytest.raises(OpsFileError, match=r"code.yaml: invalid YAML"):
        read_ops(code)
    twice = tmp_path / "twice.yaml"
    twice.write_text("device: a\ndevice: b\ngemm: []\n")
    with pytest.raises(OpsFileError, match="twice.yaml"):
        read_ops(twice)
    big = tmp_path / "big.yaml"
    big.write_text("#" * (1 << 20 + 1))
    with pytest.raises(OpsFileError, match="over the 1048576-byte limit"):
        read_ops(big)
    with pytest.raises(OpsFileError, match="no such ops table"):
        read_ops(tmp_path / "missing.yaml")


def test_what_ops_py_writes_is_a_table_the_planner_reads(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_ops", REPO / "benchmarks/gpu/ops.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_ops", mod)  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    import torch

    doc = yaml.safe_load(yaml.safe_dump(mod.table("cpu", torch.bfloat16, True, 60.0), sort_keys=False))
    t = parse_ops(doc, "ops.yaml")
    assert t.device == "cpu" and len(t.gemm) == len(mod.QUICK_GEMMS) and {r.dtype for r in t.gemm} == {"bf16"}
    assert len(t.attention) == len(mod.QUICK_ATTENTION)


def _study(tmp_path, ops_line: str) -> str:
    text = GPT.read_text().replace(
        "  gpus_per_node: 8\n", f"  gpus_per_node: 8\n  hardware: {{gpu: H200{ops_line}}}\n", 1
    )
    path = tmp_path / "study" / "gpt.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


def test_predict_prices_from_the_table_the_study_names_and_says_so(tmp_path):
    table = tmp_path / "tables" / "ops.yaml"
    table.parent.mkdir()
    doc = _ops_doc(gemm=[{"m": 1024, "n": 1024, "k": 1024, "dtype": "bf16", "ms": 2 * 1024**3 / 1e14 * 1e3}])
    table.write_text(yaml.safe_dump(doc))  # one GEMM row at 100 TFLOP/s
    with_ops = _study(tmp_path, ", ops: ../tables/ops.yaml")  # relative to the study file
    (tmp_path / "b").mkdir()
    without = _study(tmp_path / "b", "")
    # planning only: the run ids stay what they were without the table
    assert [r.run_id for r in runs_of(load_study(with_ops, env={}))] == [
        r.run_id for r in runs_of(load_study(without, env={}))
    ]
    r = runner.invoke(app, ["predict", with_ops, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    base = json.loads(runner.invoke(app, ["predict", without, "--json"]).output)
    assert got["ops_file"] == str(table.resolve()) and base["ops_file"] is None
    for run, before in zip(got["runs"], base["runs"]):
        assert run["ops_file"] == str(table.resolve()) and before["ops_file"] is None
        assert run["ops_clamped"] and run["iteration_s"] != before["iteration_s"]
    text = " ".join(runner.invoke(app, ["predict", with_ops]).output.split())  # rich wraps the line
    assert f"priced from {table.resolve()} (device NVIDIA H200)" in text
    assert "outside the table's range" in text


def test_a_missing_or_malformed_table_fails_validate_naming_the_field(tmp_path):
    missing = _study(tmp_path, ", ops: nowhere.yaml")
    r = runner.invoke(app, ["validate", missing])
    assert r.exit_code == 2
    assert "cluster.hardware.ops" in r.output and "no such ops table" in r.output
    bad = tmp_path / "study" / "bad.yaml"
    bad.write_text(yaml.safe_dump(_ops_doc(gemm=[{"m": 1, "n": 1, "k": 1, "dtype": "bf16"}])))
    r = runner.invoke(app, ["validate", _study(tmp_path, ", ops: bad.yaml")])
    assert r.exit_code == 2 and "gemm[0]: no 'ms'" in " ".join(r.output.split())


def test_the_smoke_check_prices_each_study_it_ran_from_the_table(tmp_path):
    spec = importlib.util.spec_from_file_location("ops_check", REPO / "benchmarks/gpu/ops_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = tmp_path / "ops.yaml"
    table.write_text(yaml.safe_dump(_ops_doc()))
    # the same run ids as the study file itself: the smoke's store measured those
    assert [r.run_id for r in runs_of(mod.priced_study(GPT, table))] == [
        r.run_id for r in runs_of(load_study(GPT, env={}))
    ]
    gpt = mod.check(table, GPT, tmp_path / "no-store.duckdb")
    assert "(device NVIDIA H200)" in gpt[0] and len(gpt) == 4
    assert all("[ops table]" in line and "measured -" in line for line in gpt[1:])
    tiny = mod.check(table, REPO / "benchmarks/gpu/smoke_tiny.yaml", tmp_path / "no-store.duckdb")
    # a model with an encoder module: its encoder and LLM terms priced from the table too
    assert "[ops table]" in tiny[1] and "FLOPs model" not in tiny[1]
