"""Streaming text is UTF-8 safe: a character split across tokens is emitted whole."""

from __future__ import annotations

from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlx_spec.detok import IncrementalDecoder


def test_multibyte_characters_are_never_split(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    text = "héllo wörld 日本語 naïve 🙂 ok"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # some characters really span several byte tokens
    dec = IncrementalDecoder(tok)
    pieces = [dec.add(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert "" in pieces  # some tokens waited for the rest of their character
