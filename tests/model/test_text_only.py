"""A text-only model: a description with an LLM and no encoder, for other programs' runs (trainer.command,
logs ingested with --model). It resolves to a model without an encoder, is priced without images (no encoder
FLOPs, parameters or ranks), and the packaged trainer refuses it at validate, naming trainer.model.encoder.
Descriptions with an encoder keep their run ids."""

from __future__ import annotations

import pytest

from mimo_jobs.model.arch import ArchError, ModelArch, padded_vocab
from mimo_jobs.model.presets import PRESETS
from mimo_jobs.model.resolve import arch_of, resolved_field
from mimo_jobs.model.splits import ENCODER_RULE, tp_problems
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.memory import memory_plan
from mimo_jobs.predict.params import encoder_params, llm_params, model_json, model_summary
from mimo_jobs.predict.run import sample_flops, shape_of
from mimo_jobs.predict.steptime import Efficiency, step_time
from mimo_jobs.study.diagnose import diagnose_data
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study

TINY = PRESETS["tiny"]
CMD = "python train.py --tp {{ llm.tp }}"


def _study(model, command: str | None = None, colocated: bool = True) -> dict:
    trainer = {"model": model, "train_iters": 5, "seq_length": 64}
    if command is not None:
        trainer["command"] = command
    point = {"nodes": 1, "gbs": 4} | ({"colocated": True} if colocated else {"encoder": {"dp": 1}})
    return {
        "name": "txt",
        "cluster": {"gpus_per_node": 2, "accelerator": "gpu"},
        "trainer": trainer,
        "matrix": {"points": [point]},
    }


def test_an_llm_alone_resolves_to_a_model_without_encoder():
    a = arch_of({"llm": {"preset": "tiny", "num_layers": 3}})
    assert a.encoder is None and a.text_only and a.llm.num_layers == 3
    assert a.name == a.llm.name == "tiny[num_layers=3]"
    field = resolved_field({"llm": {"preset": "tiny", "num_layers": 3}})
    assert "encoder" not in field and arch_of(field) == a  # run.yaml's form reads back the same
    assert ModelArch.from_dict(a.to_dict()) == a
    with pytest.raises(ArchError, match="missing") as e:
        arch_of({"encoder": "tiny"})
    assert e.value.field == "llm"


def test_descriptions_with_an_encoder_keep_their_run_ids():
    """Ids from the version before text-only models existed: the resolved form of a two-sided description
    is unchanged."""
    model = {"encoder": "tiny", "llm": {"preset": "tiny", "num_layers": 3}}
    assert list(resolved_field(model)) == ["name", "description", "encoder", "llm"]
    doc = _study(model, colocated=False)
    doc["name"] = "ids"
    doc["matrix"]["points"].append({"nodes": 1, "gbs": 4, "colocated": True})
    assert [r.run_id for r in runs_of(parse_study(doc, env={}))] == ["27af21c5796e", "b3cd558a2d84"]


def test_priced_without_images():
    a = arch_of({"llm": "tiny"})
    seq = 64
    f = sample_flops(a, seq, None)  # a study's data unknown: one full-size image for a model with an encoder
    assert f.encoder == 0.0 and sample_flops(TINY, seq, None).encoder > 0
    # by hand: tiny's LLM (2 layers, h 32, 4 heads, ffn 64, vocab 128, GELU MLP), 3 x forward
    h, L, ffn, v = 32, 2, 64, padded_vocab(128, 1)
    per_layer = 2 * h * 3 * h + 2 * h * h + 2 * seq * h + 2 * 2 * h * ffn
    assert (TINY.llm.num_layers, TINY.llm.hidden_size, TINY.llm.ffn_hidden_size) == (L, h, ffn)
    assert f.llm == pytest.approx(seq * 3 * (L * per_layer + 2 * h * v))
    assert encoder_params(a) == 0 and model_json(a)["encoder"] is None
    assert model_summary(a)[0] == "encoder: none (text-only)" and model_json(a)["llm"][
        "params"
    ] == llm_params(a.llm)


@pytest.mark.parametrize("colocated", [True, False])
def test_memory_and_time_on_the_llm_ranks_only(colocated):
    """A command run priced as a text-only model: its memory plan holds the LLM's rank classes only (a
    layout's encoder ranks hold nothing the model describes), its time no encoder work."""
    (run,) = runs_of(parse_study(_study({"llm": "tiny"}, CMD, colocated), env={}))
    rs = shape_of(run.layout, run.trainer)
    assert (rs.image_tokens_mean, rs.image_tokens_max) == (0.0, 0)
    gpu = get_gpu("H100")
    mem = memory_plan(rs, gpu)
    assert [m.module for c in mem.classes for m in c.modules] == ["llm"]
    (cls,) = mem.classes
    assert cls.ranks == (run.layout.llm_offset, run.layout.world - 1)
    t = step_time(rs, mem, gpu, Efficiency())
    assert t.encoder_compute_s == 0.0 and t.flops.encoder == 0.0 and t.bottleneck == "llm"


def test_the_packaged_trainer_refuses_it_at_validate():
    diag = diagnose_data(_study({"llm": "tiny"}), env={})
    (p,) = diag.problems
    assert p.rule == ENCODER_RULE and "trainer.model.encoder is missing" in p.message
    assert "trainer.command" in p.fit
    # the same model for a run of its own command validates, and a point's own command is enough
    assert diagnose_data(_study({"llm": "tiny"}, CMD), env={}).ok
    doc = _study({"llm": "tiny"})
    doc["matrix"]["points"].append({**doc["matrix"]["points"][0], "command": CMD})
    diag = diagnose_data(doc, env={})
    assert [p.rule for p in diag.problems] == [ENCODER_RULE] and diag.problems[0].path.endswith("[0]")
    # the trainer's own guard applies the same rule (models.unsupported calls tp_problems as the packaged
    # trainer); the LLM's own rules still apply to a text-only model
    a = arch_of({"llm": "tiny"})
    assert [r[0] for r in tp_problems(a, 1, 1)] == [ENCODER_RULE]
    found = [r[1] for r in tp_problems(a, 3, 3, packaged=False)]  # heads, query groups, FFN width
    assert len(found) == 3 and all(m.startswith("llm.tp=3 ") for m in found)
    assert any(r[1].startswith("encoder.tp=3 ") for r in tp_problems(TINY, 3, 3))


def test_the_planner_gives_every_gpu_to_the_llm():
    """`plan` for a text-only model: colocated layouts only (no encoder ranks to split off)."""
    from mimo_jobs.predict.layouts import price_layouts

    (run,) = runs_of(parse_study(_study({"llm": "tiny"}, CMD), env={}))
    fit, over = price_layouts(shape_of(run.layout, run.trainer), get_gpu("H100"), 2, Efficiency())
    assert fit and all(c.layout.colocated for c in fit + over)
    two_sided = runs_of(parse_study(_study("tiny", CMD), env={}))[0]
    fit, _ = price_layouts(shape_of(two_sided.layout, two_sided.trainer), get_gpu("H100"), 2, Efficiency())
    assert any(not c.layout.colocated for c in fit)
