"""`mimo-jobs data prepare`: a LLaVA-style JSONL file and real PNG/JPEG images (written by PIL) become an
energon dataset that the trainer's own provider reads back: each record's conversation as the chat
template renders it (the answers are the loss tokens), each image's bytes, size and placeholders, in
order; a bad record stops the command with its file and line (exit 2, nothing at OUT) or, with --skip-bad,
is counted and listed."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mimo_jobs.data.batch import IGNORE_INDEX
from mimo_jobs.data.images import ImageGeometry, decode

GEOM = ImageGeometry(patch_size=4, image_size=16)
SEQ = 96


def _image(path: Path, hw: tuple[int, int], color: tuple[int, int, int], fmt: str) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", (hw[1], hw[0]), color)
    im.putpixel((0, 0), (255 - color[0], 255 - color[1], 255 - color[2]))
    im.save(path, format=fmt)


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A JSONL of 12 records in the LLaVA layout: one PNG or JPEG each (one in a subfolder), one with two
    images, one text-only; and the image sizes of each record in marker order."""
    root = tmp_path_factory.mktemp("llava")
    images = root / "images"
    records, sizes = [], {}
    for i in range(12):
        hw = [(8, 8), (12, 12), (16, 8)][i % 3]
        name = f"sub/img{i}.jpg" if i == 4 else f"img{i}." + ("png" if i % 2 else "jpg")
        _image(images / name, hw, (20 * i, 200 - 10 * i, 90), "JPEG" if name.endswith("jpg") else "PNG")
        rec = {"id": f"rec.{i}", "image": name, "conversations": _turns("<image>\ncolor?", f"red {i}")}
        if i == 5:  # two images, markers in two turns
            _image(images / "second.png", (12, 12), (1, 2, 3), "PNG")
            rec["image"] = [name, "second.png"]
            rec["conversations"] = _turns("<image>\nand <image>\ncolor?", "red green")
        if i == 7:  # text-only
            del rec["image"]
            rec["conversations"] = _turns("say a word", "the")
        if i == 9:  # no marker: the image goes before the first user text
            rec["conversations"] = _turns("color?", "blue")
        records.append(rec)
        sizes[i + 1] = [] if i == 7 else [hw] + ([(12, 12)] if i == 5 else [])
    jsonl = root / "data.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps(r) for r in records[:6])
        + "\n\n"
        + "\n".join(json.dumps(r) for r in records[6:])
        + "\n"
    )
    # the blank line after record 6: records 7.. are on lines 8..
    lines = {n if n <= 6 else n + 1: i for n, i in zip(range(1, 13), range(12), strict=True)}
    return root, jsonl, images, records, {ln: sizes[i + 1] for ln, i in lines.items()}, lines


