"""Main-guard detection, checked on real interpreters: each case runs a script in a subprocess.

Why subprocesses: what is being detected is the shape of a *real* ``__main__`` (a script, ``-m``,
``-c``, stdin, a zip, a thread...), which pytest's own process cannot imitate.
"""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hwlaunch.planning import mainguard
from hwlaunch.planning.mainguard import detect_main_guard, line_is_guarded
from hwlaunch.runtime_facts import MainGuard

PROBE = """\
import dataclasses, json
from hwlaunch.planning.mainguard import detect_main_guard

def detect():
    print("MAINGUARD " + json.dumps(dataclasses.asdict(detect_main_guard())), flush=True)
"""
MARK = "# <-"

GUARDED = """\
import probe

def main():
    probe.detect()

if __name__ == "__main__":
    main()  # <-
"""
UNGUARDED = """\
import probe

probe.detect()  # <-
"""


def run_all(tmp_path: Path, args: list[str], stdin: str | None = None) -> list[dict[str, Any]]:
    """Run the interpreter in ``tmp_path`` (with the probe importable); return the detections."""
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    prefix = "MAINGUARD "
    return [
        json.loads(ln[len(prefix) :]) for ln in proc.stdout.splitlines() if ln.startswith(prefix)
    ]


def run(tmp_path: Path, args: list[str], stdin: str | None = None) -> dict[str, Any]:
    results = run_all(tmp_path, args, stdin)
    assert len(results) == 1, results
    return results[0]


def script(tmp_path: Path, source: str, name: str = "main.py") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def marked_line(source: str) -> int:
    lines = textwrap.dedent(source).splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(MARK))


def assert_result(result: dict[str, Any], status: str, path: Path, source: str) -> None:
    assert result["status"] == status, result
    assert os.path.samefile(result["file"], path)
    assert result["line"] == marked_line(source)


# -- scripts run as files ------------------------------------------------------------------------


def test_guarded_main_call(tmp_path: Path) -> None:
    path = script(tmp_path, GUARDED)
    assert_result(run(tmp_path, [str(path)]), "guarded", path, GUARDED)


def test_launch_at_module_level(tmp_path: Path) -> None:
    path = script(tmp_path, UNGUARDED)
    assert_result(run(tmp_path, [str(path)]), "unguarded", path, UNGUARDED)


def test_function_called_from_unguarded_module_level(tmp_path: Path) -> None:
    source = """\
    import probe

    def launch():
        probe.detect()

    def main():
        launch()

    main()  # <-
    """
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), "unguarded", path, source)


@pytest.mark.parametrize(
    "guard",
    [
        'if "__main__" == __name__:',
        "if __name__ == '__main__':",
        "if ('__main__' == __name__):",
    ],
)
def test_guard_spellings(tmp_path: Path, guard: str) -> None:
    source = f"import probe\n{guard}\n    probe.detect()  {MARK}\n"
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), "guarded", path, source)


def test_guard_nested_in_module_level_try(tmp_path: Path) -> None:
    source = """\
    import probe
    try:
        import json
    except ImportError:
        pass
    else:
        if __name__ == "__main__":
            with open(__file__):
                probe.detect()  # <-
    """
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), "guarded", path, source)


@pytest.mark.parametrize(("source", "status"), [(GUARDED, "guarded"), (UNGUARDED, "unguarded")])
def test_run_as_module(tmp_path: Path, source: str, status: str) -> None:
    path = script(tmp_path, source, "pkg/sub/mod.py")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    assert_result(run(tmp_path, ["-m", "pkg.sub.mod"]), status, path, source)


@pytest.mark.parametrize(
    ("target", "mark"),
    [
        ("def main():\n    t = threading.Thread(target=probe.detect)\n"
         "    t.start(); t.join()\nif __name__ == '__main__':\n    main()", "guarded"),
        ("t = threading.Thread(target=probe.detect)\nt.start(); t.join()", "unguarded"),
    ],
)  # fmt: skip
def test_called_from_another_thread(tmp_path: Path, target: str, mark: str) -> None:
    source = f"import probe, threading\n{target}  {MARK}\n"
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), mark, path, source)


def test_thread_outliving_the_main_module(tmp_path: Path) -> None:
    """Python deletes ``__main__.__file__`` when the script ends: a child would re-run nothing."""
    source = """\
    import probe, threading, time
    def late():
        time.sleep(0.3)
        probe.detect()
    threading.Thread(target=late).start()
    """
    script(tmp_path, source)
    assert run(tmp_path, ["main.py"])["status"] == "no-main-file"


# -- no main file --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "detail"),
    [
        (["-c", "import probe; probe.detect()"], None, "python -c"),
        (["-i"], "import probe\nprobe.detect()\n", "interactive interpreter"),
    ],
)
def test_no_main_file(tmp_path: Path, args: list[str], stdin: str | None, detail: str) -> None:
    result = run(tmp_path, args, stdin)
    assert result == {"status": "no-main-file", "file": None, "line": None, "detail": detail}


