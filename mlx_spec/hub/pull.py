"""From a name (a preset or a hub repo id) to local directories the engine can start from.

`pull` fetches what is missing: the target, then its drafter, which is one of
* a draft model or a sidecar MTP repo (the preset's, or --drafter REPO: its config says which);
* the MTP head an MLX conversion dropped, read out of the original checkpoint (heads.py); the
  original is the preset's `mtp_from`, else the `base_model` the conversion's model card names.
`launch_for` answers the same question from the cache alone: the app never touches the network
unless the user asked for a download.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import MlxSpecError
from ..spec import LoadSpec
from ..vocab import check_same, read_vocabulary
from . import heads
from .download import DownloadError, ProgressFn, cache_root, fetch, local_snapshot
from .presets import Preset, UnknownPresetError, find, looks_like_repo, presets


@dataclass(frozen=True)
class Plan:
    """What a name means: repos to fetch and which drafter they make."""

    name: str
    target: str
    drafter: str | None = None  # a repo: draft model or sidecar MTP head
    mtp_from: str | None = None  # an original checkpoint to read the MTP head from
    preset: Preset | None = None


@dataclass(frozen=True)
class Launch:
    """Local paths a pulled name resolves to; `spec()` makes them what `load_engine` takes."""

    name: str
    target: Path
    drafter: str = "auto"  # auto | mtp | draft | none
    draft_model: Path | None = None
    mtp: Path | None = None
    warnings: tuple[str, ...] = field(default=())

    def spec(self, user: LoadSpec | None = None) -> LoadSpec:
        """What to load: `user`'s spec on this target, this pair's drafter filling only what
        the user left unset (a drafter kind, draft model or MTP head they chose is kept)."""
        return (user or LoadSpec()).completed_by(model=self.target, drafter=self.drafter,
                                                 draft_model=self.draft_model, mtp=self.mtp)

    def to_dict(self) -> dict:
        paths = ("target", "draft_model", "mtp")
        return {k: (str(v) if k in paths and v is not None else v)
                for k, v in asdict(self).items()} | {"warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, d: dict) -> Launch:
        def path(v):
            return Path(v) if v else None

        return cls(name=d["name"], target=Path(d["target"]), drafter=d["drafter"],
                   draft_model=path(d.get("draft_model")), mtp=path(d.get("mtp")),
                   warnings=tuple(d.get("warnings", ())))


class NotDownloaded(MlxSpecError):
    """Something a name needs is not in the cache."""


def resolve(name: str, *, drafter: str | None = None) -> Plan:
    """A preset by name, or a hub repo id; anything else is one clear line."""
    preset = find(name)
    if preset is not None:
        return Plan(name=preset.name, target=preset.target, drafter=drafter or preset.drafter,
                    mtp_from=None if drafter else preset.mtp_from, preset=preset)
    if looks_like_repo(name):
        return Plan(name=name, target=name, drafter=drafter)
    known = ", ".join(p.name for p in presets())
    raise UnknownPresetError(f"unknown preset {name!r}: use one of {known}, or a hub repo id "
                             "(org/name); `mlx-spec models` lists them")


def pull(name: str, *, drafter: str | None = None, progress: ProgressFn | None = None,
         cancel: threading.Event | None = None, verify: bool = False,
         quantize_mtp: Callable[[Path, Path], Path] | None = None) -> Launch:
    """Fetch what `name` needs (resuming anything interrupted) and say how to launch it.
    quantize_mtp(head, target): a head read out of an original checkpoint is handed to it and
    its result used (loading.quantize_mtp_head: MLX work, which hub/ does not import); a
    sidecar repo's head is used as published."""
    plan = resolve(name, drafter=drafter)
    fetched: dict[str, Path] = {}

    def get(repo: str) -> Path:
        fetched[repo] = fetch(repo, progress=progress, cancel=cancel, verify=verify)
        return fetched[repo]

    def head(original: str) -> Path:
        path = heads.extract_head(original, progress=progress, cancel=cancel)
        if quantize_mtp is None:
            return path
        return quantize_mtp(heads.head_dir(original), fetched[plan.target])  # the raw head

    try:
        return _launch(plan, get, head, readme=lambda repo: _readme(repo, progress, cancel))
    except DownloadError as e:
        if not e.unreachable:
            raise
        ready = [p.name for p in presets() if missing(p.name) is None]
        hint = (f"; ready to use offline: {', '.join(ready)} (`mlx-spec chat NAME`)" if ready
                else "; nothing is downloaded yet (the bundled demo runs offline: `mlx-spec`)")
        raise DownloadError(str(e) + hint, unreachable=True) from e


def launch_for(name: str, *, drafter: str | None = None) -> Launch:
    """The Launch for `name` from the cache alone; NotDownloaded names what is missing."""
    plan = resolve(name, drafter=drafter)

    def get(repo: str) -> Path:
        path = local_snapshot(repo)
        if path is None:
            raise NotDownloaded(f"{repo} is not downloaded: `mlx-spec pull {name}` fetches it")
        return path

    def head(original: str) -> Path:
        path = heads.extracted_head(original)
        if path is None:
            raise NotDownloaded(f"the MTP head of {original} is not downloaded: "
                                f"`mlx-spec pull {name}` reads it")
        return path

    return _launch(plan, get, head, readme=_cached_readme)


