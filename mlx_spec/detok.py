"""Incremental, UTF-8 safe detokenization.

Decoding tokens one by one breaks characters whose bytes span several tokens, and some tokenizers
render a token differently depending on its left neighbour. So we decode a short window that
starts a few tokens back and emit only the new suffix — and nothing while the window ends in an
incomplete character (U+FFFD), which is emitted whole with a later token.
"""

from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # tokens before this are already emitted as text

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            new = text[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            return new
        return ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
