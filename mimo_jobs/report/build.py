"""build(): read the store, aggregate in SQL (the heavy part: medians over millions of iterations), then
apply the pure math of figures.py/triage.py per run and per study."""

from __future__ import annotations

from mimo_jobs.errors import MimoJobsError

import json
import math
from datetime import datetime, timezone

from mimo_jobs.contract import PHASES
from . import figures
from .model import ParityRow, Report, RunRow, StudyInfo, TriageRow
from .triage import EventRow, triage

OK_STATES = {"COMPLETED", "RUNNING", "PENDING", "NO DATA", "REQUEUED", "CONFIGURING", "COMPLETING"}
CURVE_POINTS = 400


class ReportError(MimoJobsError, ValueError):
    """Bad report request (unknown study, no runs at the baseline node count)."""


def _in_list(n: int) -> str:
    return "(" + ", ".join("?" * n) + ")" if n else "(NULL)"


def _values(rows: list[tuple], cols: str) -> tuple[str, list]:
    """An inline VALUES table (works on a read-only connection, unlike a temp table)."""
    if not rows:
        rows = [tuple([None] * (cols.count(",") + 1))]
    width = len(rows[0])
    sql = "(VALUES " + ", ".join("(" + ", ".join("?" * width) + ")" for _ in rows) + f") AS w({cols})"
    return sql, [x for r in rows for x in r]


def _layout(r: dict) -> str:
    if r.get("enc_dp") is None:
        return "-"
    enc = f"enc tp{r['enc_tp']} dp{r['enc_dp']}" + (f" pp{r['enc_pp']}" if (r["enc_pp"] or 1) > 1 else "")
    llm = f"llm tp{r['llm_tp']}" + (f" pp{r['llm_pp']}" if (r["llm_pp"] or 1) > 1 else "")
    llm += (f" ep{r['llm_ep']}" if (r["llm_ep"] or 1) > 1 else "") + f" dp{r['llm_dp']}"
    return f"{enc} | {llm}"


def _derive_state(
    reached: int | None, train_iters: int | None, kinds: set[str], end_reason: str | None
) -> str:
    if reached is not None and train_iters and reached >= train_iters:
        return "COMPLETED"
    for kind, state in (
        ("time_limit", "TIMEOUT"),
        ("node_fail", "NODE_FAIL"),
        ("preemption", "PREEMPTED"),
        ("cancelled", "CANCELLED"),
    ):
        if kind in kinds:
            return state
    if kinds & {
        "traceback",
        "oom",
        "segfault",
        "child_failed",
        "task_exit",
        "nccl_timeout",
        "gloo_timeout",
        "peer_lost",
    }:
        return "FAILED"
    if end_reason:
        r = end_reason.lower()
        if "complete" in r or r in ("done", "finished", "ok"):
            return "COMPLETED"
        if "time" in r:
            return "TIMEOUT"
        if "preempt" in r:
            return "PREEMPTED"
        return "FAILED"
    if reached is None and not kinds:
        return "NO DATA"
    return "INCOMPLETE"


def _gpu_name(start_msgs: list[str]) -> str | None:
    for m in start_msgs:
        try:
            d = json.loads(m)
        except (ValueError, TypeError):
            continue
        for src in (d.get("extras") or {}, d):
            for k in ("gpu", "device_name", "device"):
                v = src.get(k) if isinstance(src, dict) else None
                if isinstance(v, str) and v:
                    return v
    return None


