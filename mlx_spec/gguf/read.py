"""Opening a GGUF file: its metadata and tensors through the `gguf` package (llama.cpp's own
reader), checked once so that a truncated or corrupt file is one clear line, never a traceback
half-way through a conversion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError, first_line

MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFFile:
    """An opened GGUF file. meta: every key/value of its header (arrays as lists); tensors: the
    reader's tensor records (name, tensor_type, data as a memory map), in file order."""

    path: Path
    meta: dict[str, Any]
    tensors: tuple[Any, ...]

    @property
    def arch(self) -> str:
        return str(self.meta.get("general.architecture", "?"))

    def arch_key(self, key: str, default: Any = None) -> Any:
        """`{arch}.{key}` from the header (e.g. "block_count" → llama.block_count)."""
        return self.meta.get(f"{self.arch}.{key}", default)

    def tensor_types(self) -> dict[str, int]:
        """How many tensors of each type (Q4_K: 168, F32: 121, …): what the file holds."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts


def open_gguf(path: str | Path) -> GGUFFile:
    """Read a GGUF file's header and tensor table; raises ModelLoadError with one line when the
    file is missing, not GGUF, truncated, or its tensors run past its end."""
    from gguf import GGUFReader

    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise ModelLoadError(f"{path.name} is not a GGUF file (no GGUF magic)")
    try:
        reader = GGUFReader(path, "r")
        meta = {key: _value(field) for key, field in reader.fields.items()}
        tensors = tuple(reader.tensors)
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors, …
        raise ModelLoadError(f"{path.name} is truncated or corrupt: {first_line(e)}") from e
    size = path.stat().st_size
    for t in tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ModelLoadError(f"{path.name} is truncated: tensor {t.name} runs past the end "
                                 f"of the file ({size} bytes)")
    return GGUFFile(path, meta, tensors)


def _value(field: Any) -> Any:
    value = field.contents()
    return value.tolist() if hasattr(value, "tolist") else value
