"""The line parsers (iterline, origin, events, sacct) on real log text: upstream Megatron lines,
srun/torchrun prefixes, SLURM/NCCL/gloo/CUDA messages in their real formats."""

from datetime import datetime

import pytest

from mimo_jobs.ingest import events, iterline, origin
from mimo_jobs.submit.executors.slurm import sacct

REAL = (
    " [2024-04-06 03:02:12] iteration       71/     100 | consumed samples:         9088 | elapsed time per "
    "iteration (ms): 5361.6 | throughput per GPU (TFLOP/s/GPU): 243.6 | learning rate: 1.420000E-05 | global "
    "batch size:   128 | lm loss: 1.818812E+00 | load_balancing_loss: 1.013377E+00 | loss scale: 1.0 | grad "
    "norm: 1.300 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def test_real_megatron_line():
    it = iterline.parse_iteration(REAL)
    assert (it.iteration, it.train_iters) == (71, 100)
    assert it.time == datetime(2024, 4, 6, 3, 2, 12)
    assert it.consumed_samples == 9088 and it.gbs == 128
    assert it.elapsed_ms == 5361.6 and it.tflops_per_gpu == 243.6
    assert it.lr == pytest.approx(1.42e-5) and it.loss == pytest.approx(1.818812)
    assert it.moe_aux_loss == pytest.approx(1.013377)
    assert it.loss_scale == 1.0 and it.grad_norm == 1.3 and it.skipped == 0 and it.nan == 0
    assert it.extras == {"num zeros": 0.0}


def test_microseconds_absent_fields_and_dynamic_losses():
    line = (
        " [2024-04-06 03:02:17.483921] iteration       72/     100 | consumed samples:         9216 | elapsed "
        "time per iteration (ms): 5358.9 | global batch size:   128 | lm loss: 1.815002E+00 | mtp_1 loss: "
        "2.101000E+00 | z_loss: 3.0E-03 | loss scale: 1.0 | number of skipped iterations:   0 |"
    )
    it = iterline.parse_iteration(line)
    assert it.time == datetime(2024, 4, 6, 3, 2, 17, 483921)
    assert it.lr is None and it.grad_norm is None and it.tflops_per_gpu is None  # absent on this rank
    assert it.losses == {"lm loss": 1.815002, "mtp_1 loss": 2.101, "z_loss": 0.003}
    assert it.loss == 1.815002


def test_line_without_timestamp_and_single_other_loss():
    it = iterline.parse_iteration(
        "iteration 3/ 10 | elapsed time per iteration (ms): 12.5 | language loss: 2.5 |"
    )
    assert it.time is None and it.iteration == 3 and it.loss == 2.5


def test_not_an_iteration_line():
    assert iterline.parse_iteration("saving checkpoint at iteration      72 to /ckpt") is None


@pytest.mark.parametrize(
    "line,who,body",
    [
        (" 3: [default1]:hello", origin.Origin(task=3, local_rank=1), "hello"),
        (
            "12: [default0]:[rank24]: Traceback (most recent call last):",
            origin.Origin(12, 0, 24),
            "Traceback (most recent call last):",
        ),
        ('[rank3]:   File "x.py", line 1', origin.Origin(rank=3), '  File "x.py", line 1'),
        ("plain text: with colon", origin.Origin(), "plain text: with colon"),
    ],
)
def test_prefixes(line, who, body):
    assert origin.split_origin(line) == (who, body)


def test_global_rank_rules():
    assert origin.Origin(task=1, local_rank=1).global_rank(gpus_per_node=2) == 3  # node 1, local 1
    assert origin.Origin(task=1, local_rank=1, rank=7).global_rank(2) == 7  # torch's own [rankK] wins
    assert origin.Origin(local_rank=3).global_rank(8, node=2) == 19  # per-rank file of node 2
    assert origin.Origin(task=5).global_rank(8) is None  # a per-node label alone is not a rank
    assert origin.Origin(task=5).global_rank(1) == 5


def test_path_info():
    p = origin.path_info("runs/s/r/logs/job-77/node-1/77_abc/attempt_2/3/stderr.log")
    assert (p.job_id, p.node, p.attempt, p.local_rank, p.stream) == ("77", 1, 2, 3, "stderr")
    assert origin.path_info("runs/s/r/logs/slurm-123.out").job_id == "123"
    assert origin.path_info("runs/s/r/logs/local-local-4.out").job_id == "local-4"
    assert origin.path_info("/x/train.log").job_id is None


@pytest.mark.parametrize(
    "line,kind",
    [
        (
            "slurmstepd: error: *** JOB 1234 ON node1 CANCELLED AT 2024-04-06T03:05:00 DUE TO TIME LIMIT ***",
            "time_limit",
        ),
        (
            "slurmstepd: error: *** STEP 1234.0 ON node1 CANCELLED AT 2024-04-06T03:05:00 DUE TO PREEMPTION ***",
            "preemption",
        ),
        (
            "slurmstepd: error: *** JOB 1234 ON node3 CANCELLED AT 2024-04-06T03:05:00 DUE TO NODE FAILURE, SEE "
            "SLURMCTLD LOG FOR DETAILS ***",
            "node_fail",
        ),
        ("slurmstepd: error: *** JOB 99 ON node1 CANCELLED AT 2024-04-06T03:05:00 ***", "cancelled"),
        ("srun: error: Node failure on node5", "node_fail"),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.11 GiB of which 1.06 GiB is free.",
            "oom",
        ),
        (
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0. Some of the step tasks have been OOM "
            "Killed.",
            "oom",
        ),
        (
            "[E0302 10:10:06.310421 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600005 "
            "milliseconds before timing out.",
            "nccl_timeout",
        ),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 300000ms "
            "for recv operation to complete",
            "gloo_timeout",
        ),
        (
            "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.2]:4711",
            "peer_lost",
        ),
        (
            "  successfully saved checkpoint from iteration      72 to /lustre/ckpt [ t 1/ 2, p 1/ 1 ]",
            "checkpoint_saved",
        ),
        (
            "  successfully loaded checkpoint from /lustre/ckpt [ t 1/ 2, p 1/ 1 ] at iteration 72",
            "checkpoint_loaded",
        ),
        ("submitit WARNING (2024-04-06 03:04:59,120) - Requeued job 1234 (2 remaining timeouts)", "requeue"),
        ("srun: error: node2: task 1: Exited with exit code 1", "task_exit"),
    ],
)
def test_event_lines(line, kind):
    kinds = [e.kind for e in events.classify_line(line, 2024)]
    assert kind in kinds, kinds


