"""The local Hub stand-in (tests/hubserver.py) against the real huggingface_hub client."""

from __future__ import annotations

import functools
import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from hubenv import hub_env, skip_retry_sleeps
from hubserver import HubServer
from huggingface_hub import (
    HfApi,
    get_safetensors_metadata,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub import file_download as hf_file_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)

REPO = "org/tiny"
SHARDED = "org/sharded"
WEIGHTS = "model.safetensors"


def _safetensors(tensors: dict[str, tuple[int, ...]]) -> bytes:
    """A valid safetensors file of F32 tensors with deterministic, non-repeating-ish content."""
    header: dict = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, shape in tensors.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    blocks = range(offset // 32 + 1)
    data = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in blocks)
    return len(raw).to_bytes(8, "little") + raw + data[:offset]


@pytest.fixture
def repos(tmp_path) -> dict[str, Path]:
    tiny = tmp_path / "repos" / "tiny"
    (tiny / "sub").mkdir(parents=True)
    (tiny / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 384}))
    (tiny / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (tiny / WEIGHTS).write_bytes(_safetensors({"w": (100, 100)}))  # 40 kB of data
    (tiny / "README.md").write_text("# tiny\n")
    (tiny / "sub" / "notes.txt").write_text("not fetched\n")
    sharded = tmp_path / "repos" / "sharded"
    sharded.mkdir()
    shards = {"model-00001-of-00002.safetensors": {"a": (4, 8)},
              "model-00002-of-00002.safetensors": {"b": (16,)}}
    for name, tensors in shards.items():
        (sharded / name).write_bytes(_safetensors(tensors))
    index = {"metadata": {"total_size": 4 * (32 + 16)},
             "weight_map": {t: name for name, ts in shards.items() for t in ts}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    return {REPO: tiny, SHARDED: sharded}


@pytest.fixture
def hub(repos, tmp_path):
    with HubServer(repos) as server, hub_env(server, tmp_path / "hf"):
        yield server


def _gets(hub: HubServer, path: str) -> list[str | None]:
    """The Range headers of the GETs of a file of REPO, in order."""
    return [r for m, p, r in hub.requests if m == "GET" and p.endswith(f"/resolve/main/{path}")]


@pytest.mark.parametrize("explicit", [False, True], ids=["env", "endpoint-and-cache_dir"])
def test_snapshot_download_fetches_only_the_matching_files(hub, repos, tmp_path, explicit):
    kwargs = dict(endpoint=hub.url, cache_dir=tmp_path / "elsewhere") if explicit else {}
    cache = tmp_path / "elsewhere" if explicit else tmp_path / "hf" / "hub"
    path = Path(snapshot_download(REPO, allow_patterns=["*.json", "*.safetensors"], **kwargs))

    assert path == cache / "models--org--tiny" / "snapshots" / hub.commit(REPO)
    wanted = ["config.json", WEIGHTS, "tokenizer.json"]
    assert sorted(p.name for p in path.iterdir()) == wanted
    for name in wanted:
        assert (path / name).read_bytes() == (repos[REPO] / name).read_bytes()
    assert dict(hub.bytes_served) == {
        (REPO, name): (repos[REPO] / name).stat().st_size for name in wanted}
    sha = hub.commit(REPO)
    assert hub.requests[:2] == [
        ("GET", f"/api/models/{REPO}/revision/main", None),
        ("GET", f"/api/models/{REPO}/tree/{sha}?recursive=true&expand=false", None),
    ]
    assert sorted(p for m, p, _ in hub.requests[2:] if m == "HEAD") == [
        f"/{REPO}/resolve/{sha}/{name}" for name in wanted]


@pytest.mark.parametrize(("chunk", "resumed_at"), [(None, None), (500, 1000), (256, 768)])
def test_a_cut_transfer_is_retried_within_the_same_call(hub, repos, monkeypatch, chunk,
                                                        resumed_at):
    """http_get writes whole DOWNLOAD_CHUNK_SIZE chunks (10 MiB): on a cut it resumes with a
    Range from the last full chunk, and re-fetches what it had past it; below 10 MiB, from 0."""
    if chunk is not None:
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", chunk)
    sleeps = skip_retry_sleeps(monkeypatch)
    size = (repos[REPO] / WEIGHTS).stat().st_size
    hub.cut_after[(REPO, WEIGHTS)] = 1000

    path = hf_hub_download(REPO, WEIGHTS)

    assert Path(path).read_bytes() == (repos[REPO] / WEIGHTS).read_bytes()
    assert _gets(hub, WEIGHTS) == [None, resumed_at and f"bytes={resumed_at}-"]
    assert hub.bytes_served[(REPO, WEIGHTS)] == 1000 + size - (resumed_at or 0)
    assert sleeps == [1]  # http_get waits 1 s before retrying
    assert hub.cut_after == {}


def test_a_failed_call_leaves_nothing_to_resume_from(hub, repos, monkeypatch, tmp_path):
    """2.4.0 downloads into a per-call `<blob>.<uuid>.incomplete` and deletes it when the call
    fails, so the next call starts from byte 0."""
    monkeypatch.setattr(hf_file_download, "http_get",
                        functools.partial(hf_file_download.http_get, _nb_retries=0))
    size = (repos[REPO] / WEIGHTS).stat().st_size
    hub.cut_after[(REPO, WEIGHTS)] = 1000

    with pytest.raises(httpx2.RemoteProtocolError):
        hf_hub_download(REPO, WEIGHTS)
    blobs = tmp_path / "hf" / "hub" / "models--org--tiny" / "blobs"
    assert list(blobs.iterdir()) == []

    path = hf_hub_download(REPO, WEIGHTS)
    assert Path(path).read_bytes() == (repos[REPO] / WEIGHTS).read_bytes()
    assert _gets(hub, WEIGHTS) == [None, None]
    assert hub.bytes_served[(REPO, WEIGHTS)] == 1000 + size


def test_missing_repo_missing_file_and_gated_repo_raise_the_hub_errors(hub):
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/none", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("nobody/none")
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("nobody/none")
    with pytest.raises(RemoteEntryNotFoundError) as e:
        hf_hub_download(REPO, "nope.json")
    assert isinstance(e.value, EntryNotFoundError)

    hub.gated.add(REPO)
    with pytest.raises(GatedRepoError):
        hf_hub_download(REPO, "config.json")
    with pytest.raises(GatedRepoError):  # the listing is readable, the files are not
        snapshot_download(REPO, allow_patterns=["*.json"])
    assert HfApi().model_info(REPO).gated == "manual"
    assert hub.bytes_served == {}


def test_model_info_with_files_metadata_gives_sizes_and_lfs_sha256(hub, repos):
    info = huggingface_hub.model_info(REPO, files_metadata=True)  # the module-level HfApi
    assert info.sha == hub.commit(REPO)
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == {"config.json", "tokenizer.json", WEIGHTS, "README.md",
                             "sub/notes.txt"}
    for name, s in siblings.items():
        data = (repos[REPO] / name).read_bytes()
        assert s.size == len(data)
        if name == WEIGHTS:
            assert s.lfs is not None
            assert s.lfs.sha256 == hashlib.sha256(data).hexdigest()
            assert s.lfs.size == len(data)
        else:
            assert s.lfs is None
            assert s.blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert info.safetensors is not None and info.safetensors.total == 100 * 100
    assert HfApi(endpoint=hub.url).model_info(REPO).siblings[0].size is None  # no blobs asked


def test_get_safetensors_metadata_reads_headers_with_range_gets(hub):
    meta = get_safetensors_metadata(REPO)
    assert not meta.sharded
    assert meta.files_metadata[WEIGHTS].tensors["w"].shape == [100, 100]
    assert _gets(hub, WEIGHTS) == ["bytes=0-100000"]

    sharded = get_safetensors_metadata(SHARDED)
    assert sharded.sharded and sharded.weight_map == {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    assert sharded.files_metadata["model-00002-of-00002.safetensors"].tensors["b"].shape == [16]


def test_a_plain_range_get_returns_exactly_the_bytes_asked_for(hub, repos):
    data = (repos[REPO] / WEIGHTS).read_bytes()

    def get(range_: str | None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(hub.url_for(REPO, WEIGHTS))
        if range_ is not None:
            req.add_header("Range", range_)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    status, headers, body = get("bytes=10-19")
    assert (status, body, headers["Content-Range"]) == (206, data[10:20],
                                                       f"bytes 10-19/{len(data)}")
    assert get("bytes=-5")[::2] == (206, data[-5:])
    assert get(f"bytes={len(data) - 3}-")[::2] == (206, data[-3:])
    assert get(f"bytes=100-{10 * len(data)}")[::2] == (206, data[100:])  # clamped to the file
    assert get(f"bytes={len(data)}-")[0] == 416
    status, headers, body = get(None)
    assert (status, body) == (200, data)
    assert headers["X-Repo-Commit"] == hub.commit(REPO)
    assert headers["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert not any(k.lower().startswith("x-xet") for k in headers)
    assert hub.bytes_served[(REPO, WEIGHTS)] == 10 + 5 + 3 + (len(data) - 100) + len(data)


def test_offline_is_the_clients_no_network_case(hub, monkeypatch):
    sleeps = skip_retry_sleeps(monkeypatch)
    url = hub.url
    hub.offline = True  # nothing cached yet

    with pytest.raises(httpx2.ConnectError):
        HfApi().model_info(REPO)
    with pytest.raises(LocalEntryNotFoundError) as e:
        snapshot_download(REPO, allow_patterns=["*.json"])
    assert isinstance(e.value.__cause__, httpx2.ConnectError)
    assert sleeps == []  # repo_info is not retried
    with pytest.raises(LocalEntryNotFoundError) as e:
        hf_hub_download(REPO, "config.json")
    assert isinstance(e.value.__cause__, httpx2.ConnectError)
    assert sleeps == [1, 2, 4, 8, 8]  # but the HEAD is, 5 times, before giving up

    hub.offline = False
    assert hub.url == url  # same port again
    snapshot = snapshot_download(REPO, allow_patterns=["*.json"])
    hub.offline = True
    assert snapshot_download(REPO, allow_patterns=["*.json"]) == snapshot  # from the cache
    assert hf_hub_download(REPO, "config.json") == f"{snapshot}/config.json"
    with pytest.raises(IncompleteSnapshotError):  # its cached file list says what is missing
        snapshot_download(REPO, allow_patterns=[WEIGHTS])
