"""The tokenizer kept between runs (tokenizer_cache.py): a second load comes from the cache and
tokenizes, detokenizes and templates exactly as a fresh load; a changed tokenizer file, another
library version or a broken pickle is a miss; a tokenizer that does not pickle still loads."""

from __future__ import annotations

import shutil
import time

import mlx_lm.utils
import pytest

from mlx_spec import tokenizer_cache
from mlx_spec.loading import load_target

TEXTS = ["def héllo(x):\n    return x**2  # 日本語 12345", "  spaces\r\nand\ttabs  ", ""]


@pytest.fixture
def counted(monkeypatch):
    """How many times the slow load ran."""
    calls = []
    slow = mlx_lm.utils.load_tokenizer

    def load(*a, **kw):
        calls.append(a[0])
        return slow(*a, **kw)

    monkeypatch.setattr(mlx_lm.utils, "load_tokenizer", load)
    return calls


@pytest.fixture
def model(model_dirs, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(model_dirs("llama"), d)
    return d


def streamed(tokenizer, ids: list[int]) -> str:
    stream = tokenizer.detokenizer
    stream.reset()
    for i in ids:
        stream.add_token(i)
    stream.finalize()
    return stream.text


def same(a, b) -> None:
    for text in TEXTS:
        ids = a.encode(text)
        assert ids == b.encode(text)
        assert a.decode(ids) == b.decode(ids)
        assert streamed(a, ids) == streamed(b, ids)
    chat = [{"role": "user", "content": "hi"}]
    assert a.apply_chat_template(chat, tokenize=False) == \
        b.apply_chat_template(chat, tokenize=False)
    assert a.eos_token_ids == b.eos_token_ids
    assert type(a.detokenizer) is type(b.detokenizer)


def test_a_second_load_comes_from_the_cache_and_tokenizes_the_same(model, counted):
    _, fresh = load_target(model)
    _, again = load_target(model)
    assert counted == [model]  # the second load never ran the slow path
    same(fresh, again)


def test_a_changed_file_or_library_is_a_miss(model, counted, monkeypatch):
    load_target(model)
    config = model / "tokenizer_config.json"
    time.sleep(0.01)
    config.write_text(config.read_text())  # the same text, a new modification time
    load_target(model)
    assert len(counted) == 2
    monkeypatch.setattr(tokenizer_cache, "version", lambda package: "0.0-other")
    load_target(model)
    assert len(counted) == 3


def test_a_broken_pickle_is_replaced(model, counted):
    kept = tokenizer_cache.data_dir() / "tokenizers"
    before = set(kept.glob("*.pickle"))
    _, fresh = load_target(model)
    files = set(kept.glob("*.pickle")) - before  # this model's
    assert len(files) == 1
    for f in files:
        f.write_bytes(b"not a pickle")
    _, again = load_target(model)
    assert len(counted) == 2
    same(fresh, again)
    _, third = load_target(model)  # rewritten: from the cache again
    assert len(counted) == 2
    same(fresh, third)


def test_a_tokenizer_that_does_not_pickle_still_loads(model, monkeypatch):
    slow = mlx_lm.utils.load_tokenizer

    def unpicklable(*a, **kw):
        tok = slow(*a, **kw)
        tok._tokenizer.hook = lambda: None  # remote code can hold such things
        return tok

    monkeypatch.setattr(mlx_lm.utils, "load_tokenizer", unpicklable)
    before = set((tokenizer_cache.data_dir() / "tokenizers").glob("*.pickle"))
    _, tok = load_target(model)
    assert tok.encode("hi")
    assert set((tokenizer_cache.data_dir() / "tokenizers").glob("*.pickle")) == before
