"""Mains with no source file to re-run: code fed on stdin, and bytecode without its source.

Code on stdin (``python - < job.py``): CPython's own spawn child would try to run
``<cwd>/<stdin>`` and die; hwlaunch's workers re-run nothing of it, so spawn and forkserver
work, with a worker extension class, callables and the ``__main__`` globals they use all sent
by value. A ``.pyc`` without its source is read from its bytecode (``dis``): the guard line is
found there. The workers need no torch (their ``init_device`` binds nothing), so these tests
also run on the other Pythons of ``.ci/other-pythons``.
"""

from __future__ import annotations

import dis
import os
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hwlaunch.planning._bytecode_guard import offset_is_guarded

JOB = textwrap.dedent(
    """\
    import os, hwlaunch
    LIMIT = 7

    class Limits:
        def init_device(self):
            self.device = None  # no torch: these workers run on Pythons without it

        def limit(self):
            return LIMIT + self.rank

    def scaled_rank(worker):
        return worker.rank * LIMIT

    def run(method):
        options = {} if method == "auto" else {"start_method": method}
        try:
            with hwlaunch.launch(
                backend="cpu", world_size=2, init_distributed=False, worker_extension=Limits,
                **options,
            ) as executor:
                values = executor.collective_rpc("limit"), executor.collective_rpc(scaled_rank)
                guard = executor.plan.facts.main_guard
                print("RESULT", os.getpid(), method, "ok", executor.plan.start_method,
                      guard.status, guard.line, *(str(v).replace(" ", "") for v in values),
                      flush=True)
        except hwlaunch.HwlaunchError as exc:
            text = " ".join(str(exc).split())
            print("RESULT", os.getpid(), method, "error", type(exc).__name__, text, flush=True)
    """
)
METHODS = ("auto", "fork", "spawn", "forkserver")
LAUNCH_ALL = f"for method in {METHODS!r}:\n    run(method)  # <-\n"
GUARDED_LAUNCH = (
    'if __name__ == "__main__":\n' + textwrap.indent(LAUNCH_ALL, "    ") + "print('end')\n"
)