def test_code_from_stdin_needs_no_reimport(tmp_path: Path) -> None:
    """``python -`` sets ``__file__`` to ``<stdin>``: CPython's child would run ``<cwd>/<stdin>``
    and die, but hwlaunch's workers re-run nothing of it (as for ``-c``)."""
    result = run(tmp_path, ["-"], "import probe\nprobe.detect()\n")
    assert result["status"] == "no-main-file"
    assert result["file"] == os.path.join(str(tmp_path), "<stdin>")
    assert "code read from stdin" in result["detail"]


# -- odd programs: "unknown" is allowed, a crash or a wrong "guarded" is not -----------------------


def test_main_file_deleted_before_detection(tmp_path: Path) -> None:
    script(tmp_path, "import os, probe\nos.remove(__file__)\nprobe.detect()\n")
    result = run(tmp_path, ["main.py"])
    assert result["status"] == "not-reimportable"  # a spawned child would find no file to run
    assert "does not exist" in result["detail"]


def test_main_file_edited_after_start(tmp_path: Path) -> None:
    source = """\
    import os, probe
    if __name__ == "__main__":
        probe.detect()
        with open(__file__, "w") as f:
            f.write("\\n" * 3 + open(os.path.join(os.path.dirname(__file__), "orig.py")).read())
        probe.detect()
        with open(__file__, "w") as f:
            f.write("x = 1\\n")
        probe.detect()
    """
    script(tmp_path, source, "orig.py")
    script(tmp_path, source)
    first, shifted, truncated = run_all(tmp_path, ["main.py"])
    assert first["status"] == "guarded"
    assert shifted["status"] in ("guarded", "unguarded", "unknown")  # stale lines: no crash
    assert truncated["status"] == "unknown"  # the parse cache noticed the change


@pytest.mark.parametrize("status", ["guarded", "unguarded"])
def test_very_long_main_file(tmp_path: Path, status: str) -> None:
    filler = "".join(f"x_{i} = {i}\n" for i in range(5000))
    launch = "probe.detect()\nprobe.detect()  # <-\n"
    if status == "guarded":
        launch = "if __name__ == '__main__':\n" + textwrap.indent(launch, "    ")
    source = "import probe\n" + filler + launch
    path = script(tmp_path, source)
    first, second = run_all(tmp_path, [str(path)])
    assert first["status"] == second["status"] == status  # the second one comes from the cache
    assert second["line"] == marked_line(source)


def test_exec_of_a_string_at_module_level_is_not_guarded(tmp_path: Path) -> None:
    source = """\
    import probe
    code = 'if __name__ == "__main__":\\n    probe.detect()\\n'
    exec(compile(code, "<string>", "exec"))  # <-
    """
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), "unguarded", path, source)


def test_exec_under_a_borrowed_file_name_is_not_guarded(tmp_path: Path) -> None:
    """Code compiled under another real file's name must not borrow that file's guard."""
    other = script(tmp_path, "\nif __name__ == '__main__':\n    probe.detect()\n", "other.py")
    source = f"""\
    import probe
    exec(compile("\\n\\nprobe.detect()", {str(other)!r}, "exec"))  # <-
    """
    path = script(tmp_path, source)
    assert_result(run(tmp_path, [str(path)]), "unguarded", path, source)


@pytest.mark.parametrize(("inner", "status"), [(UNGUARDED, "unguarded"), (GUARDED, "guarded")])
def test_runpy_run_path_from_guarded_main(tmp_path: Path, inner: str, status: str) -> None:
    """The script that runpy runs as __main__ is the one a spawned child re-runs: it decides."""
    inner_path = script(tmp_path, inner, "inner.py")
    script(
        tmp_path,
        f"import runpy\nif __name__ == '__main__':\n"
        f"    runpy.run_path({str(inner_path)!r}, run_name='__main__')\n",
    )
    assert_result(run(tmp_path, ["main.py"]), status, inner_path, inner)


@pytest.mark.parametrize("source", [GUARDED, UNGUARDED])
def test_main_in_a_zip_file(tmp_path: Path, source: str) -> None:
    """A zip application's ``__main__`` is named ``__main__``: multiprocessing never re-runs it."""
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", textwrap.dedent(source))
    result = run(tmp_path, ["app.zip"])
    assert result["status"] == "no-main-file"
    assert "__main__ is __main__, which multiprocessing never re-runs" in result["detail"]


@pytest.mark.parametrize(("source", "status"), [(GUARDED, "guarded"), (UNGUARDED, "unguarded")])
def test_main_without_source_is_read_from_its_bytecode(
    tmp_path: Path, source: str, status: str
) -> None:
    """A sourceless (compiled-only) main: the child re-runs the bytecode, which ``dis`` reads."""
    path = script(tmp_path, source)
    py_compile.compile(str(path), cfile=str(tmp_path / "app.pyc"), doraise=True)
    path.unlink()
    result = run(tmp_path, ["app.pyc"])
    line = 1 + next(n for n, text in enumerate(source.splitlines()) if MARK in text)
    assert (result["status"], result["line"]) == (status, line), result
    assert result["file"] == str(tmp_path / "app.pyc")
    assert "read from the bytecode of app.pyc (its source" in result["detail"]