def build(
    con,
    study: str | None = None,
    baseline_nodes: int | None = None,
    gpu: str | None = None,
    warmup_frac: float = 0.10,
    warmup_min: int = 1,
) -> Report:
    """The report for one study (or every study in the store when `study` is None)."""
    known = [r[0] for r in con.execute("SELECT DISTINCT study FROM runs ORDER BY 1").fetchall()]
    if study is not None and study not in known:
        raise ReportError(
            f"no study {study!r} in the store; known: {', '.join(known) or '(none: run ingest)'}"
        )
    names = [study] if study is not None else known
    cur = con.execute(
        f"""SELECT run_id, study, name, nodes, gpus_per_node, world, enc_tp, enc_pp, enc_dp, llm_tp,
                                 llm_pp, llm_ep, llm_dp, gbs, seq_length, model, accelerator, spec_json
                          FROM runs WHERE study IN {_in_list(len(names))} ORDER BY study, nodes NULLS LAST, name""",
        names,
    )
    cols = [d[0] for d in cur.description]
    runs = [dict(zip(cols, r)) for r in cur.fetchall()]
    ids = [r["run_id"] for r in runs]
    studies = {n: {"scaling": "strong", "baseline_nodes": None} for n in names}
    for n, sc, bn in con.execute(
        f"SELECT name, scaling, baseline_nodes FROM studies WHERE name IN {_in_list(len(names))}", names
    ).fetchall():
        studies[n] = {"scaling": sc or "strong", "baseline_nodes": bn}

    # The three scans of the big table below (spans, steady state, curves) are most of the report's time;
    # see _spans/_steady/_curves for how each avoids per-row work it does not need.
    whole = _covers_store(con, ids)
    span, activity = _spans(con, ids, whole)
    # The later scans go without a run filter also when the report's runs hold most of the rows: grouping
    # the few rows of other runs (then dropped) costs less than a string test on every row.
    unfiltered = whole or _mostly_ours(con, span)
    cut = {rid: figures.steady_cutoff(s[0], s[1], warmup_frac, warmup_min) for rid, s in span.items()}
    agg = _steady(con, cut, span, unfiltered)
    curves = _curves(con, span, unfiltered)

    # -- scheduler state (jobs table, written by submit), else derived from events and iterations
    jobs = {}
    for rid, job, state in con.execute(
        f"""SELECT run_id, job_id, state FROM jobs WHERE run_id IN {_in_list(len(ids))}
                QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY attempt DESC NULLS LAST,
                        submit_time DESC NULLS LAST, start_time DESC NULLS LAST, job_id DESC) = 1""",
        ids,
    ).fetchall():
        jobs[rid] = (job, state)
    for rid, job, t in con.execute(
        f"""SELECT run_id, job_id, max(time) FROM events WHERE run_id IN {_in_list(len(ids))}
              AND kind NOT IN ('start') GROUP BY run_id, job_id""",
        ids,
    ).fetchall():
        activity.setdefault(rid, []).append((t or datetime.min, str(job)))
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
            try:
                ends[(rid, job)] = str(
                    (json.loads(msg).get("extras") or {}).get("reason") or json.loads(msg).get("reason") or ""
                )
            except (ValueError, AttributeError):
                ends[(rid, job)] = ""
        else:
            events.setdefault((rid, job), []).append(EventRow(rank, node, t, kind, msg or "", src, ln))

    rows: list[RunRow] = []
    triage_rows: list[TriageRow] = []
    notes: list[str] = []
    from mimo_jobs.plan.presets import PRESETS, flops_per_sample

    for r in runs:
        rid = r["run_id"]
        s = span.get(rid)
        gpus = r["world"] or ((r["nodes"] or 0) * (r["gpus_per_node"] or 0)) or None
        gbs = r["gbs"] or (s[8] if s else None)
        last_job = jobs[rid][0] if rid in jobs else (max(activity[rid])[1] if rid in activity else None)
        evs = events.get((rid, last_job), []) if last_job else []
        if rid in jobs and jobs[rid][1]:
            state, state_src = str(jobs[rid][1]).split()[0], "jobs"
        else:
            state = _derive_state(
                s[1] if s else None,
                s[4] if s else None,
                {e.kind for e in evs},
                ends.get((rid, last_job)) if last_job else None,
            )
            state_src = "derived"
        row = RunRow(
            study=r["study"],
            run_id=rid,
            name=r["name"],
            nodes=r["nodes"],
            gpus=gpus,
            gbs=gbs,
            seq_length=r["seq_length"],
            model=r["model"],
            layout=_layout(r),
            state=state,
            state_source=state_src,
            iterations=s[1] if s else None,
            train_iters=s[4] if s else None,
            jobs=s[3] if s else 0,
            window_from=cut.get(rid),
        )
        a = agg.get(rid)
        if a and a[0] is not None and gbs:
            row.t_median_ms, row.t_mean_ms, row.t_std_ms, row.window_n = a[0], a[1], a[2], a[3]
            tp = figures.throughput(gbs, a[0], r["seq_length"], gpus)
            row.samples_per_s, row.tokens_per_s = tp.samples_per_s, tp.tokens_per_s
            row.samples_per_s_per_gpu, row.tokens_per_s_per_gpu = (
                tp.samples_per_s_per_gpu,
                tp.tokens_per_s_per_gpu,
            )
            ph = {p: v for p, v in zip(PHASES, a[4:]) if v is not None}
            total = sum(ph.values())
            row.phase_ms = ph
            row.phase_share = {p: v / total for p, v in ph.items()} if total > 0 else {}
            # MFU: only for GPU runs whose GPU model (dense BF16 peak) and model preset are known.
            peak = figures.peak_flops(gpu or _gpu_name(starts.get(rid, [])))
            preset = PRESETS.get(r["model"] or "")
            if r["accelerator"] == "cpu":
                row.mfu_note = "cpu run"
            elif preset is None or not r["seq_length"] or not gpus:
                row.mfu_note = "model FLOPs unknown"
            elif peak is None:
                row.mfu_note = "GPU peak unknown (pass --gpu H100|H200|A100)"
            else:
                spec = json.loads(r["spec_json"]) if r["spec_json"] else {}
                data = (spec.get("trainer") or {}).get("data") or {}
                img, how = figures.image_tokens_per_sample(
                    data, preset.encoder.patch_size, preset.encoder.image_size
                )
                fps = flops_per_sample(preset, r["seq_length"], int(round(img)))
                row.mfu = figures.mfu(fps, tp.samples_per_s, gpus, peak)
                row.mfu_note = f"image tokens/sample from {how}"
        if s:
            c = curves.get(rid)
            if c:  # the curve ends at the last iteration with a finite loss
                row.final_samples, row.final_loss = int(c[-1][0]), c[-1][1]
        if state not in OK_STATES:
            last_t = max((t for t, j in activity.get(rid, []) if j == last_job), default=None)
            v = triage(evs, gpus, row.iterations, None if last_t == datetime.min else last_t)
            triage_rows.append(
                TriageRow(
                    r["study"],
                    rid,
                    r["name"],
                    last_job,
                    state,
                    v.rank,
                    v.node,
                    v.kind,
                    v.reason,
                    v.time,
                    v.evidence,
                )
            )
            row.flags.append(f"{state.lower()}: {v.reason[:120]}")
        rows.append(row)

    # -- across node counts, per study
    infos: list[StudyInfo] = []
    parity_rows: list[ParityRow] = []
    for name in names:
        srows = [x for x in rows if x.study == name]
        with_data = [x for x in srows if x.t_median_ms is not None]
        scaling = studies[name]["scaling"]
        use_tokens = bool(with_data) and all(x.tokens_per_s_per_gpu is not None for x in with_data)
        metric = "tokens/s/GPU" if use_tokens else "samples/s/GPU"

        def perf(x: RunRow, use_tokens: bool = use_tokens) -> float | None:
            return x.tokens_per_s_per_gpu if use_tokens else x.samples_per_s_per_gpu

        n0 = baseline_nodes or studies[name]["baseline_nodes"]
        node_counts = sorted({x.nodes for x in with_data if x.nodes is not None})
        if baseline_nodes is not None and study is not None and baseline_nodes not in node_counts:
            raise ReportError(
                f"--baseline-nodes {baseline_nodes}: study {name!r} has no run with data at "
                f"{baseline_nodes} nodes; node counts with data: "
                f"{', '.join(map(str, node_counts)) or 'none'}"
            )
        if n0 not in node_counts:
            if n0 is not None:
                notes.append(
                    f"{name}: baseline {n0} nodes has no data; using {node_counts[0] if node_counts else '-'}"
                )
            n0 = node_counts[0] if node_counts else None
        base = [x for x in with_data if x.nodes == n0]
        p0 = _median([perf(x) for x in base])
        t0 = _median([x.t_median_ms for x in base])
        g0 = base[0].gbs if base else None
        for x in srows:
            if x.t_median_ms is None:
                continue
            x.efficiency = figures.efficiency(perf(x), p0)
            x.speedup = t0 / x.t_median_ms if t0 and scaling == "strong" else None
            cv = x.t_std_ms / x.t_mean_ms if x.t_std_ms is not None and x.t_mean_ms else None
            x.flags = (
                figures.scaling_flags(x.efficiency, x.nodes, n0, x.t_median_ms, t0, scaling, cv, x.gbs, g0)
                + x.flags
            )
        # loss parity at equal consumed samples against the (first) baseline run
        base_curve = curves.get(base[0].run_id) if base else None
        if base_curve:
            pts = figures.parity_points([curves.get(x.run_id, []) for x in srows if curves.get(x.run_id)])
            for x in srows:
                c = curves.get(x.run_id)
                if not c or x.run_id == base[0].run_id:
                    continue
                par = figures.loss_parity(c, base_curve, pts)
                x.loss_parity_rel = par.max_rel_diff
                if par.max_rel_diff is not None and par.max_rel_diff > figures.PARITY_TOLERANCE:
                    x.flags.append(f"loss differs from {n0} nodes by {par.max_rel_diff:.1%} at equal samples")
                parity_rows.append(
                    ParityRow(
                        name,
                        x.run_id,
                        x.name,
                        x.nodes,
                        par.samples,
                        par.loss,
                        par.baseline_loss,
                        par.max_abs_diff,
                        par.max_rel_diff,
                    )
                )
        infos.append(StudyInfo(name, scaling, n0, [x.run_id for x in base], metric))
    notes.insert(0, "per-GPU throughput divides by ALL GPUs of the job (encoder and LLM GPUs)")
    notes.insert(
        1,
        f"steady state: iterations after the first max({warmup_min}, {warmup_frac:.0%}) of each run's "
        "logged span; t = median (mean, std also shown)",
    )
    return Report(
        generated_at=datetime.now(timezone.utc).replace(tzinfo=None),
        studies=infos,
        runs=rows,
        triage=triage_rows,
        parity=parity_rows,
        curves=curves,
        notes=notes,
        params={
            "warmup_frac": warmup_frac,
            "warmup_min": warmup_min,
            "gpu": gpu,
            "efficiency_floor": figures.EFFICIENCY_FLOOR,
            "speedup_tolerance": figures.SPEEDUP_TOLERANCE,
            "parity_tolerance": figures.PARITY_TOLERANCE,
        },
    )