def run_program(cwd: Path, args: list[str], stdin: str = "") -> list[list[str]]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HWLAUNCH_STARTUP_TIMEOUT": "60"},
    )
    output = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    assert "bootstrapping phase" not in done.stderr, output
    results = [ln.split(" ")[1:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert [r[1] for r in results] == list(METHODS), output  # each launch once: no second run
    assert len({r[0] for r in results}) == 1, output  # all from the program's own process
    return [r[1:] for r in results]


@pytest.mark.parametrize("args", [["-"], []], ids=["python -", "python < job.py"])
def test_code_from_stdin_runs_with_every_start_method(tmp_path: Path, args: list[str]) -> None:
    """Unguarded, from stdin: spawn and forkserver workers start (nothing to re-run), the
    extension class defined there works, and a callable brings the global it reads."""
    for method, outcome, used, status, line, limits, scaled in run_program(
        tmp_path, args, JOB + LAUNCH_ALL
    ):
        assert (outcome, status, line) == ("ok", "no-main-file", "None"), method
        assert (limits, scaled) == ("[7,8]", "[0,7]"), method
        assert used == ("fork" if method == "auto" else method)


def compile_without_source(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(source)
    py_compile.compile(str(path), cfile=str(tmp_path / "job.pyc"), doraise=True)
    path.unlink()
    return tmp_path / "job.pyc"


def marked_line(source: str) -> str:
    return str(1 + next(n for n, text in enumerate(source.splitlines()) if "# <-" in text))


def test_guarded_bytecode_without_source_uses_spawn_and_forkserver(tmp_path: Path) -> None:
    source = JOB + GUARDED_LAUNCH
    pyc = compile_without_source(tmp_path, source)
    for method, outcome, used, status, line, limits, scaled in run_program(tmp_path, [str(pyc)]):
        assert (outcome, status, line) == ("ok", "guarded", marked_line(source)), method
        assert (limits, scaled) == ("[7,8]", "[0,7]"), method
        if method != "auto":
            assert used == method


def test_unguarded_bytecode_without_source_is_refused_naming_its_line(tmp_path: Path) -> None:
    source = JOB + LAUNCH_ALL
    pyc = compile_without_source(tmp_path, source)
    results = run_program(tmp_path, [str(pyc)])
    by_method = {r[0]: r[1:] for r in results}
    assert by_method["auto"][:3] == ["ok", "fork", "unguarded"]
    assert by_method["fork"][:3] == ["ok", "fork", "unguarded"]
    for method in ("spawn", "forkserver"):
        outcome, kind, *words = by_method[method]
        text = " ".join(words)
        assert (outcome, kind) == ("error", "MissingMainGuardError"), text
        assert f"job.pyc:{marked_line(source)} starts workers at module level" in text
        assert "read from the bytecode of job.pyc (its source" in text and "Fix:" in text


# -- the bytecode reading itself, on the running interpreter's own compiler ---------------------

CASES = {
    "guard": 'def f(): pass\nif __name__ == "__main__":\n    f()  # T\n',
    "reversed": 'if "__main__" == __name__:\n    x = 1\n    f()  # T\n',
    "and": 'import os\nif __name__ == "__main__" and os.name:\n    f()  # T\nprint()\n',
    "before": 'f()  # F\nif __name__ == "__main__":\n    pass\n',
    "or": 'import os\nif __name__ == "__main__" or os.name:\n    f()  # F\n',
    "after": 'if __name__ == "__main__":\n    pass\nf()  # F\n',
    "else": 'if __name__ == "__main__":\n    pass\nelse:\n    f()  # F\n',
    "handler outside": 'try:\n    if __name__ == "__main__":\n        f()  # T\nexcept Exception:\n    f()  # F\n',
    "nested": 'import os\nif os.name:\n    if __name__ == "__main__":\n        f()  # T\n    f()  # F\n',
    "not equal": 'if __name__ != "__main__":\n    pass\nelse:\n    f()  # F\n',
    "try inside": 'if __name__ == "__main__":\n    try:\n        f()  # T\n    except Exception:\n        f()  # T\n    g = 1\nf()  # F\n',
    "while": 'while __name__ == "__main__":\n    f()  # T\n    break\n',
    "loop around": 'for i in range(2):\n    if __name__ == "__main__":\n        f()  # T\n    f()  # F\n',
}


def call_lines(code: object) -> list[tuple[int, int]]:
    """(line, offset) of each call instruction of module ``code``."""
    found, line = [], 0
    for instruction in dis.get_instructions(code):  # type: ignore[arg-type]
        start = getattr(instruction, "line_number", None) or instruction.starts_line
        if type(start) is int:
            line = start
        if instruction.opname in ("CALL", "CALL_FUNCTION", "CALL_METHOD"):
            found.append((line, instruction.offset))
    return found


@pytest.mark.parametrize("source", CASES.values(), ids=CASES.keys())
def test_bytecode_guard_matches_the_source(source: str) -> None:
    """Each call marked T runs only as __main__, each marked F does not."""
    code = compile(source, "job.py", "exec")
    lines = source.splitlines()
    marked = [(n, o) for n, o in call_lines(code) if "# " in lines[n - 1]]
    assert len(marked) == source.count("# "), marked
    for line, offset in marked:
        expected = lines[line - 1].endswith("# T")
        assert offset_is_guarded(code, offset) is expected, (line, lines[line - 1])


POOLS = textwrap.dedent(
    """\
    import multiprocessing, os, hwlaunch, helper

    class NoTorch:
        def init_device(self):
            self.device = None

    def square(x):
        return x * x

    def pool(worker, method, fn):
        try:
            with multiprocessing.get_context(method).Pool(1) as workers:
                return workers.map_async(fn, [worker.rank + 2]).get(timeout=60)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def pool_of_helper(worker, method):
        return pool(worker, method, helper.square)

    def pool_of_main(worker, method):
        return pool(worker, method, square)

    for start in ("fork", "spawn", "forkserver"):
        with hwlaunch.launch(
            backend="cpu", world_size=2, init_distributed=False, worker_extension=NoTorch,
            start_method=start,
        ) as executor:
            for method in ("spawn", "forkserver"):
                for call in (pool_of_helper, pool_of_main):
                    value = executor.collective_rpc(call, args=(method,))
                    print("POOL", start, method, call.__name__, value, flush=True)
    """
)


def test_workers_of_code_from_stdin_start_their_own_spawn_pools(tmp_path: Path) -> None:
    """A worker's spawn or forkserver Pool cannot re-run stdin either: a module's function
    works, a function of ``__main__`` fails at once naming it (never a Pool that waits)."""
    (tmp_path / "helper.py").write_text("def square(x):\n    return x * x\n")
    done = subprocess.run(
        [sys.executable, "-"],
        cwd=tmp_path,
        input=POOLS,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HWLAUNCH_STARTUP_TIMEOUT": "60"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln.split(" ", 4)[1:] for ln in done.stdout.splitlines() if ln.startswith("POOL ")]
    assert len(lines) == 12, done.stdout
    for start, method, call, value in lines:
        if call == "pool_of_helper":
            assert value == "[[4], [9]]", (start, method, value)
        else:
            assert value.count("MissingMainGuardError: square is defined in __main__") == 2, value
            assert "__main__ is code read from stdin, which the child cannot re-run" in value
