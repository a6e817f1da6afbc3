"""The rendezvous port of a run alone on one machine (launch.sh's MASTER_PORT in local mode, and the tests'
own torchrun launches): a port free now, drawn from 10000-19999: below the kernel's ephemeral port range and
below the ports SLURM runs take (study/render.py's PORT_BASE upward, a port per job id).

Why below it: binding port 0 hands out a port of the ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 by default), the range every outgoing connection takes its local port from. Between this probe
and torchrun's own bind, a connection of another process on the machine (gloo's and the TCP store's, when
other worlds run) can take that port, and torchrun stops with EADDRINUSE. Connections never take a port below
the range, so a port found free there stays free unless another listener picks the same one, which a random
draw from thousands makes rare. Where the ephemeral range starts below 10001, port 0.

launch.sh runs this function's own source (`probe_source`): the interpreter on the nodes may be one without
mimo_jobs (a team's own training command), so the probe is the standard library only."""

from __future__ import annotations

import inspect


def free_port() -> int:
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = list(range(10000, min(20000, low)))
    random.shuffle(ports)
    for port in [*ports[:200], 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


def probe_source() -> str:
    """A Python program that prints a port `free_port` picks (for `python -c`)."""
    return inspect.getsource(free_port) + "\n\nprint(free_port())\n"
