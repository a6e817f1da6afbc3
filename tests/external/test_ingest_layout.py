"""`ingest --layout --model` of a Megatron-LM log produced elsewhere (tests/ingest/fixtures/
megatron_upstream.log, Megatron-LM's training_log format with `throughput per GPU (TFLOP/s/GPU)` and the MoE
load-balancing loss on every line): the run gets its layout, model and GPUs, the report gives it an MFU, and
the log's own TFLOP/s/GPU and MoE loss are stored beside it. Bad layouts are refused with what is wrong."""

from __future__ import annotations

import json

import pytest

from helpers import TESTS
from helpers.submit import cli, query
from mimo_jobs.ingest.discover import IngestError
from mimo_jobs.ingest.layout import parse_layout, place

LOG = TESTS / "ingest" / "fixtures" / "megatron_upstream.log"


def test_layout_text_reads_like_the_report_writes_it():
    lay = parse_layout("enc tp1 dp8 | llm tp2 ep8 dp128")
    assert (lay["enc_tp"], lay["enc_dp"], lay["llm_tp"], lay["llm_ep"], lay["llm_dp"]) == (1, 8, 2, 8, 128)
    assert lay["world"] == 8 + 256 and lay["colocated"] is False
    assert place(lay, None, 8)["nodes"] == 33
    colo = parse_layout("llm tp2 dp8 gbs128")
    assert colo["colocated"] and colo["world"] == 16 and colo["gbs"] == 128 and colo["enc_dp"] == 8


@pytest.mark.parametrize(
    "text, expect",
    [
        ("enc tp1 dp8", "'llm' part is missing"),
        ("llm tp2 xp4", "'xp4' is not a size of llm"),
        ("9gpu tp2", "starts with 'enc', an encoder module's name"),
        ("vision tp1 | enc tp2 | llm tp2", "vision is given twice"),
        ("vision tp1 | audio xp2 | llm tp2", "'xp2' is not a size of audio"),
        ("llm tp0 dp8", "out of range"),
        ("llm tp1 dp6 ep4", "must divide"),
        ("llm tp2 | llm tp4", "given twice"),
    ],
)
def test_bad_layouts_are_refused(text, expect):
    with pytest.raises(IngestError, match=expect):
        parse_layout(text)


def test_a_layout_of_two_encoders_names_each_module_in_rank_order():
    lay = parse_layout("vision tp1 dp4 | audio tp2 dp2 | llm tp2 dp12")
    assert lay["encoders"] == [
        {"name": "vision", "tp": 1, "pp": 1, "dp": 4},
        {"name": "audio", "tp": 2, "pp": 1, "dp": 2},
    ]
    assert lay["world"] == 4 + 4 + 24 and lay["colocated"] is False
    assert (lay["enc_tp"], lay["enc_dp"]) == (None, None)  # several: only in run_modules


def test_ingest_with_a_layout_of_two_encoders_records_each_module(tmp_path):
    db = tmp_path / "s.duckdb"
    layout = "vision tp1 dp4 | audio tp2 dp2 | llm tp2 dp12"
    cli("ingest", LOG, "--db", db, "--study", "upstream", "--name", "two", "--layout", layout, check=True)
    rows = query(
        db,
        "SELECT module, position, tp, pp, dp, ranks, rank_start, rank_end FROM run_modules ORDER BY position",
    )
    assert rows == [("vision", 0, 1, 1, 4, 4, 0, 4), ("audio", 1, 2, 1, 2, 4, 4, 8)]
    (run,) = query(db, "SELECT nodes, world, enc_tp, enc_dp, llm_tp, llm_dp, colocated FROM runs")
    assert run == (4, 32, None, None, 2, 12, False)
    rep = cli("report", "upstream", "--db", db, "--format", "json", check=True)
    (row,) = json.loads(rep.stdout)["runs"]
    assert row["layout"] == "vision tp1 dp4 | audio tp2 dp2 | llm tp2 dp12", row


def test_nodes_that_do_not_fit_the_layout_are_refused():
    with pytest.raises(IngestError, match="16 ranks"):
        place(parse_layout("llm tp2 dp8"), 3, 8)


def test_ingest_with_layout_and_model_gives_mfu_and_keeps_the_logs_own_tflops(tmp_path):
    db = tmp_path / "s.duckdb"
    args = ("--db", db, "--study", "upstream", "--name", "gpt-moe", "--seq-length", "4096")
    cli("ingest", LOG, *args, "--layout", "llm tp2 dp8", "--model", "moe-8x1b", check=True)
    (run,) = query(db, "SELECT nodes, gpus_per_node, world, llm_tp, llm_dp, colocated, model FROM runs")
    assert run == (2, 8, 16, 2, 8, True, "moe-8x1b")
    its = query(db, "SELECT iteration, tflops_per_gpu, moe_aux_loss FROM iterations ORDER BY iteration")
    assert its[0] == (1, 51.5, pytest.approx(1.113377))
    assert sum(t is not None for _, t, _ in its) >= 4  # every complete line carries its figure
    rep = cli("report", "upstream", "--db", db, "--gpu", "H100", "--format", "json", check=True)
    (row,) = json.loads(rep.stdout)["runs"]
    assert row["mfu"] is not None and 0 < row["mfu"] < 1, row
    # without a model the FLOPs are unknown: no MFU, never one priced as some default model
    db2 = tmp_path / "s2.duckdb"
    cli("ingest", LOG, "--db", db2, "--study", "upstream", "--layout", "llm tp2 dp8", check=True)
    rep = cli("report", "upstream", "--db", db2, "--gpu", "H100", "--format", "json", check=True)
    assert json.loads(rep.stdout)["runs"][0]["mfu"] is None


def test_a_study_run_gives_the_layout(tmp_path):
    db = tmp_path / "s.duckdb"
    study = TESTS.parent / "studies" / "megatron_gpt_mock.yaml"
    cli("ingest", LOG, "--db", db, "--layout", f"{study}:2n-colo-l2x1x8-g256-m2", check=True)
    (run,) = query(db, "SELECT nodes, world, llm_tp, llm_dp, gbs, mbs, seq_length FROM runs")
    assert run == (2, 16, 2, 8, 256, 2, 2048)
    bad = cli("ingest", LOG, "--db", tmp_path / "b.duckdb", "--layout", f"{study}:nope")
    assert bad.returncode != 0 and "no run 'nope'" in bad.stderr + bad.stdout
