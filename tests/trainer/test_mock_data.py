"""The mock provider: deterministic per (seed, lane, position), variable image tokens, text-only samples."""

import torch

from mimo_jobs.data.batch import IGNORE_INDEX
from mimo_jobs.data.mock import MockConfig, MockProvider, image_token_id

CFG = MockConfig.one_module(
    seed=7,
    seq_length=32,
    mbs=2,
    num_microbatches=3,
    vocab_size=128,
    patch_size=4,
    channels=3,
    image_sizes=(8, 12, 16),
    text_only_fraction=0.3,
    lanes=4,
)


def test_same_lane_same_samples_whoever_reads_it():
    enc = MockProvider(CFG, [0, 1], need_images=True, need_text=True)
    llm = MockProvider(CFG, [1], need_images=False, need_text=True)
    enc.next(0)  # reading another lane first must not shift lane 1
    a, b = enc.next(1), llm.next(1)
    assert a.sample_keys == b.sample_keys
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert a.counts("vision") == b.counts("vision")
    assert b.inputs["vision"].items is None and len(a.inputs["vision"].items) == 2


def test_token_counts_images_and_masks_agree():
    p = MockProvider(CFG, [0], need_images=True, need_text=True)
    seen, text_only = set(), 0
    img = image_token_id(CFG.vocab_size)
    for _ in range(30):
        b = p.next(0)
        for i, n in enumerate(b.counts("vision")):
            assert int((b.tokens[i] == img).sum()) == n
            im = b.inputs["vision"].items[i]
            if n == 0:
                assert im is None
                text_only += 1
            else:
                side = im.shape[-1]
                assert im.shape == (3, side, side) and n == (side // 4) ** 2
                seen.add(n)
            assert float(b.loss_mask[i][:n].sum()) == 0.0  # no loss on image positions
            assert bool((b.labels[i][b.loss_mask[i] == 0] == IGNORE_INDEX).all())
    assert seen == {4, 9, 16}  # 8x8, 12x12, 16x16 images with 4x4 patches
    assert 0 < text_only < 60


def test_position_advances_step_and_microbatch():
    p = MockProvider(CFG, [3], need_images=False, need_text=True)
    got = [(b.step, b.microbatch) for b in (p.next(3) for _ in range(4))]
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0)]
    state = p.state_dict()
    nxt = p.next(3)
    q = MockProvider(CFG, [3], need_images=False, need_text=True)
    q.load_state_dict(state)
    assert q.next(3).sample_keys == nxt.sample_keys


def test_global_batch_does_not_depend_on_the_layout():
    # gbs 8: 4 lanes x mbs 2 x 1 microbatch, or 2 lanes x mbs 1 x 4 microbatches -> the same 8 samples
    a = MockConfig(**{**CFG.__dict__, "mbs": 2, "lanes": 4, "num_microbatches": 1})
    b = MockConfig(**{**CFG.__dict__, "mbs": 1, "lanes": 2, "num_microbatches": 4})
    pa, pb = MockProvider(a, range(4), False, True), MockProvider(b, range(2), False, True)
    ka = sorted(k for lane in range(4) for k in pa.next(lane).sample_keys)
    kb = sorted(k for _ in range(4) for lane in range(2) for k in pb.next(lane).sample_keys)
    assert ka == kb == sorted(f"mock/7/{i}" for i in range(8))
