"""Prompts as token ids: chat-templated conversations or raw text."""

from __future__ import annotations

from typing import Any

from .errors import MlxSpecError

Message = dict[str, Any]  # {"role": "user" | "assistant" | "system" | "tool", "content": str, …}


def valid_text(text: str) -> tuple[str, bool]:
    """`text` as valid Unicode, and whether anything had to be replaced. Bytes that are not
    UTF-8 reach Python as lone surrogates (a shell passes argv bytes through surrogateescape, a
    paste can carry them) and make tokenizers raise; each becomes U+FFFD, as a decoder would."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that do not stand for bytes
        raw = text.encode("utf-8", "surrogatepass")
    clean = raw.decode("utf-8", "replace")
    return clean, clean != text


def encode_chat(tokenizer: Any, messages: list[Message], *,
                tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The whole conversation through the model's chat template, ready for the next answer.
    tools: function definitions (OpenAI's shape) the template lays out for the model."""
    messages = [{**m, "content": valid_text(m.get("content") or "")[0]} for m in messages]
    if getattr(tokenizer, "chat_template", None) is None:
        # no template: plain transcript, so base models still work
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return encode_raw(tokenizer, text)
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **extra)
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_raw(tokenizer: Any, text: str) -> list[int]:
    if not text:
        raise MlxSpecError("the prompt is empty")
    return list(tokenizer.encode(valid_text(text)[0]))
