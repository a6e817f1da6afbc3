"""A preloaded interpreter for the trainer processes the tests start: torch, megatron-core and the trainer are
imported once, and each `python -m mimo_jobs.trainer ...` that a test starts (alone, or as a rank under a real
torchrun) runs the real trainer in a fork of it instead of importing them again.

On this suite's 2-core machines importing them is ~5 s of CPU per process against well under a second of
training, and the suite starts hundreds of trainer processes. What runs is unchanged: the same `__main__`
of mimo_jobs.trainer, with the process's own argv, environment, working directory and standard streams.

    client (the process torchrun or the test started; tests/sitecustomize.py hands it over)
      -> connects to the zygote's socket, sends argv/env/cwd and its stdin/stdout/stderr
    zygote (python -m helpers.zygote SOCKET: imports, then accepts)
      -> forks a keeper per client; the keeper forks the trainer process, tells the client its pid,
         waits for it and sends back how it ended (or SIGKILLs it when the client is gone)
    client
      -> forwards the signals it gets (SIGTERM from torchrun, SIGUSR2 from a test) to the trainer process,
         and ends the way it ended: the same exit code, or killed by the same signal

A client that cannot reach a zygote runs the trainer itself, as without one. A trainer process runs in its own
session: a test hook that kills "its process group" (MIMO_CKPT_CRASH) needs the real layout, so those tests
launch without the zygote (helpers.launch.worker_env(zygote=False)).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys

ENV = "MIMO_JOBS_TEST_ZYGOTE"  # the socket path; unset or empty: no zygote
MODULE = "mimo_jobs.trainer"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
PRELOAD = ("torch", "torch.distributed", "megatron.core", "mimo_jobs.trainer.main")


# ---------------------------------------------------------------------------------------------- client


def trainer_args(orig_argv: list[str]) -> list[str] | None:
    """The trainer's arguments when this interpreter was started as `python [opts] -m mimo_jobs.trainer ...`."""
    for i, a in enumerate(orig_argv[1:], 1):
        if a == "-m":
            return orig_argv[i + 2 :] if orig_argv[i + 1 : i + 2] == [MODULE] else None
        if not a.startswith("-"):
            return None  # a script, or -c
    return None


def hand_over(path: str, args: list[str]) -> None:
    """Run the trainer in the zygote at `path` and end this process as it ended; returns only when no zygote
    answers (the caller then runs the trainer itself)."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        head = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(head)) + head], [0, 1, 2])
        pid = int(_line(conn).split()[1])
    except (OSError, ValueError, IndexError):
        return
    try:  # from here on this process only stands in for the trainer process: it never runs anything itself
        for s in FORWARDED:
            signal.signal(s, lambda sig, _frame: _forward(pid, sig))
        try:
            kind, value = _line(conn).split()
        except (OSError, ValueError):
            kind, value = "exit", "1"  # the keeper is gone: say the process failed
        _end(kind, int(value))
    finally:
        os._exit(1)


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _line(conn: socket.socket) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise OSError("the zygote closed the connection")
        buf += chunk
    return buf.decode().strip()


def _end(kind: str, value: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if kind == "signal":
        if value not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
    os._exit(value if kind == "exit" else 128 + value)


# ---------------------------------------------------------------------------------------------- zygote


def serve(path: str) -> None:
    import importlib
    import warnings

    warnings.filterwarnings("ignore")
    for m in PRELOAD:
        importlib.import_module(m)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            _keep(conn)
        conn.close()


def _keep(conn: socket.socket) -> None:
    """The keeper: start the trainer process for this client, wait for it, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 4, 3)
        (n,) = struct.unpack("!I", msg[:4])
        head = msg[4:]
        while len(head) < n:
            head += conn.recv(n - len(head))
        req = json.loads(head)
    except (OSError, ValueError, struct.error):
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_trainer(req, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    while True:
        ready, _, _ = select.select([conn], [], [], 0.2)
        if ready and not conn.recv(16):  # the client is gone (killed): so is its trainer
            os.kill(pid, signal.SIGKILL)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    if os.WIFSIGNALED(status):
        report = f"signal {os.WTERMSIG(status)}\n"
    else:
        report = f"exit {os.waitstatus_to_exitcode(status)}\n"
    try:
        conn.sendall(report.encode())
    except OSError:
        pass
    os._exit(0)


def _run_trainer(req: dict, fds: list[int]) -> None:
    """The trainer process: the client's streams, directory, environment and argv, then mimo_jobs.trainer's
    __main__; it ends by unwinding to the interpreter's own exit (exit handlers, thread joins, the exit code
    or the traceback of an uncaught exception), as a fresh `python -m mimo_jobs.trainer` would."""
    import runpy

    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for s in (*FORWARDED, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [MODULE, *req["args"]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    sys.exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
