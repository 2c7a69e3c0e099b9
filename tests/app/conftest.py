"""Fixtures for the app tests: a private data dir per test, and a fake engine for snapshots."""

from __future__ import annotations

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    """MLX_SPEC_HOME in tmp_path: history and preferences never touch the real data dir; no
    chat model installed with the app (what `uv sync` adds is opened by
    tests/test_real_smollm2.py), so a first run here offers the demo first."""
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path))
    monkeypatch.setattr("mlx_spec.gguf.local.PACKAGED", {})
    return tmp_path
