"""The point-to-point traffic the trainer posts, recorded from its own schedule code, and a zero-buffer model
of NCCL's ordering to check it against.

Recording: every rank of a layout runs the trainer's real schedule (step/encoder_rank.run_encoder / step/llm_stage.run_stage with
the real Bridge and StageLink) in a thread of one process, with stub compute and a `Recorder` as the
communicator. The recorder delivers messages through unbounded mailboxes (so the run itself never blocks on
ordering, as under gloo) and writes down, per rank, what was posted and waited for, in order.

The model (rendezvous semantics, NCCL without its staging buffer): the k-th send from rank a to rank b
matches the k-th receive on b from a, and both complete only when both are posted and startable; an op
is startable when every op its rank posted before it, to any peer, has completed (a rank's groups on one
communicator run on one stream in posting order), except ops of its own batched group (posted together,
run together); a group counts as done only when all of its ops are (atomic). A rank stops at a wait until
the group completes, at a device synchronisation ("sync") until everything it posted has completed, and at
a collective of its TP group (the bridge's broadcast, or the compute's own all-reduces, which the stub
compute records) until every member reaches the same one. Anything left stuck is a deadlock.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from types import SimpleNamespace

import torch

import mimo_jobs.study.topology as topology
from mimo_jobs.data.batch import LaneBatch, ModuleInputs
from mimo_jobs.trainer.parallel import grids as G
from mimo_jobs.trainer.parallel.bridge import Bridge, segments_of_encoder, token_counts
from mimo_jobs.trainer.parallel.p2p import Exchanger
from mimo_jobs.trainer.parallel.pipeline import stage_link
from mimo_jobs.trainer.step.common import PhaseTimer, replica_samples
from mimo_jobs.trainer.step.encoder_rank import run_encoder
from mimo_jobs.trainer.step.llm_stage import run_stage

HIDDEN, SEQ = 4, 2
TIMEOUT_S = 30.0

# ------------------------------------------------------------------------------------ recording


class Network:
    """Mailboxes between the ranks of one in-process run, and each rank's recorded program."""

    def __init__(self):
        self.cv = threading.Condition()
        self.boxes: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> tensors in order
        self.programs: dict[int, list] = defaultdict(list)

    def take(self, key):
        with self.cv:
            if not self.cv.wait_for(lambda: self.boxes[key], TIMEOUT_S):
                raise TimeoutError(f"nothing arrived on {key} in {TIMEOUT_S} s")
            return self.boxes[key].popleft()

    def put(self, key, t) -> None:
        with self.cv:
            self.boxes[key].append(t.clone())
            self.cv.notify_all()


class _Work:
    def __init__(self, rec: Recorder, gid: int, recvs: list):
        self.rec, self.gid, self.recvs = rec, gid, recvs

    def wait(self) -> None:
        self.rec.log(("wait", self.gid))
        recvs, self.recvs = self.recvs, []
        for op in recvs:
            op.tensor.copy_(self.rec.net.take((op.peer, self.rec.rank)))

    def is_completed(self) -> bool:
        return False  # conservative: the model decides when a send completes


class Recorder:
    """A p2p.Comm for one rank: delivers through the network's mailboxes and records what is posted."""

    def __init__(self, net: Network, rank: int, events: list | None = None):
        self.net, self.rank, self.events = net, rank, events
        self._gids = itertools.count()

    def log(self, event) -> None:
        self.net.programs[self.rank].append(event)
        if self.events is not None:
            self.events.append(event)

    def post(self, ops) -> list:
        gid = next(self._gids)
        self.log(("post", gid, tuple((o.send, o.peer) for o in ops)))
        for o in ops:
            if o.send:
                self.net.put((self.rank, o.peer), o.tensor)
        return [_Work(self, gid, [o for o in ops if not o.send])]

    def broadcast(self, tensor, src: int, group, ranks: tuple[int, ...]) -> None:
        self.log(("coll", tuple(ranks)))
        if self.rank == src:
            for r in ranks:
                if r != src:
                    self.net.put((src, r), tensor)
        else:
            tensor.copy_(self.net.take((src, self.rank)))


