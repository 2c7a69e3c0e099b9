"""Where mlx-spec keeps its own files (chat history, MTP heads read out of checkpoints).

Downloaded models are not here: they live in the standard Hugging Face cache (HF_HOME), shared
with every other hub tool."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "mlx-spec"


def data_dir() -> Path:
    """MLX_SPEC_HOME, else the platform's per-user data directory."""
    if home := os.environ.get("MLX_SPEC_HOME"):
        return Path(home).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP_NAME
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / APP_NAME
