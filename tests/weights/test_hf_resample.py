"""An encoder trained at another image_size than its HuggingFace weights': the position table is resampled to
the new patch grid as transformers' own `interpolate_pos_encoding` does (SigLIP, and CLIP with its class row
apart), exactly; the loaded ViT computes what transformers computes at that size with
interpolate_pos_encoding=True; another patch size is refused with one line; the trainer's first line says
what was resampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import hf_models  # noqa: E402

from helpers.launch import worker_env  # noqa: E402
from mimo_jobs.model import hf  # noqa: E402
from mimo_jobs.model.arch import EncoderArch  # noqa: E402
from mimo_jobs.trainer.weights.hf_load import HFInitError, check_encoder  # noqa: E402

WORKER = Path(__file__).parent / "hf_worker.py"


def _embeddings(kind: str):
    """transformers' SiglipVisionEmbeddings / CLIPVisionEmbeddings of the tiny config, random weights."""
    import transformers as T

    cfg = hf_models.encoder_config(kind)
    cls = T.CLIPVisionModel if kind == "clip" else T.SiglipVisionModel
    model = cls(cfg)
    hf_models.randomize_(model, seed=3)
    emb = next(
        m for n, m in model.named_modules() if n.endswith("embeddings") and hasattr(m, "position_embedding")
    )
    return emb, cfg


@pytest.mark.parametrize("kind", ["siglip", "clip"])
@pytest.mark.parametrize("image_size", [24, 12, 36])  # 4x4 patches to 6x6, 3x3, 9x9
def test_resampling_equals_transformers_interpolate_pos_encoding(kind, image_size):
    import torch

    from mimo_jobs.trainer.weights.positions import resample_positions

    emb, cfg = _embeddings(kind)
    cls = int(kind == "clip")
    grid = image_size // cfg.patch_size
    with torch.no_grad():
        want = emb.interpolate_pos_encoding(
            torch.zeros(1, grid**2 + cls, cfg.hidden_size), image_size, image_size
        )
        got = resample_positions(emb.position_embedding.weight, grid, class_rows=cls)
    assert got.shape == (grid**2 + cls, cfg.hidden_size)
    torch.testing.assert_close(got, want[0], rtol=0, atol=1e-7)
    if cls:  # the class token's row is kept as it is
        assert torch.equal(got[0], emb.position_embedding.weight[0])


def test_the_same_grid_is_the_table_itself_and_a_non_square_table_is_refused():
    import torch

    from mimo_jobs.trainer.weights.positions import resample_positions

    t = torch.randn(17, 8)
    assert torch.equal(resample_positions(t, 4, class_rows=1), t)
    with pytest.raises(ValueError, match="15 patch rows are not a square grid"):
        resample_positions(torch.randn(15, 8), 4)


def _fields(kind: str, **over) -> EncoderArch:
    return EncoderArch(**(hf.encoder_fields(hf_models.encoder_config(kind).to_dict()) | over))


def test_another_image_size_passes_the_check_and_says_what_is_resampled(tmp_path):
    d = hf_models.save_encoder("siglip", tmp_path / "siglip")
    e = _fields("siglip", image_size=32, downsample=2)
    es = check_encoder(d, e)
    assert es.weights.image_size == 16
    assert es.resampled(e) == "position embeddings resampled from 4x4 to 8x8 (bicubic)"
    assert check_encoder(d, _fields("siglip")).resampled(_fields("siglip")) is None


def test_another_patch_size_is_refused_with_one_line(tmp_path):
    d = hf_models.save_encoder("clip", tmp_path / "clip")
    with pytest.raises(HFInitError) as err:
        check_encoder(d, _fields("clip", patch_size=8))
    msg = err.value.describe()
    assert "\n" not in msg and msg.startswith("trainer.init.encoder: ")
    assert f"{d / 'config.json'} has patch_size=4, trainer.model.encoder has patch_size=8" in msg
    assert "keep patch_size 4" in msg


def test_the_loaded_vit_equals_transformers_at_another_size(tmp_path):
    specs = [
        {"side": "encoder", "dir": str(hf_models.save_encoder(k, tmp_path / k)), "image_size": size}
        for k, size in (("siglip", 24), ("clip", 24), ("siglip", 12), ("internvit", 24))
    ]
    f = tmp_path / "specs.json"
    f.write_text(json.dumps(specs))
    p = subprocess.run(
        [sys.executable, str(WORKER), str(f)], capture_output=True, text=True, timeout=600, env=worker_env()
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    results = [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(results) == 4, p.stdout[-3000:]
    for r, size in zip(results, (24, 24, 12, 24), strict=True):
        assert r["positions_max_abs"] <= 1e-7, r
        assert r["rel"] <= 1e-5, r
        # CLIP and InternViT keep their class token first
        assert r["shape"][1] == (size // 4) ** 2 + ("clip" in r["dir"] or "internvit" in r["dir"]), r
        assert r["split_disagrees"] == [], r


@pytest.mark.slow
def test_the_trainer_trains_at_another_size_and_says_so_in_its_first_line(tmp_path):
    from helpers.launch import trainer
    from helpers.trainer import make_run_yaml

    d = hf_models.save_encoder("siglip", tmp_path / "siglip")
    model = {
        "encoder": {"hf_config": str(d / "config.json"), "image_size": 32, "downsample": 2},
        "llm": "tiny",
    }
    y = make_run_yaml(
        tmp_path / "run",
        gpn=2,
        gbs=2,
        iters=2,
        trainer={"model": model, "init": {"encoder": str(d)}},
        data={"image_sizes": [16, 32]},
    )
    p = subprocess.run(
        trainer(y, "--reference"), capture_output=True, text=True, timeout=300, env=worker_env()
    )
    assert p.returncode == 0, p.stderr[-3000:]
    first = p.stdout.splitlines()[0]
    assert first.startswith("mimo-jobs trainer: run ")
    assert "| trainer.init.encoder: position embeddings resampled from 4x4 to 8x8 (bicubic)" in first
    # the model in a few words (its whole description is in run.yaml), then where each module starts from
    assert "{" not in first
    assert "| model siglip[downsample=2][image_size=32] (encoder inline, llm inline) seq=" in first
    assert p.stdout.splitlines()[1:3] == [
        f"mimo-jobs trainer: vision: loaded from {d}",
        "mimo-jobs trainer: llm: random init",
    ]
