"""A worker's own spawn and forkserver children, in a program whose launch is unguarded.

hwlaunch forks the workers of such a program; a spawn or forkserver child that a worker (or
the program) starts afterwards must not re-run ``__main__``, which would launch the job again.
Such a child re-runs nothing: what it runs works when it is importable (a module's function,
as a DataLoader's worker loop is), and one that needs a function or class of ``__main__``
fails at once, in the worker, naming it, instead of a child that dies and a Pool that waits
for ever. The program sets forkserver as its default start method, Python 3.14's default on
Linux. Workers need no torch, so this also runs on the Pythons of ``.ci/other-pythons``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HELPER = "def square(x):\n    return x * x\n\ndef exit_with(code):\n    raise SystemExit(code)\n"
PROGRAM = textwrap.dedent(
    """\
    import json, multiprocessing, os, sys
    import hwlaunch
    import helper

    multiprocessing.set_start_method("forkserver")  # Python 3.14's default on Linux
    print("TOPLEVEL", os.getpid(), flush=True)  # printed again by any re-run of this file

    class NoTorch:
        def init_device(self):
            self.device = None  # no torch: these workers run on Pythons without it

    class Shape:
        pass

    def square(x):
        return x * x

    def context(method):
        return multiprocessing if method == "default" else multiprocessing.get_context(method)

    def pool(worker, method, fn):
        try:
            with context(method).Pool(1) as workers:
                return workers.map_async(fn, [worker.rank + 2]).get(timeout=60)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def process(worker, method, target, args):
        try:
            child = context(method).Process(target=target, args=args)
            child.start()
            child.join(60)
            return child.exitcode
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    cases = {}
    with hwlaunch.launch(
        backend="cpu", world_size=2, init_distributed=False, worker_extension=NoTorch
    ) as executor:
        cases["start method"] = executor.plan.start_method
        for method in ("spawn", "forkserver", "default"):
            run = executor.collective_rpc
            cases[method] = {
                "pool of a module's function": run(pool, args=(method, helper.square)),
                "pool of a __main__ function": run(pool, args=(method, square)),
                "process of a module's function": run(process, args=(method, helper.exit_with, (7,))),
                "process of a __main__ function": run(process, args=(method, square, (3,))),
                "process given a __main__ object": run(
                    process, args=(method, helper.exit_with, (Shape(),))
                ),
            }
    print("CASES " + json.dumps(cases), flush=True)
    """
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp_path = tmp_path_factory.mktemp("children")
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "job.py").write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,  # never hang
        env={**os.environ, "HWLAUNCH_STARTUP_TIMEOUT": "60"},
    )
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    assert "bootstrapping phase" not in done.stderr, output
    assert len([ln for ln in done.stdout.splitlines() if ln.startswith("TOPLEVEL")]) == 1, output
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("CASES "))
    found: dict[str, object] = json.loads(line.removeprefix("CASES "))
    return found


def refusals(values: object, name: str) -> None:
    assert isinstance(values, list) and len(values) == 2, values
    for text in values:
        assert str(text).startswith(f"MissingMainGuardError: {name} is defined in __main__"), text
        assert "must not re-run __main__, which reaches" in text and "job.py:" in text, text
        assert f"Fix: move {name} into a module the child can import" in text, text


def test_the_unguarded_program_runs_with_fork(cases: dict[str, object]) -> None:
    assert cases["start method"] == "fork"


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_that_run_importable_code_work(cases: dict[str, object], method: str) -> None:
    results = cases[method]
    assert isinstance(results, dict)
    assert results["pool of a module's function"] == [[4], [9]]
    assert results["process of a module's function"] == [7, 7]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_that_need_main_are_refused_naming_it(
    cases: dict[str, object], method: str
) -> None:
    results = cases[method]
    assert isinstance(results, dict)
    refusals(results["pool of a __main__ function"], "square")
    refusals(results["process of a __main__ function"], "square")
    refusals(results["process given a __main__ object"], "Shape")


def test_a_forked_worker_keeps_fork_as_its_default(cases: dict[str, object]) -> None:
    """CPython makes a child's default start method the one that started it: a fork worker's
    plain ``multiprocessing.Pool`` forks, whatever the program set, so ``__main__`` works."""
    results = cases["default"]
    assert isinstance(results, dict)
    assert results["pool of a __main__ function"] == [[4], [9]]
    assert results["process of a __main__ function"] == [0, 0]


def test_task_bytes_name_the_main_global_they_refer_to() -> None:
    """A Pool task's pickle, in every protocol, memoized or not, names its ``__main__`` global;
    the strings "__main__" and a name as plain data do not count."""
    import operator
    import pickle

    from hwlaunch.executor._main_refs import main_global_in

    def local(x: int) -> int:
        return x

    local.__module__, local.__qualname__ = "__main__", "square"
    sys.modules["__main__"].square = local  # type: ignore[attr-defined]
    try:
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            twice = pickle.dumps((0, 1, local, (local, 2), {}), protocol)
            assert main_global_in(twice) == "square", protocol
            assert main_global_in(pickle.dumps((operator.neg, [1]), protocol)) is None
            assert main_global_in(pickle.dumps(("__main__", "square"), protocol)) is None
    finally:
        del sys.modules["__main__"].square  # type: ignore[attr-defined]
