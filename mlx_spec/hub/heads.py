"""A Qwen3.5-family MTP head for an MLX conversion, which dropped it.

Two sources, in this order:

* a sidecar repo (mlx-vlm's layout, e.g. `mlx-community/Qwen3.6-27B-MTP-4bit`): fetched whole,
  it is small;
* the original checkpoint (e.g. `Qwen/Qwen3.6-27B`), which kept `mtp.*`: its safetensors index
  says which shards hold them, and range requests read only those tensors (remote.py).

What is read out of a checkpoint is written as a checkpoint of its own: the original config.json
and one safetensors file with the `mtp.*` tensors byte for byte, plus one GDN `conv1d.weight`
(a few kB). That last tensor is the layout witness: an HF-layout conv is [C, 1, K], an MLX one
[C, K, 1], and it is how the loader (drafters/nextn.py) knows the head's zero-centred norms need
+1, exactly as for a full checkpoint. The directory appears only when complete (written beside,
then renamed), so a cut transfer never leaves a head that looks whole.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..paths import data_dir
from .download import DownloadError, ProgressFn, fetch
from .remote import RangeReader, write_safetensors

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
WITNESS = "conv1d.weight"
SOURCE = "source.json"


def heads_root() -> Path:
    return data_dir() / "heads"


def head_dir(original: str) -> Path:
    return heads_root() / original.replace("/", "--")


def extracted_head(original: str) -> Path | None:
    """The head read out of `original`: its quantized copy when one was made, else as read."""
    path = head_dir(original)
    if not (path / SOURCE).exists():
        return None
    quantized = sorted(path.parent.glob(f"{path.name}.q*"))
    return next((q for q in quantized if (q / "config.json").exists()), path)


def label(d: Path) -> str | None:
    """'org/name (MTP head)' or 'org/name (MTP head, q4)' for a head directory, else None."""
    m = re.fullmatch(r"(.+?)(?:\.(q\d+))?", d.name)
    if m is None or not ((d / SOURCE).exists() or (m[2] and (d / "config.json").exists())):
        return None
    return f"{m[1].replace('--', '/')} (MTP head{', ' + m[2] if m[2] else ''})"


def all_copies(original: str) -> list[Path]:
    """The head as read and every quantized copy of it (what `rm` frees)."""
    raw = head_dir(original)
    return [p for p in [raw, *sorted(raw.parent.glob(f"{raw.name}.q*"))] if p.is_dir()]


def fetch_sidecar(repo: str, *, progress: ProgressFn | None = None, cancel=None) -> Path:
    return fetch(repo, patterns=["*.json", "*.safetensors"], progress=progress, cancel=cancel)


def extract_head(original: str, *, progress: ProgressFn | None = None, cancel=None) -> Path:
    """Read only the MTP tensors of `original` into head_dir(original); returns it."""
    from ..layouts import checkpoint_prefix

    done = extracted_head(original)
    if done is not None:
        return done
    small = fetch(original, patterns=["config.json", INDEX], progress=progress, cancel=cancel)
    config = json.loads((small / "config.json").read_text())
    prefix = checkpoint_prefix(config)
    if prefix is None:
        raise DownloadError(f"{original}'s config declares no MTP module of a known layout")
    reader = RangeReader(original)
    by_file = _where(small, reader, prefix)
    names = [n for f in by_file.values() for n in f]
    if not any(n.startswith(prefix) for n in names):
        raise DownloadError(f"{original} has no MTP tensors ({prefix}*) in its checkpoint")
    tensors: dict[str, tuple[dict, bytes]] = {}
    for file, wanted in by_file.items():
        header = reader.header(file)
        missing = [n for n in wanted if n not in header.tensors]
        if missing:
            raise DownloadError(f"{original}/{file}: the index names {missing[0]}, "
                                "the shard does not have it")
        data = reader.tensors(header, wanted)
        tensors.update({n: (header.tensors[n], data[n]) for n in wanted})
    return _write(original, config, dict(sorted(tensors.items())), reader)


def _where(small: Path, reader: RangeReader, prefix: str) -> dict[str, list[str]]:
    """shard -> the tensors to read from it: every `prefix*` tensor and one conv witness."""
    index = small / INDEX
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    else:
        weight_map = {n: SINGLE for n in reader.header(SINGLE).tensors}
    wanted = [n for n in weight_map if n.startswith(prefix)]
    witness = next((n for n in sorted(weight_map) if n.endswith(WITNESS)
                    and not n.startswith(prefix)), None)
    by_file: dict[str, list[str]] = {}
    for n in wanted + ([witness] if witness else []):
        by_file.setdefault(weight_map[n], []).append(n)
    return by_file


def _write(original: str, config: dict, tensors: dict[str, tuple[dict, bytes]],
           reader: RangeReader) -> Path:
    out = head_dir(original)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(tmp / SINGLE, tensors)
    source = {"repo": original, "tensors": len(tensors), "bytes_read": reader.bytes_read}
    (tmp / SOURCE).write_text(json.dumps(source, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
