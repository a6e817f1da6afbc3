"""A preloaded interpreter for the trainer processes the tests start: torch, megatron-core and the trainer are
imported once, and each `python -m mimo_jobs.trainer ...` that a test starts (alone, or as a rank under a real
torchrun) runs the real trainer in a fork of it instead of importing them again; so does each `python -m
torch.distributed.run ...` (torchrun itself: ~3 s of CPU to import per world it launches).

On this suite's 2-core machines importing them is ~5 s of CPU per process against well under a second of
training, and the suite starts hundreds of trainer processes. What runs is unchanged: the same `__main__`
of the module, with the process's own argv, environment, working directory, standard streams and the
signals it was started ignoring (launch.sh starts torchrun with USR1 and USR2 ignored).

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
SERVED = (MODULE, "torch.distributed.run")  # the modules a process started as `python -m M` hands over
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
# torchrun's own imports, not torch.distributed.run itself: runpy warns when the module it runs as __main__ was
# imported before
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.launcher.api",
    "megatron.core",
    "mimo_jobs.trainer.main",
)


# ---------------------------------------------------------------------------------------------- client


def served(orig_argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) when this interpreter was started as `python [opts] -m M ...` for a module M
    of SERVED; None for anything else."""
    for i, a in enumerate(orig_argv[1:], 1):
        if a == "-m":
            module = orig_argv[i + 1] if i + 1 < len(orig_argv) else None
            return (module, orig_argv[i + 2 :]) if module in SERVED else None
        if not a.startswith("-"):
            return None  # a script, or -c
    return None


def hand_over(path: str, module: str, args: list[str]) -> None:
    """Run `module` in the zygote at `path` and end this process as it ended; returns only when no zygote
    answers (the caller then runs the module itself)."""
    # the signals this process was started ignoring (an ignored signal stays ignored across exec): the
    # module's process starts ignoring them too, as it would have here
    ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        req = {
            "module": module,
            "args": args,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "ignored": ignored,
        }
        head = json.dumps(req).encode()
        socket.send_fds(conn, [struct.pack("!I", len(head)) + head], [0, 1, 2])
        pid = int(_line(conn).split()[1])
    except (OSError, ValueError, IndexError):
        return
    try:  # from here on this process only stands in for the module's process: it never runs anything itself
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
    import gc
    import importlib
    import warnings

    warnings.filterwarnings("ignore")
    for m in PRELOAD:
        importlib.import_module(m)
    # what was imported stays out of every fork's garbage collections: walking it would copy the shared
    # pages into each fork and cost each collection the whole preloaded heap
    gc.freeze()
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
    """The keeper: start the module's process for this client, wait for it, report how it ended."""
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
        _run_module(req, fds)
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


def _run_module(req: dict, fds: list[int]) -> None:
    """The module's process: the client's streams, directory, environment, argv and ignored signals, then the
    module's __main__; it ends by unwinding to the interpreter's own exit (exit handlers, thread joins, the
    exit code or the traceback of an uncaught exception), as a fresh `python -m M` would."""
    import runpy

    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for s in (*FORWARDED, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as every Python interpreter starts
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in req["ignored"]:
        signal.signal(s, signal.SIG_IGN)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [req["module"], *req["args"]]
    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
