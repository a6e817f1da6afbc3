"""Instruction data through the real loader: VQA and conversation samples whose text lives in a JSON member
(field_map json[...]), rendered with a HuggingFace tokenizer's chat template (built by the tests), labels
checked token by token against a layout the test builds on its own from the template's grammar."""

from __future__ import annotations

import contextlib
import io
import json
import tarfile

import pytest
import torch
from conftest import build_hf_tokenizer

from mimo_jobs.data.batch import IGNORE_INDEX
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.errors import DataError
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.synth import (
    CONVERSATION,
    VQA,
    conversation_sample,
    prepare,
    render_png,
    vqa_sample,
    write_shards,
)
from mimo_jobs.data.task_encoder import label_row
from mimo_jobs.data.tokenizer import CharTokenizer

GEOM = ImageGeometry(patch_size=4, image_size=16)
SEQ = 64


def _provider(path, tokenizer=None, mbs=4, on_bad_sample="error"):
    cfg = LoaderConfig(
        path=str(path),
        llm_dp=1,
        mbs=mbs,
        num_microbatches=1,
        seq_length=SEQ,
        geometry=GEOM,
        vocab_size=128,
        tokenizer=str(tokenizer) if tokenizer else None,
        on_bad_sample=on_bad_sample,
    )
    return EnergonProvider(cfg, [0], need_images=False)


def _rows(provider, batches):
    """(key, tokens, labels, loss_mask, image tokens) per sample of the next `batches` batches."""
    out = []
    for _ in range(batches):
        b = provider.next(0)
        for i, key in enumerate(b.sample_keys):
            out.append(
                (key, b.tokens[i].tolist(), b.labels[i].tolist(), b.loss_mask[i], b.counts("vision")[i])
            )
    return out


class Chat:
    """The ChatML grammar of the test tokenizer, spelled out piece by piece (no template engine)."""

    def __init__(self, path):
        from transformers import AutoTokenizer

        self.t = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.start, self.end, self.img = self.t.convert_tokens_to_ids(
            ["<|im_start|>", "<|im_end|>", "<image>"]
        )

    def enc(self, s):
        return self.t.encode(s, add_special_tokens=False)

    def header(self, role):
        return [self.start] + self.enc(role) + self.enc("\n")

    def close(self):
        return [self.end] + self.enc("\n")


def _expect(parts):
    """parts: [(token ids, is_answer)] -> padded-free tokens and labels: position p predicts p+1 when token
    p+1 is an answer token and token p is not an image placeholder."""
    toks, ans = [], []
    for ids, a in parts:
        toks += ids
        ans += [a] * len(ids)
    return toks, ans


def _check_row(tokens, labels, loss_mask, want_toks, want_ans, img_id, pad_id):
    n = len(want_toks)
    assert tokens[:n] == want_toks
    assert all(t == pad_id for t in tokens[n:])
    for p in range(len(labels)):
        if p < n - 1 and want_ans[p + 1] and want_toks[p] != img_id:
            assert labels[p] == want_toks[p + 1], p
        else:
            assert labels[p] == IGNORE_INDEX, p
    assert torch.equal(loss_mask, (torch.tensor(labels) != IGNORE_INDEX).float())


def test_vqa_from_json_member_with_chat_template_loss_on_the_answer_only(instruct_data, hf_tokenizer):
    res, cfg = instruct_data
    chat = Chat(hf_tokenizer)
    p = _provider(res.vqa, hf_tokenizer)
    try:
        rows = _rows(p, 6)
    finally:
        p.close()
    assert len(rows) == 24 and len({r[0] for r in rows}) > 12
    for key, tokens, labels, mask, n_img in rows:
        _, (h, w), _, member = vqa_sample(cfg.seed, int(key.split("-")[1]), cfg.image_sizes)
        assert n_img == GEOM.tokens(h, w) > 0
        want, ans = _expect(
            [
                (chat.header("user") + [chat.img] * n_img + chat.enc("\n"), False),
                (chat.enc(member["context"]) + chat.close(), False),
                (chat.header("assistant"), False),
                (chat.enc(member["answers"][0]) + chat.close(), True),
            ],
        )
        _check_row(tokens, labels, mask, want, ans, chat.img, chat.t.pad_token_id)
        # the answer's tokens are the only loss-bearing targets
        assert [x for x in labels if x != IGNORE_INDEX] == chat.enc(member["answers"][0]) + chat.close()


