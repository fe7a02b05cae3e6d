"""Each library's verdict at fork (``hwlaunch.planning.fork_safety``), shown by forking beside
its live threads.

Every program starts a library's threads, asks the probe and the rule what they are, then
forks children that each do the library's work, the parent doing it again after each fork. A
verdict that were wrong fails its test: a "safe" library whose children hang or fail, a
"fatal" one whose children finish. intel-openmp, mkl and opencv-python-headless are
pip-installed for the tests that need them (``plugin_sites.install_from_index``: about 340 MB
of wheels, from pip's cache after the first run); gRPC comes with Ray, numpy and GNU libgomp
with torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from plugin_sites import install_from_index

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HARNESS = textwrap.dedent(
    """\
    import json, os, sys, time
    from hwlaunch.planning.fork_safety import at_fork
    from hwlaunch.planning.threads import probe_threads

    def forks(work, n, limit=10.0):
        '''Fork n children that each run work(), the parent running it after each fork too;
        each child ends 0, 3 (it raised) or "hung" (killed after limit seconds).'''
        results = []
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    work()
                    code = 0
                except BaseException:
                    code = 3
                os._exit(code)
            results.append(wait(pid, limit))
            work()
        return results

    def wait(pid, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"

    def verdicts(library):
        '''The library's threads, as the probe and the rule see them now.'''
        found = [t for t in probe_threads().others if t.known_library == library]
        return {"threads": len(found), "verdicts": sorted({at_fork(t).verdict for t in found})}
    """
)


def run(tmp_path: Path, body: str, timeout: float = 240, **env: str) -> dict[str, Any]:
    """Run the harness and ``body`` in a fresh interpreter; the JSON it printed last."""
    script = tmp_path / "beside.py"
    script.write_text(HARNESS + textwrap.dedent(body))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_"))}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(autouse=True)
def two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the libraries start no pool threads")


def ended(results: list[Any], code: object) -> None:
    assert results and all(r == code for r in results), results


def test_openblas_idle_is_safe_its_children_and_the_parent_run_matmuls(tmp_path: Path) -> None:
    seen = run(
        tmp_path,
        """
        import numpy as np
        a = np.random.rand(600, 600)
        work = lambda: float((a @ a).sum())
        work()  # OpenBLAS's server threads run, then sleep
        seen = verdicts("OpenBLAS")
        seen["children"] = forks(work, 20)
        print(json.dumps(seen))
        """,
    )
    assert seen["threads"] >= 1 and seen["verdicts"] == ["safe"]
    ended(seen["children"], 0)


def test_openblas_busy_is_a_risk_its_fork_handler_hangs_the_parent(tmp_path: Path) -> None:
    """While another thread runs a matmul, OpenBLAS's threads are on a CPU: the kernel gives
    no registers, the probe cannot place them, and the rule calls them a risk. Rightly: a fork
    then may hang, in the fork's own handler (blas_thread_shutdown) in the parent; 7 of 8 such
    programs here hung within 5 forks. Of 30 forks, one hangs (in the parent or a child)."""
    program = """
        import threading
        import numpy as np
        a = np.random.rand(600, 600)
        def spin():
            while True:
                float((a @ a).sum())
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.3)
        found = [t for t in probe_threads().others if t.kind == "native"]
        print(json.dumps({"verdicts": sorted({at_fork(t).verdict for t in found}),
                          "running": [t.running for t in found]}), flush=True)
        print(json.dumps({"forked": forks(lambda: None, 30, limit=5)}), flush=True)
        """
    script = tmp_path / "busy.py"
    script.write_text(HARNESS + textwrap.dedent(program))
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=30
        )
        lines = done.stdout.splitlines()
    except subprocess.TimeoutExpired as hung:  # the parent hangs in a fork
        lines = (hung.stdout or b"").decode().splitlines()  # type: ignore[union-attr]
    seen = json.loads(lines[0])
    assert seen["verdicts"] == ["risk"] and all(seen["running"]), seen
    if len(lines) > 1:  # every fork returned in the parent: a child must have hung
        assert "hung" in json.loads(lines[1])["forked"], lines


def test_a_started_gnu_openmp_pool_is_fatal_its_children_hang(tmp_path: Path) -> None:
    seen = run(
        tmp_path,
        """
        import torch
        x = torch.randn(512, 512)
        work = lambda: float((x @ x).sum())
        work()  # torch's GNU OpenMP pool starts
        seen = verdicts("GNU OpenMP pool")
        seen["children"] = forks(work, 2, limit=5)
        print(json.dumps(seen))
        """,
    )
    assert seen["threads"] >= 1 and seen["verdicts"] == ["fatal"]
    ended(seen["children"], "hung")


def test_opencvs_own_openblas_is_safe_too(tmp_path: Path) -> None:
    """opencv-python bundles an OpenBLAS of its own (``libopenblasp-r0-*.so``), whose server
    starts at ``import cv2``: vLLM's driver has it beside numpy's. cv2's gemm and SVD solve run
    on it, in 20 children and the parent."""
    site = install_from_index(["opencv-python-headless"], tmp_path / "opencv")
    packages = site / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    seen = run(
        tmp_path,
        """
        import numpy as np
        import cv2
        a = np.random.rand(600, 600)
        def work():
            cv2.gemm(a, a, 1.0, None, 0.0)
            cv2.solve(a[:200, :200], a[:200, :1], flags=cv2.DECOMP_SVD)
        work()
        found = [t for t in probe_threads().others if (t.library or "").startswith("libopenblasp")]
        seen = {"threads": len(found), "verdicts": sorted({at_fork(t).verdict for t in found})}
        seen["children"] = forks(work, 20)
        print(json.dumps(seen))
        """,
        PYTHONPATH=str(packages),
    )
    assert seen["threads"] >= 1 and seen["verdicts"] == ["safe"]
    ended(seen["children"], 0)


KMP_FILES = "__KMP_REGISTERED_LIB_*_*"  # libiomp5's registration of a process: <pid>_<uid>


@pytest.fixture(scope="module")
def intel_libs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """libiomp5.so and MKL's libraries, pip-installed (removed after the module)."""
    import shutil

    prefix = tmp_path_factory.mktemp("intel")
    before = set(Path("/dev/shm").glob(KMP_FILES))
    yield install_from_index(["intel-openmp", "mkl"], prefix) / "lib"
    shutil.rmtree(prefix, ignore_errors=True)
    # libiomp5 registers each process that starts its runtime in /dev/shm and unregisters it at
    # exit; the forked children here end by os._exit (or are killed when they hang), so theirs
    # stay: removed once their process is gone, as the machine is left as it was found.
    for path in set(Path("/dev/shm").glob(KMP_FILES)) - before:
        if not psutil.pid_exists(int(path.name.split("_")[-2])):
            path.unlink(missing_ok=True)


