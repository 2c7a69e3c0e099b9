"""A GGUF header's scalars and a fingerprint of its vocabulary, read in a fraction of a second
(the `gguf` package's reader builds an object per token: seconds per file). Enough to list the
GGUF files on a machine and to pair a target with a draft model of the same vocabulary; the
tensors are never touched here."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ModelLoadError

# GGUF value types: their struct codes (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
STRING, ARRAY = 8, 9
VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def read_header(path: str | Path) -> dict[str, Any]:
    """Every scalar and string of the header; arrays are skipped, except that the vocabulary
    and merges are hashed into "vocab_sha256" (equal for files that tokenize alike); and
    "parameters", the weights outside the embeddings, from the tensor table."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path.name} is not a GGUF file (no GGUF magic)")
            version, tensors, count = struct.unpack("<IQQ", f.read(20))
            if version < 2:
                raise ModelLoadError(f"{path.name}: GGUF version {version} is too old")
            meta: dict[str, Any] = {}
            vocab = hashlib.sha256()
            for _ in range(count):
                key = _string(f)
                kind = _u32(f)
                if kind == ARRAY:
                    start = f.tell()
                    _skip_array(f)
                    if key in VOCAB_KEYS:
                        end = f.tell()
                        f.seek(start)
                        vocab.update(f.read(end - start))
                else:
                    meta[key] = _value(f, kind)
            meta["vocab_sha256"] = vocab.hexdigest()
            meta["parameters"] = _parameters(f, tensors)
            return meta
    except (struct.error, UnicodeDecodeError, ValueError, MemoryError) as e:
        raise ModelLoadError(f"{path.name} is truncated or corrupt ({e})") from e


def _parameters(f: BinaryIO, tensors: int) -> int:
    """Weights outside the embedding and output matrices (what a token's compute grows with),
    from the tensor table that follows the header (names and shapes)."""
    total = 0
    for _ in range(tensors):
        name = _string(f)
        (dims,) = struct.unpack("<I", f.read(4))
        shape = struct.unpack(f"<{dims}Q", f.read(8 * dims))
        f.seek(4 + 8, 1)  # the type and the data offset
        n = 1
        for d in shape:
            n *= d
        total += 0 if name.startswith(("token_embd.", "output.")) else n
    return total


def _u32(f: BinaryIO) -> int:
    return struct.unpack("<I", f.read(4))[0]


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > 1 << 26:
        raise ValueError(f"a string of {n} bytes")
    return f.read(n).decode("utf-8")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == STRING:
        return _string(f)
    if kind not in SCALARS:
        raise ValueError(f"value type {kind}")
    code = SCALARS[kind]
    return struct.unpack("<" + code, f.read(struct.calcsize(code)))[0]


def _skip_array(f: BinaryIO) -> None:
    kind, n = struct.unpack("<IQ", f.read(12))
    if kind == STRING:
        for _ in range(n):
            (size,) = struct.unpack("<Q", f.read(8))
            f.seek(size, 1)
    elif kind == ARRAY:
        for _ in range(n):
            _skip_array(f)
    elif kind in SCALARS:
        f.seek(n * struct.calcsize(SCALARS[kind]), 1)
    else:
        raise ValueError(f"array of value type {kind}")