def test_vqa_with_the_builtin_tokenizer_keeps_the_plain_layout(instruct_data):
    res, cfg = instruct_data
    tok = CharTokenizer(vocab_size=128, image_token_id=127)
    p = _provider(res.vqa)
    try:
        rows = _rows(p, 2)
    finally:
        p.close()
    for key, tokens, labels, mask, n_img in rows:
        _, _, _, member = vqa_sample(cfg.seed, int(key.split("-")[1]), cfg.image_sizes)
        q, a = tok.encode(member["context"]), tok.encode(member["answers"][0])
        want, ans = _expect([([tok.bos_id] + [127] * n_img + q, False), (a + [tok.eos_id], True)])
        _check_row(tokens, labels, mask, want, ans, 127, tok.pad_id)


def test_conversation_loss_on_every_assistant_turn_and_nothing_else(instruct_data, hf_tokenizer):
    res, cfg = instruct_data
    chat = Chat(hf_tokenizer)
    p = _provider(res.chat, hf_tokenizer)
    try:
        rows = _rows(p, 6)
    finally:
        p.close()
    for key, tokens, labels, mask, n_img in rows:
        _, (h, w), _, member = conversation_sample(cfg.seed, int(key.split("-")[1]), cfg.image_sizes)
        turns = member["conversation"]
        assert n_img == GEOM.tokens(h, w)
        assert turns[0]["content"].startswith("<image>\n")
        want, ans = _expect(
            [
                (chat.header("user") + [chat.img] * n_img, False),
                (chat.enc(turns[0]["content"][len("<image>") :]) + chat.close(), False),
                (chat.header("assistant"), False),
                (chat.enc(turns[1]["content"]) + chat.close(), True),
                (chat.header("user") + chat.enc(turns[2]["content"]) + chat.close(), False),
                (chat.header("assistant"), False),
                (chat.enc(turns[3]["content"]) + chat.close(), True),
            ],
        )
        _check_row(tokens, labels, mask, want, ans, chat.img, chat.t.pad_token_id)


def test_instruct_loader_resumes_exactly(instruct_data, hf_tokenizer):
    res, _ = instruct_data
    a = _provider(res.blend, hf_tokenizer, mbs=3)
    try:
        _rows(a, 4)
        state = a.state_dict()
        after = _rows(a, 5)
    finally:
        a.close()
    b = _provider(res.blend, hf_tokenizer, mbs=3)
    try:
        b.load_state_dict(state)
        again = _rows(b, 5)
    finally:
        b.close()
    assert [(k, t, lab) for k, t, lab, _, _ in after] == [(k, t, lab) for k, t, lab, _, _ in again]
    assert {k.split("-")[0] for k, *_ in after} >= {"vqa", "chat"}


@pytest.mark.parametrize("tok", ["builtin", "hf-without-template"])
def test_conversation_without_a_chat_template_is_refused_even_when_skipping(instruct_data, tmp_path, tok):
    res, _ = instruct_data
    path = None
    if tok != "builtin":
        path = build_hf_tokenizer(tmp_path / "tok")
        (path / "chat_template.jinja").unlink()
    p = _provider(res.chat, path, on_bad_sample="skip")
    try:
        with pytest.raises(DataError, match="need a tokenizer with a chat template"):
            p.next(0)
    finally:
        p.close()


