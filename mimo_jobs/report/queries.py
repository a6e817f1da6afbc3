"""The report's reads from the store: the runs and studies, the aggregates over `iterations` (the heavy
part: medians over millions of rows, done in SQL) and the jobs and events that say how each run ended.

read() returns all of it as StoreData; build.py does the report math on that."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime

from mimo_jobs.contract.iteration import PHASES

from . import figures
from .triage import EventRow

CURVE_POINTS = 400
# At most this many distinct (step, phase) pairs go into the curves' prefilter (each is one modulo per row).
_PREFILTER_MAX = 8

# enc_*: the runs table's older one-encoder columns, kept in the report's run rows as stores have them (each
# module's sizes: run_modules)
_RUN_COLUMNS = """run_id, study, name, nodes, gpus_per_node, world, enc_tp, enc_pp, enc_dp, llm_tp, llm_pp,
    llm_ep, llm_dp, gbs, seq_length, model, accelerator, spec_json, colocated, repeat, pkg_version, git_sha"""


@dataclass
class StoreData:
    """What the report reads from the store, keyed by run_id (jobs' logs by (run_id, job_id))."""

    runs: list[dict]  # the `runs` table's rows, by study, nodes, name
    studies: dict[str, dict]  # study -> {"scaling", "baseline_nodes"}
    span: dict[str, tuple]  # see _spans
    activity: dict[str, list[tuple]]  # run -> [(last activity, job_id)] from iterations and events
    cut: dict[str, int]  # run -> first iteration of its steady-state window
    steady: dict[str, tuple]  # run -> (median, mean, std, count of the iteration time, mean of each phase,
    # then the token sums of TOKEN_AGGS)
    curves: dict[str, list[tuple[float, float]]]  # run -> downsampled [(consumed samples, loss)]
    jobs: dict[str, tuple]  # run -> (job_id, state) of its latest scheduler job
    events: dict[tuple[str, str], list[EventRow]]  # (run, job) -> its events, but start/end/checkpoints
    starts: dict[str, list[str]]  # run -> messages of its start events
    ends: dict[tuple[str, str], str]  # (run, job) -> the reason its end event gives
    nonfinite: dict[str, int] = field(default_factory=dict)  # run -> iterations with a NaN/Inf loss or grad
    # the runs a later attempt of their point superseded (store/attempts.py), left out of everything above:
    # (their `runs` row, the run id of the latest attempt, the state of their latest job)
    superseded: list[tuple[dict, str, str | None]] = field(default_factory=list)


def study_names(con) -> list[str]:
    """Every study that has runs in the store, sorted."""
    return [r[0] for r in con.execute("SELECT DISTINCT study FROM runs ORDER BY 1").fetchall()]


def read(con, names: list[str], warmup_frac: float, warmup_min: int) -> StoreData:
    """Everything the report needs about the runs of the studies `names`."""
    runs, superseded = _latest_attempts(con, _runs(con, names))
    studies = _studies(con, names)
    ids = [r["run_id"] for r in runs]
    # The three scans of the big table below (spans, steady state, curves) are most of the report's time;
    # see _spans/_steady/_curves for how each avoids per-row work it does not need.
    whole = _covers_store(con, ids)
    span, activity, nonfinite = _spans(con, ids, whole)
    # The later scans go without a run filter also when the report's runs hold most of the rows: grouping
    # the few rows of other runs (then dropped) costs less than a string test on every row.
    unfiltered = whole or _mostly_ours(con, span)
    cut = {rid: figures.steady_cutoff(s[0], s[1], warmup_frac, warmup_min) for rid, s in span.items()}
    steady = _steady(con, cut, span, unfiltered)
    curves = _curves(con, span, unfiltered)
    jobs = _latest_jobs(con, ids)
    _add_event_activity(con, ids, activity)
    events, starts, ends = _events(con, ids)
    return StoreData(
        runs, studies, span, activity, cut, steady, curves, jobs, events, starts, ends, nonfinite, superseded
    )


def _in_list(n: int) -> str:
    return "(" + ", ".join("?" * n) + ")" if n else "(NULL)"


def _values(rows: list[tuple], cols: str) -> tuple[str, list]:
    """An inline VALUES table (works on a read-only connection, unlike a temp table)."""
    if not rows:
        rows = [tuple([None] * (cols.count(",") + 1))]
    width = len(rows[0])
    sql = "(VALUES " + ", ".join("(" + ", ".join("?" * width) + ")" for _ in rows) + f") AS w({cols})"
    return sql, [x for r in rows for x in r]


def _runs(con, names: list[str]) -> list[dict]:
    """The runs of the studies `names`, by study, node count (unknown last) and name."""
    cur = con.execute(
        f"""SELECT {_RUN_COLUMNS} FROM runs WHERE study IN {_in_list(len(names))}
            ORDER BY study, nodes NULLS LAST, name""",
        names,
    )
    cols = [d[0] for d in cur.description]
    runs = [dict(zip(cols, r)) for r in cur.fetchall()]
    from mimo_jobs.store.modules import modules_of

    mods = modules_of(con, [r["run_id"] for r in runs])
    for r in runs:
        r["modules"] = mods.get(r["run_id"], [])
    return runs


def _latest_attempts(con, runs: list[dict]) -> tuple[list[dict], list[tuple[dict, str, str | None]]]:
    """The latest attempt of each point among `runs`, and the runs a later attempt superseded (with the
    run id that did and the state of their own latest job)."""
    from mimo_jobs.store.attempts import superseded

    later = superseded(con)
    gone = [r for r in runs if r["run_id"] in later]
    states = _latest_jobs(con, [r["run_id"] for r in gone]) if gone else {}
    return (
        [r for r in runs if r["run_id"] not in later],
        [(r, later[r["run_id"]], (states.get(r["run_id"]) or (None, None))[1]) for r in gone],
    )


def _studies(con, names: list[str]) -> dict[str, dict]:
    """Each study's scaling kind (strong unless the store says) and stored baseline node count."""
    studies = {n: {"scaling": "strong", "baseline_nodes": None} for n in names}
    for n, sc, bn in con.execute(
        f"SELECT name, scaling, baseline_nodes FROM studies WHERE name IN {_in_list(len(names))}", names
    ).fetchall():
        studies[n] = {"scaling": sc or "strong", "baseline_nodes": bn}
    return studies


def _latest_jobs(con, ids: list[str]) -> dict[str, tuple]:
    """The scheduler's (job_id, state) of each run's latest job (jobs table, written by submit)."""
    jobs = {}
    for rid, job, state in con.execute(
        f"""SELECT run_id, job_id, state FROM jobs WHERE run_id IN {_in_list(len(ids))}
                QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY attempt DESC NULLS LAST,
                        submit_time DESC NULLS LAST, start_time DESC NULLS LAST, job_id DESC) = 1""",
        ids,
    ).fetchall():
        jobs[rid] = (job, state)
    return jobs


def _add_event_activity(con, ids: list[str], activity: dict[str, list[tuple]]) -> None:
    """Add each job's last event (but its start) to `activity`: a job may log after its last iteration."""
    for rid, job, t in con.execute(
        f"""SELECT run_id, job_id, max(time) FROM events WHERE run_id IN {_in_list(len(ids))}
              AND kind NOT IN ('start') GROUP BY run_id, job_id""",
        ids,
    ).fetchall():
        activity.setdefault(rid, []).append((t or datetime.min, str(job)))


def _end_reason(msg: str) -> str:
    """The reason an end event's message gives ("" when none or unreadable)."""
    try:
        return str((json.loads(msg).get("extras") or {}).get("reason") or json.loads(msg).get("reason") or "")
    except (ValueError, AttributeError):
        return ""


def _events(con, ids: list[str]) -> tuple[dict, dict, dict]:
    """The runs' events in time order: per (run, job) the events triage reads, per run the start
    messages, per (run, job) the end reason. Checkpoint events are left out."""
    events: dict[tuple[str, str], list[EventRow]] = {}
    starts: dict[str, list[str]] = {}
    ends: dict[tuple[str, str], str] = {}
    for rid, job, rank, node, t, kind, msg, src, ln in con.execute(
        f"""SELECT run_id, job_id, rank, node, time, kind, message, source_file, line_no FROM events
                WHERE run_id IN {_in_list(len(ids))} AND kind NOT IN ('checkpoint_saved', 'checkpoint_loaded')
                ORDER BY time NULLS LAST, source_file, line_no""",
        ids,
    ).fetchall():
        if kind == "start":
            starts.setdefault(rid, []).append(msg)
        elif kind == "end":
            ends[(rid, job)] = _end_reason(msg)
        else:
            events.setdefault((rid, job), []).append(EventRow(rank, node, t, kind, msg or "", src, ln))
    return events, starts, ends


def job_events(con, keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[EventRow]]:
    """(run id, job id) -> the job's events that triage reads (as the report reads them), for `keys`."""
    found = _events(con, sorted({rid for rid, _ in keys}))[0]
    return {k: found[k] for k in keys if k in found}


def _covers_store(con, ids: list[str]) -> bool:
    """True when the report covers every run of the store. The scans of `iterations` then need no per-row
    `run_id IN (...)` filter (a string test on millions of rows costs about as much as the aggregate
    itself); groups of runs outside `ids` (rows whose run is not in `runs`) are dropped after grouping."""
    return con.execute("SELECT count(*) FROM runs").fetchone()[0] == len(set(ids))


def _spans(
    con, ids: list[str], whole: bool
) -> tuple[dict[str, tuple], dict[str, list[tuple]], dict[str, int]]:
    """Per run: the span of the stitched curve (superseded rows are older attempts of re-run iterations),
    each job's last activity (which job is the run's latest), and how many of its iterations had a NaN/Inf
    loss or gradient (Megatron's "number of nan iterations"). One scan, grouped per (run, job)."""
    keep = set(ids)
    where = "" if whole else f"run_id IN {_in_list(len(ids))} AND "
    span: dict[str, tuple] = {}
    activity: dict[str, list[tuple]] = {}
    groups: dict[str, list[tuple]] = {}
    nonfinite: dict[str, int] = {}
    # (A job whose rows are all superseded is an older attempt: it can never be the latest job.)
    for row in con.execute(
        f"""SELECT run_id, job_id, max(time), min(iteration), max(iteration), count(*), max(train_iters),
                   max(gbs), sum(coalesce(nan, 0))
            FROM iterations WHERE {where}NOT coalesce(superseded, false)
            GROUP BY run_id, job_id""",
        [] if whole else ids,
    ).fetchall():
        if row[0] not in keep:
            continue
        if row[8]:
            nonfinite[row[0]] = nonfinite.get(row[0], 0) + int(row[8])
        activity.setdefault(row[0], []).append((row[2] or datetime.min, str(row[1])))
        if row[5]:
            groups.setdefault(row[0], []).append(row[3:])
    for rid, gs in groups.items():
        # (min iteration, max iteration, rows, jobs, train_iters, final loss, final samples, -, gbs); the
        # final loss/samples come from the end of the loss curve (cheaper than arg_max over all rows)
        span[rid] = (
            min(g[0] for g in gs),
            max(g[1] for g in gs),
            sum(g[2] for g in gs),
            len(gs),
            max((g[3] for g in gs if g[3] is not None), default=None),
            None,
            None,
            None,
            max((g[4] for g in gs if g[4] is not None), default=None),
        )
    return span, activity, nonfinite


def _majority(key: dict[str, object], rows: dict[str, int]) -> tuple[object, list[str]]:
    """The value of `key` that the most rows share (ties: the larger value), and the runs that have it."""
    weight: dict[object, int] = {}
    for rid, k in key.items():
        weight[k] = weight.get(k, 0) + (rows.get(rid) or 0)
    best = max(weight, key=lambda k: (weight[k], k))
    return best, [rid for rid, k in key.items() if k == best]


def _mostly_ours(con, span: dict[str, tuple]) -> bool:
    """True when at most 3 in 5 rows of the store are other runs'. Measured on 5M rows: `run_id IN (100
    names)` costs ~0.8x the steady-state aggregates and ~0.6x the curves' scan per row, so grouping the
    other runs' rows too is cheaper up to ~1.5 of them per row of ours."""
    total = con.execute("SELECT count(*) FROM iterations").fetchone()[0]
    return 2 * total <= 5 * sum(s[2] for s in span.values())


def _scope(ids: list[str], unfiltered: bool) -> tuple[str, list]:
    """A run filter for a scan of iterations, or none (groups of other runs are dropped after grouping)."""
    return ("", []) if unfiltered else (f"i.run_id IN {_in_list(len(ids))} AND ", list(ids))


# Over the window's iterations whose carried tokens were counted: their time (ms), the carried, loss-bearing
# and image tokens, and how many there are (a window counted in part gives rates over that part only).
_COUNTED = "FILTER (WHERE i.carried_tokens IS NOT NULL)"
TOKEN_AGGS = ", ".join(
    f"{agg} {_COUNTED}"
    for agg in (
        "sum(i.elapsed_ms)",
        "sum(i.carried_tokens)",
        "sum(i.tokens)",
        "sum(i.image_tokens)",
        "count(*)",
    )
)


# After TOKEN_AGGS: what the run's own log says over the window (report/external.py): the median of its
# TFLOP/s/GPU and the mean of its MoE load-balancing loss.
LOGGED_AGGS = "median(i.tflops_per_gpu), avg(i.moe_aux_loss)"
LOGGED_AT = 4 + len(PHASES) + 5  # where they start in a `steady` tuple


def _steady(con, cut: dict[str, int], span: dict[str, tuple], unfiltered: bool) -> dict[str, tuple]:
    """Steady-state aggregates per run: median/mean/std/count of the iteration time over the window
    (iteration >= the run's cutoff), the mean of each phase (numeric copies of `phases`), then TOKEN_AGGS.

    The runs that share the most common cutoff (in a usual study: all of them, or all but the failed ones)
    get a constant filter the scan applies itself; only the others are joined to their cutoffs on the
    string run_id (a join that, for every run, costs about as much as the aggregates)."""
    if not cut:
        return {}
    aggs = "median(i.elapsed_ms), avg(i.elapsed_ms), stddev_samp(i.elapsed_ms), count(*), " + ", ".join(
        f"avg(i.{p}_ms)" for p in PHASES
    )
    aggs += ", " + TOKEN_AGGS + ", " + LOGGED_AGGS
    # a time that is not finite and positive measured nothing (a clock that stepped, a bad log line): it is
    # left out, so a run with no other times has no figures ("-") rather than infinite throughput
    window = "NOT coalesce(i.superseded, false) AND isfinite(i.elapsed_ms) AND i.elapsed_ms > 0"
    c, major = _majority(cut, {rid: s[2] for rid, s in span.items()})
    scope, params = _scope(major, unfiltered)
    keep = set(major)
    out = {
        row[0]: row[1:]
        for row in con.execute(
            f"""SELECT i.run_id, {aggs} FROM iterations i
                WHERE {scope}{window} AND i.iteration >= {int(c)} GROUP BY i.run_id""",
            params,
        ).fetchall()
        if row[0] in keep
    }
    rest = [(rid, co) for rid, co in cut.items() if rid not in keep]
    if rest:
        vals, params = _values(rest, "run_id, cutoff")
        for row in con.execute(
            f"""SELECT i.run_id, {aggs} FROM iterations i JOIN {vals} ON i.run_id = w.run_id
                WHERE {window} AND i.iteration >= w.cutoff GROUP BY i.run_id""",
            params,
        ).fetchall():
            out[row[0]] = row[1:]
    return out


def _curves(con, span: dict[str, tuple], unfiltered: bool) -> dict[str, list[tuple[float, float]]]:
    """Loss curves, downsampled in SQL to about CURVE_POINTS per run: iterations i0, i0 + step, ... and the
    last one i1 (step = ceil(span / CURVE_POINTS)), each with a finite loss.

    As for the steady state: the runs on the most common grid (i0, i1, step) are selected by a constant
    condition; the others by a join to their grids, after a prefilter on the iteration alone."""
    if not span:
        return {}
    grid = {rid: (s[0], s[1], max(1, math.ceil((s[1] - s[0] + 1) / CURVE_POINTS))) for rid, s in span.items()}
    x = "coalesce(i.consumed_samples, i.iteration * i.gbs, i.iteration)::DOUBLE"
    # one row per run with its points as two lists: ~3x less Python work than a row per point
    points = f"list({x} ORDER BY i.iteration), list(i.loss ORDER BY i.iteration)"
    finite = "NOT coalesce(i.superseded, false) AND i.loss IS NOT NULL AND NOT isnan(i.loss)"
    (i0, i1, st), major = _majority(grid, {rid: s[2] for rid, s in span.items()})
    scope, params = _scope(major, unfiltered)
    keep = set(major)
    found = {
        rid: list(zip(xs, ys))
        for rid, xs, ys in con.execute(
            f"""SELECT i.run_id, {points} FROM iterations i
                WHERE {scope}((i.iteration - {int(i0)}) % {int(st)} = 0 OR i.iteration = {int(i1)})
                  AND {finite}
                GROUP BY i.run_id""",
            params,
        ).fetchall()
        if rid in keep
    }
    rest = [(rid, *g) for rid, g in grid.items() if rid not in keep]
    if rest:
        # A prefilter on the iteration alone that every selected row passes ((it - i0) % step = 0 <=>
        # it % step = i0 % step, for it >= i0 >= 0): the scan drops ~99% of the rows before the join,
        # which then only checks the exact per-run condition on the few left.
        pairs = sorted({(st, i0 % st) for _, i0, _, st in rest})
        pre = ""
        if len(pairs) <= _PREFILTER_MAX and all(i0 >= 0 for _, i0, _, _ in rest):
            ends = ", ".join(str(int(i1)) for i1 in sorted({i1 for _, _, i1, _ in rest}))
            pre = "(" + " OR ".join(f"i.iteration % {int(st)} = {int(r)}" for st, r in pairs)
            pre += f" OR i.iteration IN ({ends})) AND "  # first: the most selective test
        vals, params = _values(rest, "run_id, i0, i1, step")
        for rid, xs, ys in con.execute(
            f"""SELECT i.run_id, {points} FROM iterations i JOIN {vals} ON i.run_id = w.run_id
                WHERE {pre}{finite} AND ((i.iteration - w.i0) % w.step = 0 OR i.iteration = w.i1)
                GROUP BY i.run_id""",
            params,
        ).fetchall():
            found[rid] = list(zip(xs, ys))
    return {rid: found[rid] for rid in sorted(found)}  # in run_id order, as ORDER BY run_id gave them


def job_seconds(con, ids: list[str]) -> dict[str, tuple[float, int, int]]:
    """Per run, over its jobs that started and ended (first attempts, retries and requeues alike): the summed
    elapsed seconds, the jobs counted, and the jobs left out (still running or never started)."""
    out = {}
    for rid, secs, done, left in con.execute(
        f"""SELECT run_id,
                   sum(epoch(end_time) - epoch(start_time)) FILTER (WHERE end_time >= start_time),
                   count(*) FILTER (WHERE end_time >= start_time),
                   count(*) FILTER (WHERE end_time IS NULL OR start_time IS NULL OR end_time < start_time)
            FROM jobs WHERE run_id IN {_in_list(len(ids))} GROUP BY run_id""",
        ids,
    ).fetchall():
        out[rid] = (float(secs or 0.0), int(done), int(left))
    return out


def carried_totals(con, ids: list[str]) -> dict[str, int]:
    """Per run: the carried tokens of all its iterations (the latest attempt of each), where counted."""
    return dict(
        con.execute(
            f"""SELECT run_id, sum(carried_tokens) FROM iterations
                WHERE run_id IN {_in_list(len(ids))} AND NOT coalesce(superseded, false)
                  AND carried_tokens IS NOT NULL GROUP BY run_id""",
            ids,
        ).fetchall()
    )


def rank_memory(con, ids: list[str]) -> list[dict]:
    """Every rank's measured memory facts of the runs `ids` (the rank_memory table), by run, rank, module."""
    if not ids:
        return []
    cur = con.execute(
        f"""SELECT * FROM rank_memory WHERE run_id IN {_in_list(len(ids))} ORDER BY run_id, rank, module""",
        ids,
    )
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def logged_extras(con, cut: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per run of `cut` (run -> first iteration of its window): the mean over the window of every number
    its iteration lines carry beyond the columns (the extras JSON: top-level numbers and the losses without
    a column of their own). Only the runs given are read: the caller passes the runs of other programs."""
    if not cut:
        return {}
    vals, params = _values(list(cut.items()), "run_id, cutoff")
    out: dict[str, dict[str, float]] = {}
    for rid, key, mean in con.execute(
        f"""WITH x AS (
                SELECT i.run_id, i.extras::JSON AS e FROM iterations i JOIN {vals} ON i.run_id = w.run_id
                WHERE i.iteration >= w.cutoff AND i.extras IS NOT NULL AND NOT coalesce(i.superseded, false)),
            kv AS (
                SELECT run_id, k, e->>k AS v FROM (SELECT run_id, e, unnest(json_keys(e)) AS k FROM x)
                WHERE k <> 'losses'
                UNION ALL
                SELECT run_id, k, e->'losses'->>k FROM (
                    SELECT run_id, e, unnest(json_keys(e->'losses')) AS k FROM x
                    WHERE json_type(e->'losses') = 'OBJECT'))
            SELECT run_id, k, avg(TRY_CAST(v AS DOUBLE)) FROM kv GROUP BY run_id, k
            HAVING count(TRY_CAST(v AS DOUBLE)) > 0 ORDER BY run_id, k""",
        params,
    ).fetchall():
        if mean is not None and math.isfinite(mean):
            out.setdefault(rid, {})[key] = mean
    return out


def phase_means(con, cut: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per run of `cut` (run -> first iteration of its window): the mean over the window of every phase its
    iteration records time (the `phases` JSON, whatever its keys: a module's `<module>_fwd` and `_bwd`
    included, report/encphases.py)."""
    if not cut:
        return {}
    vals, params = _values(list(cut.items()), "run_id, cutoff")
    out: dict[str, dict[str, float]] = {}
    for rid, key, mean in con.execute(
        f"""WITH x AS (
                SELECT i.run_id, i.phases::JSON AS e FROM iterations i JOIN {vals} ON i.run_id = w.run_id
                WHERE i.iteration >= w.cutoff AND i.phases IS NOT NULL AND NOT coalesce(i.superseded, false)
                  AND json_type(i.phases::JSON) = 'OBJECT')
            SELECT run_id, k, avg(TRY_CAST(e->>k AS DOUBLE)) FROM (
                SELECT run_id, e, unnest(json_keys(e)) AS k FROM x)
            GROUP BY run_id, k HAVING count(TRY_CAST(e->>k AS DOUBLE)) > 0 ORDER BY run_id, k""",
        params,
    ).fetchall():
        if mean is not None and math.isfinite(mean):
            out.setdefault(rid, {})[key] = mean
    return out
