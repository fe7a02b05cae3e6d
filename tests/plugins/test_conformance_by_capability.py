"""hwlaunch.testing holds a vendor's executor to what its ExecutorSpec declares, not its name.

The zoo distribution (tests/plugins/executor_plugin_dists/zoo) is installed into a target
directory, and a vendor's test module, written here, runs hwlaunch's conformance classes against
its executors in a pytest subprocess, as the vendor's own CI would:

- ``zoo-procs`` declares what mp declares (``start_method``): the worker contract runs once per
  start method, and passes;
- ``inline`` runs its one worker in this process and declares ``in_process``: it passes;
- ``zoo-liar`` is the same class under a spec without ``in_process``, so it promises each rank a
  process of its own: the contract's process check fails it, naming the capability.

The backend suite takes vendor executors the same way, through ``executors``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from plugin_sites import EXECUTOR_DISTS, install, site_environ

pytestmark = [pytest.mark.timeout(420)]

VENDOR_TESTS = """
from hwlaunch.testing import BackendConformance, ExecutorConformance


class TestZooProcs(ExecutorConformance):
    executor = "zoo-procs"


class TestInline(ExecutorConformance):
    executor = "inline"


class TestLiar(ExecutorConformance):
    executor = "zoo-liar"


class TestCPUUnderZooExecutors(BackendConformance):
    backend = "cpu"
    executors = ("zoo-procs", "inline")
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], str]:
    """Each lifecycle or worker-contract test of the vendor's module, by id, and its outcome."""
    root = tmp_path_factory.mktemp("by_capability")
    site = install([EXECUTOR_DISTS / "zoo"], root / "site")
    (root / "test_vendor.py").write_text(VENDOR_TESTS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-k",
            "worker_contract or test_lifecycle",
            "test_vendor.py",
        ],
        env=site_environ(site),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=400,
    )
    report = done.stdout + done.stderr
    found = re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR) (test_vendor\.py::\S+)", report, re.M)
    return {test: outcome for outcome, test in found}, report


def test_a_vendor_executor_declaring_start_method_gets_every_start_method(
    outcomes: tuple[dict[str, str], str],
) -> None:
    got, report = outcomes
    for method in ("fork", "spawn", "forkserver"):
        test = f"test_vendor.py::TestZooProcs::test_worker_contract[{method}]"
        assert got.get(test) == "PASSED", report
        under_backend = (
            f"test_vendor.py::TestCPUUnderZooExecutors::test_lifecycle[zoo-procs-{method}]"
        )
        assert got.get(under_backend) == "PASSED", report


def test_an_in_process_vendor_executor_passes_as_one(outcomes: tuple[dict[str, str], str]) -> None:
    got, report = outcomes
    assert got.get("test_vendor.py::TestInline::test_worker_contract[inline]") == "PASSED", report
    under_backend = "test_vendor.py::TestCPUUnderZooExecutors::test_lifecycle[inline]"
    assert got.get(under_backend) == "PASSED", report


def test_an_executor_that_breaks_its_declared_capability_fails(
    outcomes: tuple[dict[str, str], str],
) -> None:
    got, report = outcomes
    assert got.get("test_vendor.py::TestLiar::test_worker_contract[zoo-liar]") == "FAILED", report
    assert "executor 'zoo-liar' does not declare in_process, so each rank must run" in report
