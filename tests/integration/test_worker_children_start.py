"""A worker's own children start as a plain process's do, whatever started the worker.

CPython makes a child's default start method the one that started it, so a worker started by
forkserver or spawn used to start its Pool and DataLoader workers the same slow way, each one
re-importing ``__main__`` and torch. Inside an mp worker the default is the platform's, which a
plain process has (fork on Linux before Python 3.14, forkserver from 3.14). The first test needs
no torch and runs on the Pythons of ``.ci/other-pythons`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

DEFAULTS = textwrap.dedent(
    """\
    import json, multiprocessing, os, sys
    import hwlaunch

    class NoTorch:
        def init_device(self):
            self.device = None

    def square(x):
        return x * x

    def children(worker):
        with multiprocessing.Pool(1) as pool:  # the default method: a __main__ function works
            squares = pool.map_async(square, [worker.rank + 2]).get(timeout=60)
        return [multiprocessing.get_start_method(), squares]

    if __name__ == "__main__":
        seen = {"plain": multiprocessing.get_start_method()}
        for method in ("fork", "spawn", "forkserver"):
            with hwlaunch.launch(backend="cpu", world_size=2, start_method=method,
                                 init_distributed=False, worker_extension=NoTorch) as ex:
                seen[method] = ex.collective_rpc(children, timeout=120)
        print("SEEN " + json.dumps(seen), flush=True)
    """
)


HELPER = textwrap.dedent(
    """\
    import torch

    def pooled(x):
        y = torch.randn(256, 256)
        return [torch.get_num_threads(), float((y @ y).sum()) != 0.0]
    """
)


def run_program(tmp_path: Path, source: str, timeout: float = 240) -> Any:
    (tmp_path / "job.py").write_text(source)
    (tmp_path / "helper.py").write_text(HELPER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "OMP_"))}
    done = subprocess.run(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "HWLAUNCH_STARTUP_TIMEOUT": "120"},
    )
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SEEN ")), None)
    assert line is not None, output
    return json.loads(line.removeprefix("SEEN "))


def test_a_workers_default_start_method_is_a_plain_processs(tmp_path: Path) -> None:
    seen = run_program(tmp_path, DEFAULTS)
    plain = seen.pop("plain")
    assert plain == ("forkserver" if sys.version_info >= (3, 14) else "fork")
    for method, ranks in seen.items():
        assert ranks == [[plain, [4]], [plain, [9]]], method


LOADER = textwrap.dedent(
    """\
    import json, multiprocessing, os, sys
    import torch, hwlaunch
    from torch.utils.data import DataLoader, Dataset
    from helper import pooled

    class Numbers(Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):  # its method, and whether this worker is its parent
            return os.getppid(), multiprocessing.get_start_method()

    def load(worker):
        loader = DataLoader(Numbers(), batch_size=None, num_workers=2)
        return sorted({(ppid == os.getpid(), method) for ppid, method in loader})

    def after_a_parallel_op(worker):
        x = torch.randn(256, 256)
        float((x @ x).sum())  # the worker's own OpenMP pool starts (2 threads)
        with multiprocessing.Pool(1) as pool:  # forked: without care its matmul would hang
            return [torch.get_num_threads(), pool.map_async(pooled, [0]).get(timeout=60)]

    if __name__ == "__main__":
        seen = {}
        for method in ("forkserver", "spawn"):
            with hwlaunch.launch(backend="cpu", world_size=1, executor="mp", start_method=method,
                                 init_distributed=False) as ex:
                seen[method] = ex.collective_rpc(load, timeout=120)
                seen[method + " pool"] = ex.collective_rpc(after_a_parallel_op, timeout=120)
        print("SEEN " + json.dumps(seen), flush=True)
    """
)


@pytest.mark.slow
def test_dataloader_and_pool_workers_fork_from_a_forkserver_or_spawn_worker(
    tmp_path: Path,
) -> None:
    """The DataLoader's workers are forked, as children of the worker, from a worker that
    forkserver or spawn started (not by a fork server of the worker's, nor spawned); a Pool child forked after the worker's OpenMP pool started runs torch on
    one thread and finishes its matmul, where it would wait for ever for the pool."""
    pytest.importorskip("torch")
    if sys.version_info >= (3, 14):
        pytest.skip("forkserver is the platform's default from Python 3.14")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the worker starts no OpenMP pool")
    seen = run_program(tmp_path, LOADER)
    for method in ("forkserver", "spawn"):
        assert seen[method] == [[[True, "fork"]]], method
        assert seen[method + " pool"] == [[2, [[1, True]]]], method
