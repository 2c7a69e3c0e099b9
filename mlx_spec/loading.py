"""Loading targets and their tokenizers through mlx-lm, with one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .drafters import nextn
from .errors import ModelLoadError, first_line
from .kinds import DRAFTERS
from .layouts import mlx_lm_overrides
from .model import TargetModel
from .spec import MAX_DRAFT, LoadSpec


def load_target(path_or_repo: str | Path, *, lazy: bool = False,
                dtype: str | None = None) -> tuple[TargetModel, Any]:
    """(TargetModel, mlx-lm TokenizerWrapper) for a local model directory or a hub repo id.
    lazy: weights are mapped, not read, until used (to inspect a model's layout). dtype
    ("float32", …): its floating-point weights cast to that at load (the name says so)."""
    from mlx_lm.utils import load_model

    from .tokenizer_cache import load_tokenizer

    local = _local_dir(path_or_repo)  # a hub repo id is fetched (resumably) first
    _check_model_dir(local)
    try:
        overrides = mlx_lm_overrides(json.loads((local / "config.json").read_text()))
        # mlx-lm's `load`, in its two halves: the tokenizer kept ready between runs
        model, config = load_model(local, lazy, model_config=overrides or {})
        tokenizer = load_tokenizer(local, eos_token_ids=config.get("eos_token_id"))
    except ModelLoadError:
        raise
    except Exception as e:  # mlx-lm raises many kinds; the user needs one line
        raise ModelLoadError(f"cannot load model {path_or_repo}: {first_line(e)}") from e
    context = int(
        config.get("max_position_embeddings")
        or config.get("text_config", {}).get("max_position_embeddings")
        or 4096
    )
    name = _display_name(path_or_repo)
    if dtype is not None:
        import mlx.core as mx

        model.set_dtype(getattr(mx, dtype))
        name = f"{name} ({dtype.replace('float', 'f')})"
    target = TargetModel(model, context_length=context, name=name, path=local, config=config,
                         tokenizer=tokenizer, cast=dtype)
    return target, tokenizer


def _check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    config = path / "config.json"
    if not config.exists():
        raise ModelLoadError(f"{path} is not a model directory (no config.json)")
    try:
        json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"corrupt config.json in {path}: {first_line(e)}") from e
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"no weights (*.safetensors) in {path}")


def _local_dir(name: str | Path) -> Path:
    """A local directory for a path, for a GGUF file (converted once into MLX_SPEC_HOME/gguf/,
    gguf/directory.py), or for a hub repo id (a model, a sidecar MTP head such as
    `mlx-community/Qwen3.6-27B-MTP-4bit`), fetched into the Hugging Face cache if needed, the
    way `mlx-spec pull` fetches (hub/download.py)."""
    from .gguf import converted, model_file

    if (file := model_file(name)) is not None:
        return converted(file)
    if is_local(name) or str(name).count("/") != 1:
        return Path(name).expanduser()
    from .hub import DownloadError, fetch

    try:
        return fetch(str(name))
    except DownloadError as e:
        raise ModelLoadError(f"cannot fetch {name}: {e}") from e


def is_local(name: str | Path) -> bool:
    """A path on this machine (it exists, or is written as one: a .gguf file, an Ollama
    model), not a hub repo id."""
    text = str(name)
    return Path(name).exists() or text.startswith((".", "/", "~", "ollama:")) or \
        text.lower().endswith(".gguf")


def _display_name(path_or_repo: str | Path) -> str:
    """A directory's name; for a hub cache snapshot (models--org--name/snapshots/SHA), org/name;
    for a GGUF file, its name and the form its weights run in ("… Q4_1 → f32")."""
    p = Path(path_or_repo).expanduser()
    if p.is_file() or str(path_or_repo).startswith("ollama:"):
        from .gguf import default_format

        shown = path_or_repo if str(path_or_repo).startswith("ollama:") else p.name
        return f"{shown} → {default_format()}"
    if not p.exists():
        return str(path_or_repo)
    repo = p.parent.parent.name
    if p.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return p.name


def find_eagle3_head(model_path: str | Path) -> Path | None:
    """An EAGLE-3 head beside a model directory (DIR/eagle3/, where train-drafter writes it)."""
    d = Path(model_path).expanduser() / "eagle3"
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return d if config.get("speculators_model_type") == "eagle3" else None


def paired_draft(model: str | Path) -> str | None:
    """For a GGUF target: the largest GGUF beside it or in the usual local stores (Ollama, LM
    Studio, llama.cpp, the Hugging Face cache) with its vocabulary, at most a third its size."""
    from .gguf import LocalGGUF, draft_for, find_local, model_file

    try:
        file = model_file(model)
    except ModelLoadError:
        return None
    if file is None or not file.is_file():
        return None
    target = LocalGGUF(str(model), file, "given", file.stat().st_size)
    siblings = [LocalGGUF(str(p), p, "beside it", p.stat().st_size)
                for p in file.parent.glob("*.gguf") if p.is_file()]
    found = draft_for(target, siblings + find_local())
    return found.name if found else None


def find_mtp_head(model_path: str | Path | None, target: TargetModel | None = None
                  ) -> Path | None:
    """A model's MTP head: DIR/mtp/ or a sibling DIR-mtp/ (a head trained by train-drafter, or a
    published sidecar as mlx-vlm splits them), else the checkpoint itself if it kept its own."""
    given = Path(model_path).expanduser() if model_path is not None else None
    p = given if given is not None and given.is_dir() else target.path if target else None
    if p is None:
        return None
    for candidate in (p / "mtp", p.parent / f"{p.name}-mtp"):
        if (candidate / "mtp_config.json").exists() or nextn.is_sidecar(candidate):
            return candidate
    if target is not None and nextn.has_checkpoint_head(target, p):
        return p
    return None


def load_engine(spec: LoadSpec | None = None):
    """A ready Engine for `spec` (default: the bundled demo pair, its drafter, auto).

    spec.draft_length None: the drafter's own length where its files declare one (a Gemma 4
    assistant's `num_assistant_tokens`), else "auto". spec.drafter "auto": an MTP head beside
    the model, else the draft model, else none."""
    from .assets import DEMO_DRAFT, demo_model, demo_variant, shipped_head
    from .engine import Engine

    spec = spec or LoadSpec()
    model, draft_model, dtype = spec.model, spec.draft_model, None
    if model is None:  # the bundled demo, in the variant that can pay on this device
        variant = demo_variant()
        model, dtype = demo_model(variant.name), variant.dtype
        if not Path(model).exists():
            raise ModelLoadError(
                "no --model given and the bundled demo model is missing "
                f"({model}); build it with `python -m mlx_spec.train.demo`"
            )
        if draft_model is None and spec.drafter == "draft":
            draft_model = demo_model(DEMO_DRAFT)
    target, tokenizer = load_split_or_whole(model, spec, dtype=dtype)
    chosen = spec.drafter
    if chosen == "auto":
        if draft_model is None and not (spec.mtp or find_mtp_head(model, target)):
            # one train-drafter wrote beside the model, else one shipped for it, else (a GGUF)
            # a smaller local GGUF with the same vocabulary
            draft_model = (find_eagle3_head(target.path) or shipped_head(target)
                           or paired_draft(model))
        chosen = ("draft" if draft_model else
                  "mtp" if (spec.mtp or find_mtp_head(model, target)) else "none")
    d = make_drafter(chosen, target, model_path=model, draft_model=draft_model, mtp=spec.mtp,
                     lookup=spec.lookup)
    if target.ranks > 1:
        check_split_drafter(d)
    draft_length = spec.draft_length
    if draft_length is None:  # the drafter's own length where its files give one, else auto
        own = d.draft_length if d is not None else None
        draft_length = min(own, MAX_DRAFT) if own else "auto"
    return Engine(target, tokenizer, d, draft_length=draft_length, kv_bits=spec.kv_bits)


def load_split_or_whole(model: str | Path, spec: LoadSpec, *, dtype: str | None = None
                        ) -> tuple[TargetModel, Any]:
    """The target on this machine (cast to `dtype`), or split over the hostfile's
    (distributed/launch.py; as saved: every rank loads its own part)."""
    if spec.hostfile is None:
        return load_target(model, dtype=dtype)
    from .distributed.launch import load_split

    whole, tokenizer = load_target(model, lazy=True)  # each rank reads only its part
    return load_split(whole, hostfile=spec.hostfile, mode=spec.split), tokenizer


def check_split_drafter(drafter: Any) -> None:
    """Drafters that read the target's KV cache directly cannot follow it onto other machines
    (a tensor split holds a slice of every layer's heads; a pipeline the layers elsewhere)."""
    if drafter is not None and drafter.reads_target_kv:
        raise ModelLoadError(f"the {drafter.name} drafter reads the target's own KV cache, "
                             "which is split over the machines: use a draft model, a "
                             "published MTP head (nextn), EAGLE-3 (--tensor) or --drafter ngram")


def make_drafter(kind: str, target: TargetModel, *, model_path=None, draft_model=None, mtp=None,
                 lookup: bool = False):
    """A drafter of `kind` (kinds.DRAFTERS) for `target`; None for "none". lookup: a model
    drafter behind prompt lookup (drafters/lookup.py; "ngram" is lookup already)."""
    build = {"none": lambda: None, "ngram": _ngram, "mtp": lambda: _mtp(target, model_path, mtp),
             "draft": lambda: _draft_model(target, draft_model)}
    assert build.keys() == DRAFTERS.keys()
    if kind not in build:
        raise ModelLoadError(f"unknown drafter {kind!r} (one of {', '.join(DRAFTERS)})")
    drafter = build[kind]()
    if lookup and drafter is not None and kind != "ngram":
        from .drafters.lookup import LookupFirst

        drafter = LookupFirst(drafter)
    return drafter


def _ngram():
    from .drafters import NgramDrafter

    return NgramDrafter()


def _draft_model(target: TargetModel, draft_model):
    """--draft-model DIR: whatever drafter the directory holds, told apart by its config — a
    Gemma 4 assistant, an EAGLE-3 head, a DFlash block drafter, an MTP head (ours or a
    sidecar), else a plain LM."""
    from .drafters import DraftModelDrafter
    from .drafters.assistant import is_assistant, load_assistant
    from .drafters.dflash import is_dflash, load_dflash
    from .drafters.eagle3 import is_eagle3, load_eagle3
    from .drafters.mtp_files import load_mtp_drafter

    if draft_model is None:
        raise ModelLoadError("--drafter draft needs --draft-model")
    path = _local_dir(draft_model)
    if is_assistant(path):
        return load_assistant(path, target)
    if is_eagle3(path):
        return load_eagle3(path, target)
    if is_dflash(path):
        return load_dflash(path, target)
    if (path / "mtp_config.json").exists() or nextn.is_sidecar(path):
        return load_mtp_drafter(path, target)
    draft, _ = load_target(path)
    return DraftModelDrafter(draft, target)


def _mtp(target: TargetModel, model_path, mtp):
    from .drafters.mtp_files import load_mtp_drafter

    path = _local_dir(mtp) if mtp else find_mtp_head(model_path, target)
    if path is None:
        if nextn.declared_layers(target, target.config):
            raise ModelLoadError(
                f"{target.name}'s config declares an MTP layer but its weights are not in "
                "the checkpoint (MLX conversions drop them); pass --mtp DIR with a sidecar "
                "head (e.g. mlx-community/Qwen3.6-27B-MTP-4bit) or the original checkpoint"
            )
        raise ModelLoadError(f"no MTP head found beside {model_path}; pass --mtp DIR")
    return load_mtp_drafter(path, target)


def quantize_mtp_head(raw: Path, target_dir: str | Path, *, bits: int | None = None) -> Path:
    """A quantized sidecar of an MTP head read out of an original checkpoint (`raw`, as
    hub.pull extracted it), for the target at `target_dir`: at the target's own bits and group
    size, or at `bits` (group size 64, or the target's). The published tensors are kept; the
    copy is written beside them (`RAW.qBITS`), which hub.launch_for prefers from then on."""
    import shutil

    target, _ = load_target(target_dir, lazy=True)  # its layout and args; weights not read
    q = dict(target.config.get("quantization") or {})
    if bits is None and not q:
        raise ModelLoadError(f"{target.name} is not quantized, so there is nothing to match: "
                             "pass --quantize-mtp BITS (4 or 8)")
    q = {"group_size": int(q.get("group_size", 64)), "bits": int(bits or q["bits"])}
    head, _ = nextn.load_checkpoint_head(target, raw)
    nextn.quantize_head(head, bits=q["bits"], group_size=q["group_size"])
    out = raw.with_name(f"{raw.name}.q{q['bits']}")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    nextn.save_sidecar(tmp, head, target, quantization=q)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out

