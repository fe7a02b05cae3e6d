"""Shared fixtures. Kept minimal: anything one test module needs lives in that module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray binds its services to 127.0.0.1 only with this set; tests send traffic to loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ``HWLAUNCH_*`` variable and an empty working directory (so no config file is found).

    Returns the working directory, where a test may write ``hwlaunch.toml`` or ``pyproject.toml``.
    """
    for name in list(os.environ):
        if name.startswith("HWLAUNCH_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path
