"""Fetching hub repositories into the standard Hugging Face cache, and finding them there.

huggingface_hub does the transfer (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE and the
token are its own settings, honoured as they are). What this module adds:

* a plan first (which files, how many bytes are still missing) so disk space is checked before a
  byte is written;
* one file at a time through `hf_hub_download`, whose `.incomplete` files make an interrupted
  transfer resume where it stopped on the next pull;
* progress as `Progress` values (bytes, rate, ETA) and a cancel event, checked on every chunk;
* a hash check: a large file's ETag on the hub is its sha256, and the cache names the blob by it,
  so a file fetched in this pull (or every file, with verify=True) is hashed and a mismatch is
  fetched again once, then reported;
* one clear line for every failure (`DownloadError`).

Nothing here imports MLX: the app's process fetches without loading an engine.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError, first_line

MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py")
DISK_MARGIN = 1.02  # fetch only with 2% more free space than the missing bytes


class DownloadError(MlxSpecError):
    """A fetch failed: not found, gated, offline, disk full, corrupt after a retry."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable  # no network (or HF_HUB_OFFLINE): the cache may serve


class Cancelled(MlxSpecError):
    """The user cancelled a fetch; what was received is kept and resumes next time."""


@dataclass(frozen=True)
class Progress:
    """Where a pull stands. done/total count the bytes still to fetch when the pull began."""

    repo: str
    file: str
    done: int
    total: int
    rate: float  # bytes per second, averaged since the pull began
    verifying: bool = False

    @property
    def eta_s(self) -> float | None:
        if self.rate <= 0 or self.total <= self.done:
            return None
        return (self.total - self.done) / self.rate


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    cached: bool


ProgressFn = Callable[[Progress], None]


