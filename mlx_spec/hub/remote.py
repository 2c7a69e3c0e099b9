"""Reading a few tensors out of a safetensors file on the hub with HTTP range requests.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(name -> dtype, shape, data_offsets relative to the end of the header), then the data. So one
small request reads every tensor's place, and one request per run of adjacent wanted tensors
reads only those bytes: a 1 GB MTP head comes out of a 50 GB checkpoint without the trunk.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from .download import DownloadError, describe_failure

HEAD_PROBE = 100_000  # most headers fit in the first 100 kB: one request instead of two


@dataclass(frozen=True)
class Header:
    """A remote safetensors file's header: where each tensor's bytes are."""

    repo: str
    file: str
    data_start: int  # 8 + N
    tensors: dict[str, dict]  # name -> {"dtype", "shape", "data_offsets": [begin, end]}
    metadata: dict
    probe: bytes = b""  # the file's first bytes, as read for the header (tensors may be in it)


class RangeReader:
    """Range GETs of one repo's files at one revision; counts the bytes it received."""

    def __init__(self, repo: str, revision: str | None = None):
        self.repo, self.revision = repo, revision
        self.bytes_read = 0

    def get(self, file: str, start: int, end: int, *, exact: bool = True) -> bytes:
        """Bytes [start, end) of `file` (end exclusive; fewer at the file's end if not exact)."""
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        url = hf_hub_url(self.repo, file, revision=self.revision, endpoint=constants.ENDPOINT)
        headers = {**build_hf_headers(), "Range": f"bytes={start}-{end - 1}"}
        try:
            response = get_session().get(url, headers=headers, follow_redirects=True,
                                         timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
            hf_raise_for_status(response)
        except Exception as e:
            raise DownloadError(describe_failure(self.repo, e, file)) from e
        body = response.content
        if response.status_code == 200:  # the server ignored Range: keep only what was asked
            body = body[start:end]
        self.bytes_read += len(response.content)
        if len(body) != end - start and (exact or not body):
            raise DownloadError(f"{self.repo}/{file}: asked for {end - start} bytes at {start}, "
                                f"got {len(body)}")
        return body

    def header(self, file: str) -> Header:
        first = self.get(file, 0, HEAD_PROBE, exact=False)
        (n,) = struct.unpack("<Q", first[:8])
        raw = first[8 : 8 + n] if len(first) >= 8 + n else self.get(file, 8, 8 + n)
        try:
            table = json.loads(raw)
        except ValueError as e:
            raise DownloadError(f"{self.repo}/{file} is not a safetensors file") from e
        metadata = table.pop("__metadata__", {}) or {}
        return Header(self.repo, file, 8 + n, table, metadata, first)

    def tensors(self, header: Header, names: list[str]) -> dict[str, bytes]:
        """The raw bytes of `names`, one request per run of adjacent tensors."""
        spans = sorted((header.tensors[n]["data_offsets"], n) for n in names)
        out: dict[str, bytes] = {}
        run: list[tuple[list[int], str]] = []
        for span in [*spans, None]:
            if run and (span is None or span[0][0] != run[-1][0][1]):
                start, end = run[0][0][0], run[-1][0][1]
                a, b = header.data_start + start, header.data_start + end
                blob = header.probe[a:b] if b <= len(header.probe) else self.get(header.file, a, b)
                for (b, e), n in run:
                    out[n] = blob[b - start : e - start]
                run = []
            if span is not None:
                run.append(span)
        return out


def write_safetensors(path: Path, tensors: dict[str, tuple[dict, bytes]],
                      metadata: dict | None = None) -> None:
    """A safetensors file from (header entry, raw bytes) pairs, bytes copied as they are."""
    table: dict[str, dict] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, (entry, data) in tensors.items():
        table[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                       "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(table, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for _, data in tensors.values():
            fh.write(data)
