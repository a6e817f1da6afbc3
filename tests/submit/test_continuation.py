"""A run that differs from a completed run only by a longer train_iters continues from that run's latest
checkpoint (trainer.init.checkpoint), in its own run directory; a real DuckDB store and real study expansion."""

from __future__ import annotations

import json
from pathlib import Path

from mimo_jobs.contract.manifest import MANIFEST, Provenance, iter_name, manifest_doc
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.store import catalog
from mimo_jobs.store.connection import connect
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.submit import jobs_table, service
from mimo_jobs.submit.checkpoints import is_longer_version
from mimo_jobs.submit.lineage import RunRow, links, study_links


def study(iters: int, lr: float = 2e-3):
    return parse_study(
        {
            "name": "grow",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 2},
            "trainer": {"model": "tiny", "train_iters": iters, "lr": {"max": lr}},
            "matrix": {"points": [{"nodes": 1, "encoder": {"tp": 1, "dp": 1}, "llm": {"tp": 1}, "gbs": 2}]},
        },
        env={},
    )


def completed_run(con, root: Path, iters: int, saved: list[int]) -> Path:
    """Record a completed run of `iters` iterations whose checkpoint directory holds `saved`."""
    st = study(iters)
    (spec,) = runs_of(st)
    rd = RunDir.of(root / "runs", spec.study, spec.name, spec.run_id)
    ck = rd.checkpoint_dir(None)
    prov = Provenance(spec.run_id, spec.study, spec.name, {}, 2)
    for it in saved:
        d = ck / iter_name(it)
        d.mkdir(parents=True)
        doc = manifest_doc(
            iteration=it, consumed_samples=2 * it, provenance=prov, files={}, rank_modules={}, save_s=0.0
        )
        (d / MANIFEST).write_text(json.dumps(doc))
    catalog.record_study(con, catalog.StudyRecord(**st.catalog_fields()), "grow.yaml")
    catalog.record_run(con, catalog.RunRecord(**spec.catalog_fields()), str(rd.root), "0", {})
    jobs_table.insert_job(con, spec.run_id, "j1", "local", 0, "0", None, state="COMPLETED")
    return ck


def test_longer_run_continues_the_completed_one(tmp_path):
    con = connect(tmp_path / "store.duckdb")
    ck = completed_run(con, tmp_path, iters=2, saved=[1, 2])
    (longer,) = runs_of(study(4))
    sel = service.plan_submit(con, [longer], force=False)
    (run,) = sel.submit
    assert run.run_id == longer.run_id and run.trainer.init.checkpoint == str(ck / "iter_0000002")
    assert not run.trainer.init.weights_only
    (note,) = sel.notes
    assert f"{longer.name} ({longer.run_id}): continues completed run" in note and str(ck) in note

    (other,) = runs_of(study(4, lr=1e-3))  # another learning rate: another run, from the start
    (shorter,) = runs_of(study(1))
    sel = service.plan_submit(con, [other, shorter], force=False)
    assert [r.trainer.init for r in sel.submit] == [None, None] and sel.notes == []


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_both_runs_show_the_lineage(tmp_path):
    from helpers.submit import cli

    db = tmp_path / "store.duckdb"
    con = connect(db)
    ck = completed_run(con, tmp_path, iters=2, saved=[1, 2])
    (old,) = runs_of(study(2))
    before = _tree(ck.parent)
    (run,) = service.plan_submit(con, runs_of(study(4)), force=False).submit
    rd = RunDir.of(tmp_path / "runs", run.study, run.name, run.run_id)  # what submit_runs records
    catalog.record_run(con, catalog.RunRecord(**run.catalog_fields()), str(rd.root), "0", {})

    (link,) = study_links(con, "grow")
    assert (link.source, link.target) == (old.run_id, run.run_id) and not link.weights_only
    assert link.checkpoint == str(ck / "iter_0000002")
    assert link.line() == (
        f"{old.name} ({old.run_id}) continued by {run.name} ({run.run_id}) from iter_0000002"
    )
    assert _tree(ck.parent) == before  # the completed run's directory: not a byte written
    con.close()

    out = cli("status", "grow", "--db", db, check=True).stdout
    assert f"lineage: {link.line()}" in out


def test_links_need_the_checkpoint_inside_a_runs_directory(tmp_path):
    spec = {"trainer": {}}
    src = RunRow("a", "A", str(tmp_path / "a"), spec)
    custom = RunRow(
        "c", "C", str(tmp_path / "c"), {"trainer": {"checkpoint_dir": str(tmp_path / "elsewhere")}}
    )

    def starting_from(path: Path, weights_only=False) -> RunRow:
        return RunRow(
            "b",
            "B",
            str(tmp_path / "b"),
            {"trainer": {"init": {"checkpoint": str(path), "weights_only": weights_only}}},
        )

    assert [(x.source, x.target) for x in links([src, starting_from(tmp_path / "a" / "checkpoints")])] == [
        ("a", "b")
    ]
    (w,) = links([src, custom, starting_from(tmp_path / "elsewhere" / "iter_0000004", True)])
    assert w.source == "c" and w.weights_only and "its weights taken by B (b) from iter_0000004" in w.line()
    # a path beside the run's checkpoints, or in no run's directory: no source
    assert links([src, starting_from(tmp_path / "a" / "checkpoints2")]) == []
    assert links([src, starting_from(tmp_path / "x" / "checkpoints")]) == []


def test_is_longer_version_compares_everything_but_the_length():
    (a,) = runs_of(study(2))
    (b,) = runs_of(study(3))
    assert is_longer_version(b.to_dict(), a.to_dict())
    assert not is_longer_version(a.to_dict(), b.to_dict())
    assert not is_longer_version(a.to_dict(), a.to_dict())
    (c,) = runs_of(study(3, lr=1e-3))
    assert not is_longer_version(c.to_dict(), a.to_dict())
