"""A model's tokenizer, kept ready between runs: mlx-lm's `load_tokenizer` parses tokenizer.json
in Python and in Rust several times over and walks the whole vocabulary twice (on a Qwen2.5
vocabulary, longer than reading its 2 GB of weights: DESIGN.md, "Measurements"); the finished
TokenizerWrapper, pickled, comes back in a fraction of that (its Rust tokenizer rebuilt once from
its own JSON).

The pickle lives in MLX_SPEC_HOME/tokenizers/, written by this process from files on this
machine, and is keyed by everything that could make it stale: the directory, each tokenizer
file's size and modification time, and the versions of Python, mlx-lm, transformers and
tokenizers. A key that does not match is a miss; a pickle that will not load is removed and the
tokenizer loaded the slow way (and kept again). A tokenizer that cannot be pickled (remote
code) is simply loaded every time."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .paths import data_dir

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
         "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt",
         "added_tokens.json", "chat_template.jinja", "chat_template.json")
PACKAGES = ("mlx-lm", "transformers", "tokenizers")
FORMAT = 1  # bump when what is pickled changes shape


def load_tokenizer(path: Path, eos_token_ids: Any = None) -> Any:
    """mlx-lm's TokenizerWrapper for the model directory `path`, from the cache when it holds
    one for these files and library versions."""
    from mlx_lm.utils import load_tokenizer as load_slowly

    file = cache_file(path, eos_token_ids)
    if file is not None and file.exists():
        try:
            return pickle.loads(file.read_bytes())
        except Exception:  # noqa: BLE001 - a stale or broken pickle: forget it, load anew
            file.unlink(missing_ok=True)
    tokenizer = load_slowly(path, None, eos_token_ids=eos_token_ids)
    if file is not None:
        keep(tokenizer, file)
    return tokenizer


def cache_file(path: Path, eos_token_ids: Any) -> Path | None:
    """Where the tokenizer of `path` is kept; None if its files cannot be read."""
    parts = [f"format {FORMAT}", str(path.resolve()), repr(eos_token_ids),
             sys.version.split()[0]]
    for package in PACKAGES:
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package} -")
    try:
        for name in FILES:
            f = path / name
            if f.exists():
                st = f.stat()
                parts.append(f"{name} {st.st_size} {st.st_mtime_ns}")
    except OSError:
        return None
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return data_dir() / "tokenizers" / f"{digest}.pickle"


def keep(tokenizer: Any, file: Path) -> None:
    """Pickle it to `file` (written beside it, then renamed: a reader never sees half a file);
    a tokenizer that does not pickle, or a disk that refuses, only costs the next start."""
    try:
        data = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # one that pickles but will not load back is not kept
    except Exception:  # noqa: BLE001 - remote-code tokenizers and the like: not cached
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        part = file.with_suffix(f".{os.getpid()}.partial")
        part.write_bytes(data)
        part.replace(file)
    except OSError:
        return
