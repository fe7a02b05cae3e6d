"""Main-guard detection over odd programs that tests/integration/test_mainguard.py does not already run.

tests/integration/test_mainguard.py covers a main deleted before detection, edited after start, very long,
``exec`` of a string and under a borrowed file name, ``runpy.run_path``, a zip application and a
sourceless ``.pyc``. Here: code compiled under the main file's *own* name, a main rewritten with
syntax the parser cannot read or bytes it cannot decode, deleted after a cached detection,
replaced by a directory, ``-m`` of a module imported from a zip, a frozen-style main (no file on
disk, no loader source), and a script run by ``exec(open(...).read())`` from ``python -c``.
"unknown" is an allowed answer; a crash or a wrong "guarded" is not. Last, a property: however
the parse of a main file takes shortcuts, its answer is that of a full ``ast`` parse.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwlaunch.planning import mainguard

PROBE = """\
import dataclasses, json
from hwlaunch.planning.mainguard import detect_main_guard

def detect():
    print("MAINGUARD " + json.dumps(dataclasses.asdict(detect_main_guard())), flush=True)
"""
PREFIX = "MAINGUARD "


def detections(tmp_path: Path, args: list[str]) -> list[dict[str, Any]]:
    """Run the interpreter in ``tmp_path`` with the probe importable; every detection, in order."""
    (tmp_path / "probe.py").write_text(PROBE)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [
        json.loads(ln[len(PREFIX) :]) for ln in done.stdout.splitlines() if ln.startswith(PREFIX)
    ]


def write(tmp_path: Path, source: str, name: str = "main.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_exec_under_the_main_files_own_name_is_not_guarded(tmp_path: Path) -> None:
    """Code compiled from a string under ``__file__`` is not the file: its line 5 is not the
    file's line 5. The launch really runs at module level (line 3), unguarded.

    Fails today: ``_detect`` in core/hwlaunch/planning/mainguard.py trusts the innermost module-level frame whose
    ``co_filename`` equals its ``__file__``, which the exec'd string satisfies; its line 5 falls
    in the file's guard body, so the answer is a wrong "guarded".
    """
    write(
        tmp_path,
        """\
        import probe
        code = "\\n\\n\\n\\nprobe.detect()"
        exec(compile(code, __file__, "exec"))
        if __name__ == "__main__":
            pass
        """,
    )
    (result,) = detections(tmp_path, ["main.py"])
    assert result["status"] in ("unguarded", "unknown"), result


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b"def broken(:\n" * 3, "SyntaxError"),
        (b"\xff\xfe\x00 not utf-8 \x80\x81" * 20, "SyntaxError"),  # tokenize: bad encoding
        (b"# -*- coding: no-such-codec -*-\nx = 1\n" * 4, "SyntaxError"),
    ],
    ids=["syntax", "undecodable", "unknown-codec"],
)
def test_main_rewritten_unreadable_after_start(tmp_path: Path, content: bytes, detail: str) -> None:
    """The file on disk stops being Python while its first version runs: "unknown", saying why."""
    write(
        tmp_path,
        f"""\
        import probe
        if __name__ == "__main__":
            probe.detect()
            with open(__file__, "wb") as f:
                f.write({content!r})
            probe.detect()
        """,
    )
    first, second = detections(tmp_path, ["main.py"])
    assert first["status"] == "guarded"
    assert second["status"] == "unknown", second
    assert detail in second["detail"]


def test_main_deleted_after_a_cached_detection(tmp_path: Path) -> None:
    """The parse cache must not answer for a file that is gone."""
    write(
        tmp_path,
        """\
        import os, probe
        if __name__ == "__main__":
            probe.detect()
            os.remove(__file__)
            probe.detect()
        """,
    )
    first, second = detections(tmp_path, ["main.py"])
    assert first["status"] == "guarded"
    assert second["status"] == "not-reimportable", second


def test_main_replaced_by_a_directory(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        import os, probe
        if __name__ == "__main__":
            os.remove(__file__)
            os.mkdir(__file__)
            probe.detect()
        """,
    )
    (result,) = detections(tmp_path, ["main.py"])
    assert result["status"] == "unknown"
    assert "main.py" in result["detail"]


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_run_as_module_imported_from_a_zip(tmp_path: Path, guarded: bool) -> None:
    """``python -m app`` with ``app`` found by zipimport on PYTHONPATH (not a zip application).

    The zip loader gives the source of ``app`` (the spec's name, which the child re-runs).
    """
    body = "import probe\n"
    body += "if __name__ == '__main__':\n    probe.detect()\n" if guarded else "probe.detect()\n"
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as archive:
        archive.writestr("app.py", body)
    (tmp_path / "probe.py").write_text(PROBE)
    done = subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path / 'lib.zip'}{os.pathsep}{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith(PREFIX)]
    result = json.loads(line[len(PREFIX) :])
    assert result["status"] == ("guarded" if guarded else "unguarded"), result
    assert result["file"].endswith(os.path.join("lib.zip", "app.py"))
    assert result["line"] == (3 if guarded else 2)


