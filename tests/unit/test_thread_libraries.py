"""The libraries the probe recognises in a thread's file, and the rule's verdict on each.

The file names are those the wheels users have ship (numpy's, opencv's, torch's, auditwheel's
renames, intel-openmp's); a verdict is backed by a test that forks beside the library's threads
(tests/integration/test_fork_beside_libraries.py), which docs/threads.md names row by row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hwlaunch.planning.fork_safety import AT_FORK, at_fork, judge_threads
from hwlaunch.planning.threads import KNOWN_LIBRARIES, known_library
from hwlaunch.runtime_facts import ThreadFacts, ThreadInfo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("path", "known"),
    [
        ("/v/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so", "OpenBLAS"),
        ("/v/site-packages/opencv_python.libs/libopenblasp-r0-2ecf47d5.3.13.so", "OpenBLAS"),
        ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "OpenBLAS"),
        ("/v/site-packages/scipy.libs/libscipy_openblas-b75cc656.so", "OpenBLAS"),
        ("/v/site-packages/torch/lib/libgomp.so.1", "GNU OpenMP pool"),
        ("/v/site-packages/torch.libs/libgomp-a34b3233.so.1.0.0", "GNU OpenMP pool"),
        ("/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0", "GNU OpenMP pool"),
        ("/v/lib/libiomp5.so", "Intel OpenMP pool"),
        ("/v/site-packages/torch.libs/libiomp5-0a1b2c3d.so", "Intel OpenMP pool"),
        ("/v/site-packages/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so", "gRPC"),
        ("/v/lib/libiompstubs5.so", None),  # the stubs: no runtime, no threads
        ("/v/lib/libmkl_core.so.3", None),  # MKL's threads are its threading layer's
        ("/v/site-packages/ray/_raylet.so", None),
        ("/v/site-packages/torch/lib/libtorch_cpu.so", None),
        ("/v/lib/libgompx.so", None),
    ],
)
def test_a_library_is_known_by_the_file_its_wheel_ships(path: str, known: str | None) -> None:
    assert known_library(path) == known


def test_every_known_library_has_a_verdict() -> None:
    assert {known for _, known in KNOWN_LIBRARIES} == set(AT_FORK)


def test_the_verdict_follows_the_library_and_the_kernels_view_of_the_thread() -> None:
    blas = ThreadInfo("python", "native", "libopenblas.so.0", None, "OpenBLAS")
    gomp = ThreadInfo("python", "native", "libgomp.so.1", "torch", "GNU OpenMP pool")
    unknown = ThreadInfo("python", "native", "_raylet.so", "ray")
    running = ThreadInfo("python", "native", running=True)
    poller = ThreadInfo("poller", "python")
    verdicts = judge_threads(ThreadFacts((blas, gomp, unknown, running, poller)))
    assert verdicts.safe == (blas,) and verdicts.fatal == (gomp,)
    assert verdicts.risk == (unknown, running, poller) and verdicts.gravest == "fatal"
    assert at_fork(gomp).fix and not at_fork(blas).fix


def test_the_docs_table_has_a_row_and_a_real_test_per_library() -> None:
    docs = (ROOT / "docs" / "threads.md").read_text()
    table = docs.split("### Libraries at fork", 1)[1].split("\n### ", 1)[0]
    tests = (ROOT / "tests" / "integration" / "test_fork_beside_libraries.py").read_text()
    for library in ("OpenBLAS", "GNU OpenMP", "Intel OpenMP", "MKL", "gRPC"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {library}"))
        named = re.findall(r"`(test_\w+)`", row)
        assert named and all(f"def {name}(" in tests for name in named), row
