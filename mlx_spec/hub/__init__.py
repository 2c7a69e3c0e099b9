"""Models from the Hugging Face hub: presets, fetching, MTP heads read out of checkpoints.

Imports no MLX at module level: the app's process may fetch without loading an engine."""

from .child import PullProcess
from .download import Cancelled, DownloadError, Progress, fetch, gb, local_snapshot
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
    "PullProcess", "gb",
    "UnknownPresetError", "fetch", "find", "fits", "installed", "launch_for", "local_snapshot",
    "memory_bytes", "missing", "presets", "pull", "remove", "resolve",
]
