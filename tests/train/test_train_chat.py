"""train-drafter on a chat model without --data (train/chat.py): user turns in the model's own
template, answered by the target itself, kept on disk so a later sitting reads them instead of
answering again; rows begin where conversations do; held-out prompts are never trained on."""

from __future__ import annotations

import numpy as np
import pytest

from mlx_spec.loading import load_target
from mlx_spec.train import chat


@pytest.fixture(scope="module")
def target(model_dirs):
    return load_target(model_dirs("qwen3"))


def test_rows_begin_at_each_conversation():
    convs = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    rows = chat.windows(convs, 6)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11],
                                         [9, 10, 11, 12, 13, 14]])
    np.testing.assert_array_equal(chat.windows([[1, 2]], 5), [[1, 2, 1, 2, 1]])


def test_prompts_are_user_turns_in_the_models_template_and_held_out_ones_are_not_trained(
        target):
    _, tok = target
    prompts = chat.chat_prompts(tok, 120)
    assert len(prompts) == 120
    text = tok.decode(prompts[0])
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    asks = set(chat.EVERYDAY) | set(chat.stdlib_questions(2000))
    assert not asks & set(chat.HELD_OUT_CHAT)
    decoded = {tok.decode(p) for p in prompts}
    for ask, p in zip(chat.HELD_OUT_CHAT, chat.held_out_prompts(tok), strict=True):
        assert ask in tok.decode(p) and tok.decode(p) not in decoded
    qs = chat.stdlib_questions(40)
    assert len(qs) == 40 and len({q.split("`")[1].split(".")[0] for q in qs}) > 5  # spread


def test_answers_are_kept_and_a_later_sitting_reads_them(target, tmp_path, monkeypatch):
    """A sitting out of time stops after a batch; the next goes on from there; a third finds
    everything answered and answers nothing."""
    t, tok = target
    prompts = chat.chat_prompts(tok, 40)
    store = tmp_path / "chat"
    first = list(chat.conversations(t, tok, prompts, store, seconds=0.0, max_tokens=12,
                                    batch=16))
    assert len(first) == 16  # out of time after one batch (at least one is always made)
    for p, c in zip(prompts, first, strict=False):
        assert c[: len(p)] == p and 0 < len(c) - len(p) <= 12
    whole = list(chat.conversations(t, tok, prompts, store, seconds=None, max_tokens=12,
                                    batch=16))
    assert len(whole) == 40 and whole[:16] == first

    def no_more(*a, **k):
        raise AssertionError("answered again")

    monkeypatch.setattr(chat, "answer", no_more)
    assert list(chat.conversations(t, tok, prompts, store, seconds=None, max_tokens=12,
                                   batch=16)) == whole


def test_greedy_answers_are_the_targets_own(target):
    """The batched answers at T = 0 are the target's greedy continuation (checked against the
    engine's target-only decoding, prompt by prompt)."""
    from helpers import conversation, run

    t, tok = target
    prompts = chat.chat_prompts(tok, 3)
    got = chat.answer(t, tok, prompts, max_tokens=10, temperature=0.0, seed=0)
    for p, row in zip(prompts, got, strict=True):
        want, _ = run(conversation(t, tok, None), prompt=p, max_tokens=10)
        n = min(len(want.tokens), len(row) - len(p))
        assert n > 0
        assert row[len(p) : len(p) + n] == list(want.tokens)[:n]
