"""Shared fixtures. Kept minimal: anything one test module needs lives in that module."""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

# Ray binds its services to 127.0.0.1 only with this set; tests send traffic to loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A Ray client left in this process by a finished Ray session (Ray sometimes keeps one after
# ray.shutdown()) ends the whole process with exit code 1 and no output once it has failed to
# reach its GCS, which that shutdown stopped, for this long (Ray's default: 60 s): pytest then
# dies in whatever test runs a minute after a Ray module. Ray processes still end with their
# raylet, as the tests of leftovers check.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(24 * 3600))

# pytest-timeout (signal method) fails a test that runs past its timeout, but only once the
# main thread is back in Python: a test stuck in native code would hold the run with no word of
# where. .ci/run sends SIGPWR to a pytest that printed nothing for far longer than any timeout:
# faulthandler's handler (native, it needs no GIL) writes every thread's stack to this file.
_hang_report: IO[str] | None = None
if os.environ.get("TESTS_HANG_REPORT") and hasattr(signal, "SIGPWR"):
    _hang_report = open(os.environ["TESTS_HANG_REPORT"], "a")  # noqa: SIM115 (kept open)
    faulthandler.register(signal.SIGPWR, file=_hang_report, all_threads=True)


def _uses_ray(item: pytest.Item) -> bool:
    """Marked ``ray``, or named for it (``test_executor_ray.py``, ``test_lifecycle_ray_...``:
    the conformance kit's tests carry no marker of this suite)."""
    named = item.nodeid.split("[")[0].lower()  # not by its parameters' ids
    return item.get_closest_marker("ray") is not None or "ray" in re.split(r"[^a-z0-9]+", named)


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start Ray in this process run last, each group in its own order. Ray
    leaves native threads here even after ``ray.shutdown()`` (gRPC's, its core worker's), and a
    process forked from a parent with those threads may crash or hang in them (a forked mp
    worker died by SIGSEGV before reporting its start-up error, once in CI): the tests that
    fork workers must fork from a pytest without them, as the docs tell users to. Each of
    them carries the ``ray`` marker, so that ``-m ray`` and ``-m "not ray"`` select them."""
    for item in items:
        if _uses_ray(item) and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray)
    items.sort(key=_uses_ray)  # stable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A module that leaves this process connected to Ray is said so, and disconnected: the
    next module's ``ray.init`` would fail on it, and once its cluster is gone Ray's client
    would wait on the dead GCS (see above) or end this process."""
    yield
    if nextitem is not None and getattr(nextitem, "module", None) is getattr(item, "module", None):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        warnings.warn(
            f"{item.nodeid.split('::')[0]} left this process connected to Ray: disconnected",
            pytest.PytestWarning,
            stacklevel=1,
        )
        ray.shutdown()


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
