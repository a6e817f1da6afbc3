"""The rendezvous port of a run alone on one machine: free, below the kernel's ephemeral range (where no
outgoing connection can take it before torchrun binds it) and below the ports SLURM runs take; launch.sh
runs the same rule with the standard library alone."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from mimo_jobs.contract.ports import free_port, probe_source
from mimo_jobs.study.render import PORT_BASE


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_the_port_is_free_and_below_the_ephemeral_range_and_slurms_ports():
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < min(PORT_BASE, _ephemeral_low()) for p in ports), ports
    assert len(ports) > 1  # drawn, not one fixed port every run would share
    assert all(_bindable(p) for p in ports)


def test_a_port_in_use_is_never_picked(monkeypatch):
    import random

    held = []
    try:
        for port in range(10000, 20000):  # three ports of the range held by listeners here
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
            except OSError:
                s.close()
                continue
            held.append(s)
            if len(held) == 3:
                break
        busy = [s.getsockname()[1] for s in held]

        def busy_first(ports):  # the draw comes to the held ports first
            ports.sort(key=lambda p: (p not in busy, p))

        monkeypatch.setattr(random, "shuffle", busy_first)
        picked = free_port()
        assert picked not in busy and 10000 <= picked < 20000
        assert picked == min(p for p in range(10000, 20000) if p not in busy and _bindable(p))
    finally:
        for s in held:
            s.close()


def test_launch_sh_runs_the_same_rule_without_mimo_jobs():
    # -I: isolated, neither this checkout nor site-packages on the path (a team's own interpreter)
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe_source()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    port = int(p.stdout)
    assert 10000 <= port < min(PORT_BASE, _ephemeral_low())