# ---------------------------------------------------------------------------------------- model


class _Model:
    """The zero-buffer model's state over every rank's recorded program."""

    def __init__(self, programs: dict[int, list]):
        self.programs = programs
        self.pc = {r: 0 for r in programs}
        self.ops: list[dict] = []  # every posted op: rank, peer, send, gid, done
        self.groups: dict[tuple[int, int], list[dict]] = defaultdict(list)  # (rank, gid) -> its ops
        self.queue: dict[int, list[dict]] = defaultdict(list)  # rank -> its ops in posting order
        self.sent: dict[tuple[int, int], list[dict]] = defaultdict(list)  # (src, dst) -> sends in order
        self.received: dict[tuple[int, int], list[dict]] = defaultdict(list)  # (src, dst) -> receives
        self.colls: dict[tuple[int, tuple], int] = defaultdict(int)  # (rank, members) -> broadcasts passed

    def group_done(self, rank: int, gid: int) -> bool:
        return all(o["done"] for o in self.groups[(rank, gid)])

    def startable(self, o: dict) -> bool:
        """Every op the rank posted earlier, to any peer, is done, or in this op's group; an earlier group
        must be done as a whole (NCCL runs a rank's groups on one communicator in posting order)."""
        for e in self.queue[o["rank"]]:
            if e is o:
                return True
            if e["gid"] != o["gid"] and not self.group_done(e["rank"], e["gid"]):
                return False
        raise AssertionError("op not in its queue")

    def coll_ready(self, rank: int, members: tuple) -> bool:
        n = self.colls[(rank, members)]
        for r in members:
            passed = self.colls[(r, members)]
            at = self.pc[r] < len(self.programs[r]) and self.programs[r][self.pc[r]] == ("coll", members)
            if not (passed > n or (passed == n and at)):
                return False
        return True

    def post(self, rank: int, gid: int, posted) -> None:
        for send, peer in posted:
            o = {"rank": rank, "peer": peer, "send": send, "gid": gid, "done": False}
            self.ops.append(o)
            self.groups[(rank, gid)].append(o)
            self.queue[rank].append(o)
            (self.sent[(rank, peer)] if send else self.received[(peer, rank)]).append(o)

    def advance(self, rank: int) -> bool:
        """Run `rank` until it blocks; whether it moved."""
        prog, moved = self.programs[rank], False
        while self.pc[rank] < len(prog):
            ev = prog[self.pc[rank]]
            if ev[0] == "post":
                self.post(rank, ev[1], ev[2])
            elif ev[0] == "wait" and not self.group_done(rank, ev[1]):
                break
            elif ev[0] == "sync" and not all(o["done"] for o in self.queue[rank]):
                break  # a device synchronisation waits for everything the rank posted, sends in flight too
            elif ev[0] == "coll":
                if not self.coll_ready(rank, ev[1]):
                    break
                self.colls[(rank, ev[1])] += 1
            self.pc[rank] += 1
            moved = True
        return moved

    def match(self) -> bool:
        """Complete every matched send/receive pair whose two ops can start; whether any did."""
        moved = False
        for key, sends in self.sent.items():
            for s, rv in zip(sends, self.received[key]):
                if not s["done"] and self.startable(s) and self.startable(rv):
                    s["done"] = rv["done"] = True
                    moved = True
        return moved

    def stuck(self) -> str | None:
        def name(o):
            return f"{'send to' if o['send'] else 'recv from'} {o['peer']} (group {o['gid']})"

        lines = []
        for r, prog in self.programs.items():
            pending = [name(o) for o in self.ops if o["rank"] == r and not o["done"]]
            if self.pc[r] < len(prog):
                ev = prog[self.pc[r]]
                lines.append(f"rank {r} stuck at {ev[:2]}; its pending ops: {', '.join(pending) or 'none'}")
            elif pending:
                lines.append(f"rank {r} never completes: {', '.join(pending)}")
        return "deadlock: " + "; ".join(lines) if lines else None


