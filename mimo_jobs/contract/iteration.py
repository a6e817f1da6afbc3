"""The iteration record: the trainer (last LLM rank) appends one JSON line per iteration to
<run dir>/metrics.jsonl; ingest reads them (and, for upstream Megatron logs, the same figures parsed from
iteration lines). Keep fields additive: unknown keys are kept as extras.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# pipeline_wait: an LLM stage blocked on its neighbouring stage (llm.pp > 1)
PHASES = ("enc_fwd", "enc_bwd", "bridge_wait", "llm_fwd", "llm_bwd", "optimizer", "data", "pipeline_wait")

# The measured values of one iteration as the store keeps them (SQL types), in the iterations table's order
# between `time` and the phases: the one list ingest stages, the store's table is created with and the
# record below carries under the same names.
VALUE_COLUMNS: dict[str, str] = {
    "elapsed_ms": "DOUBLE",
    "loss": "DOUBLE",
    "lr": "DOUBLE",
    "grad_norm": "DOUBLE",
    "consumed_samples": "BIGINT",
    "gbs": "INTEGER",
    "loss_scale": "DOUBLE",
    "skipped": "INTEGER",
    "nan": "INTEGER",
    "samples_per_s": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "tokens_per_s_per_gpu": "DOUBLE",
    "tflops_per_gpu": "DOUBLE",
    "moe_aux_loss": "DOUBLE",
    # token counts of the global batch (NULL where a log does not say): loss-bearing, carried, image
    "tokens": "BIGINT",
    "carried_tokens": "BIGINT",
    "image_tokens": "BIGINT",
}
# each phase also as a number of milliseconds (the report averages millions of rows; numbers aggregate ~50x
# cheaper than the JSON they come from)
PHASE_COLUMNS = tuple(f"{p}_ms" for p in PHASES)


@dataclass
class IterationRecord:
    kind: str  # "iteration" (also "start" with the layout, "end" with the exit reason)
    run_id: str
    job_id: str  # scheduler job id (SLURM_JOB_ID, or the local executor's id)
    attempt: int  # restart count (SLURM_RESTART_COUNT or local retry)
    time: str  # ISO-8601 UTC when the iteration finished
    iteration: int  # 1-based, as in Megatron's log
    train_iters: int
    consumed_samples: int
    elapsed_ms: float  # wall time of this iteration
    lr: float
    gbs: int
    loss: float  # token-weighted mean lm loss over the global batch
    grad_norm: float | None
    loss_scale: float = 1.0
    skipped: int = 0  # 1 if the optimizer step was skipped (inf/nan)
    nan: int = 0
    tokens: int = 0  # LLM tokens (loss-bearing) in this global batch
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0  # carried tokens / elapsed (gbs * seq_length / elapsed when not counted)
    tokens_per_s_per_gpu: float = 0.0  # over ALL GPUs of the job (encoder ranks included)
    tflops_per_gpu: float | None = None
    moe_aux_loss: float | None = None
    # the sequence positions the batch carries (content, image placeholders included; not the padding) and
    # the image tokens among them; None where not counted
    carried_tokens: int | None = None
    image_tokens: int | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)  # keys from PHASES, per iteration
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)
