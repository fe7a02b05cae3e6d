"""Shared fixtures. Kept minimal: anything one test module needs lives in that module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
