"""Checkpoint discovery, pruning and compatibility (pure file logic) and the preemption watch (real signals
sent to this process). No torch.distributed here."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import mimo_jobs.contract.manifest as MF
import mimo_jobs.trainer.checkpoint.files as C
import mimo_jobs.trainer.signals as S
from mimo_jobs.contract.requeue import REQUEUE_EXIT_CODE, REQUEUE_MARKER

LAYOUT = {
    "nodes": 1,
    "gpus_per_node": 3,
    "enc_tp": 1,
    "enc_pp": 1,
    "enc_dp": 1,
    "llm_tp": 1,
    "llm_pp": 1,
    "llm_dp": 2,
    "llm_ep": 1,
    "llm_etp": 1,
    "llm_cp": 1,
    "num_experts": 0,
    "gbs": 4,
    "mbs": 1,
}


def fake_ckpt(
    root: Path, it: int, run_id: str = "r1", layout: dict | None = None, complete: bool = True
) -> Path:
    d = root / (MF.iter_name(it) + ("" if complete else ".tmp"))
    d.mkdir(parents=True)
    (d / "rank").mkdir()
    (d / "rank" / "rank-00000.pt").write_bytes(b"x" * 10)
    if complete:
        (d / "manifest.json").write_text(
            json.dumps(
                {
                    "format": MF.FORMAT_VERSION,
                    "iteration": it,
                    "consumed_samples": 4 * it,
                    "time": "t",
                    "files": {"rank/rank-00000.pt": 10},
                    "bytes": 10,
                    "provenance": {
                        "run_id": run_id,
                        "study": "s",
                        "run_name": "n",
                        "layout": layout or LAYOUT,
                        "world": 3,
                        "git_sha": "abc",
                    },
                }
            )
        )
    return d


def prov(**kw) -> MF.Provenance:
    base = {"run_id": "r1", "study": "s", "run_name": "n", "layout": LAYOUT, "world": 3}
    base.update(kw)
    return MF.Provenance(**base)


def test_latest_marker_wins_and_partial_dirs_are_ignored(tmp_path):
    fake_ckpt(tmp_path, 2)
    fake_ckpt(tmp_path, 4)
    fake_ckpt(tmp_path, 6, complete=False)  # a crashed save
    (tmp_path / "latest").write_text("iter_0000002\n")
    assert [c.iteration for c in MF.list_checkpoints(tmp_path)] == [2, 4]
    assert MF.latest_checkpoint(tmp_path).iteration == 2
    # a crash between the rename and the marker update: the marker is stale/missing -> newest complete
    (tmp_path / "latest").unlink()
    assert MF.latest_checkpoint(tmp_path).iteration == 4
    (tmp_path / "latest").write_text("iter_0000009\n")  # names nothing complete
    assert MF.latest_checkpoint(tmp_path).iteration == 4
    assert MF.latest_checkpoint(tmp_path / "nope") is None


def test_manifest_of_other_format_is_named(tmp_path):
    d = fake_ckpt(tmp_path, 2)
    m = json.loads((d / "manifest.json").read_text())
    m["format"] = 99
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(MF.CheckpointError, match="format 99"):
        MF.read_manifest(d)


def test_prune_keeps_k_newest_and_latest_and_clears_crash_leftovers(tmp_path):
    for it in (2, 4, 6, 8):
        fake_ckpt(tmp_path, it)
    fake_ckpt(tmp_path, 5, complete=False)
    fake_ckpt(tmp_path, 10, complete=False)  # newer than latest: may be an in-flight save, kept
    (tmp_path / ".deleting-iter_0000001-7").mkdir()
    (tmp_path / "latest").write_text("iter_0000008\n")
    C.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iter_0000006",
        "iter_0000008",
        "iter_0000010.tmp",
        "latest",
    ]


def test_prune_never_deletes_what_latest_names(tmp_path):
    for it in (2, 4, 6):
        fake_ckpt(tmp_path, it)
    (tmp_path / "latest").write_text("iter_0000002\n")  # e.g. resumed from 2 after 4 and 6 were written
    C.prune(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002", "iter_0000006", "latest"]


def test_compatibility_messages():
    info = MF.CheckpointInfo(
        path=Path("/c/iter_0000002"),
        iteration=2,
        consumed_samples=8,
        run_id="r1",
        study="s",
        run_name="n",
        git_sha=None,
        layout=LAYOUT,
        world=3,
        time="t",
    )
    assert MF.check_compatible(info, prov()) == []
    (msg,) = MF.check_compatible(info, prov(run_id="r2", run_name="m"))
    assert "belongs to run r1 (s/n)" in msg and "this is run r2 (s/m)" in msg
    (msg,) = MF.check_compatible(info, prov(layout={**LAYOUT, "llm_dp": 4, "enc_dp": 2}))
    assert "enc_dp=1 vs now 2" in msg and "llm_dp=2 vs now 4" in msg and "trainer.init.checkpoint" in msg
    assert len(MF.check_compatible(info, prov(run_id="x", layout={**LAYOUT, "llm_tp": 2}))) == 2


def test_a_module_of_other_sizes_is_another_layout():
    """Each encoder module's sizes decide how its files are cut: two layouts of vision + audio that differ
    only in the audio module's dp are not the same layout (no rank may read its own files)."""
    from mimo_jobs.study.topology import Layout, ModuleShape

    def record(audio_dp: int) -> dict:
        mods = (ModuleShape("vision", 1, 1, 1), ModuleShape("audio", 1, 1, audio_dp))
        return Layout(nodes=1, gpus_per_node=4, encoders=mods, llm_dp=2, gbs=4, mbs=1).to_dict()

    saved, now = record(1), record(2)
    info = MF.CheckpointInfo(Path("/c/iter_0000002"), 2, 8, "r1", "s", "n", None, saved, 4, "t")
    assert MF.same_layout(info, prov(layout=saved, world=4))
    assert not MF.same_layout(info, prov(layout=now, world=4))
    (msg,) = MF.check_compatible(info, prov(layout=now, world=4))
    assert "encoders.audio.dp=1 vs now 2" in msg and "vision" not in msg
    # the one-vision record keeps its enc_* fields, and the two forms differ field by field
    assert MF.layout_diff(LAYOUT, saved)[0] == ("gpus_per_node", 3, 4)
    assert ("enc_tp", 1, None) in MF.layout_diff(LAYOUT, saved)


