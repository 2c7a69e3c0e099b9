"""Models from the Hugging Face hub: presets, fetching, MTP heads read out of checkpoints.

Imports no MLX at module level: the app's process may fetch without loading an engine."""

from .fetch import Cancelled, DownloadError, Progress, fetch, local_snapshot
from .presets import Preset, UnknownPresetError, find, fits, memory_bytes, presets
from .pull import (
    Installed,
    Launch,
    NotDownloaded,
    installed,
    launch_for,
    missing,
    pull,
    remove,
    resolve,
)

__all__ = [
    "Cancelled", "DownloadError", "Installed", "Launch", "NotDownloaded", "Preset", "Progress",
    "UnknownPresetError", "fetch", "find", "fits", "installed", "launch_for", "local_snapshot",
    "memory_bytes", "missing", "presets", "pull", "remove", "resolve",
]
