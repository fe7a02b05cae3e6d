"""Shared fixtures. Kept minimal: anything one test module needs lives in that module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray binds its services to 127.0.0.1 only with this set; tests send traffic to loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A Ray client left in this process by a finished Ray session (Ray sometimes keeps one after
# ray.shutdown()) ends the whole process with exit code 1 and no output once it has failed to
# reach its GCS, which that shutdown stopped, for this long (Ray's default: 60 s): pytest then
# dies in whatever test runs a minute after a Ray module. Ray processes still end with their
# raylet, as the tests of leftovers check.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(24 * 3600))


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