def test_deadline_from_env():
    assert S.deadline_from_env({}) is None
    assert S.deadline_from_env({"SLURM_JOB_END_TIME": "1700000000"}) == 1700000000.0
    assert S.deadline_from_env({"MIMO_JOB_DEADLINE": "5", "SLURM_JOB_END_TIME": "9"}) == 5.0
    with pytest.raises(ValueError, match="MIMO_JOB_DEADLINE='soon' is not epoch seconds"):
        S.deadline_from_env({"MIMO_JOB_DEADLINE": "soon"})


def test_deadline_accounts_for_step_and_save_time():
    now = 1000.0
    w = S.PreemptionWatch(deadline=now + 100, margin_s=30)
    assert w.local_state(now) == (0, False)
    w.note_step(20)  # 30 + 1.5 * 20 = 60 s needed
    assert w.local_state(now) == (0, False)
    w.note_save(30)  # 30 + 1.5 * 50 = 105 s needed > 100 s left
    assert w.local_state(now) == (0, True)
    assert S.PreemptionWatch(deadline=None).local_state(now) == (0, False)


@pytest.mark.parametrize("name", S.STOP_SIGNALS)
def test_signal_sets_the_flag_and_stops(name):
    w = S.PreemptionWatch(term_grace_s=60).install()  # uninstall cancels the SIGTERM exit timer
    try:
        assert w.should_stop() is None
        os.kill(os.getpid(), getattr(signal, name))
        for _ in range(100):  # delivered at the next bytecode boundary of the main thread
            if w.received:
                break
            time.sleep(0.01)
        assert w.received == name
        stop = w.should_stop()  # no process group: the local decision
        assert stop is not None and stop.reason == f"signal:{name}"
    finally:
        w.uninstall()
    assert signal.getsignal(getattr(signal, name)) is not w._handler


def test_a_stop_signal_after_the_end_is_decided_is_ignored_to_the_last_instruction():
    """A job whose scheduler sends its warning signal just as the last iteration finished: the interpreter's
    exit gives the handled signals their default action back (terminate), so once the trainer has settled
    how it ends (`settle`) a stop signal must be ignored, even while the process is exiting."""
    import subprocess
    import sys

    code = (
        "import atexit, os, signal, time\n"
        "import mimo_jobs.trainer.signals as S\n"
        "w = S.PreemptionWatch().install()\n"
        "w.settle()\n"
        "assert all(signal.getsignal(getattr(signal, n)) == signal.SIG_IGN for n in S.STOP_SIGNALS)\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "time.sleep(0.05)\n"
        "assert w.received is None\n"
        "import threading\n"
        "# a signal during the interpreter's exit, after its own handlers are gone\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), os.kill(os.getpid(), signal.SIGUSR2)), daemon=False).start()\n"
        "atexit.register(lambda: time.sleep(0.5))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def test_sigterm_without_a_world_stop_exits_after_the_grace():
    # what happens to a rank stuck in a collective when torchrun tears down after a sibling died
    import subprocess
    import sys

    code = (
        "import os, signal, time; from mimo_jobs.trainer.signals import PreemptionWatch; "
        "w = PreemptionWatch(term_grace_s=0.5).install(); os.kill(os.getpid(), signal.SIGTERM); "
        "time.sleep(30); print('still alive')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    # exited by the grace, not after the 30 s sleep (which would print and exit 0)
    assert r.returncode == 128 + signal.SIGTERM and "still alive" not in r.stdout
    assert "no world-wide stop within" in r.stderr and "of SIGTERM (a peer is gone?): exiting" in r.stderr


def test_requeue_marker_roundtrip(tmp_path):
    assert S.read_requeue_marker(tmp_path) is None
    p = S.write_requeue_marker(tmp_path / "ck", 7, "signal:SIGUSR2", "123")
    assert p.name == REQUEUE_MARKER
    m = S.read_requeue_marker(tmp_path / "ck")
    assert (m["iteration"], m["reason"], m["job_id"]) == (7, "signal:SIGUSR2", "123")
    assert REQUEUE_EXIT_CODE == 75


def test_toolkit_import_stays_light():
    import subprocess
    import sys

    # the checkpoint format the toolkit reads (`mimo-jobs status`) and the trainer's device decision, which
    # runs before torch is imported; the trainer's own modules import torch like any training code
    code = (
        "import sys, mimo_jobs.contract.manifest, mimo_jobs.contract.requeue, mimo_jobs.trainer.device; "
        "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