def test_frozen_style_main_without_a_file_or_source(tmp_path: Path) -> None:
    """As a frozen application runs it: ``sys.frozen``, a ``__file__`` with nothing on disk, and
    the main code compiled under that name, with no loader able to give its source."""
    frozen = tmp_path / "bundle" / "app.py"  # never created
    source = "import probe\nif __name__ == '__main__':\n    probe.detect()\n"
    runner = f"""\
    import sys, __main__
    sys.frozen = True
    __main__.__file__ = {str(frozen)!r}
    exec(compile({source!r}, {str(frozen)!r}, "exec"), __main__.__dict__)
    """
    (result,) = detections(tmp_path, ["-c", textwrap.dedent(runner)])
    assert result["status"] == "not-reimportable", result  # a spawned child could not run it
    assert "does not exist" in result["detail"]


def test_script_run_by_exec_from_python_c(tmp_path: Path) -> None:
    """``python -c "exec(open('train.py').read())"``: a spawned child re-runs nothing."""
    write(tmp_path, "import probe\nprobe.detect()\n", "train.py")
    (result,) = detections(tmp_path, ["-c", "exec(open('train.py').read())"])
    assert result["status"] == "no-main-file"
    assert result["detail"] == "python -c"


# -- the parse: whatever shortcut it takes, the answer of a full parse --------------------------
# Pieces of programs that make a lexical scan of the source go wrong if anything does: a def or
# a guard inside strings and comments, continuations, brackets at column 0, decorators, clauses.
PIECES = [
    'if __name__ == "__main__":\n    launch()\n',
    "if __name__ == '__main__': launch()\n",
    "def f():\n    return 1\n",
    "def g(x=(\n1)):\n    s = '''\ndef h():\nif __name__ == \"__main__\":\n'''\n",
    "class C:\n    s = 'a\\\nb'  # it's\n    def m(self):\n        pass\n",
    "@decorator\n@other(\n1)\ndef d():\n    pass\n",
    "async def a():\n    await x\n",
    'x = f"{1}" \\\n    + "y"\n',
    "t = (\ndef_ := 1,\n)\n",
    's = """\ndef fake():\n    pass\n"""\n',
    "# def commented():\n",
    "if True:\n    def nested():\n        pass\nelse:\n    pass\n",
    "try:\n    pass\nexcept Exception:\n    pass\nfinally:\n    launch()\n",
    "define = 1\nclass_ = 2\n",
    "b = rb'\\\\' + b'\\''\n",
    "u = '''it''s'''  # '''\n",
    "with x:\n  if __name__ == '__main__':\n    launch()\n",
    "for i in []:\n    pass\nelse:\n    launch()\n",
    "match x:\n    case 1:\n        launch()\n",
    "x = [\n]\n",
    "\n",
    "    \n",
    "lambda: (yield)\n",
]
TRICKY = st.text(alphabet="\\'\"#()[]{}@:=\n\t\r\x0b\x0c ;adefiscl_", max_size=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | TRICKY, max_size=10))
def test_parse_shortcuts_agree_with_a_full_parse(pieces: list[str]) -> None:
    """``_analyse`` may skip what a guard cannot be in; its answer must be a full parse's."""
    source = "".join(pieces)
    warnings.simplefilter("ignore", SyntaxWarning)  # random text: invalid escapes and such
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        with contextlib.suppress(SyntaxError, ValueError, RecursionError):
            mainguard._analyse(source)  # anything but a crash; a child would fail to import
        return
    expected = (tuple(mainguard._guard_bodies(tree.body)), source.count("\n") + 1)
    assert mainguard._analyse(source) == expected