def test_intel_openmp_preloaded_under_torch_is_safe(tmp_path: Path, intel_libs: Path) -> None:
    """vLLM's CPU build preloads libiomp5.so, which then runs torch's OpenMP regions: its fork
    handler gives each child a runtime of its own, whose parallel matmuls finish."""
    seen = run(
        tmp_path,
        """
        import torch
        x = torch.randn(512, 512)
        work = lambda: float((x @ x).sum()) + float(torch.randn(2_000_000).exp().sum())
        work()
        seen = verdicts("Intel OpenMP pool")
        seen["children"] = forks(work, 10)
        print(json.dumps(seen))
        """,
        LD_PRELOAD=str(intel_libs / "libiomp5.so"),
    )
    assert seen["threads"] >= 1 and seen["verdicts"] == ["safe"]
    ended(seen["children"], 0)


MKL_GEMM = """
    import ctypes
    mkl = ctypes.CDLL("libmkl_rt.so.3")
    N = 600
    A = (ctypes.c_double * (N * N))(*([1.0] * (N * N)))
    C = (ctypes.c_double * (N * N))()
    def work():
        mkl.cblas_dgemm(101, 111, 111, N, N, N, ctypes.c_double(1.0), A, N, A, N,
                        ctypes.c_double(0.0), C, N)
        assert C[0] == N
    work()
    seen = {**verdicts("Intel OpenMP pool"), "gnu": verdicts("GNU OpenMP pool")}
    seen["children"] = forks(work, CHILDREN, limit=5)
    print(json.dumps(seen))
    """


@pytest.mark.parametrize(
    ("layer", "library", "verdict", "children"),
    [("INTEL", "intel", "safe", 0), ("GNU", "gnu", "fatal", "hung")],
)
def test_mkl_threads_are_its_threading_layers(
    tmp_path: Path, intel_libs: Path, layer: str, library: str, verdict: str, children: object
) -> None:
    """MKL starts no threads of its own: its threading layer's OpenMP runs them, Intel's by
    default (safe: children's dgemm finish) or GNU's (fatal: they hang)."""
    seen = run(
        tmp_path,
        MKL_GEMM.replace("CHILDREN", "10" if layer == "INTEL" else "2"),
        LD_LIBRARY_PATH=str(intel_libs),
        MKL_THREADING_LAYER=layer,
    )
    found = seen if library == "intel" else seen["gnu"]
    assert found["threads"] >= 1 and found["verdicts"] == [verdict], seen
    ended(seen["children"], children)


GRPC = """
    import subprocess
    SERVER = '''
    import grpc, sys
    from concurrent import futures
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.E", {"Echo": echo}),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    sys.stdin.read()
    '''
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    address = f"127.0.0.1:{int(server.stdout.readline())}"
    import grpc
    kept = grpc.insecure_channel(address)
    def call(channel):
        return channel.unary_unary("/t.E/Echo")(b"hi", timeout=5)
    def fresh():
        with grpc.insecure_channel(address) as channel:
            call(channel)
    call(kept)  # gRPC's threads start (its timer, event engine, lifeguard)
    time.sleep(0.3)
    seen = verdicts("gRPC")
    seen["plain"] = forks(lambda: sum(range(1000)), 5)
    seen["grpc"] = forks(fresh, 10) + forks(lambda: call(kept), 30)
    server.kill()
    print(json.dumps(seen))
    """


def test_grpc_is_a_risk_children_that_use_it_fail_now_and_then(tmp_path: Path) -> None:
    """gRPC skips its fork handlers while its threads run ("Other threads are currently calling
    into gRPC"): a child that does not use gRPC runs, one that calls through a channel of its
    own or the parent's fails now and then (UNAVAILABLE), without hanging."""
    seen = run(tmp_path, GRPC)
    assert seen["threads"] >= 1 and seen["verdicts"] == ["risk"]
    ended(seen["plain"], 0)
    assert 3 in seen["grpc"] and set(seen["grpc"]) <= {0, 3}, seen
