"""Whether two models share a tokenizer: the one rule, for a loaded pair (drafters) and for two
downloaded directories (hub, before launch). No MLX: the app's process may ask."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import TokenizerMismatchError


def check_same(draft: dict[str, int], target: dict[str, int], draft_name: str,
               target_name: str) -> None:
    """Token -> id maps (special tokens included) must be equal; else one line naming a token
    the two disagree on. Embedding sizes are not compared: padded vocabularies are fine."""
    if draft != target:
        raise TokenizerMismatchError(f"{draft_name} does not share {target_name}'s tokenizer: "
                                     f"{_first_difference(draft, target)}")


def read_vocabulary(model_dir: Path) -> dict[str, int] | None:
    """A directory's token -> id map from its tokenizer.json (added tokens included), as
    `get_vocab()` gives it; None when there is no such file to read."""
    try:
        data = json.loads((model_dir / "tokenizer.json").read_text())
        vocab = dict(data["model"]["vocab"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab


def _first_difference(draft: dict[str, int], target: dict[str, int]) -> str:
    if len(draft) != len(target):
        head = f"{len(draft)} tokens against {len(target)}"
    else:
        head = "the same number of tokens, other ids"
    for token, i in sorted(target.items(), key=lambda kv: kv[1]):
        if draft.get(token) != i:
            where = "missing" if token not in draft else f"id {draft[token]}"
            return f"{head}; e.g. {token!r} is id {i} for the target, {where} for the draft"
    extra = next(t for t in draft if t not in target)
    return f"{head}; e.g. {extra!r} exists only for the draft"
