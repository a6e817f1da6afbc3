"""The `run_modules` table: one row per encoder module of a run (its name, kind, sizes and ranks), and the one
reader every command that shows a run's encoder layout calls (`modules_of`, `layout_text`).

A store written before the table existed (schema 7 and older) kept one encoder in `runs.enc_tp/enc_pp/
enc_dp`: migration copies those into the table as the module `vision`, and a read-only copy of such a store
(no migration) is read from the same columns, so every run keeps its layout however old its store.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.contract.modules import VISION


@dataclass(frozen=True)
class ModuleRow:
    """One encoder module of a run as the store keeps it."""

    module: str
    position: int  # rank order among the run's encoders (0 first)
    kind: str | None  # the encoder's modality (image, audio); None when the run's model is not known
    tp: int
    pp: int
    dp: int
    ranks: int  # GPUs the module runs on (colocated: every rank of the run)
    rank_start: int | None = None  # its first rank (heterogeneous: modules in order, then the LLM)
    rank_end: int | None = None  # exclusive


COLUMNS = ("module", "position", "kind", "tp", "pp", "dp", "ranks", "rank_start", "rank_end")


def record_modules(con, run_id: str, modules) -> None:
    """The run's encoder modules (ModuleRow or its fields as a mapping, ...), replacing what the store held."""
    con.execute("DELETE FROM run_modules WHERE run_id = ?", [run_id])
    for m in modules:
        m = m if isinstance(m, ModuleRow) else ModuleRow(**m)
        con.execute(
            f"INSERT INTO run_modules (run_id, {', '.join(COLUMNS)}) VALUES (?{', ?' * len(COLUMNS)})",
            [run_id, *(getattr(m, c) for c in COLUMNS)],
        )


# Runs whose encoder kept its sizes only in runs.enc_* (schema 7 and older): the module vision.
FROM_OLD_COLUMNS = """SELECT r.run_id, 'vision', 0, NULL, r.enc_tp, r.enc_pp, r.enc_dp,
        CASE WHEN r.colocated THEN r.world ELSE r.enc_tp * r.enc_pp * r.enc_dp END,
        0, CASE WHEN r.colocated THEN r.world ELSE r.enc_tp * r.enc_pp * r.enc_dp END
    FROM runs r
    WHERE r.enc_tp IS NOT NULL AND r.enc_pp IS NOT NULL AND r.enc_dp IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM run_modules m WHERE m.run_id = r.run_id)"""


def backfill(con) -> None:
    """Migration to the module table: every run known only by runs.enc_* gets its module row."""
    con.execute(f"INSERT INTO run_modules (run_id, {', '.join(COLUMNS)}) {FROM_OLD_COLUMNS}")


def modules_of(con, run_ids: list[str] | None = None) -> dict[str, list[ModuleRow]]:
    """run id -> its encoder modules in rank order (all runs, or those of `run_ids`); a run of an older
    store without module rows is read from runs.enc_*. A run with no known encoder layout is absent."""
    where = "" if run_ids is None else f" WHERE run_id IN ({', '.join('?' * len(run_ids))})"
    args = [] if run_ids is None else list(run_ids)
    if run_ids is not None and not run_ids:
        return {}
    rows = con.execute(
        f"""SELECT run_id, {", ".join(COLUMNS)} FROM run_modules{where}
            UNION ALL SELECT * FROM ({FROM_OLD_COLUMNS}){where}
            ORDER BY run_id, position""",
        args + args,
    ).fetchall()
    out: dict[str, list[ModuleRow]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(ModuleRow(*r[1:]))
    return out


def layout_text(modules: list[ModuleRow]) -> str:
    """The encoders of a run as report and status show them: `enc tp1 dp8` for the one encoder named vision,
    else each module by its name, `vision tp1 dp4 | audio tp2 dp2` (pp where not 1; what `ingest --layout`
    reads back); "-" when unknown."""
    if not modules:
        return "-"

    def sizes(m: ModuleRow) -> str:
        return f"tp{m.tp} dp{m.dp}" + (f" pp{m.pp}" if (m.pp or 1) > 1 else "")

    if len(modules) == 1 and modules[0].module == VISION:
        return "enc " + sizes(modules[0])
    return " | ".join(f"{m.module} {sizes(m)}" for m in modules)
