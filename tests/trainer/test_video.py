"""Video through the same seam as images: an image module with a temporal patch (Qwen2-VL's
temporal_patch_size 2, a 3-D patch embedding) embeds a sample's frames in groups of two, one image's worth of
tokens per group; the mock provider draws videos for a share of its image samples, the planner prices them
by frames, and the trainer matches the one-process reference on them. No branch in the step: a family field,
a data member and a token rule. The trainer on videos against the one-process reference, colocated and on
ranks of their own: tests/trainer/test_dual_towers.py (its first tower has this temporal patch)."""

import json
import re
import subprocess
import sys

import pytest
import torch

from helpers.launch import worker_env
from helpers.trainer import make_run_yaml
from mimo_jobs.data.mock import MockProvider, mock_config
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.predict.datastats import data_mix
from mimo_jobs.study.runspec import load_run_yaml

RTOL = 1e-5
VIDEO = {
    "name": "tiny-video",
    "encoders": {"vision": {"preset": "tiny", "temporal_patch_size": 2}},
    "llm": "tiny",
}
DATA = {"text_only_fraction": 0.25, "image_sizes": [8, 16], "video_fraction": 0.5, "video_frames": [3, 4]}
SEQ = {"seq_length": 48}


def _run_yaml(tmp_path, **kw):
    return make_run_yaml(tmp_path, gbs=4, model=VIDEO, data=DATA, trainer=SEQ, **kw)


def test_videos_reach_the_image_module_priced_by_frames(tmp_path):
    run, _ = load_run_yaml(_run_yaml(tmp_path / "run", gpn=2, llm={"dp": 2}, colocated=True))
    prov = MockProvider(mock_config(run, run.rank_layout()), [0, 1], need_images=True, need_text=True)
    seen, tokens, samples = set(), 0, 0
    for _ in range(40):
        for lane in (0, 1):
            b = prov.next(lane)
            for i, item in enumerate(b.items("vision")):
                n = b.counts("vision")[i]
                assert int((b.tokens[i] == b.inputs["vision"].token_id).sum()) == n
                tokens, samples = tokens + n, samples + 1
                if item is None:
                    assert n == 0
                    continue
                side = item.shape[-1]
                frames = item.shape[1] if item.dim() == 5 else 0
                # two frames per temporal group, the last group of a 3-frame video padded: 2 groups either way
                assert n == (2 if frames else 1) * (side // 4) ** 2
                seen.add((side, frames))
    assert seen == {(8, 0), (16, 0), (8, 3), (16, 3), (8, 4), (16, 4)}
    # the planner's mean over the stated mix agrees with what the provider drew (160 samples)
    mix = data_mix(run.trainer.data, arch_of(run.trainer.model).encoders["vision"])
    assert "videos (0.5 of them)" in mix.source
    assert tokens / samples == pytest.approx(mix.image_tokens_mean, rel=0.15)
    assert mix.image_tokens_max == 2 * 16


def test_the_temporal_patch_is_qwen2_vls_3d_convolution_and_an_image_is_its_frame_repeated():
    """The ViT's patch embedding of a clip equals conv3d with kernel (2, p, p) and stride (2, p, p) over the
    frames, the weight laid out [h, C, t, p, p] (transformers' Qwen2VLVisionModel PatchEmbed); an image
    embeds as a clip of that image twice; a 3-frame video as its frames with the last repeated. Built in a
    process of its own (megatron-core's process groups)."""
    p = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, timeout=300, env=worker_env(), check=False
    )
    assert p.returncode == 0 and p.stdout.strip(), p.stderr[-6000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["conv3d_diff"] < 1e-5, got
    assert got["video_rows"] == 2 * 4  # two temporal groups of (8/4)^2 patches
    assert got["image_is_two_frames"] and got["short_video_is_padded"], got


def _encoder_checks() -> dict:
    import datetime
    import os

    import torch.distributed as dist

    import mimo_jobs.trainer.model.models as M
    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.model.arch import ModelArch
    from mimo_jobs.trainer.build import _seed_megatron

    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    enc_s, llm_s = G.ModuleShape(G.ENCODER, 0, 1, 1, 1), G.ModuleShape(G.LANGUAGE, 0, 1, 1, 1)
    grids = G.build_grids({"vision": enc_s}, llm_s, "gloo", datetime.timedelta(seconds=60))
    _seed_megatron(grids, 1)
    arch = arch_of(VIDEO)
    one = ModelArch(arch.name, encoder=arch.encoders["vision"], llm=arch.llm)
    prec = M.Precision(use_gpu=False, bf16=False)
    vit_cfg, proj_cfg = M.encoder_configs(one, 1, prec)
    enc = M.build_encoder(one, vit_cfg, proj_cfg, grids.encoders["vision"].pgc, prec)
    M.canonical_init_(enc, 1, "encoder", 0, 1)
    seen = []
    enc.vit.embedder.register_forward_hook(lambda _m, _a, out: seen.append(out[0].detach()))
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(4, 3, 8, 8, generator=g)
    with torch.no_grad():
        video = enc([frames])
        h = enc.vit.embedder.weight.shape[0]
        kernel = enc.vit.embedder.weight.view(h, 3, 2, 4, 4)
        want = torch.nn.functional.conv3d(frames.permute(1, 0, 2, 3)[None], kernel, stride=(2, 4, 4))
        diff = float((seen[-1][0] - want[0].flatten(1).T).abs().max())
        image = frames[0]
        return {
            "conv3d_diff": diff,
            "video_rows": int(video.shape[0]),
            "image_is_two_frames": bool(torch.equal(enc([image]), enc([torch.stack([image, image])]))),
            "short_video_is_padded": bool(
                torch.equal(enc([frames[:3]]), enc([torch.cat([frames[:3], frames[2:3]])]))
            ),
        }


@pytest.mark.parametrize(
    ("data", "kind", "words"),
    [
        (
            {"video_fraction": 0.5},
            "module-data",
            "trainer.data.video_fraction: 0.5: video_frames is empty; give video_frames, e.g. [4, 8]",
        ),
        (
            {"video_fraction": 0.5, "video_frames": [16], "image_sizes": [16]},
            "image-size",
            "trainer.data.video_frames: a 16-frame video is 128 placeholder tokens over the image modules vision, "
            "which does not fit seq_length=48 with text; use fewer frames, smaller images or trainer.seq_length "
            "> 129",
        ),
    ],
    ids=["no-frames", "too-long"],
)
def test_a_video_the_trainer_refuses_is_refused_by_validate_first_in_the_same_words(
    tmp_path, data, kind, words
):
    import yaml

    from helpers.submit import cli
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.trainer.main import PreflightError, preflight

    doc = {
        "name": "video",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 1},
        "trainer": {"model": VIDEO, **SEQ, "train_iters": 3, "data": {**DATA, **data}},
        "matrix": {"points": [{"nodes": 1, "colocated": True, "llm": {"dp": 1}, "gbs": 4}]},
    }
    if "video_frames" not in data:
        del doc["trainer"]["data"]["video_frames"]
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli("validate", str(study))
    path, rest = words.split(": ", 1)
    message, fit = rest.rsplit("; ", 1)
    assert r.returncode == 2 and f"{path}: [{kind}] {message}" in r.stderr, r.stderr
    assert f"-> {fit}" in r.stderr, r.stderr
    (run,) = runs_of(parse_study(doc))
    with pytest.raises(PreflightError, match=re.escape(f"run.yaml: {words}")):
        preflight(run, {}, reference=True)


if __name__ == "__main__":
    import os

    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    print(json.dumps(_encoder_checks()), flush=True)
    os._exit(0)