def missing(name: str, *, drafter: str | None = None) -> str | None:
    """Why `name` cannot launch from the cache (None: it can)."""
    try:
        launch_for(name, drafter=drafter)
    except MlxSpecError as e:  # not downloaded, or a pair that cannot launch (tokenizers)
        return str(e)
    return None


def _launch(plan: Plan, get, head, readme) -> Launch:
    target = get(plan.target)
    warnings: list[str] = []
    if plan.preset is not None and not plan.preset.loadable:
        if plan.drafter:
            get(plan.drafter)
        warnings.append(f"{plan.preset.drafter_kind} drafters cannot be loaded yet; "
                        f"{plan.name} runs target-only")
        return Launch(plan.name, target, drafter="none", warnings=tuple(warnings))
    if plan.drafter:
        d = get(plan.drafter)
        if _is_sidecar(d):
            return Launch(plan.name, target, drafter="mtp", mtp=d)
        _check_tokenizers(target, d, plan)
        return Launch(plan.name, target, drafter="draft", draft_model=d)
    if plan.mtp_from:  # the preset says where the head is (and the app needs no MLX to know)
        return Launch(plan.name, target, drafter="mtp", mtp=head(plan.mtp_from))
    if not _needs_head(target):
        return Launch(plan.name, target)  # auto: the model's own head, if its checkpoint has one
    original = base_model(readme(plan.target))
    if original is None:
        warnings.append(f"{plan.target} dropped its MTP head and its card names no original "
                        "checkpoint; pass --drafter REPO (a sidecar head or a draft model)")
        return Launch(plan.name, target, drafter="none", warnings=tuple(warnings))
    return Launch(plan.name, target, drafter="mtp", mtp=head(original))


def _is_sidecar(path: Path) -> bool:
    return _config(path).get("model_type", "").endswith("_mtp")


def _config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _needs_head(target: Path) -> bool:
    """The config declares an MTP module the checkpoint does not carry (an MLX conversion)."""
    from ..layouts import checkpoint_prefix, tensor_names

    prefix = checkpoint_prefix(_config(target))
    return prefix is not None and not any(n.startswith(prefix) for n in tensor_names(target))


def _readme(repo: str, progress, cancel) -> str:
    try:
        path = fetch(repo, patterns=["README.md"], progress=progress, cancel=cancel)
    except DownloadError:
        return ""
    return _read_text(path / "README.md")


def _cached_readme(repo: str) -> str:
    path = local_snapshot(repo)
    return _read_text(path / "README.md") if path else ""


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def base_model(card: str) -> str | None:
    """The `base_model` a model card's YAML front matter names (first one if a list)."""
    front = re.match(r"^---\n(.*?)\n---", card, re.S)
    if not front:
        return None
    m = re.search(r"^base_model:\s*(?:\n\s*-\s*)?['\"]?([\w.-]+/[\w.-]+)", front.group(1), re.M)
    return m.group(1) if m else None


def _check_tokenizers(target: Path, draft: Path, plan: Plan) -> None:
    """The draft model must share the target's tokenizer (read from the files, before launch)."""
    a, b = read_vocabulary(draft), read_vocabulary(target)
    if a is not None and b is not None:
        check_same(a, b, str(plan.drafter), plan.target)


@dataclass(frozen=True)
class Installed:
    repo: str
    bytes: int
    path: Path


def installed() -> list[Installed]:
    """Every model repo in the hub cache with its size on disk, and each extracted MTP head."""
    out: list[Installed] = []
    root = cache_root()
    for d in sorted(root.glob("models--*")) if root.is_dir() else []:
        out.append(Installed(d.name.removeprefix("models--").replace("--", "/"), _size(d), d))
    heads_root = heads.heads_root()
    for d in sorted(heads_root.iterdir()) if heads_root.is_dir() else []:
        if (name := heads.label(d)) is not None:
            out.append(Installed(name, _size(d), d))
    return sorted(out, key=lambda i: i.repo.lower())


def _size(d: Path) -> int:
    """Bytes on disk under d, each file once (snapshots link to blobs)."""
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())


def remove(name: str) -> list[Installed]:
    """Delete a preset's or repo's files from the cache; returns what was freed."""
    plan = resolve(name)
    repos = {plan.target, *([plan.drafter] if plan.drafter else [])}
    gone = [i for i in installed() if i.repo in repos]
    for original in {plan.mtp_from, base_model(_cached_readme(plan.target))} - {None}:
        gone += [Installed(heads.label(d) or d.name, _size(d), d)
                 for d in heads.all_copies(original)]
    for i in gone:
        shutil.rmtree(i.path)
    return gone
