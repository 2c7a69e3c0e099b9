"""A GGUF file as an mlx-lm model directory: converted once into MLX_SPEC_HOME/gguf/, keyed by
the file (path, size, modification time) and the weight form, so the second start reads a
finished directory and never parses the GGUF again. Written into a `.partial` directory and
renamed when complete: an interrupted or failed conversion leaves nothing half-written."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MlxSpecError, ModelLoadError, first_line
from ..paths import data_dir
from .arch import arch_of, config_for, mlx_name, undo_conversion
from .read import GGUFFile, open_gguf
from .tokenizer import build_tokenizer
from .weights import EXACT, FORMATS, REQUANT_BITS, decode, repack, requantize

VERSION = 1  # bump when the conversion's output changes: old cache entries are then unused
SHARD_BYTES = 2 << 30
MANIFEST = "gguf_source.json"
Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def is_gguf(name: str | Path) -> bool:
    return str(name).lower().endswith(".gguf")


def default_format() -> str:
    """The weight form that pays on this device: f32 where MLX runs on the CPU (OpenBLAS's
    f32 matmul is memory-bound there, its quantized matmul compute-bound), else quantized."""
    import mlx.core as mx

    return "quantized" if mx.metal.is_available() else "f32"


def cache_dir(path: Path, weights: str) -> Path:
    """Where `path` converted to `weights` lives: keyed by what changes when the file does."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{weights}|{VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return data_dir() / "gguf" / f"{path.stem}-{weights}-{digest}"


def converted(path: str | Path, *, weights: str | None = None,
              progress: Progress | None = None) -> Path:
    """The mlx-lm directory for a GGUF file, converting it the first time."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    weights = weights or default_format()
    out = cache_dir(path, weights)
    if (out / MANIFEST).exists():
        return out
    return convert(path, out, weights=weights, progress=progress)


def convert(path: str | Path, out: str | Path, *, weights: str = "f32",
            progress: Progress | None = None) -> Path:
    """Write the GGUF file at `path` as an mlx-lm model directory `out` (replacing it)."""
    if weights not in FORMATS:
        raise MlxSpecError(f"weights must be one of {', '.join(FORMATS)}, got {weights!r}")
    out = Path(out).expanduser()
    f = open_gguf(path)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write(f, tmp, weights, progress)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, MlxSpecError | KeyboardInterrupt):
            raise
        raise ModelLoadError(f"cannot convert {f.path.name}: {first_line(e)}") from e
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _write(f: GGUFFile, out: Path, weights: str, progress: Progress | None) -> None:
    arch = arch_of(f)
    tok, tok_config, stops = build_tokenizer(f)
    config = config_for(f, arch, stops)
    quant: dict[str, Any] = {}
    shard: dict[str, Any] = {}
    size, shards, forms = 0, 0, {}
    for i, t in enumerate(f.tensors):
        name = mlx_name(arch, t.name)
        if name is None:
            continue
        arrays, form = _tensor(arch, t, config, weights)
        forms[form] = forms.get(form, 0) + 1
        if len(arrays) > 1:  # quantized: weight, scales, biases beside each other
            quant[name.removesuffix(".weight")] = {"group_size": 32, "bits": form_bits(form)}
        for suffix, a in arrays.items():
            shard[name.removesuffix(".weight") + "." + suffix if suffix != "weight" else name] = a
            size += a.nbytes
        if size >= SHARD_BYTES:
            shards = _save(shard, out, shards)
            shard, size = {}, 0
        if progress:
            progress(i + 1, len(f.tensors))
    _save(shard, out, shards)
    if quant:  # per-layer bits; layers absent here stay dense (mlx-lm looks for .scales)
        bits = max(q["bits"] for q in quant.values())
        config["quantization"] = {"group_size": 32, "bits": bits, **quant}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    (out / MANIFEST).write_text(json.dumps({
        "file": str(f.path.resolve()), "name": f.path.name, "sha256": sha256(f.path),
        "architecture": f.arch, "weights": weights, "tensor_types": f.tensor_types(),
        "converted_as": forms, "version": VERSION}, indent=1))


def _tensor(arch, t, config: dict, weights: str) -> tuple[dict[str, Any], str]:
    """One tensor's arrays ({"weight": …} or weight/scales/biases) and how it was stored:
    "f32", "exact q4" / "exact q8" (repacked), or "requantized qN"."""
    raw = decode(t)
    kind = t.tensor_type.name
    if weights == "f32" or raw.ndim != 2 or t.name.endswith("norm.weight"):
        return {"weight": undo_conversion(arch, t.name, raw, config)}, "f32"
    if kind in EXACT:  # repacked in the file's row order, then each array's rows restored
        packed = repack(t, raw)
        return ({k: undo_conversion(arch, t.name, a, config) for k, a in packed.items()},
                f"exact q{EXACT[kind]}")
    bits = REQUANT_BITS.get(kind, 8)
    return requantize(undo_conversion(arch, t.name, raw, config), bits), f"requantized q{bits}"


def form_bits(form: str) -> int:
    return int(form.rsplit("q", 1)[1])


def _save(arrays: dict[str, Any], out: Path, index: int) -> int:
    import mlx.core as mx

    if arrays:
        mx.save_safetensors(str(out / f"model-{index:05d}.safetensors"),
                            {k: mx.array(v) for k, v in arrays.items()})
    return index + 1


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def source_of(model_dir: str | Path) -> dict[str, Any] | None:
    """What a converted directory was made from (its manifest), or None for other models."""
    try:
        return json.loads((Path(model_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
