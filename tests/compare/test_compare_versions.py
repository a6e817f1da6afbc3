"""`mimo-jobs compare`: the demo study ingested into two stores under two code versions (the versions set
here, as a second checkout would record them) compares as equal, with both versions shown in every format;
with one run's iteration times inflated by a known factor in OTHER, exactly that run is a regression. The factor
is twice the noise the tool itself measures for that run (at least 1.5x): on a busy machine the demo's own
iteration times can spread by tens of percent, and an inflation inside that spread is rightly no regression."""

from __future__ import annotations

import csv
import io
import json
import shutil

import duckdb
import pytest

from helpers.demo_runs import demo_store
from helpers.submit import cli

pytestmark = pytest.mark.slow
SLOW_RUN = "1n-e1x2-l1x1x2-g6"


def _versioned(src, dst, version: str, sha: str, inflate: str | None = None, factor: float = 1.0):
    shutil.copy(src, dst)
    con = duckdb.connect(str(dst))
    try:
        con.execute("UPDATE runs SET pkg_version = ?, git_sha = ?", [version, sha])
        if inflate:
            con.execute(
                "UPDATE iterations SET elapsed_ms = elapsed_ms * ? WHERE run_id IN "
                "(SELECT run_id FROM runs WHERE name = ?)",
                [factor, inflate],
            )
    finally:
        con.close()
    return dst


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    db, _ = demo_store(tmp_path_factory)
    d = tmp_path_factory.mktemp("versions")
    before = _versioned(db, d / "before.duckdb", "0.9.0", "a" * 40)
    after = _versioned(db, d / "after.duckdb", "1.0.0", "b" * 40)
    p = _compare(before, after, "json")
    assert p.returncode == 0, p.stdout + p.stderr
    (noise,) = [r["noise"] for r in json.loads(p.stdout)["rows"] if r["base_run"] == SLOW_RUN]
    factor = max(1.5, 1 + 2 * noise)
    slower = _versioned(db, d / "slower.duckdb", "1.0.1", "c" * 40, inflate=SLOW_RUN, factor=factor)
    return before, after, slower, factor


def _compare(base, other, form: str):
    return cli("compare", "cpu_local", "cpu_local", "--db", base, "--other-db", other, "--format", form)


def test_two_versions_of_the_same_runs_compare_equal(stores):
    before, after, _, _ = stores
    p = _compare(before, after, "json")
    assert p.returncode == 0, p.stdout + p.stderr
    v = json.loads(p.stdout)
    assert len(v["rows"]) == 4 and v["unmatched"] == []
    for r in v["rows"]:
        assert r["base_run"] == r["other_run"]
        assert (r["base_version"], r["other_version"]) == ("0.9.0 " + "a" * 12, "1.0.0 " + "b" * 12)
        assert r["time_ratio"] == pytest.approx(1.0) and r["throughput_ratio"] == pytest.approx(1.0)
        assert r["loss_max_rel_diff"] == pytest.approx(0.0, abs=1e-12)
        assert r["regressions"] == [] and r["metric"] == "tokens/s/GPU"
    # the versions are columns in every format
    for form in ("table", "md", "html", "csv"):
        out = _compare(before, after, form).stdout
        assert "0.9.0 aaaaaaaaaaaa" in out and "1.0.0 bbbbbbbbbbbb" in out, form
    rows = list(csv.DictReader(io.StringIO(_compare(before, after, "csv").stdout)))
    assert {r["other_version"] for r in rows} == {"1.0.0 " + "b" * 12}


def test_an_inflated_run_is_the_one_regression(stores):
    before, _, slower, factor = stores
    p = _compare(before, slower, "json")
    assert p.returncode == 1, p.stdout + p.stderr  # a regression fails the command (CI can gate on it)
    v = json.loads(p.stdout)
    bad = {r["other_run"]: r for r in v["rows"] if r["regressions"]}
    assert list(bad) == [SLOW_RUN]
    assert bad[SLOW_RUN]["time_ratio"] == pytest.approx(factor, rel=1e-9)
    assert bad[SLOW_RUN]["throughput_ratio"] == pytest.approx(1 / factor, rel=1e-9)
    table = _compare(before, slower, "table").stdout
    assert f"1 of 4 matched runs regressed beyond the noise: {SLOW_RUN}" in table
