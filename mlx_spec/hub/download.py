"""Fetching hub repositories into the standard Hugging Face cache, and finding them there.

huggingface_hub answers the questions (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE and the
token are its own settings, honoured as they are); the transfer is ours, for one reason:
huggingface_hub 2.4 resumes only within one call (its partial file is unique to the call and
deleted when the call fails), and a Mac user on a flaky connection must not restart 16 GB.

* `plan` lists the repo's files at one commit (model_info with sizes and hashes), so disk space
  is checked before a byte is written and progress has a total;
* each file streams into blobs/<etag>.part, a name that survives the process: the next pull sends
  `Range: bytes=<size>-` and carries on (`cut` connections are retried in the same call too);
* a large file's etag is its sha256: the finished file is hashed before it is renamed into
  place, a mismatch is fetched once more from zero, then reported. Only then is it linked into
  snapshots/<commit>/ (the layout huggingface_hub and every hub tool read), so nothing
  half-written is ever treated as complete;
* progress as `Progress` values (bytes, rate, ETA) and a cancel event, checked on every chunk;
* one clear line for every failure (`DownloadError`).

Nothing here imports MLX: the app's process fetches without loading an engine.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
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
    etag: str  # the blob's name in the cache: sha256 for large (LFS) files, git sha1 otherwise
    cached: bool

    @property
    def hashed(self) -> bool:
        """The etag is a sha256 of the content (so the content can be checked against it)."""
        return len(self.etag) == 64


ProgressFn = Callable[[Progress], None]
RETRIES = 3  # a dropped connection is resumed this many times within one call


def cache_root() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def repo_dir(repo: str) -> Path:
    return cache_root() / ("models--" + repo.replace("/", "--"))


def local_snapshot(repo: str) -> Path | None:
    """The cached snapshot of `repo` if it has a config.json; never touches the network."""
    root = repo_dir(repo)
    try:
        commit = (root / "refs" / "main").read_text().strip()
    except OSError:
        return None
    path = root / "snapshots" / commit
    return path if (path / "config.json").exists() else None


def plan(repo: str, patterns: Iterable[str] = MODEL_FILES) -> tuple[str, list[RemoteFile]]:
    """(commit, the files of `repo` matching `patterns` with sizes, etags, cached or not)."""
    from huggingface_hub import HfApi

    if offline():
        raise DownloadError(f"{repo}: HF_HUB_OFFLINE is set", unreachable=True)
    try:
        info = HfApi().model_info(repo, files_metadata=True)
    except Exception as e:
        raise DownloadError(describe_failure(repo, e), unreachable=unreachable(e)) from e
    patterns = list(patterns)
    snapshot = repo_dir(repo) / "snapshots" / str(info.sha)
    files = []
    for s in info.siblings or []:
        if not any(fnmatch.fnmatch(s.rfilename, p) for p in patterns):
            continue
        etag = s.lfs.sha256 if s.lfs else s.blob_id
        size = int(s.lfs.size if s.lfs else s.size or 0)
        here = snapshot / s.rfilename
        cached = here.exists() and here.stat().st_size == size
        files.append(RemoteFile(s.rfilename, size, str(etag), cached))
    if not files:
        raise DownloadError(f"{repo} has no files matching {', '.join(patterns)}")
    return str(info.sha), files


def fetch(repo: str, *, patterns: Iterable[str] = MODEL_FILES, progress: ProgressFn | None = None,
          cancel: threading.Event | None = None, verify: bool = False) -> Path:
    """Fetch what is missing of `repo` into the cache and return its snapshot directory.
    Offline (no network, or HF_HUB_OFFLINE), a cached snapshot is returned as it is."""
    patterns = list(patterns)
    try:
        commit, files = plan(repo, patterns)
    except DownloadError as e:
        cached = local_snapshot(repo) if e.unreachable else None
        if cached is None:
            raise
        return cached
    missing = [f for f in files if not f.cached]
    check_disk(sum(f.size - _partial_size(repo, f) for f in missing), repo)
    meter = _Meter(repo, sum(f.size for f in missing), progress, cancel)
    for f in missing:
        _fetch_file(repo, commit, f, meter)
    if verify:
        for f in files:
            if f.cached and (problem := corruption(repo_dir(repo) / "snapshots" / commit / f.name,
                                                   f, meter)):
                meter.note(f"{f.name} {problem}: fetching it again")
                _fetch_file(repo, commit, f, meter)
    if missing:
        meter.emit(force=True)  # the last report says 100%
    _write_ref(repo, commit)
    path = repo_dir(repo) / "snapshots" / commit
    if patterns == list(MODEL_FILES) and not (path / "config.json").exists():
        raise DownloadError(f"{repo} has no config.json: not a model repository")
    return path


def _partial_size(repo: str, f: RemoteFile) -> int:
    part = repo_dir(repo) / "blobs" / f"{f.etag}.part"
    return part.stat().st_size if part.exists() else 0


def _fetch_file(repo: str, commit: str, f: RemoteFile, meter: _Meter) -> None:
    """Stream one file into blobs/<etag>.part (resuming it), check it, move it into place,
    link it from the snapshot. A hash mismatch is fetched once more from zero, then reported."""
    blobs = repo_dir(repo) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    part, blob = blobs / f"{f.etag}.part", blobs / f.etag
    meter.start(f.name)
    if blob.exists() and corruption(blob, f, meter) is None:  # another revision had it
        _link(repo, commit, f, blob)
        return
    for attempt in (0, 1):
        _stream(repo, commit, f, part, meter)
        problem = corruption(part, f, meter)
        if problem is None:
            break
        part.unlink()
        if attempt == 1:
            raise DownloadError(f"{repo}/{f.name} is corrupt after a fresh fetch ({problem})")
        meter.note(f"{f.name} {problem}: fetching it again")
    part.replace(blob)
    _link(repo, commit, f, blob)


def _link(repo: str, commit: str, f: RemoteFile, blob: Path) -> None:
    link = repo_dir(repo) / "snapshots" / commit / f.name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    try:
        link.symlink_to(os.path.relpath(blob, link.parent))
    except OSError:  # no symlinks here (some filesystems): a copy, as huggingface_hub does
        shutil.copyfile(blob, link)


def _stream(repo: str, commit: str, f: RemoteFile, part: Path, meter: _Meter) -> None:
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo, f.name, revision=commit, endpoint=constants.ENDPOINT)
    for attempt in range(RETRIES + 1):
        have = part.stat().st_size if part.exists() else 0
        if have > f.size:
            part.unlink()
            have = 0
        meter.resumed(have)
        if have == f.size:
            return
        headers = {**build_hf_headers(), **({"Range": f"bytes={have}-"} if have else {})}
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                      timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
                hf_raise_for_status(response)
                mode = "ab" if have and response.status_code == 206 else "wb"
                if mode == "wb":
                    meter.resumed(0)  # the server ignored the Range: from zero
                with part.open(mode) as out:
                    for chunk in response.iter_bytes():  # as they arrive: a cut loses nothing
                        meter.add(len(chunk))
                        out.write(chunk)
            if part.stat().st_size >= f.size:
                return
            raise ConnectionError("the connection closed before the end of the file")
        except Cancelled:
            raise
        except Exception as e:
            if isinstance(e, OSError) and e.errno == 28:
                raise DownloadError(describe_failure(repo, e, f.name)) from e
            transient = unreachable(e)
            if not transient or attempt == RETRIES:
                line = describe_failure(repo, e, f.name)
                if transient:
                    line += "; what arrived is kept: run it again to resume"
                raise DownloadError(line, unreachable=transient) from e
        time.sleep(min(2**attempt, 8))


def _write_ref(repo: str, commit: str) -> None:
    ref = repo_dir(repo) / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit:
        tmp = ref.with_suffix(".tmp")
        tmp.write_text(commit)
        tmp.replace(ref)


def corruption(path: Path, f: RemoteFile, meter: _Meter | None = None) -> str | None:
    """Why the file at `path` is not the published `f`, or None if it is: its size, and its
    sha256 where the etag is one."""
    try:
        actual = path.stat().st_size
    except OSError:
        return "is missing"
    if actual != f.size:
        return f"has {actual} bytes, expected {f.size}"
    if not f.hashed:
        return None
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            if meter is not None:
                meter.verifying(f.name)
    return None if digest.hexdigest() == f.etag else "differs from its published sha256"


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
        self._credited = 0  # bytes of the current file counted as already present
        self.began = time.perf_counter()
        self.last = 0.0

    def add(self, n: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"download of {self.repo} cancelled; it resumes next time")
        self.done += n
        self._credited += n
        self.emit()

    def start(self, name: str) -> None:
        self.file, self._credited = name, 0

    def resumed(self, n: int) -> None:
        """`n` bytes of the current file are on disk (a .part from an earlier attempt or pull)."""
        self.done += n - self._credited
        self._credited = n

    def note(self, text: str) -> None:
        self.file = text
        self.emit(force=True)

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
        elapsed = now - self.began
        rate = self.done / elapsed if elapsed > 0.5 else 0.0  # no ETA from the first instant
        self.report(Progress(self.repo, self.file, min(self.done, self.total), self.total, rate,
                             verifying))
