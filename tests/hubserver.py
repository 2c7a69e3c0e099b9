"""A small local stand-in for the Hugging Face Hub, for tests that download models.

`HubServer` serves local directories as model repos (revision `main`, one fake commit per
repo) on 127.0.0.1, speaking the part of the Hub API that huggingface_hub 2.4.0 uses for
downloads. `hub_env` (hubenv.py) points huggingface_hub at it. Everything below was read off 2.4.0's
source, not remembered.

    with HubServer({"org/tiny": tmp_path / "tiny"}) as hub, hub_env(hub, tmp_path / "hf"):
        path = snapshot_download("org/tiny", allow_patterns=["*.json"])

What the client asks for (and what the server answers)
------------------------------------------------------
- `snapshot_download(repo)`: `GET /api/models/{repo}/revision/main` (repo_info; only `sha`
  is used), then `GET /api/models/{repo}/tree/{sha}?recursive=true&expand=false` (the file
  list; `allow_patterns` is applied to it on the client), then, per matching file, what
  `hf_hub_download(revision=sha)` does.
- `hf_hub_download`: `HEAD /{repo}/resolve/{rev}/{path}`, which must carry `X-Repo-Commit`
  and `ETag` (or `X-Linked-Etag`; the blob's name in the cache), and the size as
  `X-Linked-Size` or `Content-Length`; then `GET` on the same URL. No `X-Xet-Hash` header or
  `Link: ...; rel="xet-auth"` is ever sent, so the client never takes its Xet path.
- `HfApi().model_info(repo, files_metadata=True)`: `GET /api/models/{repo}?blobs=true`
  (`/revision/{rev}` when a revision is given). Siblings get `size`, `blobId`, and
  `lfs: {sha256, size, pointerSize}` for LFS-like files.
- `get_safetensors_metadata(repo)`: `HEAD .../resolve/main/model.safetensors` (file_exists),
  then `GET` with `range: bytes=0-100000` (clamped to the file: 206), and a second ranged GET
  when the header is longer. For sharded repos, `model.safetensors.index.json` first.
- The first `build_hf_headers()` of a process fetches `GET {ENDPOINT}/api/agent-harnesses`
  (agent detection for the user agent, cached in `HF_HOME` for a day). The server answers it
  with an empty registry; `hub_env` pre-seeds the in-process registry so it is not fetched.

LFS-like files (`*.safetensors` and anything over `LFS_THRESHOLD` bytes) get ETag = their
sha256 (as on the Hub; the client names the blob after it) plus `X-Linked-Etag` and
`X-Linked-Size`; other files get ETag = the git blob sha1 of their content.

Errors are answered the way the Hub does, headers `X-Error-Code` / `X-Error-Message`, which
`hf_raise_for_status` turns into: unknown repo -> 404 `RepoNotFound` ->
`RepositoryNotFoundError`; unknown file -> 404 `EntryNotFound` (with `X-Repo-Commit`) ->
`RemoteEntryNotFoundError`; unknown revision -> 404 `RevisionNotFound` ->
`RevisionNotFoundError`; a repo in `gated` -> 401 `GatedRepo` on its `/resolve/` URLs ->
`GatedRepoError` (a subclass of `RepositoryNotFoundError`). As on the Hub, a gated repo's
metadata (model_info, tree) stays readable, with `"gated": "manual"`.

`offline = True` closes the listening socket (set it back to reopen on the same port), so
connections are refused and the client sees `httpx2.ConnectError`, its "no network" case:
`hf_hub_download` / `snapshot_download` raise `LocalEntryNotFoundError` (from the
ConnectError) when nothing is cached, and `HfApi` calls raise the raw `httpx2.ConnectError`.
Closing accepted connections without answering would give `RemoteProtocolError` instead,
which huggingface_hub does not treat as offline.

With something cached, offline `hf_hub_download` returns the cached file, and
`snapshot_download` returns the cached snapshot folder: checked against the file list it cached
(`IncompleteSnapshotError` if files are missing), but returned as is, even incomplete, when the
folder was filled by `hf_hub_download` alone (which caches no file list).

`cut_after` sends the full headers, then the first N body bytes, then closes the connection
(a clean FIN: the client's h11 raises `httpx2.RemoteProtocolError`, "peer closed connection
without sending complete message body"). It applies to the next GET of that file only.

Resume in 2.4.0: within one call only. `file_download.http_get` catches
`ConnectError`/`TimeoutException`/`RemoteProtocolError` while streaming, sleeps 1 s, and
re-requests with `Range: bytes={written}-` (up to 5 times without progress). It writes whole
`constants.DOWNLOAD_CHUNK_SIZE` chunks (10 MiB; httpx2's `iter_bytes(chunk_size)` buffers), so
`written` is the last 10 MiB boundary: a cut file under 10 MiB is re-fetched from byte 0, without
a Range. Across calls there is nothing to resume from: the partial file is
`{blob}.{uuid8}.incomplete`, unique to the call, and deleted in a `finally` when the call fails.
A process killed mid-transfer (SIGTERM, SIGKILL) skips that `finally`: its `.incomplete` stays
in `blobs/` as an orphan that no later call reads or removes (checked: the next call GETs from
byte 0, no Range, and the orphan is still there afterwards).
A reset connection (RST: `httpx2.ReadError`) is not retried at all; it escapes hf_hub_download.

How the client in this process is pointed at the server: hubenv.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_THRESHOLD = 10_000  # bytes; larger files (and every *.safetensors) are served as LFS files
MAIN = "main"
_CHUNK = 1 << 16
_DATE = "2024-01-01T00:00:00.000Z"
_SKIP_DIRS = {".git", ".cache"}  # not repo content (.cache/huggingface is local_dir metadata)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")  # one range; anything else is ignored (200)


def fake_commit(repo_id: str) -> str:
    """The fixed commit sha (40 hex) a repo is served at."""
    return hashlib.sha1(f"commit:{repo_id}".encode()).hexdigest()


@dataclass(frozen=True)
class RepoFileInfo:
    path: str  # repo-relative, '/'-separated
    size: int
    blob_id: str  # git blob sha1: of the content, or of the LFS pointer for LFS files
    sha256: str | None  # set for LFS files only
    pointer_size: int | None  # set for LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _file_info(root: Path, rel: str) -> RepoFileInfo:
    path = root / rel
    size = path.stat().st_size
    if rel.endswith(".safetensors") or size > LFS_THRESHOLD:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        sha256 = h.hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
        pointer_bytes = pointer.encode()
        return RepoFileInfo(rel, size, _git_blob_sha1(pointer_bytes), sha256, len(pointer_bytes))
    return RepoFileInfo(rel, size, _git_blob_sha1(path.read_bytes()), None, None)


def _error(code: str | None, message: str, status: int) -> tuple[int, dict[str, str], bytes]:
    headers = {"X-Error-Message": message}
    if code is not None:
        headers["X-Error-Code"] = code
    return status, headers, json.dumps({"error": message}).encode()


class HubServer:
    """Serves `repos` (repo_id -> local directory, files served recursively) as Hub model repos.

    Use as a context manager (start/stop). State, all safe to read and edit from tests:
    `bytes_served[(repo, path)]`: body bytes sent by GETs of a file, summed (a Counter: 0 when
    never fetched); `requests`: `(method, raw request path incl. query, Range header)` in
    arrival order; `gated`: repo ids whose files answer 401 GatedRepo; `cut_after[(repo, path)]
    = n`: the next GET of that file sends n body bytes, then the connection is closed (the
    entry is removed by that GET); `corrupt`: (repo, path) pairs whose GETs flip the first
    byte of the body they send (the bytes differ from the advertised sha256); `offline`: True
    refuses connections.
    """

    def __init__(self, repos: Mapping[str, Path | str]) -> None:
        self.repos: dict[str, Path] = {repo: Path(d) for repo, d in repos.items()}
        self.bytes_served: Counter[tuple[str, str]] = Counter()
        self.requests: list[tuple[str, str, str | None]] = []
        self.gated: set[str] = set()
        self.cut_after: dict[tuple[str, str], int] = {}
        self.corrupt: set[tuple[str, str]] = set()
        self.url = ""
        self._offline = False
        self._port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._infos: dict[tuple[Path, int, int], RepoFileInfo] = {}

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> HubServer:
        self._listen()
        if self._offline:
            self._unlisten()
        return self

    def __exit__(self, *exc: object) -> None:
        self._unlisten()

    @property
    def offline(self) -> bool:
        return self._offline

    @offline.setter
    def offline(self, value: bool) -> None:
        if value == self._offline:
            return
        self._offline = value
        if not self.url:  # not started yet: __enter__ applies it
            return
        if value:
            self._unlisten()
        else:
            self._listen()

    def _listen(self) -> None:
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), _Handler)
        httpd.hub = self  # type: ignore[attr-defined]
        httpd.handle_error = _quiet_handle_error  # type: ignore[method-assign]
        self._port = httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self._port}"
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name=f"HubServer:{self._port}",
        )
        self._thread.start()

    def _unlisten(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ---- repo content ----------------------------------------------------------------------

    def commit(self, repo_id: str) -> str:
        """The commit sha `repo_id` is served at (also the snapshot folder name in the cache)."""
        return fake_commit(repo_id)

    def url_for(self, repo_id: str, path: str, revision: str = MAIN) -> str:
        """The /resolve/ URL of a file, as `hf_hub_url` builds it."""
        return f"{self.url}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    def files(self, repo_id: str) -> dict[str, RepoFileInfo]:
        """The files of a repo, path -> info (hashes cached while size and mtime are unchanged)."""
        root = self.repos[repo_id]
        out: dict[str, RepoFileInfo] = {}
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                full = Path(dirpath) / name
                rel = full.relative_to(root).as_posix()
                st = full.stat()
                key = (full, st.st_size, st.st_mtime_ns)
                with self._lock:
                    info = self._infos.get(key)
                if info is None:
                    info = _file_info(root, rel)
                    with self._lock:
                        self._infos[key] = info
                out[rel] = info
        return out

    # ---- request handling (called from handler threads) ------------------------------------

    def _record(self, method: str, raw_path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests.append((method, raw_path, range_header))

    def _count(self, repo: str, path: str, n: int) -> None:
        with self._lock:
            self.bytes_served[(repo, path)] += n

    def _take_cut(self, repo: str, path: str) -> int | None:
        with self._lock:
            return self.cut_after.pop((repo, path), None)

    def _find_repo(self, rest: str) -> str | None:
        """The known repo id that `rest` ('{repo}' or '{repo}/...') starts with."""
        for repo in sorted(self.repos, key=len, reverse=True):
            if rest == repo or rest.startswith(repo + "/"):
                return repo
        return None

    def _check_revision(self, repo: str, revision: str) -> tuple[int, dict[str, str], bytes] | None:
        if revision in (MAIN, fake_commit(repo)):
            return None
        return _error("RevisionNotFound", f"Invalid rev id: {revision}", 404)

    def _api(self, rest: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        repo = self._find_repo(rest)
        if repo is None:
            return _error("RepoNotFound", "Repository not found", 404)
        tail = rest[len(repo):].strip("/")
        kind, _, after = tail.partition("/")
        if kind in ("", "revision"):
            revision = after or MAIN
            if (err := self._check_revision(repo, revision)) is not None:
                return err
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            return 200, {}, json.dumps(self._model_info(repo, blobs)).encode()
        if kind == "tree":
            revision, _, sub = after.partition("/")
            if (err := self._check_revision(repo, revision or MAIN)) is not None:
                return err
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries = self._tree(repo, sub.strip("/"), recursive)
            if entries is None:
                return _error("EntryNotFound", f"{sub} does not exist on \"{revision}\"", 404)
            return 200, {}, json.dumps(entries).encode()
        return _error(None, "Not Found", 404)

    def _model_info(self, repo: str, blobs: bool) -> dict[str, Any]:
        files = self.files(repo)
        siblings: list[dict[str, Any]] = []
        for f in files.values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling.update(size=f.size, blobId=f.blob_id)
                if f.sha256 is not None:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size,
                                      "pointerSize": f.pointer_size}
            siblings.append(sibling)
        info: dict[str, Any] = {
            "_id": fake_commit(repo)[:24], "id": repo, "modelId": repo,
            "author": repo.split("/")[0] if "/" in repo else None,
            "sha": fake_commit(repo), "lastModified": _DATE, "createdAt": _DATE,
            "private": False, "disabled": False, "gated": "manual" if repo in self.gated else False,
            "downloads": 0, "likes": 0, "tags": [], "library_name": "mlx",
            "siblings": siblings, "usedStorage": sum(f.size for f in files.values()),
        }
        if (params := self._safetensors_parameters(repo, files)) is not None:
            info["safetensors"] = {"parameters": params, "total": sum(params.values())}
        return info

    def _safetensors_parameters(self, repo: str, files: dict[str, RepoFileInfo]
                                ) -> dict[str, int] | None:
        counts: Counter[str] = Counter()
        found = False
        for f in files.values():
            if not f.path.endswith(".safetensors"):
                continue
            try:
                with (self.repos[repo] / f.path).open("rb") as fh:
                    n = int.from_bytes(fh.read(8), "little")
                    header = json.loads(fh.read(n))
            except (OSError, ValueError):
                continue
            found = True
            for name, t in header.items():
                if name != "__metadata__":
                    count = 1
                    for d in t["shape"]:
                        count *= d
                    counts[t["dtype"]] += count
        return dict(counts) if found else None

    def _tree(self, repo: str, sub: str, recursive: bool) -> list[dict[str, Any]] | None:
        files = self.files(repo)
        prefix = sub + "/" if sub else ""
        if sub and not any(p.startswith(prefix) for p in files):
            return None
        dirs: set[str] = set()
        out: list[dict[str, Any]] = []
        for f in files.values():
            if not f.path.startswith(prefix):
                continue
            parts = f.path[len(prefix):].split("/")
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                dirs.add(prefix + "/".join(parts[:i]))
            if recursive or len(parts) == 1:
                entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size,
                                         "path": f.path}
                if f.sha256 is not None:
                    entry["lfs"] = {"oid": f.sha256, "size": f.size,
                                    "pointerSize": f.pointer_size}
                out.append(entry)
        out += [{"type": "directory", "oid": hashlib.sha1(f"tree:{repo}:{d}".encode()).hexdigest(),
                 "size": 0, "path": d} for d in dirs]
        return sorted(out, key=lambda e: e["path"])


def _quiet_handle_error(request: Any, client_address: Any) -> None:
    """Clients hanging up mid-response are expected here; anything else is printed."""
    exc = sys.exc_info()[1]
    if not isinstance(exc, ConnectionError):
        import traceback

        traceback.print_exc()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # every response still carries Connection: close

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_POST(self) -> None:
        self._handle(head=False)

    def _handle(self, head: bool) -> None:
        hub = self.hub
        range_header = self.headers.get("Range")
        hub._record(self.command, self.path, range_header)
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        if self.command == "POST":
            return self._reply(*_error(None, "Not Found", 404), head=False)
        if path == "/api/agent-harnesses":
            body = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()
            return self._reply(200, {}, body, head=head)
        if path.startswith("/api/models/"):
            return self._reply(*hub._api(path[len("/api/models/"):], query), head=head)
        if path.startswith("/api/"):
            return self._reply(*_error("RepoNotFound", "Repository not found", 404), head=head)
        repo_part, sep, after = path.lstrip("/").partition("/resolve/")
        if not sep:
            return self._reply(*_error(None, "Not Found", 404), head=head)
        repo = repo_part
        if repo not in hub.repos:
            return self._reply(*_error("RepoNotFound", "Repository not found", 404), head=head)
        revision, _, file_path = after.partition("/")
        if (err := hub._check_revision(repo, revision)) is not None:
            return self._reply(*err, head=head)
        commit = {"X-Repo-Commit": fake_commit(repo)}
        if repo in hub.gated:
            status, headers, body = _error(
                "GatedRepo",
                f"Access to model {repo} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                401,
            )
            return self._reply(status, {**headers, **commit}, body, head=head)
        info = hub.files(repo).get(file_path)
        if info is None:
            status, headers, body = _error("EntryNotFound", "Entry not found", 404)
            return self._reply(status, {**headers, **commit}, body, head=head)
        self._serve_file(repo, info, range_header, head, commit)

    def _serve_file(self, repo: str, info: RepoFileInfo, range_header: str | None, head: bool,
                    commit: dict[str, str]) -> None:
        size = info.size
        headers = {**commit, "ETag": f'"{info.etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if info.sha256 is not None:
            headers |= {"X-Linked-Etag": f'"{info.sha256}"', "X-Linked-Size": str(size)}
        start, end, status = 0, size - 1, 200
        m = _RANGE.match(range_header.strip()) if range_header else None
        if m and (m[1] or m[2]):
            if m[1]:
                start = int(m[1])
                end = min(int(m[2]), size - 1) if m[2] else size - 1
            else:  # suffix range: the last n bytes
                start = max(size - int(m[2]), 0)
            if start >= size or start > end:
                headers["Content-Range"] = f"bytes */{size}"
                return self._reply(416, headers, b"", head=head)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()
        if head:
            return
        cut = self.hub._take_cut(repo, info.path)
        to_send = length if cut is None else min(cut, length)
        flip = (repo, info.path) in self.hub.corrupt
        with (self.hub.repos[repo] / info.path).open("rb") as f:
            f.seek(start)
            while to_send > 0:
                chunk = f.read(min(_CHUNK, to_send))
                if not chunk:
                    break
                if flip:
                    chunk, flip = bytes([chunk[0] ^ 0xFF]) + chunk[1:], False
                # counted before it is written, so that it is counted by the time the client
                # has it (a test reads bytes_served as soon as its download returns)
                self.hub._count(repo, info.path, len(chunk))
                self.wfile.write(chunk)
                to_send -= len(chunk)
        self.wfile.flush()
        if cut is not None and cut < length:
            # Closed with a body still owed: the client reads EOF mid-body.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_WR)

    def _reply(self, status: int, headers: dict[str, str], body: bytes, head: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if body and not headers.get("Content-Type"):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
