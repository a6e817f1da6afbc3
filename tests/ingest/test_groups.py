"""Small files are ingested many to one transaction (per-rank logs: thousands of them). The store and the
stats must be exactly those of one transaction per file, also when a file of a group fails: the group is
rolled back and taken file by file, so the failure costs only its own file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.lines import LineHandler
from mimo_jobs.store import connection as store


def _logs(root: Path, n: int = 12) -> list[Path]:
    """n small logs of one run (each its own job): iteration lines, a checkpoint save, one traceback."""
    rng = random.Random(5)
    out = []
    for j in range(n):
        lines = []
        for it in range(1, 30):
            lines.append(
                f" [2026-03-02 10:{j:02d}:{it:02d}] iteration {it:8d}/     100 | consumed samples: {8 * it:6d} | "
                f"elapsed time per iteration (ms): {100 + rng.random():.1f} | learning rate: 1.000000E-04 | "
                f"global batch size:     8 | lm loss: {5 - it / 10 + rng.random() / 100:.6E} | loss scale: 1.0 |"
            )
            lines.append(f"{j}: [default0]:data loader: lane {it} prefetched 8 samples")
        lines.append(f"{j}: [default0]: successfully saved checkpoint from iteration 29 to /ckpt")
        if j == 7:
            lines += [
                "0: [default0]:Traceback (most recent call last):",
                '0: [default0]:  File "t.py", line 1',
                "0: [default0]:RuntimeError: boom",
            ]
        p = root / f"slurm-{100 + j}.out"
        p.write_text("\n".join(lines) + "\n")
        out.append(p)
    return out


def _ingest(db: Path, logs: list[Path]) -> tuple:
    con = store.connect(db)
    st = ingest.ingest_paths(con, logs, log_run=ingest.LogRunInfo(study="s", name="n", gpus_per_node=1))
    it = con.execute("SELECT * EXCLUDE (source_file) FROM iterations ORDER BY job_id, iteration").fetchall()
    ev = con.execute("SELECT * EXCLUDE (source_file) FROM events ORDER BY job_id, line_no, kind").fetchall()
    files = con.execute("""SELECT path, run_id, size, lines, bad_lines, kind, "offset", truncated, state
                           FROM ingested_files ORDER BY path""").fetchall()
    con.close()
    return it, ev, files, st


@pytest.mark.parametrize("failing", [None, "slurm-105.out"])
def test_groups_store_what_one_file_at_a_time_stores(tmp_path, monkeypatch, failing):
    logs = _logs(tmp_path)
    if failing:  # one file's scan fails (a disk error while it is read)
        real = LineHandler.line

        def line(self, line_no, text):
            if self.src.endswith(failing):
                raise OSError(5, "Input/output error")
            return real(self, line_no, text)

        monkeypatch.setattr(LineHandler, "line", line)
    calls = []
    real_group = ingest._ingest_group
    monkeypatch.setattr(
        ingest, "_ingest_group", lambda *a, **k: calls.append(len(a[1])) or real_group(*a, **k)
    )
    monkeypatch.setattr(ingest, "GROUP_FILES", 5)
    grouped = _ingest(tmp_path / "g.duckdb", logs)
    assert calls == [5, 5, 2]  # 12 small files: groups of 5, 5 and 2
    monkeypatch.setattr(ingest, "GROUP_FILES", 1)
    single = _ingest(tmp_path / "s.duckdb", logs)
    assert len(calls) == 3  # no groups of one
    for g, s in zip(grouped[:3], single[:3]):
        assert g == s
    assert grouped[3].as_dict() == single[3].as_dict()
    st = grouped[3]
    if failing:
        assert st.files == 12 and len(st.problems) == 1 and failing in st.problems[0]
        assert len(grouped[2]) == 11 and not any(f[0].endswith(failing) for f in grouped[2])
    else:
        assert st.files == 12 and not st.problems and len(grouped[2]) == 12
    assert st.iterations == 29 * len(grouped[2]) and len(grouped[0]) == st.iterations
    assert {e[5] for e in grouped[1]} >= {"checkpoint_saved", "traceback"}
