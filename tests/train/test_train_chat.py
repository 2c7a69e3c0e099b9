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


class _Tok:
    """A stand-in tokenizer: ids are characters' codes, 0 the stop token."""

    eos_token_ids, eos_token_id = {0}, 0
    chat_template = "stub"

    def decode(self, ids):
        return "".join(map(chr, ids))

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return f"<s>user:{messages[0]['content']}</s>"


def test_a_turn_that_ended_keeps_its_stop_token():
    """batch_generate leaves the stop token out: a turn shorter than max_tokens ended by one,
    and gets it back (so the head learns where turns end); one cut at max_tokens does not."""
    tok = _Tok()
    assert chat.ended(tok, [5, 6], 4) == ([5, 6, 0], True)
    assert chat.ended(tok, [5, 0], 4) == ([5, 0], True)
    assert chat.ended(tok, [5, 6, 7, 8], 4) == ([5, 6, 7, 8], False)


def test_the_models_own_questions_are_whole_turns_kept_once(tmp_path, monkeypatch):
    """The model writes user turns from its template's user start: only whole ones (ended
    before max_tokens) of 3..80 words, each once, none with template markup; kept on disk, so
    a later sitting writes no more; spread evenly through the prompt list."""
    import importlib
    import types

    generate = importlib.import_module("mlx_lm.generate")  # (mlx_lm.generate: a function)
    tok = _Tok()
    assert tok.decode(chat.user_turn_start(tok)) == "<s>user:"
    CUT = "A turn cut off in the middle of a sentence that goes on and on"
    written = ["How do I fix a bike?", "how do i fix a bike?", "Hi", CUT,
               "What is <|im_end|> here?", "Tell me about the moon please."]
    calls = []

    def fake(model, tokenizer, prompts, *, max_tokens, **kw):
        calls.append(prompts)
        assert prompts == [chat.user_turn_start(tok)] * len(prompts)
        ids = [tok.encode(w)[:max_tokens] for w in written]
        return types.SimpleNamespace(token_ids=ids)

    monkeypatch.setattr(generate, "batch_generate", fake)
    target = types.SimpleNamespace(model=None)
    got = chat.own_questions(target, tok, 5, tmp_path, seconds=0.0, max_tokens=40, log=print)
    assert got == ["How do I fix a bike?", "Tell me about the moon please."]
    assert len(calls) == 1  # out of time after one batch
    monkeypatch.setattr(generate, "batch_generate", None)  # a later sitting: read back
    assert chat.own_questions(target, tok, 5, tmp_path, seconds=None, log=print) == got
    own = [f"question {i} of mine" for i in range(5)]
    prompts = [tok.decode(p) for p in chat.chat_prompts(tok, 20, 0, own)]
    assert len(prompts) == 20
    at = [prompts.index(f"<s>user:{q}</s>") for q in own]
    assert at == sorted(at) and all(3 <= b - a <= 4 for a, b in zip(at, at[1:], strict=False))
