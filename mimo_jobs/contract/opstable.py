"""The measured operator table: the YAML benchmarks/gpu/ops.py writes and a study names as
`cluster.hardware.ops`, its rows as typed data, and the check of every field (study/opsfile.py reads the
file; predict/optable.py prices shapes from it). Nothing else is accepted. The format (docs/predict.md, "A
measured operator table"):

  device: NVIDIA H200          # the device's name
  torch: 2.8.0                 # optional: the torch that measured it
  gemm:                        # at least one row: an (m x k) @ (k x n) GEMM, its dtype, median milliseconds
    - {m: 8192, n: 2048, k: 2048, dtype: bf16, ms: 0.21, tflops: 654.4}   # tflops optional: 2mnk / ms
  attention:                   # fused attention [b, h, s, d] forward (may be empty)
    - {b: 1, h: 16, s: 8192, d: 128, causal: true, ms: 1.9, tflops: 578.7}
  skipped: []                  # optional: the shapes ops.py left out past its time budget
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mimo_jobs.errors import MimoJobsError

MAX_ROWS = 10_000
DTYPES = ("bf16", "fp8", "fp16", "fp32")
TOP = {"device": True, "torch": False, "gemm": True, "attention": False, "skipped": False}
GEMM_FIELDS = ("m", "n", "k", "dtype", "ms")
ATTENTION_FIELDS = ("b", "h", "s", "d", "causal", "ms")
MAX_DIM = 1 << 24
TFLOPS_AGREE = 0.01  # a row's optional tflops must agree with its shape and ms to 1%


class OpsFileError(MimoJobsError, ValueError):
    pass


@dataclass(frozen=True)
class GemmRow:
    m: int
    n: int
    k: int
    dtype: str
    ms: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def rate(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / (self.ms * 1e-3)


@dataclass(frozen=True)
class AttentionRow:
    b: int
    h: int
    s: int
    d: int
    causal: bool
    ms: float

    @property
    def flops(self) -> float:
        """Forward FLOPs of QK^T and AV (the causal mask halves them), as ops.py counts them."""
        return 4.0 * self.b * self.h * self.s * self.s * self.d * (0.5 if self.causal else 1.0)

    @property
    def rate(self) -> float:
        return self.flops / (self.ms * 1e-3)


@dataclass(frozen=True)
class OpsTable:
    """One device's measured table: where it came from, the device's name, its rows."""

    source: str
    device: str
    gemm: tuple[GemmRow, ...]
    attention: tuple[AttentionRow, ...]

    def gemm_dtypes(self) -> frozenset[str]:
        return frozenset(r.dtype for r in self.gemm)


def parse_ops(doc, source: str) -> OpsTable:
    """The table of a YAML document already read (module docstring's format)."""
    if not isinstance(doc, dict):
        raise OpsFileError(
            f"{source}: not a mapping of {', '.join(TOP)} (the YAML benchmarks/gpu/ops.py writes)"
        )
    for key in doc:
        if key not in TOP:
            raise OpsFileError(f"{source}: unknown key {key!r}; an ops table has {', '.join(TOP)}")
    for key, required in TOP.items():
        if required and key not in doc:
            raise OpsFileError(
                f"{source}: no {key!r}; an ops table has {', '.join(k for k, r in TOP.items() if r)}"
            )
    device = doc["device"]
    if not isinstance(device, str) or not device.strip():
        raise OpsFileError(f"{source}: device: {device!r} is not a device name (a non-empty string)")
    if "torch" in doc and not isinstance(doc["torch"], str | int | float):
        raise OpsFileError(f"{source}: torch: give the torch version as a string")
    if "skipped" in doc and not isinstance(doc["skipped"], list):
        raise OpsFileError(f"{source}: skipped: a list of the shapes left out, or none")
    gemm = tuple(
        GemmRow(**_row(source, "gemm", i, r, GEMM_FIELDS)) for i, r in enumerate(_rows(doc, "gemm", source))
    )
    if not gemm:
        raise OpsFileError(f"{source}: gemm: no rows; measure at least one GEMM shape")
    att = tuple(
        AttentionRow(**_row(source, "attention", i, r, ATTENTION_FIELDS))
        for i, r in enumerate(_rows(doc, "attention", source))
    )
    for kind, rows in (("gemm", gemm), ("attention", att)):
        for i, (row, raw) in enumerate(zip(rows, doc.get(kind) or [])):
            _tflops_agree(source, kind, i, row, raw)
    return OpsTable(source, device.strip(), gemm, att)


def _rows(doc: dict, kind: str, source: str) -> list:
    rows = doc.get(kind)
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise OpsFileError(f"{source}: {kind}: a list of rows, not a {type(rows).__name__}")
    if len(rows) > MAX_ROWS:
        raise OpsFileError(f"{source}: {kind}: {len(rows)} rows, over the limit of {MAX_ROWS}")
    return rows


def _row(source: str, kind: str, i: int, raw, fields: tuple[str, ...]) -> dict:
    """One row's fields, each checked: positive integer dimensions, a known dtype, a boolean mask, positive
    finite milliseconds."""
    where = f"{source}: {kind}[{i}]"
    if not isinstance(raw, dict):
        raise OpsFileError(f"{where}: a mapping of {', '.join(fields)}, not {raw!r}")
    allowed = (*fields, "tflops")
    for key in raw:
        if key not in allowed:
            raise OpsFileError(f"{where}: unknown field {key!r}; a {kind} row has {', '.join(allowed)}")
    out = {}
    for f in fields:
        if f not in raw:
            raise OpsFileError(f"{where}: no {f!r}; a {kind} row has {', '.join(fields)}")
        v = raw[f]
        if f == "dtype":
            if v not in DTYPES:
                raise OpsFileError(f"{where}.dtype: {v!r} is not one of {', '.join(DTYPES)}")
        elif f == "causal":
            if not isinstance(v, bool):
                raise OpsFileError(f"{where}.causal: {v!r} is not true or false")
        elif f == "ms":
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise OpsFileError(f"{where}.ms: {v!r} is not a positive number of milliseconds")
            v = float(v)
        elif isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise OpsFileError(f"{where}.{f}: {v!r} is not an integer from 1 to {MAX_DIM}")
        out[f] = v
    return out


def _tflops_agree(source: str, kind: str, i: int, row, raw: dict) -> None:
    """A row's optional `tflops` (what ops.py prints beside ms) must be its shape's FLOPs over its ms."""
    if "tflops" not in raw:
        return
    v = raw["tflops"]
    want = row.rate / 1e12
    if isinstance(v, bool) or not isinstance(v, int | float) or abs(v - want) > TFLOPS_AGREE * want:
        raise OpsFileError(
            f"{source}: {kind}[{i}].tflops: {v!r} does not match the row's shape and ms ({want:.4g} TFLOP/s); "
            "fix it or leave it out"
        )
