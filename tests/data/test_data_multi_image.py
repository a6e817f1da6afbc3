"""Samples with several images through the real loader: energon's InterleavedSample (text and images in
turn) and conversations with one <image> marker per image (HF chat template), one per row and packed. The
encoder gets every image in placeholder order, and the trainer's scatter puts image i's j-th embedding at
the j-th placeholder of image i's run, checked position by position against the generator's record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from helpers.launch import trainer, worker_env
from mimo_jobs.data.batch import IGNORE_INDEX, flatten
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.synth_multi import write_interleaved, write_multi_image

GEOM = ImageGeometry(patch_size=4, image_size=16)
SIZES = ((8, 8), (12, 12), (16, 8))
SEQ = 96


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi")
    inter = write_interleaved(root / "inter", 24, SIZES, seed=3, per_shard=12)
    multi = write_multi_image(root / "multi", 24, SIZES, seed=4, per_shard=12)
    return root, inter, multi


def _provider(path, tokenizer=None, packing=False, mbs=4) -> EnergonProvider:
    cfg = LoaderConfig(
        path=str(path),
        llm_dp=1,
        mbs=mbs,
        num_microbatches=1,
        seq_length=SEQ,
        geometry=GEOM,
        vocab_size=128,
        tokenizer=str(tokenizer) if tokenizer else None,
        packing=packing,
        packing_buffer_size=8,
    )
    return EnergonProvider(cfg, [0], need_images=True)


def _runs(row: list[int], image_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of placeholders in a row, left to right."""
    runs, t = [], 0
    while t < len(row):
        if row[t] == image_id:
            s = t
            while t < len(row) and row[t] == image_id:
                t += 1
            runs.append((s, t - s))
        else:
            t += 1
    return runs


def _scatter(batch, image_id: int, img_emb: torch.Tensor) -> torch.Tensor:
    """The trainer's own scatter (step.common.decoder_input) with zero token embeddings: [b, s, h]."""
    from mimo_jobs.trainer.step.common import decoder_input

    emb = torch.nn.Embedding(128, img_emb.shape[1])
    torch.nn.init.zeros_(emb.weight)
    core = SimpleNamespace(
        embedding=SimpleNamespace(word_embeddings=emb), config=SimpleNamespace(sequence_parallel=False)
    )
    st = SimpleNamespace(language=SimpleNamespace(core=core), device="cpu")
    assert batch.inputs["vision"].token_id == image_id
    with torch.no_grad():
        return decoder_input(st, batch, {"vision": img_emb}).transpose(0, 1)


def _check_batches(p: EnergonProvider, record: dict, n_batches: int) -> int:
    """Every row: its images' placeholder runs, in order, hold as many tokens as the generator's image sizes
    give, the encoder's inputs are those images in that order, and the scatter puts (image, token) k at the
    k-th placeholder of that image's run. Returns the images checked."""
    img_id = p.image_token_id
    checked = 0
    for _ in range(n_batches):
        b = p.next(0)
        flat = flatten(b.inputs["vision"].items)
        # image g's token j embeds as (g, j): recognisable wherever it lands
        counts = [GEOM.tokens_of_decoded(tuple(im.shape)) for im in flat]
        img_emb = torch.cat(
            [torch.tensor([[g, j] for j in range(n)], dtype=torch.float) for g, n in enumerate(counts)]
        )
        out = _scatter(b, img_id, img_emb)
        g = 0
        for r, joined in enumerate(b.sample_keys):
            sizes = [hw for key in joined.split("+") for hw in record[key]]
            runs = _runs(b.tokens[r].tolist(), img_id)
            assert [n for _, n in runs] == [GEOM.tokens(h, w) for h, w in sizes], joined
            for start, n in runs:
                assert tuple(flat[g].shape[-2:]) in {tuple(hw) for hw in SIZES}
                for j in range(n):  # position by position
                    assert out[r, start + j].tolist() == [g, j], (joined, start + j)
                    assert b.labels[r, start + j] == IGNORE_INDEX  # an image position carries no loss
                g += 1
                checked += 1
            assert b.counts("vision")[r] == sum(n for _, n in runs)
        assert g == len(flat)  # every image the encoder embeds has its run
    return checked