def test_main_file_with_coding_declaration(tmp_path: Path) -> None:
    source = "# -*- coding: latin-1 -*-\nimport probe\nname = 'é'\n"
    source += "if __name__ == '__main__':\n    probe.detect()  # <-\n"
    path = tmp_path / "main.py"
    path.write_bytes(source.encode("latin-1"))
    assert_result(run(tmp_path, [str(path)]), "guarded", path, source)


# -- in-process ----------------------------------------------------------------------------------


def test_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("no stack")

    monkeypatch.setattr(mainguard, "_main_thread_frame", boom)
    result = detect_main_guard()
    assert result.status == "unknown"
    assert result.detail == "detection failed: RuntimeError: no stack"


@pytest.mark.parametrize(
    ("guard", "text"),
    [
        (MainGuard("unguarded", "/w/train.py", 12), "unguarded (train.py:12)"),
        (MainGuard("guarded", "/w/train.py", 30), "guarded (train.py:30)"),
        (MainGuard("no-main-file", detail="interactive interpreter"),
         "no-main-file (interactive interpreter)"),
        (MainGuard("unknown", "/w/main.py", 3, "cannot read or parse main.py: SyntaxError"),
         "unknown (main.py:3: cannot read or parse main.py: SyntaxError)"),
        (MainGuard("unknown"), "unknown"),
    ],
)  # fmt: skip
def test_describe(guard: MainGuard, text: str) -> None:
    assert guard.describe() == text


GUARD = 'if __name__ == "__main__":\n'


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (GUARD + "    launch()  # <-\n", True),
        ("launch()  # <-\n" + GUARD + "    pass\n", False),
        (GUARD + "    pass\nlaunch()  # <-\n", False),
        (GUARD + "    pass\nelse:\n    launch()  # <-\n", False),
        (GUARD + "    pass\nelif x:\n    launch()  # <-\n", False),
        ("if x:\n    pass\nel" + GUARD + "    launch()  # <-\n", True),
        (GUARD + "    def main():\n        launch()  # <-\n", True),
        (GUARD + "    for i in range(2):\n        if i:\n            launch()  # <-\n", True),
        ("if __name__ == '__main__' and x:\n    launch()  # <-\n", True),
        ("if x and __name__ == '__main__':\n    launch()  # <-\n", True),
        ("if __name__ == '__main__' or x:\n    launch()  # <-\n", False),
        ("if __name__ != '__main__':\n    pass\nelse:\n    launch()  # <-\n", True),
        ("if __name__ != '__main__':\n    launch()  # <-\nelse:\n    pass\n", False),
        ("if not __name__ == '__main__':\n    pass\nelse:\n    launch()  # <-\n", True),
        ("if __name__ != '__main__' or x:\n    pass\nelse:\n    launch()  # <-\n", True),
        ("if __name__ != '__main__' and x:\n    pass\nelse:\n    launch()  # <-\n", False),
        ("if __name__ in ('__main__',):\n    launch()  # <-\n", True),
        ("if __name__ in {'__main__'}:\n    launch()  # <-\n", True),
        ("if __name__ in ['__main__', 'x']:\n    launch()  # <-\n", True),
        ("if __name__ in ('__main__', '__mp_main__'):\n    launch()  # <-\n", False),
        ("if __name__ in ('__main__', y):\n    launch()  # <-\n", False),
        ("if __name__ in '__main__':\n    launch()  # <-\n", False),
        ("if __name__ not in ('__main__',):\n    pass\nelse:\n    launch()  # <-\n", True),
        ("match __name__:\n    case '__main__':\n        launch()  # <-\n", True),
        ("match __name__:\n    case '__main__' if x:\n        launch()  # <-\n", True),
        ("match __name__:\n    case '__main__':\n        pass\n    case _:\n        launch()  # <-\n",
         False),
        ("match __name__:\n    case '__main__' | '__mp_main__':\n        launch()  # <-\n", False),
        ("match x:\n    case '__main__':\n        launch()  # <-\n", False),
        ("if __name__ == '__main__' == x:\n    launch()  # <-\n", False),
        ("if __name__ is '__main__':\n    launch()  # <-\n", False),
        ("def f():\n    " + GUARD + "        launch()  # <-\n", False),
        ("class C:\n    " + GUARD + "        launch()  # <-\n", False),
        ("with x:\n    try:\n        " + GUARD + "            launch()  # <-\n"
         "    finally:\n        pass\n", True),
        ("match x:\n    case 1:\n        " + GUARD + "            launch()  # <-\n", True),
        ("if b'__main__' == __name__:\n    launch()  # <-\n", False),
        ("if '__main__' == __name__: launch()  # <-\n", True),
        (GUARD + "    launch(  # <-\n        1)\n", True),
        (GUARD + "    launch(\n  # <-\n", None),
    ],
)  # fmt: skip
def test_line_is_guarded(source: str, expected: bool | None) -> None:
    assert line_is_guarded(source, marked_line(source)) is expected