def test_event_times():
    (ev,) = events.classify_line(
        "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-04-06T03:05:00 DUE TO TIME LIMIT ***"
    )
    assert ev.time == datetime(2024, 4, 6, 3, 5, 0)
    (ev,) = events.classify_line(
        "[E0302 10:10:06.310421 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
        "operation timeout",
        2026,
    )
    assert ev.time == datetime(2026, 3, 2, 10, 10, 6, 310421)  # glog carries no year: taken from the hint


def test_traceback_tracker_interleaved():
    # Two ranks' tracebacks interleave line by line; each ends at its own exception line.
    tr = events.TracebackTracker()
    tr.start("a", 10, None)
    tr.start("b", 11, None)
    assert tr.feed("a", '  File "x.py", line 3, in f') is None
    assert tr.feed("b", '  File "y.py", line 9, in g') is None
    assert tr.feed("a", "KeyError: 'image'") == (10, events.Event("traceback", "KeyError: 'image'", None))
    assert tr.feed("b", "    g()") is None
    assert tr.feed("b", "ValueError: bad") == (11, events.Event("traceback", "ValueError: bad", None))
    assert not tr.pending


def test_traceback_truncated_is_flushed():
    tr = events.TracebackTracker()
    tr.start("r", 3, None)
    tr.feed("r", '  File "a.py", line 1')
    assert tr.flush() == [
        ("r", 3, events.Event("traceback", "traceback truncated (no exception line)", None))
    ]


def test_traceback_keeps_last_exception_of_a_chain():
    tr = events.TracebackTracker()
    tr.start("r", 5, None)
    lines = [
        '  File "a.py", line 1',
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 2',
        "RuntimeError: final",
    ]
    # The chain's first exception line ends the event (the process died on the last one, which
    # follows in the same block); what matters for triage is the type and message of an exception.
    out = [tr.feed("r", s) for s in lines]
    assert [o for o in out if o] == [(5, events.Event("traceback", "RuntimeError: final", None))]


def test_sacct_dump():
    lines = [
        "JobID|JobName|State|ExitCode|Start|End|NodeList|Restarts\n",
        "4242|mimo|TIMEOUT|0:0|2026-03-02T10:00:00|2026-03-02T11:00:05|node[1-2]|1\n",
        "4242.batch|batch|CANCELLED|0:15|2026-03-02T10:00:00|2026-03-02T11:00:05|node1|0\n",
        "4243|mimo|CANCELLED by 0|0:0|2026-03-02T10:00:00|Unknown|None assigned|0\n",
    ]
    recs = sacct.parse_dump(lines)
    assert [(r.job_id, r.state, r.exit_code, r.restarts) for r in recs] == [
        ("4242", "TIMEOUT", 0, 1),
        ("4243", "CANCELLED", 0, 0),
    ]
    assert recs[0].end == datetime(2026, 3, 2, 11, 0, 5) and recs[1].end is None
    with pytest.raises(ValueError, match="JobID"):
        sacct.parse_dump(["hello|world\n"])


def test_sacct_poll_and_dump_of_one_job():
    """The executor's poll (no header, sacct ran here) and a dump given to ingest read one job alike, but for
    what each documents: a signal death's exit code, "None assigned" nodes."""
    row = "7|CANCELLED by 0|0:15|2026-03-02T10:00:00|2026-03-02T11:00:05|None assigned|None"
    (p,) = sacct.parse_poll("7|CANCELLED by 0|0:15|2026-03-02T09:59:00|" + row.split("|", 3)[3] + "|/r/a\n")
    (d,) = sacct.parse_dump(
        ["JobID|State|ExitCode|Start|End|NodeList|Reason\n", row + "\n", "7.batch|x|0:0|||n|\n"]
    )
    assert (p.job_id, p.state, p.reason) == (d.job_id, d.state, d.reason) == ("7", "CANCELLED", None)
    assert (p.exit_code, d.exit_code) == (128 + 15, 0)  # polled: as a shell reports a signal death
    assert (p.node_list, d.node_list, p.work_dir) == (None, "None assigned", "/r/a")
    assert d.start == datetime(2026, 3, 2, 10, 0, 0) and d.end == datetime(2026, 3, 2, 11, 0, 5)