def _vqa_shard(root, member_bytes):
    png = render_png(8, 8, "red", 0, 0)
    write_shards(root, "bad", [("vqa-0000000", {"png": png, "json": member_bytes})], 4)
    with contextlib.redirect_stdout(io.StringIO()):
        prepare(root, ["bad-000000.tar"], VQA)
    return root


@pytest.mark.parametrize(
    "member,match",
    [
        (b"{not json", "member 'json' is not valid UTF-8 JSON"),
        (json.dumps({"question": "q?", "answers": ["a"]}).encode(), "context"),
    ],
    ids=["broken-json", "missing-key"],
)
def test_bad_json_member_names_the_sample(tmp_path, member, match):
    root = _vqa_shard(tmp_path / "ds", member)
    p = _provider(root)
    try:
        with pytest.raises(DataError, match=match) as e:
            p.next(0)
    finally:
        p.close()
    assert "vqa-0000000" in str(e.value) and "bad-000000.tar" in str(e.value)


def test_conversation_image_markers_must_match_the_images(tmp_path, hf_tokenizer):
    png = render_png(8, 8, "red", 0, 0)
    turns = [{"from": "human", "value": "<image> <image> two?"}, {"from": "gpt", "value": "red"}]
    write_shards(
        tmp_path, "c", [("c-0", {"png": png, "json": json.dumps({"conversation": turns}).encode()})], 4
    )
    with contextlib.redirect_stdout(io.StringIO()):
        prepare(tmp_path, ["c-000000.tar"], CONVERSATION)
    p = _provider(tmp_path, hf_tokenizer)
    try:
        with pytest.raises(DataError, match=r"2 <image> marker\(s\) but the sample has 1 image"):
            p.next(0)
    finally:
        p.close()


def test_label_rule_never_puts_loss_on_an_image_position():
    # BOS, 2 image tokens, then a target-only text: position 2 (an image) may not predict token 3
    row = label_row([1, 9, 9, 5, 6], [False, False, False, True, True], image_token_id=9)
    assert row.tolist() == [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 6]


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path):
    from mimo_jobs.data.tokenizer import HFTokenizer

    path = build_hf_tokenizer(tmp_path / "big", vocab_size=120)
    with pytest.raises(DataError, match="choose a preset with vocab_size >= "):
        HFTokenizer(str(path), vocab_size=64, image_token_id=63)


def test_synth_writes_instruction_members_as_a_vqa_dataset_expects(instruct_data):
    res, cfg = instruct_data
    with tarfile.open(res.vqa / res.vqa_shards[0]) as t:
        member = json.loads(t.extractfile("vqa-0000003.json").read())
    assert member == vqa_sample(cfg.seed, 3, cfg.image_sizes)[3]
    assert set(member) == {"context", "answers"} and isinstance(member["answers"], list)


def test_cli_synth_writes_vqa_and_conversations_and_refuses_negative_counts(tmp_path):
    import subprocess
    import sys

    import yaml

    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "mimo_jobs.cli", "data", "synth", str(out), "-n", "20", "-f", "0.5"]
    r = subprocess.run(
        cmd + ["--vqa", "10", "--conversations", "20", "--samples-per-shard", "8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "10 VQA samples in 2 shard(s)" in r.stdout and "20 conversations in 3 shard(s)" in r.stdout
    blend = yaml.safe_load((out / "blend.yaml").read_text())["splits"]["train"]["blend"]
    assert {e["path"]: e["weight"] for e in blend} == {
        "./caps": 0.2,
        "./text": 0.2,
        "./vqa": 0.2,
        "./chat": 0.4,
    }
    meta = yaml.safe_load((out / "chat" / ".nv-meta" / "dataset.yaml").read_text())
    assert meta["sample_type"]["__class__"] == "ConversationSample"
    bad = subprocess.run(
        cmd[:5] + [str(tmp_path / "bad"), "--vqa", "-1"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "vqa=-1" in bad.stderr and not (tmp_path / "bad").exists()
