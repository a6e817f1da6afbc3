"""Test-run-wide trainer runs: each distinct run is launched once per pytest run, and every test that needs it
reads its directory (the `shared_runs` fixture in tests/conftest.py).

Two kinds of run, two keys:
- a world (the trainer under torchrun) is keyed by the project's own run id (mimo_jobs.study.expand.run_id_of:
  study, cluster, trainer settings and point) and its rank count;
- a one-process `--reference` run is keyed by the layout-free part of the run (`reference_key`): the model, the
  data, the global and micro batch and every trainer setting that changes the numbers, without the grids,
  colocation, or the settings that only schedule work or trade memory for compute. That the reference's
  figures do not depend on those is itself tested, by references launched apart from this cache
  (tests/trainer/test_parity.py::test_reference_losses_do_not_depend_on_the_layout).

The pytest workers of one run share the cache's root: a lock file per key makes the first worker that asks launch
the run and the others wait for its result. A failed launch is kept as it ended, so every test that asks for it
fails with the same output.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

# what a one-process reference does not depend on: where the ranks are and how work is scheduled or memory
# traded (the run's figures are per global batch). Which samples share a microbatch does matter (a MoE
# router's load-balancing loss is taken per microbatch): the key keeps the microbatch size and, when a
# microbatch holds more than one sample, the LLM's lanes, which decide how samples are grouped.
LAYOUT_POINT = ("nodes", "encoder", "encoders", "llm", "colocated", "repeats", "time_limit")
LAYOUT_TRAINER = (
    "encoder_inflight",
    "recompute",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
)
LAYOUT_CLUSTER = ("gpus_per_node",)


def shared_root(tmp_path_factory) -> Path:
    """This pytest run's directory that all its workers see: under pytest-xdist a worker's temporary root
    (<run>/popen-gwN) sits in it; a run without workers has its own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Held by one process of the run at a time: the others wait here (an flock, released if its holder dies)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class Launched:
    """A finished launch: its run directory and metrics, what it printed and how it exited."""

    run_yaml: Path
    metrics: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def run_dir(self) -> Path:
        return self.run_yaml.parent

    def iterations(self) -> list[dict]:
        lines = self.metrics.read_text().splitlines() if self.metrics.is_file() else []
        return [r for r in map(json.loads, lines) if r["kind"] == "iteration"]

    def ok(self, what: str) -> Launched:
        assert self.returncode == 0, (
            f"{what} failed (rc={self.returncode}):\n{self.stdout[-3000:]}\n{self.stderr[-6000:]}"
        )
        return self


def reference_key(doc: dict) -> str:
    """The layout-free part of a run.yaml document, hashed."""
    run = doc["run"]
    payload = {
        "cluster": {k: v for k, v in run["cluster"].items() if k not in LAYOUT_CLUSTER},
        "trainer": {k: v for k, v in run["trainer"].items() if k not in LAYOUT_TRAINER},
        "point": {k: v for k, v in run["point"].items() if k not in LAYOUT_POINT},
        "lanes": run["layout"]["llm_dp"] if run["layout"]["mbs"] > 1 else None,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def world_key(doc: dict, nproc: int) -> str:
    return f"{doc['run']['run_id']}-n{nproc}"


# a launcher: (the run.yaml to run, the metrics file, reference or not, nproc) -> the finished process
Launch = Callable[[Path, Path, bool, int], subprocess.CompletedProcess]


class SharedRuns:
    """The cache under `root`: <root>/<kind>-<key>/ holds a run's run.yaml, metrics.jsonl and result.json."""

    def __init__(self, root: Path, launch: Launch):
        self.root = root
        self.launch = launch
        root.mkdir(parents=True, exist_ok=True)

    def reference(self, run_yaml: Path) -> Launched:
        """The one-process reference for `run_yaml`, launched once per layout-free key."""
        doc = yaml.safe_load(run_yaml.read_text())
        return self._once(f"reference-{reference_key(doc)}", doc, reference=True, nproc=0)

    def world(self, run_yaml: Path, nproc: int) -> Launched:
        """`run_yaml` under torchrun with `nproc` ranks, launched once per run id and rank count."""
        doc = yaml.safe_load(run_yaml.read_text())
        return self._once(f"world-{world_key(doc, nproc)}", doc, reference=False, nproc=nproc)

    def _once(self, name: str, doc: dict, reference: bool, nproc: int) -> Launched:
        home = self.root / name
        with exclusive(self.root / f"{name}.lock"):  # another worker launching this run: wait for its result
            if not (home / "result.json").is_file():
                self._launch(home, doc, reference, nproc)
        return self._read(home)

    def _launch(self, home: Path, doc: dict, reference: bool, nproc: int) -> None:
        home.mkdir(parents=True, exist_ok=True)
        run_yaml = home / "run.yaml"
        run_yaml.write_text(yaml.safe_dump(_rehomed(doc, home)))
        p = self.launch(run_yaml, home / "metrics.jsonl", reference, nproc)
        result = {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
        tmp = home / "result.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, home / "result.json")  # a reader sees a whole result or none

    @staticmethod
    def _read(home: Path) -> Launched:
        r = json.loads((home / "result.json").read_text())
        return Launched(home / "run.yaml", home / "metrics.jsonl", r["returncode"], r["stdout"], r["stderr"])


def _rehomed(doc: dict, home: Path) -> dict:
    """The run.yaml document with its run directory (and every path in it) moved to `home`."""
    old = doc["paths"]["run_dir"]
    paths = {
        k: (str(home) + v[len(old) :] if isinstance(v, str) and v.startswith(old) else v)
        for k, v in doc["paths"].items()
    }
    return {**doc, "paths": paths}
