"""Real programs, started every way Python can start one, launching with every start method.

Each shape runs in a subprocess that launches four times (hwlaunch decides, fork, spawn,
forkserver) with the cpu backend and two workers. Each launch must end in a correct run or a
clear hwlaunch error: never the "bootstrapping phase" RuntimeError, a hang, or a second run of
the program (every RESULT line comes from the first process). The shapes follow CPython's
Lib/test/test_multiprocessing_main_handling.py (script, module, package, directory, zip, -c,
stdin, runpy), plus .pyc files, -i, cProfile and IPython.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 20 interpreters with torch, each starting 4 worker pairs

METHODS = ("auto", "fork", "spawn", "forkserver")
DEFS = textwrap.dedent(
    """\
    import os, sys
    import torch  # as real programs do; fork workers then start without importing it
    import hwlaunch

    def rank_of(worker):
        return worker.rank

    def square(x):
        return x * x

    def pool_squares(worker, method):
        import multiprocessing
        with multiprocessing.get_context(method).Pool(1) as pool:
            return pool.map(square, [worker.rank + 2])

    def run_one(method, call=rank_of, *args):
        options = {} if method == "auto" else {"start_method": method}
        try:
            with hwlaunch.launch(
                backend="cpu", world_size=2, init_distributed=False, **options
            ) as executor:
                value = executor.collective_rpc(call, args=args)
                used = executor.plan.start_method
            print("RESULT", os.getpid(), method, "ok", used, value, flush=True)
        except hwlaunch.HwlaunchError as exc:
            text = " ".join(str(exc).split())
            print("RESULT", os.getpid(), method, "error", type(exc).__name__, text, flush=True)

    def launch_all():
        for method in os.environ["SHAPE_METHODS"].split(","):
            run_one(method)
    """
)
GUARDED = DEFS + 'if __name__ == "__main__":\n    launch_all()\n'
UNGUARDED = DEFS + "launch_all()\n"
OK = dict.fromkeys(METHODS, "ok")
# An unsafe main: fork (what hwlaunch picks) works; spawn and forkserver are refused up front.
REFUSED = {"auto": "ok", "fork": "ok", "spawn": "error", "forkserver": "error"}


@dataclass(frozen=True)
class Shape:
    name: str
    prepare: Callable[[Path], tuple[list[str], str | None]]  # -> (python arguments, stdin)
    expected: dict[str, str]
    reason: str = ""  # a fragment the refusals must contain
    methods: tuple[str, ...] = METHODS


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def script(source: str) -> Callable[[Path], tuple[list[str], str | None]]:
    return lambda d: ([str(write(d / "main.py", source))], None)


def module(source: str) -> Callable[[Path], tuple[list[str], str | None]]:
    return lambda d: (write(d / "main.py", source) and ["-m", "main"], None)


def pyc(keep_source: bool, text: str = GUARDED) -> Callable[[Path], tuple[list[str], str | None]]:
    def prepare(d: Path) -> tuple[list[str], str | None]:
        source = write(d / "main.py", text)
        py_compile.compile(str(source), cfile=str(d / "main.pyc"), doraise=True)
        if not keep_source:
            source.unlink()
        return [str(d / "main.pyc")], None

    return prepare


def package(d: Path) -> tuple[list[str], str | None]:
    write(d / "pkg" / "__init__.py", "")
    write(d / "pkg" / "__main__.py", UNGUARDED)
    return ["-m", "pkg"], None


def directory(d: Path) -> tuple[list[str], str | None]:
    write(d / "app" / "__main__.py", UNGUARDED)
    return [str(d / "app")], None


def zipapp(d: Path) -> tuple[list[str], str | None]:
    with zipfile.ZipFile(d / "app.zip", "w") as archive:
        archive.writestr("__main__.py", UNGUARDED)
    return [str(d / "app.zip")], None


def zip_module(source: str) -> Callable[[Path], tuple[list[str], str | None]]:
    def prepare(d: Path) -> tuple[list[str], str | None]:
        with zipfile.ZipFile(d / "lib.zip", "w") as archive:
            archive.writestr("zipmain.py", source)
        return ["-m", "zipmain"], None

    return prepare


def interactive(d: Path) -> tuple[list[str], str | None]:
    write(d / "defs.py", DEFS)
    return ["-i", str(d / "defs.py")], "launch_all()\n"


def runpy_path(d: Path) -> tuple[list[str], str | None]:
    write(d / "inner.py", UNGUARDED)
    runner = "import runpy\nif __name__ == '__main__':\n    runpy.run_path('inner.py', run_name='__main__')\n"
    return [str(write(d / "runner.py", runner))], None


def runpy_module(d: Path) -> tuple[list[str], str | None]:
    write(d / "inner.py", UNGUARDED)
    runner = "import runpy\nif __name__ == '__main__':\n    runpy.run_module('inner', run_name='__main__')\n"
    return [str(write(d / "runner.py", runner))], None


def two_launches(d: Path) -> tuple[list[str], str | None]:
    source = DEFS + 'run_one("auto")\nif __name__ == "__main__":\n    launch_all()\n'
    return [str(write(d / "main.py", source))], None


SHAPES = [
    Shape("script-guarded", script(GUARDED), OK),
    Shape("script-unguarded", script(UNGUARDED), REFUSED, "starts workers at module level"),
    Shape("pyc-with-source", pyc(keep_source=True), OK),
    Shape("pyc-without-source-guarded", pyc(keep_source=False), OK),
    Shape(
        "pyc-without-source-unguarded",
        pyc(keep_source=False, text=UNGUARDED),
        REFUSED,
        "main.pyc:",
    ),
    Shape("module-guarded", module(GUARDED), OK),
    Shape("module-unguarded", module(UNGUARDED), REFUSED, "main.py:"),
    Shape("package-main-unguarded", package, OK),
    Shape("directory-main-unguarded", directory, OK),
    Shape("zipapp-unguarded", zipapp, OK),
    Shape("zip-module-guarded", zip_module(GUARDED), OK),
    Shape("zip-module-unguarded", zip_module(UNGUARDED), REFUSED, "lib.zip/zipmain.py:"),
    Shape("dash-c", lambda d: (["-c", UNGUARDED], None), OK),
    Shape("stdin-dash", lambda d: (["-"], UNGUARDED), OK),
    Shape("stdin-redirect", lambda d: ([], UNGUARDED), OK),
    Shape("interactive", interactive, OK),
    Shape("runpy-run-path-unguarded", runpy_path, REFUSED, "inner.py:"),
    Shape("runpy-run-module-from-guarded-runner", runpy_module, OK),
    Shape(
        "cprofile-unguarded",
        lambda d: (["-m", "cProfile", str(write(d / "main.py", UNGUARDED))], None),
        OK,
    ),
    Shape(
        "ipython-run-guarded",
        lambda d: (
            write(d / "main.py", GUARDED)
            and ["-m", "IPython", "--no-banner", "-c", "%run main.py"],
            None,
        ),
        OK,
    ),
    Shape(
        "ipython-run-unguarded",
        lambda d: (
            write(d / "main.py", UNGUARDED)
            and ["-m", "IPython", "--no-banner", "-c", "%run main.py"],
            None,
        ),
        REFUSED,
        "main.py:",
    ),
    Shape("ipython-cell", lambda d: (["-m", "IPython", "--no-banner", "-c", UNGUARDED], None), OK),
    Shape(
        "two-launches",
        two_launches,
        {"auto": "ok", "fork": "ok", "spawn": "error", "forkserver": "error"},
        "an earlier launch of this process at main.py:",
        methods=("fork", "spawn", "forkserver"),
    ),
]


def run_program(
    tmp_path: Path, args: list[str], stdin: str | None, methods: tuple[str, ...]
) -> tuple[list[list[str]], subprocess.CompletedProcess[str]]:
    env = {
        **os.environ,
        "SHAPE_METHODS": ",".join(methods),
        "PYTHONPATH": str(tmp_path / "lib.zip"),
        "HWLAUNCH_STARTUP_TIMEOUT": "60",
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        input=stdin if stdin is not None else "",
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    results = [
        line.split(" ", 5)[1:] for line in done.stdout.splitlines() if line.startswith("RESULT ")
    ]
    return results, done


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_way_to_start_a_program(tmp_path: Path, shape: Shape) -> None:
    args, stdin = shape.prepare(tmp_path)
    results, done = run_program(tmp_path, args, stdin, shape.methods)
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert "bootstrapping phase" not in done.stderr, output
    assert done.returncode == 0, output
    expected = [m for m in METHODS if m in shape.expected and (m in shape.methods or m == "auto")]
    assert [r[1] for r in results] == expected, output  # each launch once: no second run
    assert len({r[0] for r in results}) == 1, output  # all in the program's own process
    for _, method, outcome, *rest in results:
        assert outcome == shape.expected[method], (method, rest, output)
        if outcome == "ok":
            used, value = rest
            assert value == "[0, 1]", (method, rest)
            if method != "auto":
                assert used == method
        else:
            kind, text = rest
            assert kind == "MissingMainGuardError", (method, text)
            assert shape.reason in text, (method, text)
            assert "Fix:" in text


POOLS = textwrap.dedent(
    """
    def pools(worker, methods):
        return [pool_squares(worker, method) for method in methods]
    """
)


def test_workers_hand_main_functions_to_their_own_pools(tmp_path: Path) -> None:
    """A function of ``__main__`` reaches a worker by value; the worker's Pool sends it by
    reference, which works once it is the worker's ``__main__``'s own (any method, any Pool)."""
    source = (
        DEFS
        + POOLS
        + textwrap.dedent(
            """
        if __name__ == "__main__":
            for method in ("fork", "spawn", "forkserver"):
                run_one(method, pools, ["fork", "forkserver", "spawn"])
        """
        )
    )
    results, done = run_program(tmp_path, [str(write(tmp_path / "main.py", source))], None, ())
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    assert [r[1:3] for r in results] == [[m, "ok"] for m in ("fork", "spawn", "forkserver")], output
    for _, method, _, used, value in results:
        assert used == method
        assert value == "[[[4], [4], [4]], [[9], [9], [9]]]", (method, value)


def test_unguarded_script_whose_worker_starts_a_spawn_pool(tmp_path: Path) -> None:
    """The forked worker's spawned Pool children must not re-run the module-level launch, so
    they cannot have ``__main__.square``: a fork Pool works, a spawn or forkserver Pool of it
    fails at once naming it (no hang, no rerun; tests/integration/test_worker_children.py has the rest)."""
    source = (
        DEFS
        + POOLS
        + textwrap.dedent(
            """
        run_one("auto", pools, ["fork"])
        run_one("auto", pools, ["spawn"])
        run_one("auto", pools, ["forkserver"])
        """
        )
    )
    results, done = run_program(tmp_path, [str(write(tmp_path / "main.py", source))], None, ())
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    assert "bootstrapping phase" not in done.stderr, output
    assert len(results) == 3 and len({r[0] for r in results}) == 1, output
    (_, _, outcome, used, value), *refused = results
    assert (outcome, used, value) == ("ok", "fork", "[[[4]], [[9]]]"), output
    for _, _, outcome, kind, text in refused:
        assert (outcome, kind) == ("error", "WorkerError"), text
        assert "MissingMainGuardError" in text
        assert "square is defined in __main__, which a spawn or forkserver child" in text, text
        assert "must not re-run __main__, which reaches" in text and "main.py:" in text, text
        assert "get_context('fork')" in text