def rendezvous_deadlock(programs: dict[int, list]) -> str | None:
    """Run the recorded programs under the zero-buffer model; None if all complete, else what is stuck."""
    m = _Model(programs)
    moved = True
    while moved:
        moved = any([m.advance(r) for r in programs])
        moved = m.match() or moved
    return m.stuck()


# ------------------------------------------------------------------------------------ scenarios


def compute_collective(st, module) -> None:
    """What a TP group's compute does on the device besides the messages: its own all-reduces (TP > 1),
    every member at the same point of the same kernels, recorded as a collective of the group."""
    if module.tp > 1:
        _tp, pp_rank, dp = module.coords(st.role.rank)
        members = tuple(module.rank_of(t, pp_rank, dp) for t in range(module.tp))
        st.bridge.p2p.comm.log(("coll", members))


def _counts(lane: int, m: int, mbs: int) -> list[int]:
    """Image tokens per sample: varied, with text-only samples (0) and some image-less microbatches."""
    return [((3 * m + 5 * (lane * mbs + j)) % 4) * (m % 3 != 2) for j in range(mbs)]


def lane_batch(lane: int, m: int, mbs: int):
    return LaneBatch(
        lane=lane,
        step=0,
        microbatch=m,
        sample_keys=[f"{m}/{lane * mbs + j}" for j in range(mbs)],
        tokens=None,
        labels=None,
        loss_mask=None,
        position_ids=None,
        inputs={
            "vision": ModuleInputs(127, _counts(lane, m, mbs)),
            # the audio module's placeholders (a model of two encoder modules): other zeros than the image's
            "audio": ModuleInputs(126, _counts(lane, m + 1, mbs)),
        },
    )


class StubStage:
    """run_stage's compute with tensors of the right shapes: checks what it receives, produces zeros."""

    def __init__(self, st, mbs: int, trace: list | None = None):
        self.st, self.mbs, self.trace = st, mbs, trace

    def batch(self, m: int):
        return lane_batch(self.st.role.dp_rank, m, self.mbs)

    def forward(self, m: int, emb, hidden):
        if self.trace is not None:
            self.trace.append(("compute", "F", m))
        compute_collective(self.st, self.st.llm_shape)
        role = self.st.role
        if role.is_first_stage:
            assert set(emb) == {br.module for br in self.st.bridges}, (role.rank, m, set(emb))
            for k, v in emb.items():
                assert v.shape == (sum(token_counts(self.batch(m), k)), HIDDEN), (role.rank, m, k, v.shape)
        else:
            assert hidden.shape == self.st.link.shape, (role.rank, m)
        to_next = None if role.is_last_stage else torch.zeros(self.st.link.shape)
        return (m, emb, hidden), to_next

    def backward(self, item, grad):
        if self.trace is not None:
            self.trace.append(("compute", "B", item[0]))
        compute_collective(self.st, self.st.llm_shape)
        m, emb, hidden = item
        role = self.st.role
        assert (grad is None) == role.is_last_stage, (role.rank, m)
        to_prev = None if hidden is None else torch.zeros_like(hidden)
        back = role.is_first_stage and not self.st.run.trainer.freeze.encoder
        return to_prev, ({k: torch.zeros_like(v) for k, v in emb.items()} if back else None)


def _encoder_stub(st, mbs: int, trace: list | None):
    module = st.bridge.module
    segs = segments_of_encoder(st.module_plans[module], st.role.dp_rank)

    def forward(m: int):
        if trace is not None:
            trace.append(("compute", "F", m))
        compute_collective(st, st.module_shapes[module])
        mb = {g.lane: lane_batch(g.lane, m, mbs) for g in segs}
        _inputs, keys, counts = replica_samples(mb, segs, module)
        return torch.zeros(sum(counts), HIDDEN), keys, counts

    def backward(flat, grad) -> None:
        if trace is not None:
            trace.append(("compute", "B", None))
        compute_collective(st, st.module_shapes[module])
        assert grad.shape == flat.shape

    return forward, backward


