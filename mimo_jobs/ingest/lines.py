"""What a candidate line of a log means: an iteration row, an event, part of a traceback or of torchrun's
"Root Cause" summary. One LineHandler per file; either scanner (readers) hands it the file's candidate lines
in order, and it stages rows (staging.Stage).
"""

from __future__ import annotations

import json
from datetime import datetime

from . import events, iterline
from .events import Event, TracebackTracker
from .origin import Origin, PathInfo, split_origin, srun_label
from .readers import FileState
from .runs import RunCtx
from .staging import measured_time, storable_int
from .timestamps import find_time, store_text

TRACEBACK = "Traceback (most recent call last)"
ROOT_CAUSE = "Root Cause (first observed failure)"
_LAUNCHER_WORDS = ("slurmstepd:", "srun:")


class LineHandler:
    """Turns one log's candidate lines into staged iterations and events. Only lines holding a trigger
    (events.ALL_TRIGGERS) ever reach it; with the compiled scanner most iteration lines do not either."""

    def __init__(
        self, st: FileState, ctx: RunCtx, job: str, pinfo: PathInfo, stage, src: str, want_iters: bool
    ) -> None:
        self.st, self.ctx, self.job, self.pinfo, self.stage, self.src = st, ctx, job, pinfo, stage, src
        self.want_iters = want_iters  # False: metrics.jsonl carries the run's iterations
        self.tracker = TracebackTracker()
        self.base_attempt = pinfo.attempt or 0
        stage.log_const = (ctx.run_id, job, src)
        # an entry of torchrun's summary being read, [line_no, kind, field lines]: the "Root Cause" entry
        # (child_failed) or one of its "Failures:" list (child_failed_other)
        self._entry: list | None = None
        # an iteration line of an srun --label log cut before its closing '|', waiting for the rest: (task,
        # head, line, line number). Its rest is either the very next line without a label (a terminal
        # wrapped the line and a paste kept the wrap: srun labels every line it writes, so an unlabelled
        # line right after a cut one is its wrap) or the next line of that task (srun split a long line
        # into two labelled lines; other tasks' lines may come between). Both scanners hand over the line
        # after a cut one whatever it holds (wants_next), and any later candidate line.
        self._cut: tuple[int, tuple, str, int] | None = None
        self._seen = 0  # the number of the last line handed over
        self._resume(st.open_blocks)

    def fast(self) -> bool:
        """Whether iteration lines may skip the origin/traceback bookkeeping (the C scanner's fast mode).
        Not while a cut line waits: every candidate line must come here to be joined to it or end it."""
        return not self.tracker.pending and self._entry is None and self._cut is None

    def wants_next(self) -> bool:
        """Whether the next line of the file must be handed over whatever it holds: the line after a cut
        iteration line may be its wrapped rest, which need hold no trigger."""
        return self._cut is not None and self._cut[3] == self._seen

    def line(self, line_no: int, line: str) -> None:
        """One candidate line (1-based number, no newline), or the line after a cut one (wants_next)."""
        after_cut = self.wants_next()
        self._seen = line_no
        if self._continued(line_no, line) or self._fast_iteration(line_no, line):
            return
        if after_cut and not events.holds_trigger(line):
            return  # handed over only as a cut line's possible rest: nothing else to read in it
        origin, body = split_origin(line)
        if body.startswith(_LAUNCHER_WORDS):
            origin = Origin()  # srun labels what slurmstepd and srun print too: the label is no writer
        if events.is_summary_field(body):
            self._summary_field(line_no, body)
        key = (origin.task, origin.local_rank, origin.rank)
        if self.tracker.active(key) and TRACEBACK not in body:
            done = self.tracker.feed(key, body)
            if done:
                self._emit(origin, done[0], done[1])
            if body[:1] in (" ", "\t") and self.tracker.active(key):
                return  # a frame of the open traceback
        if iterline.ITERATION_TRIGGER in body:
            head = iterline.iteration_head(body)
            if head is not None:
                self._iteration(head, body, line_no)
                return
        if TRACEBACK in body:
            if not self.tracker.active(key):
                lt = self._last_time()
                self.tracker.start(key, line_no, find_time(body, lt.year if lt else None) or lt)
            return
        if ROOT_CAUSE in body:
            if self._entry is not None:
                self._finish_entry()
            self._entry = [line_no, "child_failed", []]
            return
        lt = self._last_time()
        for ev in events.classify_line(body, lt.year if lt else None):
            self._emit(origin, line_no, ev)

    def finish(self) -> None:
        """End of the file's complete lines: blocks still open become events, and are kept in the file's
        state: if the file grows, the next ingest goes on with them and replaces those events. A cut
        iteration line still waiting for its rest is a garbled line."""
        self._end_cut()
        tracebacks = self.tracker.state()
        self.st.open_blocks = (
            {"tracebacks": tracebacks, "entry": self._entry} if tracebacks or self._entry else None
        )
        if self._entry is not None:
            self._finish_entry()
        for key, ln, ev in self.tracker.flush():
            self._emit(Origin(*key), ln, ev)  # the key is (task, local rank, rank) of its lines' prefixes

    def _resume(self, blocks: dict | None) -> None:
        """Go on with the blocks the last ingest left open; the events it wrote for them are replaced."""
        if not blocks:
            return
        self.tracker.restore(blocks.get("tracebacks") or [])
        self._entry = blocks.get("entry")
        starts = [t[1] for t in blocks.get("tracebacks") or []]
        self.stage.replace_events(starts + ([self._entry[0]] if self._entry else []))

    # ------------------------------------------------------------------------------------- iterations

    def _fast_iteration(self, line_no: int, line: str) -> bool:
        """The bulk of a big log: an iteration line needs no origin (the head regex skips prefixes)."""
        if not (self.fast() and iterline.ITERATION_TRIGGER in line):
            return False
        head = iterline.iteration_head(line)
        if head is None:
            return False
        self._iteration(head, line, line_no)
        return True

    def _continued(self, line_no: int, line: str) -> bool:
        """Whether `line` is the rest of the waiting cut line (then the joined line is handled): the very
        next line without a label (a wrap), or the next line of the same task (an srun split). A line of the
        same task that is not ends the wait (the cut line is garbled); other lines pass."""
        if self._cut is None:
            return False
        task, head, cut, cut_no = self._cut
        label = srun_label(line)
        if label is None:
            if line_no != cut_no + 1 or not _is_rest(line):
                return False
            rest = line
        elif label[0] != task:
            return False
        elif not _is_rest(label[1]):
            self._end_cut()
            return False
        else:
            rest = label[1]
        self._cut = None
        self._iteration(head, cut + rest, line_no, joinable=False)
        return True

    def _end_cut(self) -> None:
        if self._cut is not None:
            _, head, cut, line_no = self._cut
            self._cut = None
            self._iteration(head, cut, line_no, joinable=False)

    def _iteration(self, head: tuple, text: str, line_no: int, joinable: bool = True) -> None:
        it, total, ts, end = head
        st = self.st
        if joinable and self.want_iters and not text[end:].rstrip().endswith("|"):
            label = srun_label(text)
            if label is not None:  # srun split it or a terminal wrapped it: its rest may follow (_continued)
                self._end_cut()
                self._cut = (label[0], head, text, line_no)
                return
        if storable_int(it, "INTEGER") is None:
            st.bad += 1  # an iteration number the store cannot hold: a garbled line
            return
        if ts:
            try:
                datetime.fromisoformat(ts)
            except ValueError:  # no such calendar time (2026-02-30): the line has no usable timestamp
                ts = None
        if ts:
            st.last_time = ts
        if st.last_iter is not None and it <= st.last_iter:
            st.restarts += 1  # the job resumed from a checkpoint and re-ran iterations
        st.last_iter = it
        if not self.want_iters:
            return
        rest = text[end:]
        if not rest.rstrip().endswith("|"):
            # cut before its closing '|' (wrapped at a terminal's width): the last number may be cut too
            st.bad += 1
            return
        (elapsed, lr, gn, cs, gbs, ls, sk, nan, tf), loss, aux, extras = _fields(rest)
        if not measured_time(elapsed):
            st.bad += 1  # garbled (e.g. interleaved with another rank's output)
            return
        row = [it, ts, elapsed, loss, lr, gn, cs, gbs, ls, sk, nan, tf, aux, extras]
        if not self.stage.log_iteration(row + [self.base_attempt + st.restarts, total], line_no):
            st.bad += 1

    # ------------------------------------------------------------------------------------- events

    def _rank(self, origin: Origin) -> tuple[int | None, int | None]:
        """(global rank, node) of a line, from its prefixes and else from the file's path."""
        p = self.pinfo
        if origin == Origin() and p.local_rank is not None:
            origin = Origin(local_rank=p.local_rank)
        if origin.task is not None and origin.local_rank is None and origin.rank is None:
            return self._task(origin.task, p.node)  # srun --label's "N: " alone
        node = origin.task if origin.task is not None else p.node
        return origin.global_rank(self.ctx.gpus_per_node, p.node), node

    def _task(self, task: int, node: int | None) -> tuple[int | None, int | None]:
        """(rank, node) of an srun task: a node in this toolkit's runs (one torchrun per node), a rank in
        other logs (`srun --ntasks-per-node=<GPUs>`: one task per GPU), or where a node has one GPU."""
        if self.ctx.ours:
            return (task if self.ctx.gpus_per_node == 1 else None), task
        return task, node

    def _last_time(self) -> datetime | None:
        return datetime.fromisoformat(self.st.last_time) if self.st.last_time else None

    def _event(self, rank: int | None, node: int | None, line_no: int, ev: Event) -> None:
        t = store_text(ev.time or self._last_time())
        self.stage.event([self.ctx.run_id, self.job, rank, node, t, ev.kind, ev.message, self.src, line_no])

    def _emit(self, origin: Origin, line_no: int, ev: Event) -> None:
        rank, node = self._rank(origin)
        if rank is None:
            rank, node = self._named(ev, node)
        self._event(rank, node, line_no, ev)

    def _named(self, ev: Event, node: int | None) -> tuple[int | None, int | None]:
        """(rank, node) from what the line's text names, when its prefixes name no rank. An srun task is a
        node in this toolkit's runs (one torchrun per node) and a rank in other logs (one task per GPU);
        an NCCL header's local rank is a rank only when the node is known."""
        gpn = self.ctx.gpus_per_node
        if ev.rank is not None:
            return ev.rank, node
        if ev.task is not None:
            return self._task(ev.task, node)
        if ev.local_rank is not None and node is None and self.ctx.nodes == 1:
            return ev.local_rank, 0  # one node, one process per GPU: the device index is the rank
        if ev.local_rank is not None and node is not None and gpn:
            return node * gpn + ev.local_rank, node
        return None, node

    def _summary_field(self, line_no: int, body: str) -> None:
        """A field of torchrun's summary: of the "Root Cause" entry when its line came first, else of an
        entry of the "Failures:" list (which comes before the root cause)."""
        if self._entry is None:
            self._entry = [line_no, "child_failed_other", []]
        self._entry[2].append(body)
        if len(self._entry[2]) >= events.ROOT_CAUSE_SPAN or _last_field(body):
            self._finish_entry()

    def _finish_entry(self) -> None:
        line_no, kind, fields = self._entry
        self._entry = None
        rc = events.parse_root_cause(fields, kind)
        if rc:
            rank, ev = rc
            self._event(rank, None, line_no, ev)


def _is_rest(text: str) -> bool:
    """Whether `text` can be the rest of an iteration line cut before its closing '|': it starts no
    iteration line of its own and ends with the '|'."""
    return iterline.iteration_head(text) is None and text.rstrip().endswith("|")


def _last_field(body: str) -> bool:
    """The last field of a torchrun summary entry ("traceback : ...")."""
    return body.lstrip().startswith(events.ROOT_FIELD_LAST)


def _fields(rest: str) -> tuple[list, object, object, str]:
    """(FAST_COLUMNS values, loss, aux loss, extras JSON) of an iteration line's fields."""
    fast = iterline.fast_fields(rest, as_text=True)
    if fast is not None:
        return fast
    # a non-numeric or non-finite value somewhere: the generic parser decides
    cols, losses, ex = iterline.parse_fields(rest)
    loss, aux = iterline.main_losses(losses)
    rest_losses = iterline.extra_losses(losses)
    if rest_losses:
        ex["losses"] = rest_losses
    return [cols.get(c) for c in iterline.FAST_COLUMNS], loss, aux, json.dumps(ex)
