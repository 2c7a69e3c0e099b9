"""Prompts as token ids: chat-templated conversations or raw text."""

from __future__ import annotations

from typing import Any

from .errors import MlxSpecError

Message = dict[str, str]  # {"role": "user" | "assistant" | "system", "content": str}


def encode_chat(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The whole conversation through the model's chat template, ready for the next answer."""
    if getattr(tokenizer, "chat_template", None) is None:
        # no template: plain transcript, so base models still work
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return encode_raw(tokenizer, text)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_raw(tokenizer: Any, text: str) -> list[int]:
    if not text:
        raise MlxSpecError("the prompt is empty")
    return list(tokenizer.encode(text))