def rank_states(
    enc_dp: int,
    llm_dp: int,
    pp: int,
    mbs: int,
    microbatches: int,
    inflight: int,
    tp: int = 1,
    frozen=False,
    audio_dp: int | None = None,
):
    """One fake TrainState per rank of the layout, with the real Bridges and StageLink on a Recorder. With
    `audio_dp` the model has two encoder modules, each on ranks of its own: vision (enc_dp replicas) then
    audio (audio_dp replicas), each with its own bridge into the LLM's first stage."""
    mods = [topology.ModuleShape("vision", tp, 1, enc_dp)]
    if audio_dp is not None:
        mods.append(topology.ModuleShape("audio", tp, 1, audio_dp))
    lay = topology.Layout(
        nodes=1,
        gpus_per_node=sum(m.ranks for m in mods) + tp * pp * llm_dp,
        encoders=tuple(mods),
        llm_tp=tp,
        llm_pp=pp,
        llm_dp=llm_dp,
        gbs=mbs * llm_dp * microbatches,
        mbs=mbs,
    )
    plan = topology.rank_layout(lay)
    encs, llm = G.encoder_shapes(plan), G.language_shape(plan)
    net = Network()
    run = SimpleNamespace(
        trainer=SimpleNamespace(
            encoder_inflight=inflight,
            freeze=SimpleNamespace(encoder=frozen, every_encoder=lambda _model: frozen),
            model=None,
        )
    )
    states = []
    for rank in range(lay.world):
        role = G.role_of(rank, encs[G.own_module(encs, rank)], llm)
        rec = Recorder(net, rank)
        bridges = [
            Bridge(
                G.module_plan(plan, name),
                shape,
                llm,
                role,
                None,
                None,
                HIDDEN,
                torch.float32,
                "cpu",
                p2p=Exchanger(rec),
                module=name,
            )
            for name, shape in encs.items()
            if role.is_language or shape.contains(rank)
        ]
        link = None
        if role.is_language and pp > 1:
            link = stage_link(llm, role, (SEQ, mbs, HIDDEN), torch.float32, "cpu", p2p=Exchanger(rec))
        states.append(
            SimpleNamespace(
                run=run,
                plan=plan,
                module_plans=G.module_plans(plan),
                role=role,
                module_shapes=encs,
                llm_shape=llm,
                bridge=bridges[0],
                bridges=bridges,
                link=link,
                iteration=3,
                modules=(),  # no DDP-wrapped module: the step's DP sync has nothing to do
            )
        )
    return net, states


def run_rank(st, mbs: int, tm: PhaseTimer | None = None, trace: list | None = None) -> None:
    """One rank's side of an iteration's exchanges, through the trainer's own schedule functions."""
    tm = tm or PhaseTimer()
    if st.role.is_encoder:
        forward, backward = _encoder_stub(st, mbs, trace)
        run_encoder(st, forward, backward, tm)
    else:
        run_stage(st, StubStage(st, mbs, trace), st.plan.num_microbatches, tm)


def run_threads(states, mbs: int, make=None) -> None:
    """Run every rank's side of an iteration in its own thread; `make(st)` -> (PhaseTimer, trace list) is
    called in the rank's thread."""
    errors: list = []

    def body(st):
        try:
            tm, trace = make(st) if make is not None else (None, None)
            run_rank(st, mbs, tm, trace)
        except BaseException as e:  # reported below, with the rank
            errors.append((st.role.rank, e))

    threads = [threading.Thread(target=body, args=(st,), daemon=True) for st in states]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    if errors:
        raise AssertionError(f"rank {errors[0][0]} failed: {errors[0][1]!r}") from errors[0][1]
    assert not any(t.is_alive() for t in threads), "the buffered run itself hung"


def record(**layout) -> dict[int, list]:
    """Every rank's recorded program for one iteration of the layout (all ranks in threads)."""
    net, states = rank_states(**layout)
    try:
        run_threads(states, layout["mbs"])
    except AssertionError as e:
        raise AssertionError(f"{layout}: {e}") from e
    return dict(net.programs)
