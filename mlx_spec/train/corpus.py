"""The offline corpus: Python's own standard-library sources, split into train and held-out files.

Besides raw code, a fraction of the samples are chat-formatted (user: a function's signature and
docstring, assistant: the function) so that the demo model answers in the chat template too.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HELD_OUT_PERCENT = 3


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the running interpreter's stdlib, in a fixed order (no site-packages)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in sorted(root.rglob("*.py"))
        if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts
    ]
    return files


def is_held_out(path: Path) -> bool:
    """A stable file-level split decided by a hash of the name, never by order."""
    digest = hashlib.sha256(path.name.encode() + str(path.parent.name).encode()).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def chat_samples(source: str) -> Iterator[tuple[str, str]]:
    """(user, assistant) pairs: 'Write <signature> — <docstring line>' → the function's source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = ast.get_source_segment(source, node)
        if not body or len(body) > 1500:
            continue
        doc = (ast.get_docstring(node) or "").strip().split("\n")[0]
        signature = body.split("\n", 1)[0].rstrip(":")
        ask = f"Write {signature.strip()}" + (f" — {doc}" if doc else "")
        yield ask, body


def documents(split: str, *, chat_template) -> Iterator[str]:
    """Training documents of one split ('train' or 'heldout'): raw files, then chat samples."""
    for path in stdlib_files():
        if is_held_out(path) != (split == "heldout"):
            continue
        text = read_text(path)
        if not text:
            continue
        yield text
        for i, (ask, answer) in enumerate(chat_samples(text)):
            if i % 3 == 0:  # a third of the functions, so chat does not dominate the corpus
                yield chat_template(ask, answer)


def prompts_from_corpus(tokenizer: Any, n: int, length: int = 48) -> list[list[int]]:
    """The first `length` tokens of n held-out stdlib files (never seen in training)."""
    out = []
    for path in stdlib_files():
        if len(out) == n:
            break
        text = read_text(path) if is_held_out(path) else None
        if text and len(text) > 2000:
            ids = tokenizer.encode(text[: length * 16], add_special_tokens=False)
            out.append(list(ids[:length]))
    return out


def long_prompt(tokenizer: Any, length: int) -> list[int]:
    """`length` tokens of held-out stdlib source, files joined in order (long-context rows),
    encoded 40 lines at a time (a whole file can exceed the tokenizer's stated maximum, and
    transformers warns about it)."""
    ids: list[int] = []
    for path in stdlib_files():
        lines = (read_text(path) or "").splitlines(keepends=True) if is_held_out(path) else []
        for i in range(0, len(lines), 40):
            ids += tokenizer.encode("".join(lines[i : i + 40]), add_special_tokens=False)
            if len(ids) >= length:
                return ids[:length]
    raise ValueError(f"the held-out corpus has fewer than {length} tokens")
