"""`cluster.slurm`: what only SLURM reads of a study (its #SBATCH headers and srun flags).

Studies written before executors had sections give these keys flat under `cluster:`; the cluster schema
moves them here (mimo_jobs/study/spec.py), and a run's id hashes them flat as before, so those runs keep
their ids. Pydantic only: the study schema imports this module.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:=+/-]{1,128}\Z")
ARG_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=+/@%-]+)?\Z")


class SlurmSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    exclusive: bool = True
    sbatch_args: list[str] = Field(default_factory=list)  # extra "--key=value" headers
    srun_args: list[str] = Field(default_factory=list)

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_word(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_WORD_RE.match(v):
            raise ValueError(f"{v!r} is not a valid SLURM name (letters, digits, _.,:=+/- only)")
        return v

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _args(cls, v: list[str], info) -> list[str]:
        what = "sbatch" if info.field_name == "sbatch_args" else "srun"
        for a in v:
            if not ARG_RE.match(a):
                raise ValueError(
                    f"{what} arg {a!r} must look like --key or --key=value (no spaces or quotes)"
                )
        return v
