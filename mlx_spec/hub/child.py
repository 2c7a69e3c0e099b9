"""A pull in a child process (`mlx-spec pull NAME --progress-json`), for the app.

The app's process keeps no hub transfer threads and never imports MLX (reading an MTP head out
of a checkpoint needs it), and cancelling is ending the child: huggingface_hub's `.incomplete`
files keep what arrived, and the next pull resumes from there. The child writes one JSON object
per line: {"event": "progress", ...Progress} at most ten times a second, then
{"event": "done", "launch": ...}; on failure it exits 2 with one line on stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

from .download import Cancelled, DownloadError, Progress
from .pull import Launch


class PullProcess:
    def __init__(self, name: str, *, drafter: str | None = None):
        cmd = [sys.executable, "-m", "mlx_spec.cli", "pull", name, "--progress-json"]
        if drafter:
            cmd += ["--drafter", drafter]
        self.name = name
        self.cancelled = False
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)

    def events(self) -> Iterator[Progress | Launch]:
        """Progress reports, then the Launch; DownloadError / Cancelled if it ends otherwise."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == "progress":
                msg.pop("event")
                yield Progress(**msg)
            elif msg.get("event") == "done":
                self.proc.wait()
                yield Launch.from_dict(msg["launch"])
                return
        code = self.proc.wait()
        if self.cancelled:
            raise Cancelled(f"download of {self.name} cancelled; it resumes next time")
        err = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()
        line = err[-1] if err else f"the download process exited with {code}"
        raise DownloadError(line.removeprefix("mlx-spec: error: "))

    def cancel(self) -> None:
        self.cancelled = True
        if self.proc.poll() is None:
            self.proc.terminate()

    def close(self) -> None:
        self.cancel()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