def _covers_store(con, ids: list[str]) -> bool:
    """True when the report covers every run of the store. The scans of `iterations` then need no per-row
    `run_id IN (...)` filter (a string test on millions of rows costs about as much as the aggregate
    itself); groups of runs outside `ids` (rows whose run is not in `runs`) are dropped after grouping."""
    return con.execute("SELECT count(*) FROM runs").fetchone()[0] == len(set(ids))


def _spans(con, ids: list[str], whole: bool) -> tuple[dict[str, tuple], dict[str, list[tuple]]]:
    """Per run: the span of the stitched curve (superseded rows are older attempts of re-run iterations),
    and each job's last activity (which job is the run's latest). One scan, grouped per (run, job)."""
    keep = set(ids)
    where = "" if whole else f"run_id IN {_in_list(len(ids))} AND "
    span: dict[str, tuple] = {}
    activity: dict[str, list[tuple]] = {}
    groups: dict[str, list[tuple]] = {}
    # (A job whose rows are all superseded is an older attempt: it can never be the latest job.)
    for row in con.execute(
        f"""SELECT run_id, job_id, max(time), min(iteration), max(iteration), count(*), max(train_iters),
                   max(gbs)
            FROM iterations WHERE {where}NOT coalesce(superseded, false)
            GROUP BY run_id, job_id""",
        [] if whole else ids,
    ).fetchall():
        if row[0] not in keep:
            continue
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
    return span, activity


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


def _steady(con, cut: dict[str, int], span: dict[str, tuple], unfiltered: bool) -> dict[str, tuple]:
    """Steady-state aggregates per run: median/mean/std/count of the iteration time over the window
    (iteration >= the run's cutoff) and the mean of each phase (numeric copies of `phases`).

    The runs that share the most common cutoff (in a usual study: all of them, or all but the failed ones)
    get a constant filter the scan applies itself; only the others are joined to their cutoffs on the
    string run_id (a join that, for every run, costs about as much as the aggregates)."""
    if not cut:
        return {}
    aggs = "median(i.elapsed_ms), avg(i.elapsed_ms), stddev_samp(i.elapsed_ms), count(*), " + ", ".join(
        f"avg(i.{p}_ms)" for p in PHASES
    )
    window = "NOT coalesce(i.superseded, false) AND i.elapsed_ms IS NOT NULL"
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


# At most this many distinct (step, phase) pairs go into the curves' prefilter (each is one modulo per row).
_PREFILTER_MAX = 8


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


def _median(vals: list[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return figures.stats(v).median if v else None
