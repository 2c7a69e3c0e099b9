"""The drafter kinds, in one table: the CLI's choices, `make_drafter`, the engine service and the
app's settings all read it. No MLX import here: the UI process reads it too."""

from __future__ import annotations

DRAFTERS: dict[str, str] = {  # kind -> what proposes the tokens
    "none": "off: target-only decoding, through the same loop",
    "mtp": "an MTP head on the target's own hidden state (the model's own, or trained)",
    "draft": "a smaller model with the same tokenizer",
    "ngram": "prompt lookup: continuations found earlier in the conversation",
}


def kind_of(drafter_name: str) -> str:
    """The kind of a drafter from its name ("mtp-deepseek" and "mtp+lookup" are "mtp")."""
    return drafter_name.split("+", 1)[0].split("-", 1)[0]


def copies_first(drafter_name: str) -> bool:
    """Does the drafter copy from the conversation's own text first ("mtp+lookup")?"""
    return drafter_name.endswith("+lookup")