def _data(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error(p: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def _members(root: Path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory):
    root, jsonl, images, *_ = source
    out = tmp_path_factory.mktemp("out") / "ds"
    p = _data("prepare", jsonl, "--images", images, "-o", out, "--samples-per-shard", "5")
    assert p.returncode == 0, p.stderr
    return out, p


def test_prepare_writes_every_record_with_its_own_image_bytes(source, prepared):
    _, jsonl, images, records, _, lines = source
    out, p = prepared
    assert (
        f"{out}: 12 samples (train 12, val 0, test 0) with 12 images and 0 audio clips in 3 shard(s)"
        in p.stdout
    )
    assert sorted(x.name for x in out.glob("*.tar")) == [
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
    ]
    meta = out / ".nv-meta"
    assert (
        (meta / "dataset.yaml").is_file()
        and (meta / "split.yaml").is_file()
        and (meta / "index.sqlite").is_file()
    )
    members = _members(out)
    assert sorted(members) == [f"l{ln:09d}" for ln in sorted(lines)]
    for ln, i in lines.items():
        got = members[f"l{ln:09d}"]
        rec = records[i]
        assert json.loads(got["json"]) == {"id": rec["id"], "conversation": rec["conversations"]}
        paths = rec.get("image", [])
        paths = paths if isinstance(paths, list) else [paths]
        imgs = sorted(k for k in got if k != "json")
        assert [k.split(".")[0] for k in imgs] == [str(j) for j in range(len(paths))]
        for j, rel in enumerate(paths):
            ext = "png" if rel.endswith("png") else "jpg"
            assert got[f"{j}.{ext}"] == (images / rel).read_bytes()
    manifest = json.loads((out / "prepare.json").read_text())
    assert manifest["samples"] == {"train": 12, "val": 0, "test": 0} and manifest["skipped"] == 0


def test_the_trainers_provider_reads_it_back(source, prepared, hf_tokenizer):
    """Through the energon provider and task encoder the trainer uses: per sample its images' placeholder
    runs (sizes in marker order), the decoded pixels of the original files, and the loss tokens are exactly
    the answers as the chat template closes them."""
    from transformers import AutoTokenizer

    from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig

    _, _, images, records, sizes, lines = source
    out, _ = prepared
    cfg = LoaderConfig(
        path=str(out),
        llm_dp=1,
        mbs=4,
        num_microbatches=1,
        seq_length=SEQ,
        geometry=GEOM,
        vocab_size=128,
        tokenizer=str(hf_tokenizer),
    )
    hf = AutoTokenizer.from_pretrained(hf_tokenizer)
    p = EnergonProvider(cfg, [0], need_images=True)
    seen = set()
    try:
        while len(seen) < 12:
            b = p.next(0)
            img_id = p.image_token_id
            for r, key in enumerate(b.sample_keys):
                ln = int(key[1:])
                rec = records[lines[ln]]
                seen.add(key)
                want = [GEOM.tokens(h, w) for h, w in sizes[ln]]
                assert b.counts("vision")[r] == sum(want), key
                assert b.tokens[r].tolist().count(img_id) == sum(want), key
                paths = rec.get("image", [])
                paths = paths if isinstance(paths, list) else [paths]
                got = b.inputs["vision"].items[r]
                got = [] if got is None else got if isinstance(got, list) else [got]
                assert len(got) == len(paths), key
                for pixels, rel in zip(got, paths, strict=True):
                    assert pixels.equal(decode((images / rel).read_bytes(), GEOM)), key
                labels = [t for t in b.labels[r].tolist() if t != IGNORE_INDEX]
                answer = rec["conversations"][1]["value"]
                assert labels == hf(answer + "<|im_end|>\n", add_special_tokens=False).input_ids, key
    finally:
        p.close()
    assert len(seen) == 12


def test_split_shares_are_dealt_exactly(source, tmp_path):
    _, jsonl, images, *_ = source
    out = tmp_path / "split"
    p = _data("prepare", jsonl, "--images", images, "-o", out, "--split", "2,1,1")
    assert p.returncode == 0, p.stderr
    assert "(train 6, val 3, test 3)" in p.stdout
    import yaml

    split = yaml.safe_load((out / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert split == {"train": ["train-000000.tar"], "val": ["val-000000.tar"], "test": ["test-000000.tar"]}
    keys = {s: sorted(k for k in _keys(out / f"{s}-000000.tar")) for s in ("train", "val", "test")}
    assert sum(len(v) for v in keys.values()) == 12 and not set(keys["train"]) & set(keys["val"])


def _keys(shard: Path) -> set[str]:
    with tarfile.open(shard) as tar:
        return {m.name.split(".", 1)[0] for m in tar.getmembers()}


def _bad_copy(source, tmp_path, line_no: int, text: str) -> Path:
    _, jsonl, *_ = source
    lines = jsonl.read_text().splitlines()
    lines[line_no - 1] = text
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    return bad


@pytest.mark.parametrize(
    "line,text,says",
    [
        (
            3,
            '{"image": "nowhere.png", "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]}',
            "image 'nowhere.png': no such file",
        ),
        (3, "{not json", "not JSON"),
        (10, '{"conversations": [{"from": "human", "value": "hi"}]}', "conversation has no assistant turn"),
        (
            2,
            '{"image": "img1.png", "conversations": [{"from": "human", "value": "<image><image>"}, {"from": "gpt", "value": "x"}]}',
            "2 <image> marker(s) but the sample has 1 image(s)",
        ),
        (4, '{"image": "../data.jsonl", "conversations": []}', "leaves the image folder"),
        (
            5,
            '{"image": "notes.txt", "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]}',
            "is not an image PIL reads; convert it to PNG or JPEG",
        ),
        (1, "[1, 2]", "a JSON list, expected an object"),
    ],
    ids=["missing-image", "not-json", "no-answer", "markers", "escape", "not-an-image", "not-an-object"],
)
def test_a_bad_record_is_named_by_file_and_line_and_nothing_is_written(source, tmp_path, line, text, says):
    _, _, images, *_ = source
    (images / "notes.txt").write_text("not an image")
    bad = _bad_copy(source, tmp_path, line, text)
    out = tmp_path / "out"
    msg = _one_error(_data("prepare", bad, "--images", images, "-o", out))
    assert msg.startswith(f"error: {bad}:{line}: ") and says in msg, msg
    assert "--skip-bad" in msg
    assert not out.exists() and not list(tmp_path.glob(".out.prepare-staging*"))


def test_skip_bad_counts_and_lists_what_it_skipped(source, tmp_path):
    _, _, images, *_ = source
    bad = _bad_copy(source, tmp_path, 3, '{"image": "gone.png", "conversations": []}')
    with bad.open("ab") as f:
        f.write(b"\xff\xfe not utf-8\n")
    out = tmp_path / "out"
    p = _data("prepare", bad, "--images", images, "-o", out, "--skip-bad")
    assert p.returncode == 0, p.stderr
    assert "11 samples" in p.stdout and "skipped 2 bad record(s)" in p.stdout
    manifest = json.loads((out / "prepare.json").read_text())
    assert manifest["skipped"] == 2
    assert [s["line"] for s in manifest["skipped_lines"]] == [3, 14]
    assert "not UTF-8" in manifest["skipped_lines"][1]["reason"]


def test_bad_arguments_are_one_line_and_exit_2(source, tmp_path):
    _, jsonl, images, *_ = source
    out = tmp_path / "o"
    assert "--split '1,1'" in _one_error(
        _data("prepare", jsonl, "--images", images, "-o", out, "--split", "1,1")
    )
    assert "train share must be above 0" in _one_error(
        _data("prepare", jsonl, "--images", images, "-o", out, "--split", "0,1,1")
    )
    assert "need at least 1" in _one_error(
        _data("prepare", jsonl, "--images", images, "-o", out, "--samples-per-shard", "0")
    )
    assert "no such file" in _one_error(_data("prepare", tmp_path / "none.jsonl", "-o", out))
    assert "not a directory" in _one_error(_data("prepare", jsonl, "--images", jsonl, "-o", out))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert "not empty" in _one_error(_data("prepare", jsonl, "--images", images, "-o", tmp_path / "full"))
    assert not out.exists()


def test_a_record_line_is_read_one_at_a_time(source, tmp_path):
    """Streaming: the records are read line by line (a generator), not loaded whole."""
    from mimo_jobs.data.prepare import _lines

    _, jsonl, *_ = source
    seen = []
    gen = _lines(jsonl, seen.append)
    first = next(gen)
    assert first[0] == 1 and json.loads(first[1])["id"] == "rec.0"
    assert len(seen) == 1 and seen[0] == len(jsonl.read_bytes().splitlines(keepends=True)[0])
    gen.close()


def test_deal_keeps_each_split_at_its_share():
    from mimo_jobs.data.prepare import deal

    counts = {"train": 0, "val": 0, "test": 0}
    shares = (0.8, 0.1, 0.1)
    for n in range(1, 101):
        counts[deal(counts, shares)] += 1
        for s, share in zip(counts, shares, strict=True):
            assert abs(counts[s] - share * n) < 1, (n, counts)
    assert counts == {"train": 80, "val": 10, "test": 10}


def test_data_stats_reads_it_with_a_chat_tokenizer(source, prepared, hf_tokenizer, tmp_path):
    _, _, _, _, sizes, _ = source
    out, _ = prepared
    dest = tmp_path / "stats.json"
    p = _data("stats", out, "--seq-length", SEQ, "--tokenizer", hf_tokenizer, "--json", "-o", dest)
    assert p.returncode == 0, p.stderr
    doc = json.loads(dest.read_text())
    assert doc["samples"] == 12 and doc["skipped"] == 0
    want = sorted(sum(GEOM.tokens(h, w) for h, w in s) for s in sizes.values())
    assert sorted(s["image_tokens"] for s in doc["per_sample"]) == want