@pytest.mark.parametrize("packing", [False, True], ids=["one-per-row", "packed"])
def test_interleaved_images_land_at_their_placeholders(datasets, packing):
    root, inter, _ = datasets
    p = _provider(root / "inter", packing=packing)
    try:
        assert _check_batches(p, inter, 3) > 12
        # every text token (and EOS) is a label, predicted from the position before it unless that one is
        # an image placeholder; BOS, images and padding are never labels
        b = p.next(0)
        tok, img = p.tokenizer, p.image_token_id
        for r in range(len(b.sample_keys)):
            row = b.tokens[r].tolist()
            want = [
                row[t + 1]
                if row[t] != img and row[t + 1] not in (tok.bos_id, tok.pad_id, img)
                else IGNORE_INDEX
                for t in range(SEQ - 1)
            ]
            assert b.labels[r, :-1].tolist() == want
    finally:
        p.close()


def test_multi_image_conversations_with_a_chat_template(datasets, hf_tokenizer):
    root, _, multi = datasets
    p = _provider(root / "multi", tokenizer=hf_tokenizer, packing=True)
    try:
        assert _check_batches(p, multi, 2) > 8
        # the assistant's answer names each image's color in order; only it (and its end) carries loss
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(hf_tokenizer)
        b = p.next(0)
        for r, joined in enumerate(b.sample_keys):
            labels = [t for t in b.labels[r].tolist() if t != IGNORE_INDEX]
            want = []
            for key in joined.split("+"):
                answer = json.loads(_member(root / "multi", key))["conversation"][1]["content"]
                want += hf(answer + "<|im_end|>\n", add_special_tokens=False).input_ids
            assert labels == want, joined
    finally:
        p.close()


def _member(root: Path, key: str) -> str:
    import tarfile

    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                if m.name == f"{key}.json":
                    return tf.extractfile(m).read().decode()
    raise KeyError(key)


@pytest.mark.slow  # a fresh trainer process: importing megatron-core dominates
def test_the_trainer_takes_a_step_on_interleaved_samples(datasets, tmp_path):
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.study.runspec import run_yaml_doc

    root, _, _ = datasets
    study = parse_study(
        {
            "name": "interleaved",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 2},
            "trainer": {
                "model": "tiny",
                "seq_length": SEQ,
                "train_iters": 1,
                "seed": 7,
                "data": {"provider": "energon", "path": str(root / "inter"), "packing": True},
            },
            "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 1}, "gbs": 2, "mbs": 2}]},
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(tmp_path / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    env = worker_env()
    proc = subprocess.run(
        trainer(rd.run_yaml, "--reference", "--quiet"),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (rd.root / "metrics.reference.jsonl").read_text().splitlines()]
    it = next(r for r in rows if r["kind"] == "iteration")
    # what the lane's first microbatch holds, counted here from the run's own loader settings
    from mimo_jobs.data.energon_provider import make_energon_provider

    p = make_energon_provider(spec, spec.rank_layout(), [0], False, True)
    try:
        b = p.next(0)
        want = (int(b.loss_mask.sum()), sum(b.counts("vision")))
    finally:
        p.close()
    assert (it["tokens"], it["extras"]["image_tokens"]) == want
    assert want[1] > 0 and it["loss"] > 0


def test_data_synth_writes_the_several_image_datasets(tmp_path):
    """`mimo-jobs data synth --interleaved N` writes a dataset the provider reads, every sample's images at
    their placeholders; `--multi-image` one beside it."""
    out = tmp_path / "d"
    cmd = [sys.executable, "-m", "mimo_jobs.cli", "data", "synth", str(out), "-n", "8", "-s", "8,16x8"]
    r = subprocess.run([*cmd, "--interleaved", "12", "--multi-image", "5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "d/interleaved: 12 interleaved" in r.stdout and "d/multi: 5 conversations" in r.stdout
    assert (out / "multi" / ".nv-meta" / "dataset.yaml").exists()
    p = _provider(out / "interleaved")
    try:
        keys = set()
        for _ in range(12):  # shuffled with repeats: read well past one pass
            keys |= set(p.next(0).sample_keys)
        assert keys == {f"inter-{i:07d}" for i in range(12)}  # every written sample, nothing else
    finally:
        p.close()