def cache_root() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def local_snapshot(repo: str, patterns: Iterable[str] = MODEL_FILES) -> Path | None:
    """The cached snapshot of `repo` if it has a config and weights; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo, allow_patterns=list(patterns), local_files_only=True))
    except Exception:
        return None
    if not (path / "config.json").exists():
        return None
    return path


def plan(repo: str, patterns: Iterable[str] = MODEL_FILES) -> list[RemoteFile]:
    """The files of `repo` matching `patterns`, their sizes and whether they are cached."""
    from huggingface_hub import snapshot_download

    try:
        infos = snapshot_download(repo, allow_patterns=list(patterns), dry_run=True)
    except Exception as e:
        raise DownloadError(describe_failure(repo, e), unreachable=unreachable(e)) from e
    files = [RemoteFile(i.filename, int(i.file_size or 0), not i.will_download) for i in infos]
    if not files:
        raise DownloadError(f"{repo} has no model files ({', '.join(patterns)})")
    return files


def fetch(repo: str, *, patterns: Iterable[str] = MODEL_FILES, progress: ProgressFn | None = None,
          cancel: threading.Event | None = None, verify: bool = False) -> Path:
    """Fetch what is missing of `repo` into the cache and return its snapshot directory."""
    patterns = list(patterns)
    try:
        files = plan(repo, patterns)
    except DownloadError as e:
        cached = local_snapshot(repo, patterns) if e.unreachable else None
        if cached is None:
            raise
        return cached  # offline: the copy in the cache is what there is
    missing = [f for f in files if not f.cached]
    check_disk(sum(f.size for f in missing), repo)
    meter = _Meter(repo, sum(f.size for f in missing), progress, cancel)
    for f in missing:
        _download(repo, f.name, meter)
    path = local_snapshot(repo, patterns)
    if path is None:
        raise DownloadError(f"{repo}: fetched, but the snapshot has no config.json")
    fetched = {f.name for f in missing}
    for f in files:
        if verify or f.name in fetched:
            _verify(repo, path, f, meter)
    return path


def _download(repo: str, name: str, meter: _Meter, *, force: bool = False) -> None:
    from huggingface_hub import hf_hub_download

    meter.file = name
    try:
        hf_hub_download(repo, name, tqdm_class=meter.bar_class(), force_download=force)
    except Cancelled:
        raise
    except Exception as e:
        if isinstance(e.__context__, Cancelled):
            raise e.__context__ from None
        raise DownloadError(describe_failure(repo, e, name), unreachable=unreachable(e)) from e


def _verify(repo: str, snapshot: Path, f: RemoteFile, meter: _Meter) -> None:
    """Size always; sha256 where the cache names the blob by it (the hub's ETag of LFS files).
    A corrupt file is fetched once more, then reported."""
    for attempt in (0, 1):
        problem = corruption(snapshot / f.name, f.size, meter)
        if problem is None:
            return
        if attempt == 1:
            raise DownloadError(f"{repo}/{f.name} is corrupt after a fresh fetch ({problem})")
        _download(repo, f.name, meter, force=True)


def corruption(path: Path, size: int, meter: _Meter | None = None) -> str | None:
    """Why the cached file at `path` is not the published one, or None if it is."""
    try:
        actual = path.stat().st_size
    except OSError:
        return "missing"
    if size and actual != size:
        return f"{actual} bytes, expected {size}"
    blob = path.resolve().name
    if len(blob) != 64 or any(c not in "0123456789abcdef" for c in blob):
        return None  # a small git file: its ETag is not a sha256
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            if meter is not None:
                meter.verifying(path.name)
    return None if digest.hexdigest() == blob else "sha256 differs"


def check_disk(needed: int, repo: str) -> None:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if needed * DISK_MARGIN > free:
        raise DownloadError(
            f"not enough disk space for {repo}: {gb(needed)} to fetch, {gb(free)} free in {root} "
            "(free some with `mlx-spec rm`, or point HF_HOME elsewhere)"
        )


def gb(n: int | float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def describe_failure(repo: str, e: BaseException, name: str | None = None) -> str:
    """One line for a failed hub call, by what the user can do about it."""
    from huggingface_hub import errors as he

    what = f"{repo}/{name}" if name else repo
    if isinstance(e, he.GatedRepoError):
        return (f"{repo} is gated: accept its licence on huggingface.co, then log in "
                "(`hf auth login`) or set HF_TOKEN")
    if isinstance(e, he.RepositoryNotFoundError):
        return f"{repo} was not found on the hub (check the id; private repos need HF_TOKEN)"
    if isinstance(e, he.RevisionNotFoundError):
        return f"{repo} has no such revision"
    if isinstance(e, he.RemoteEntryNotFoundError):
        return f"{what} does not exist on the hub"
    if isinstance(e, OSError) and e.errno == 28:
        return f"disk full while fetching {what}; what was fetched resumes next time"
    if offline():
        return f"{what} is not in the cache and HF_HUB_OFFLINE is set"
    if unreachable(e):
        return f"cannot reach the hub for {what} ({first_line(e)})"
    return f"cannot fetch {what}: {type(e).__name__}: {first_line(e)}"


def unreachable(e: BaseException) -> bool:
    """The hub could not be reached (no network, refused, timed out, or offline mode)."""
    from huggingface_hub import errors as he

    if offline():
        return True
    seen: BaseException | None = e
    while seen is not None:
        name = type(seen).__name__
        if isinstance(seen, ConnectionError | TimeoutError | he.LocalEntryNotFoundError) or (
                "Connect" in name or "Timeout" in name or "RemoteProtocol" in name):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Meter:
    """Turns huggingface_hub's tqdm calls into throttled `Progress` reports and cancels."""

    every_s = 0.1

    def __init__(self, repo: str, total: int, report: ProgressFn | None,
                 cancel: threading.Event | None):
        self.repo, self.total, self.report, self.cancel = repo, total, report, cancel
        self.done, self.file = 0, ""
        self.start = time.perf_counter()
        self.last = 0.0

    def add(self, n: float) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"download of {self.repo} cancelled; it resumes next time")
        self.done += int(n)
        self.emit()

    def verifying(self, name: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"checking {self.repo} cancelled")
        self.file = name
        self.emit(verifying=True)

    def emit(self, *, verifying: bool = False, force: bool = False) -> None:
        now = time.perf_counter()
        if self.report is None or (not force and now - self.last < self.every_s):
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-6)
        self.report(Progress(self.repo, self.file, min(self.done, self.total), self.total, rate,
                             verifying))

    def bar_class(self) -> type:
        meter = self

        class Bar:  # the part of tqdm huggingface_hub calls
            def __init__(self, *args, initial: float = 0, **kwargs):
                meter.done += int(initial)  # resumed from a .incomplete file

            def __enter__(self):
                return self

            def __exit__(self, *exc) -> None:
                meter.emit(force=True)

            def update(self, n: float | None = 1) -> None:
                meter.add(n or 0)

            def close(self) -> None:
                pass

            def set_postfix_str(self, *args, **kwargs) -> None:
                pass

            def set_description(self, *args, **kwargs) -> None:
                pass

            def refresh(self) -> None:
                pass

        return Bar
