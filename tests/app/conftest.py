"""Fixtures for the app tests: a private data dir per test, and a fake engine for snapshots."""

from __future__ import annotations

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    """MLX_SPEC_HOME in tmp_path: history and preferences never touch the real data dir."""
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path))
    return tmp_path
