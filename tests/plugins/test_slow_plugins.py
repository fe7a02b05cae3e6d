"""A plugin that hangs at import is named after a few seconds, with the fix, while its import
goes on; and no thread of that is left afterwards to change the fork verdict.

The plugin is a real distribution (``tests/plugins/slow_dists/hangs_at_import``), pip-installed
into a site of its own (not with ``plugin_dists/``, whose site every discovery test loads): its
import waits for a vendor service that never answers, or for ``HANGS_AT_IMPORT_SECONDS``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from plugin_sites import PLUGINS, install, site_environ

from hwlaunch._discovery import PLUGIN_SLOW

SLOW_DISTS = PLUGINS / "slow_dists"
NAMED = "plugin 'hangsatimport' (hwlaunch-hangs-at-import 0.7.0) has been loading"
FIX = "If it hangs, skip it: HWLAUNCH_DISABLE_PLUGINS=hangsatimport"

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_env")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow_plugins")
    return install([SLOW_DISTS / "hangs_at_import"], root / "site")


def first_line_with(proc: subprocess.Popen[str], text: str, timeout: float) -> tuple[str, float]:
    """The first line of ``proc``'s stderr that holds ``text``, and when it came."""
    assert proc.stderr is not None
    began = time.monotonic()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while (left := began + timeout - time.monotonic()) > 0:
            if selector.select(left):
                line = proc.stderr.readline()
                if not line:
                    break
                if text in line:
                    return line, time.monotonic() - began
    raise AssertionError(f"no line with {text!r} on stderr within {timeout:g}s")


def test_a_plugin_that_hangs_at_import_is_named_with_the_fix(site: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwlaunch.cli", "backends"],
        env=site_environ(site),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line, after = first_line_with(proc, NAMED, PLUGIN_SLOW + 20)
        assert proc.poll() is None  # the import goes on
    finally:
        proc.kill()
        proc.wait()
    assert after >= PLUGIN_SLOW - 1, after
    assert FIX in line and "(hwlaunch_hangs_at_import)" in line
    assert "in wait_for_the_vendor_daemon" in line or "hwlaunch_hangs_at_import.py" in line, line


def test_a_slow_plugin_is_named_then_loads_and_leaves_no_thread(site: Path, tmp_path: Path) -> None:
    """The import ends after 1.5x the notice: the backend is there, and the process has no
    thread but its own (the fork verdict sees none; fork stays the start method)."""
    script = tmp_path / "slow_then_fine.py"
    script.write_text(
        textwrap.dedent(
            """\
            import json, threading
            import hwlaunch
            from hwlaunch.planning.registry import default_registry

            if __name__ == "__main__":
                plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="mp")
                print(json.dumps({
                    "backends": sorted(default_registry().backends),
                    "threads": [t.name for t in threading.enumerate()],
                    "others": plan.facts.threads.summary(),
                    "start_method": plan.start_method,
                }))
            """
        )
    )
    env = site_environ(site, HANGS_AT_IMPORT_SECONDS=str(PLUGIN_SLOW * 1.5))
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert NAMED in done.stderr and FIX in done.stderr
    found = json.loads(done.stdout)
    assert "slownpu" in found["backends"]
    assert found["threads"] == ["MainThread"], found
    assert found["others"] == "no other threads" and found["start_method"] == "fork"


def test_the_fix_it_names_skips_the_plugin(site: Path, tmp_path: Path) -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", "backends"],
        env=site_environ(site, HWLAUNCH_DISABLE_PLUGINS="hangsatimport"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < PLUGIN_SLOW + 60
    assert "has been loading" not in done.stderr
    assert os.environ.get("HANGS_AT_IMPORT_SECONDS") is None
