"""Bad data never disappears silently: a clear error naming dataset, shard and key, or a counted skip that
the log reports -- and the LLM side (which never decodes pixels) skips exactly what the encoder side skips."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import struct
import zlib

import pytest

from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.errors import DataError
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.synth import CAPTIONING, prepare, render_png, write_shards

GOOD = [f"g-{i:03d}" for i in range(12)]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png_bad_pixels(h: int = 8, w: int = 8) -> bytes:
    """A PNG whose header and chunk CRCs are valid but whose pixel stream is not zlib data."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", b"not zlib at all" * 4)
        + _chunk(b"IEND", b"")
    )


def _dataset(root, bad: list[tuple[str, dict]], per_shard: int = 4):
    good = [(k, {"png": render_png(8, 8, "red", 0, i), "txt": b"a red thing"}) for i, k in enumerate(GOOD)]
    samples = good[:6] + bad + good[6:]
    with contextlib.redirect_stdout(io.StringIO()):
        shards = write_shards(root, "bad", samples, per_shard)
        prepare(root, shards, CAPTIONING)
    # independent record of where each key was written
    return {key: f"bad-{i // per_shard:06d}.tar" for i, (key, _) in enumerate(samples)}


def _cfg(root, mode: str, nw: int = 0, **kw) -> LoaderConfig:
    return LoaderConfig(
        path=str(root),
        llm_dp=1,
        mbs=4,
        num_microbatches=1,
        seq_length=64,
        geometry=ImageGeometry(4, 16),
        vocab_size=128,
        num_workers=nw,
        on_bad_sample=mode,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        **kw,
    )


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory):
    png = render_png(8, 8, "blue", 0, 99)
    bad = [
        ("b-random", {"png": b"\x89PNG" + bytes(range(200)), "txt": b"x"}),  # not an image
        ("b-trunc", {"png": png[:45], "txt": b"x"}),  # cut-off file
        ("b-nocap", {"png": png}),  # caption field missing from the shard
        ("b-long", {"png": png, "txt": b"y" * 300}),
    ]  # does not fit seq_length=64
    root = tmp_path_factory.mktemp("bad")
    return root, _dataset(root, bad)


def test_error_mode_names_dataset_shard_and_key(bad_root):
    root, where = bad_root
    p = EnergonProvider(_cfg(root, "error"), [0], need_images=True)
    try:
        with pytest.raises(DataError) as ei:
            for _ in range(5):
                p.next(0)
    finally:
        p.close()
    msg = str(ei.value)
    m = re.search(r"shard (bad-\d{6}\.tar), sample '(b-[a-z]+)'", msg)
    assert m, msg
    assert where[m.group(2)] == m.group(1)  # the shard named is the one the key was written to
    assert str(root) in msg and "on_bad_sample: skip" in msg


@pytest.mark.parametrize("need_images", [True, False])
def test_skip_mode_counts_every_bad_sample_and_both_sides_agree(bad_root, caplog, need_images):
    root, where = bad_root
    p = EnergonProvider(_cfg(root, "skip"), [0], need_images=need_images)
    keys, events = [], []
    with caplog.at_level(logging.WARNING, logger="mimo_jobs.data"):
        for _ in range(3):  # exactly one epoch of the 12 good samples (no sample shuffle)
            b = p.next(0)
            keys += b.sample_keys
            events += b.meta["events"]
    p.close()
    assert sorted(keys) == GOOD
    skipped = {e["key"]: e for e in events}
    assert set(skipped) == {"b-random", "b-trunc", "b-nocap", "b-long"}
    assert {k: e["shard"] for k, e in skipped.items()} == {k: where[k] for k in skipped}
    assert {k: e["reason"] for k, e in skipped.items()} == {
        "b-random": "image",
        "b-trunc": "image",
        "b-nocap": "load",
        "b-long": "overlong",
    }
    assert p.totals().skipped == {"image": 2, "load": 1, "overlong": 1}
    assert p.totals().samples == 12
    logged = [r.getMessage() for r in caplog.records]
    for k in skipped:
        assert any(k in line and where[k] in line for line in logged), (k, logged)


def test_truncate_text_is_counted(bad_root):
    root, _ = bad_root
    p = EnergonProvider(_cfg(root, "skip", truncate_text=True), [0], need_images=False)
    rows = [p.next(0) for _ in range(4)]
    p.close()
    long_rows = [(b, i) for b in rows for i, k in enumerate(b.sample_keys) if k == "b-long"]
    assert long_rows, "the overlong sample is kept when truncating"
    b, i = long_rows[0]
    assert int((b.tokens[i] != 0).sum()) == 64  # fills the sequence exactly
    assert p.totals().truncated >= 1 and "overlong" not in p.totals().skipped


def test_pixels_that_fail_after_a_good_header_stop_the_run_even_in_skip_mode(tmp_path):
    where = _dataset(tmp_path, [("b-pixels", {"png": png_bad_pixels(), "txt": b"broken pixels"})])
    llm = EnergonProvider(_cfg(tmp_path, "skip"), [0], need_images=False)
    keys = [k for _ in range(4) for k in llm.next(0).sample_keys]
    llm.close()
    assert "b-pixels" in keys  # header is fine: the LLM side keeps it (it never decodes)...
    enc = EnergonProvider(_cfg(tmp_path, "skip"), [0], need_images=True)
    with pytest.raises(
        DataError, match=rf"shard {where['b-pixels']}, sample 'b-pixels': image passed the header"
    ):
        for _ in range(4):
            enc.next(0)
    enc.close()  # ...so skipping it on the encoder side would misalign the lanes: an error instead


def test_all_bad_dataset_stops_instead_of_looping(tmp_path, monkeypatch):
    import mimo_jobs.data.task_encoder as te

    monkeypatch.setattr(te, "MAX_CONSECUTIVE_SKIPS", 20)
    samples = [(f"b-{i:03d}", {"png": b"junk", "txt": b"x"}) for i in range(8)]
    with contextlib.redirect_stdout(io.StringIO()):
        prepare(tmp_path, write_shards(tmp_path, "junk", samples, 4), CAPTIONING)
    p = EnergonProvider(_cfg(tmp_path, "skip"), [0], need_images=False)
    with pytest.raises(DataError, match="20 consecutive samples were skipped"):
        p.next(0)
    p.close()


def test_not_a_dataset_and_empty_split(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"is not a prepared energon dataset \(no \.nv-meta/dataset\.yaml\)"):
        EnergonProvider(_cfg(tmp_path / "plain", "error"), [0], need_images=False)
    with pytest.raises(DataError, match="does not exist"):
        EnergonProvider(_cfg(tmp_path / "missing", "error"), [0], need_images=False)
    # a dataset whose shards all went to the val split: the train split is empty
    root = tmp_path / "valonly"
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    good = [(f"g-{i}", {"png": render_png(8, 8, "red", 0, i), "txt": b"t"}) for i in range(4)]
    shards = write_shards(root, "v", good, 4)
    with contextlib.redirect_stdout(io.StringIO()):
        BaseWebdatasetFactory.prepare_dataset(
            root, shards, split_parts_ratio=[("train", 0.0), ("val", 1.0)], shuffle_seed=None, workers=1
        )
    import yaml

    (root / ".nv-meta" / "dataset.yaml").write_text(yaml.safe_dump(CAPTIONING))
    with pytest.raises(DataError, match="train split is empty|no samples"):
        p = EnergonProvider(_cfg(root, "error"), [0], need_images=False)
        p.next(0)
