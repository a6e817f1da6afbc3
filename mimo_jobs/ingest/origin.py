"""Who wrote a log line: the srun/torchrun prefixes of the line, and what the log file's path says.

- srun --label writes `N: ` (the task, a node index when srun starts one torchrun per node); torchrun --tee
  writes `[defaultK]:` (the local rank); torch itself writes `[rankK]:` (the global rank). They nest, in
  any order.
- torchrun's per-rank log files live at logs/job-<job>/node-<n>/<rdzv>/attempt_<k>/<local_rank>/
  {stdout,stderr}.log; SLURM and the local executor write slurm-<job>.out / local-<job>.out, the Kubernetes
  executor one k8s-<job>.node-<n>.out per node rank (contract/rundir.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """Who wrote a line, as far as its prefixes tell. `rank` is global; `task` is the srun task id."""

    task: int | None = None  # srun --label N (a node index when srun launches one torchrun per node)
    local_rank: int | None = None  # torchrun [defaultK]:
    rank: int | None = None  # torch's own [rankK]:

    def global_rank(self, gpus_per_node: int | None = None, node: int | None = None) -> int | None:
        """Global rank: [rankK] wins; else node*gpn + local rank (node from the label or the file path)."""
        if self.rank is not None:
            return self.rank
        n = self.task if self.task is not None else node
        if self.local_rank is not None:
            if n is None:
                return self.local_rank if gpus_per_node in (None, 1) or node is None else None
            if gpus_per_node is None:
                return None
            return n * gpus_per_node + self.local_rank
        if self.task is not None and gpus_per_node == 1:
            return self.task
        return None


# No `^`: Pattern.match(line, pos) anchors at pos, and `^` would only match at 0.
_PREFIX_RE = re.compile(
    r"[ \t]*(\d{1,6}): |\[default(\d{1,4})\]:|\[rank(\d{1,6})\]: ?"
)  # torch writes "[rank3]: text"


def split_origin(line: str) -> tuple[Origin, str]:
    """Strip any chain of srun/torchrun prefixes ("0: [default3]:[rank3]: text") and say who wrote it."""
    task = local = rank = None
    pos = 0
    for _ in range(4):  # prefixes never nest deeper; bound the loop against odd input
        m = _PREFIX_RE.match(line, pos)
        if not m:
            break
        if m.group(1) is not None:
            task = int(m.group(1))
        elif m.group(2) is not None:
            local = int(m.group(2))
        else:
            rank = int(m.group(3))
        pos = m.end()
    return Origin(task, local, rank), line[pos:]


# srun --label's "N: " as it starts a line; a line srun split in two starts its second part with the label
# again, which the cut may leave without its space ("3:55E+01 | ...").
_LABEL_RE = re.compile(r"[ \t]*(\d{1,6}):(?: |(?=\S))")


def srun_label(line: str) -> tuple[int, str] | None:
    """(task, the text after the label) of a line srun --label wrote, else None."""
    m = _LABEL_RE.match(line)
    return (int(m.group(1)), line[m.end() :]) if m else None


_RANK_PATH_RE = re.compile(
    r"(?:^|/)job-(?P<job>[^/]+)/node-(?P<node>\d+)/(?:[^/]+/)?attempt_(?P<attempt>\d+)/(?P<local>\d+)/"
    r"(?P<stream>stdout|stderr|error)\.(?:log|json)$"
)
_JOB_FILE_RE = re.compile(
    r"(?:^|/)(?:slurm|local|k8s)-(?P<job>[A-Za-z0-9_.\-]+?)(?:\.node-(?P<node>\d+)|\.\d+)?\.(?:out|err|log)$"
)
_JOB_DIR_RE = re.compile(r"(?:^|/)job-(?P<job>[^/]+)/")


@dataclass(frozen=True)
class PathInfo:
    job_id: str | None = None
    node: int | None = None
    attempt: int | None = None  # torchrun restart (attempt_<k>)
    local_rank: int | None = None
    stream: str | None = None


def path_info(path: str) -> PathInfo:
    """What a log file's path says: its job, and for torchrun per-rank files the node/attempt/local rank."""
    p = path.replace("\\", "/")
    m = _RANK_PATH_RE.search(p)
    if m:
        return PathInfo(m["job"], int(m["node"]), int(m["attempt"]), int(m["local"]), m["stream"])
    m = _JOB_FILE_RE.search(p)
    if m:
        return PathInfo(m["job"], int(m["node"]) if m["node"] else None)
    m = _JOB_DIR_RE.search(p)
    if m:
        return PathInfo(m["job"])
    return PathInfo()
