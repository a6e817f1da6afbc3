"""One expanded run of a study (`RunSpec`) and its run.yaml: the trainer's complete, self-contained input."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import mimo_jobs.study.topology as topology
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.priced import unpriced
from mimo_jobs.study.spec import ClusterSpec, PointSpec, TrainerSpec


@dataclass(frozen=True)
class RunSpec:
    """One expanded point of a study: everything needed to render, launch and train it."""

    study: str
    name: str
    run_id: str
    index: int  # position in the expanded matrix
    repeat: int
    point: PointSpec  # resolved (llm.dp filled in)
    layout: topology.Layout
    cluster: ClusterSpec
    trainer: TrainerSpec
    # the study file's directory, where its relative paths start (None: not read from a file); what a
    # command template calls {{ study_dir }}. run.yaml does not need it (its paths are absolute), so it is
    # no part of what a run is: a run read back from run.yaml is the same run
    study_dir: str | None = field(default=None, compare=False)

    @property
    def time_limit(self) -> str:
        return self.point.time_limit or self.cluster.time_limit

    def to_dict(self) -> dict:
        return {
            "study": self.study,
            "name": self.name,
            "run_id": self.run_id,
            "index": self.index,
            "repeat": self.repeat,
            # one of encoder / encoders: the point as a study writes it (and a one-encoder run as it always was)
            "point": self.point.model_dump(
                mode="json", exclude={"encoders"} if self.point.encoders is None else {"encoder"}
            ),
            "layout": self.layout.to_dict(),
            "cluster": self.cluster.model_dump(mode="json"),
            # a model the study did not write is left out: read back, it is the default again and still
            # not given (study/priced.py prices a run of its own command only with a given model)
            "trainer": self.trainer.model_dump(
                mode="json", exclude=None if self.trainer.model_given else {"model"}
            ),
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        return cls(
            study=d["study"],
            name=d["name"],
            run_id=d["run_id"],
            index=int(d["index"]),
            repeat=int(d["repeat"]),
            point=PointSpec.model_validate(d["point"]),
            layout=topology.Layout.from_dict(d["layout"]),
            cluster=ClusterSpec.model_validate(d["cluster"]),
            trainer=TrainerSpec.model_validate(d["trainer"]),
        )

    def rank_layout(self) -> topology.RankLayout:
        return topology.rank_layout(self.layout, self.trainer_kind())

    def trainer_kind(self) -> topology.Trainer:
        """What the topology rules need of this run: a text-only model, and whether the packaged trainer or
        a command of the study's own trains it."""
        return trainer_kind(self.trainer, self.point.command)

    def catalog_fields(self) -> dict:
        """The run as the store's `runs` row keeps it (store.catalog.RunRecord's fields)."""
        lay = self.layout
        axes = ("nodes", "gpus_per_node", "world", "llm_tp", "llm_pp", "llm_ep")
        one = None if lay.several else lay.encoders[0]
        return {
            "run_id": self.run_id,
            "study": self.study,
            "name": self.name,
            "index": self.index,
            "repeat": self.repeat,
            **{a: getattr(lay, a) for a in (*axes, "llm_etp", "llm_dp", "gbs", "mbs", "colocated")},
            # the one encoder in runs.enc_*; every module, one or several, in run_modules
            "enc_tp": one and one.tp,
            "enc_pp": one and one.pp,
            "enc_dp": one and one.dp,
            "modules": module_rows(lay, self.trainer.model),
            "seq_length": self.trainer.seq_length,
            "model": _model_text(self.trainer.model) if unpriced(self) is None else None,
            "accelerator": self.cluster.accelerator,
            "spec": self.to_dict(),
        }


def module_rows(lay: topology.Layout, model) -> tuple[dict, ...]:
    """Each encoder module of a layout as the store's run_modules row (store.modules.ModuleRow's fields):
    its ranks from topology.module_ranges, its kind the modality of the model's encoder of that name."""
    kinds = _modalities(model)
    return tuple(
        {
            "module": r.name,
            "position": i,
            "kind": kinds.get(r.name),
            "tp": r.tp,
            "pp": r.pp,
            "dp": r.dp,
            "ranks": r.rank_end - r.rank_start,
            "rank_start": r.rank_start,
            "rank_end": r.rank_end,
        }
        for i, r in enumerate(topology.module_ranges(lay))
    )


def _modalities(model) -> dict[str, str]:
    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import arch_of

    try:
        return {n: a.modality for n, a in arch_of(model).named_encoders}
    except (ArchError, ValueError):  # an unresolvable model is reported where the model is read
        return {}


def trainer_kind(trainer: TrainerSpec, point_command: str | None = None) -> topology.Trainer:
    """topology.Trainer of a study's trainer (and a point's own command, which overrides the study's)."""
    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import arch_of

    try:
        text_only = arch_of(trainer.model).text_only
    except (ArchError, ValueError):  # an unresolvable model is reported where the model is read
        text_only = False
    return topology.Trainer(
        text_only=text_only,
        packaged=not (point_command or trainer.command),
        split_layers=trainer.pipeline_split_layers,
    )


def _model_text(model: str | dict) -> str:
    """The store's `model` text: a preset's name, or a resolved description as JSON (what ingest --model
    stores too; report/predicted.model_name reads its name back)."""
    return model if isinstance(model, str) else json.dumps(model, sort_keys=True)


@dataclass
class PointResult:
    """A point after expansion: a run, or the rules it breaks (reported all together)."""

    index: int
    label: str  # yaml path of the point's origin, e.g. matrix.points[2]
    run: RunSpec | None
    violations: list[topology.Violation]


def load_run_yaml(path: str | Path) -> tuple[RunSpec, dict]:
    """Read a rendered run.yaml: the RunSpec plus the whole document (paths, provenance)."""
    doc = yaml.safe_load(Path(path).read_text())
    return RunSpec.from_dict(doc["run"]), doc


def run_yaml_doc(spec: RunSpec, run_dir: str | Path, provenance: dict | None = None) -> dict:
    """The document render writes to <run dir>/run.yaml (the trainer's whole input)."""
    rd = RunDir(Path(run_dir).resolve())
    ckpt = str(rd.checkpoint_dir(spec.trainer.checkpoint_dir))
    return {
        "run": spec.to_dict(),
        "plan": spec.rank_layout().to_dict(),
        "paths": {
            "run_dir": str(rd.root),
            "metrics": str(rd.metrics),
            "logs": str(rd.logs),
            "checkpoints": ckpt,
        },
        "provenance": provenance or {},
    }
