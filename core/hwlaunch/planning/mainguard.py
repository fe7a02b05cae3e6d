"""What a spawn or forkserver child will do with this process's ``__main__``, decided before any
process starts.

Why: spawn and forkserver re-run the main module in every child (as ``__mp_main__``). When that
re-run reaches a launch, the child launches again: Python dies with the cryptic "bootstrapping
phase" RuntimeError, or, when the launch is hwlaunch's, a second copy of the job starts.

What the child re-runs is CPython's decision, not ours: ``multiprocessing.spawn``'s
``get_preparation_data`` (in the parent) sends the main module's ``__spec__.name``, else its
``__file__``; ``_fixup_main_from_name`` skips a name that is ``__main__`` or ends in
``.__main__`` (``python -m pkg``, a directory, a zip app), and ``_fixup_main_from_path`` skips a
file named ``ipython``. :func:`reimport_target` follows those rules for the running interpreter;
the source of what is re-run, and the line of it that is running now, decide the rest.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import multiprocessing
import os
import re
import sys
import threading
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import process, spawn
from types import FrameType, ModuleType
from typing import Literal

from hwlaunch.planning._bytecode_guard import offset_is_guarded
from hwlaunch.runtime_facts import MainGuard

_Spans = tuple[tuple[int, int], ...]
# The file name CPython gives code read from stdin (``python - < job.py``).
STDIN = "<stdin>"
_STDIN_DETAIL = (
    "code read from stdin: workers re-run nothing of it (hwlaunch sends __main__'s callables "
    "and classes by value)"
)


_launched_unguarded: list[MainGuard] = []


def note_launch(guard: MainGuard) -> None:
    """Remember a launch made at module level, outside a guard (by ``launch()``).

    Why: a later, guarded launch's spawn/forkserver children re-run the whole main module, this
    earlier launch included.
    """
    if guard.status == "unguarded" and guard.file and guard.line:
        _launched_unguarded.append(guard)


def detect_main_guard() -> MainGuard:
    """Inspect the main thread's stack, ``sys.modules["__main__"]`` and its source; never raises.

    The running line that matters is that of the outermost module-level frame executing the
    main module's own namespace and file: the child re-runs that module from the top, so it
    reaches the launch exactly when that line is outside a guard. Code compiled from a string
    (``exec``) is not re-run by the child, the line of the main file that called it is; a
    frame of another file under the main namespace could give a wrong "guarded", which is the
    one answer that must never be wrong.
    """
    try:
        return _detect()
    except Exception as exc:  # a diagnostic must never break a launch
        return MainGuard("unknown", detail=f"detection failed: {type(exc).__name__}: {exc}")


def line_is_guarded(source: str, lineno: int) -> bool | None:
    """Whether line ``lineno`` of ``source`` lies in a branch that runs only as ``__main__``.

    ``None`` when the source cannot be parsed (the bodies of top-level functions and classes are
    skipped, so a syntax error inside one may go unnoticed). See :func:`_main_branch` for the
    tests that count; anything else is not trusted (conservative).
    """
    try:
        spans, _ = _analyse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return any(start <= lineno <= end for start, end in spans)


@dataclass(frozen=True)
class ReimportTarget:
    """What ``multiprocessing.spawn.prepare`` does in a child: run a module by name, a file by
    path, or nothing (``kind`` None, with ``why``)."""

    kind: Literal["name", "path"] | None
    value: str = ""
    why: str = ""


def reimport_target(main: ModuleType | None) -> ReimportTarget:
    """The parent's ``get_preparation_data`` and the child's ``_fixup_main_from_*`` skips."""
    if main is None:
        return ReimportTarget(None, why="there is no __main__ module")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return ReimportTarget(
                None, why=f"__main__ is {name}, which multiprocessing never re-runs"
            )
        return ReimportTarget("name", name)
    if sys.platform == "win32" and (getattr(spawn, "WINEXE", False) or spawn.WINSERVICE):
        return ReimportTarget(None, why="a frozen Windows executable")
    path = getattr(main, "__file__", None)
    if path is None:
        return ReimportTarget(None, why=_no_file_reason())
    path = os.path.normpath(_absolute(path))
    if os.path.splitext(os.path.basename(path))[0] == "ipython":
        return ReimportTarget(None, why=f"{path} is named ipython, which multiprocessing skips")
    return ReimportTarget("path", path)


def _detect() -> MainGuard:
    frames = _module_frames(_main_thread_frame())
    inside = _reimporting(frames)
    if inside is not None:
        return inside
    main = sys.modules.get("__main__")
    target = reimport_target(main)
    if target.kind is None or main is None:
        return MainGuard("no-main-file", detail=target.why)
    if target.kind == "path" and not os.path.exists(target.value):
        if os.path.basename(target.value) == STDIN:
            return MainGuard("no-main-file", target.value, detail=_STDIN_DETAIL)
        return MainGuard(
            "not-reimportable",
            target.value,
            detail=f"{target.value} does not exist: a spawned child would run it",
        )
    file = getattr(main, "__file__", None)
    try:
        source_file, source = _main_source(main, target, frames)
    except _SourceGone as gone:
        return _after_earlier_launches(_check_bytecode(gone.pyc, gone.frame, gone.why))
    except (OSError, SyntaxError, ValueError, ImportError) as exc:
        return MainGuard("unknown", file, detail=f"{type(exc).__name__}: {exc}")
    frame = _running_frame(frames, main, source_file)
    if frame is None:
        running = frames[0].f_code.co_filename if frames else "nothing at module level"
        return MainGuard(
            "unknown",
            source_file,
            detail=f"the top level of {os.path.basename(source_file)} is not running ({running})",
        )
    return _after_earlier_launches(_check(source_file, frame.f_lineno, source))


def _after_earlier_launches(guard: MainGuard) -> MainGuard:
    """A guarded line, unless an earlier launch of this process ran outside a guard of the
    same file: the child re-runs that one too."""
    if guard.status != "guarded":
        return guard
    for earlier in _launched_unguarded:
        if _same_path(earlier.file or "", guard.file or ""):
            return MainGuard(
                "unguarded",
                earlier.file,
                earlier.line,
                f"an earlier launch of this process at {earlier.where(short=True)} runs at "
                "module level",
            )
    return guard


def _reimporting(frames: list[FrameType]) -> MainGuard | None:
    """This process is a spawn/forkserver child still re-running the program's ``__main__``."""
    mp_main = [f for f in frames if f.f_globals.get("__name__") == "__mp_main__"]
    inheriting = getattr(multiprocessing.current_process(), "_inheriting", False)
    if not (mp_main or inheriting):
        return None
    frame = mp_main[-1] if mp_main else (frames[-1] if frames else None)
    file, line = (frame.f_code.co_filename, frame.f_lineno) if frame else (None, None)
    return MainGuard(
        "reimporting",
        file,
        line,
        "multiprocessing is re-running __main__ as __mp_main__ in a child it is starting",
    )


def _main_thread_frame() -> FrameType | None:
    """The main thread's current frame, so that a call from a worker thread still works."""
    if threading.current_thread() is threading.main_thread():
        return sys._getframe()
    ident = threading.main_thread().ident
    return None if ident is None else sys._current_frames().get(ident)


def _module_frames(frame: FrameType | None) -> list[FrameType]:
    """Module-level frames on the stack, innermost first."""
    found = []
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            found.append(frame)
        frame = frame.f_back
    return found


def _running_frame(frames: list[FrameType], main: ModuleType, file: str) -> FrameType | None:
    """The outermost module-level frame running the main module's namespace and its file.

    Outermost: ``exec(compile(src, __file__, "exec"))`` nests a frame with the same namespace
    and file name but the string's line numbers; the file's own frame is the one outside it.
    """
    namespace = vars(main)
    for frame in reversed(frames):
        if frame.f_globals is namespace and _same_path(frame.f_code.co_filename, file):
            return frame
    return None


def _absolute(path: str) -> str:
    """As multiprocessing makes a relative main path absolute: against the start directory."""
    original: str | None = getattr(process, "ORIGINAL_DIR", None)
    if not os.path.isabs(path) and original is not None:
        path = os.path.join(original, path)
    return path


def _same_path(a: str, b: str) -> bool:
    def norm(path: str) -> str:
        return os.path.normcase(os.path.normpath(_absolute(path)))

    return norm(a) == norm(b)


def _no_file_reason() -> str:
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return "interactive interpreter"
    if sys.argv[:1] == ["-c"]:
        return "python -c"
    return "__main__ has no file"


def _main_source(
    main: ModuleType, target: ReimportTarget, frames: list[FrameType]
) -> tuple[str, str | None]:
    """(file name the main's code carries, its source; None when read from the file itself).

    Raises when the re-run cannot be analysed, with what could not be read.
    """
    file = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if file is None and spec is not None:
        file = spec.origin
    if not isinstance(file, str):
        raise ValueError(f"{target.value} has no file name to read its source from")
    if file.endswith((".pyc", ".pyo")):
        return _pyc_source(file, frames), None
    if os.path.isfile(file):
        return file, None
    # A member of a zip archive: the module's loader has the source, as for tracebacks.
    loader = getattr(spec, "loader", None) or getattr(main, "__loader__", None)
    get_source = getattr(loader, "get_source", None)
    name = spec.name if spec is not None else target.value
    source = get_source(name) if get_source is not None else None
    if source is None:
        raise OSError(f"no source available for {file}")
    return file, source


def _pyc_source(pyc: str, frames: list[FrameType]) -> str:
    """The source file a ``.pyc`` main was compiled from, if it is still what was compiled.

    The code's file name says where the source was; the ``.pyc`` header's source mtime and size
    (or hash) say whether that file still holds what was compiled.
    """
    frame = next(
        (f for f in reversed(frames) if _same_path(f.f_globals.get("__file__") or "", pyc)),
        None,
    )
    if frame is None:
        raise OSError(f"{pyc} is running no module-level code to find its source from")
    compiled_from = frame.f_code.co_filename
    source = _absolute(compiled_from)
    with open(pyc, "rb") as f:
        header = f.read(16)
    try:
        with open(source, "rb") as f:
            data = f.read()
        stat = os.stat(source)
    except OSError:
        raise _SourceGone(pyc, frame, f"its source {compiled_from} is gone") from None
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:
        same = importlib.util.source_hash(data) == header[8:16]
    else:
        mtime, size = (
            int.from_bytes(header[8:12], "little"),
            int.from_bytes(header[12:16], "little"),
        )
        same = (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF) == (mtime, size)
    if not same:
        raise _SourceGone(pyc, frame, f"{compiled_from} changed since it was compiled")
    return compiled_from


class _SourceGone(Exception):
    """A ``.pyc`` main without the source it was compiled from: its bytecode decides."""

    def __init__(self, pyc: str, frame: FrameType, why: str) -> None:
        super().__init__(why)
        self.pyc, self.frame, self.why = pyc, frame, why


def _check_bytecode(pyc: str, frame: FrameType, why: str) -> MainGuard:
    """The guard of the running instruction, read from the module's code object (``dis``).

    The frame is the module-level frame running ``pyc``: its code is what a child re-runs.
    """
    detail = f"read from the bytecode of {os.path.basename(pyc)} ({why})"
    if frame.f_lasti < 0:
        return MainGuard("unknown", pyc, frame.f_lineno, f"no running instruction: {detail}")
    guarded = offset_is_guarded(frame.f_code, frame.f_lasti)
    return MainGuard("guarded" if guarded else "unguarded", pyc, frame.f_lineno, detail)


def _check(filename: str, lineno: int | None, source: str | None) -> MainGuard:
    name = os.path.basename(filename)
    if lineno is None:
        return MainGuard("unknown", filename, None, "the running line of __main__ is unknown")
    try:
        if source is None:
            stat = os.stat(filename)
            spans, nlines = _analyse_file(filename, stat.st_mtime_ns, stat.st_size)
        else:
            spans, nlines = _analyse(source)
    except (OSError, SyntaxError, ValueError, RecursionError) as exc:
        detail = f"cannot read or parse {name}: {type(exc).__name__}: {exc}"
        return MainGuard("unknown", filename, lineno, detail)
    if lineno > nlines:
        return MainGuard("unknown", filename, lineno, f"{name} changed on disk since it started")
    guarded = any(start <= lineno <= end for start, end in spans)
    return MainGuard("guarded" if guarded else "unguarded", filename, lineno)


@functools.lru_cache(maxsize=32)
def _analyse_file(filename: str, mtime_ns: int, size: int) -> tuple[_Spans, int]:
    """Keyed on (file, mtime, size): repeated detection costs one stat, not a parse."""
    with tokenize.open(filename) as f:  # honours a PEP 263 coding declaration
        return _analyse(f.read())


def _analyse(source: str) -> tuple[_Spans, int]:
    """Line spans of main-guard bodies, and the number of lines (to notice an edited file).

    Parsing a whole 5,000-line script costs tens of milliseconds, nearly all of it in the
    bodies of top-level functions and classes, where a module-level guard cannot be. So the
    source is parsed with those statements blanked out (line numbers unchanged) when a lexical
    scan can find them exactly; on any doubt, or a parse error, the whole source is parsed.
    """
    nlines = source.count("\n") + 1
    outline = _module_outline(source)
    if outline is not None:
        try:
            return tuple(_guard_bodies(ast.parse(outline).body)), nlines
        except (SyntaxError, ValueError, RecursionError):
            pass  # the whole source decides: the same answer, or the genuine error
    return tuple(_guard_bodies(ast.parse(source).body)), nlines


# Comments, and complete string literals from their opening quote (a prefix never changes where
# a literal ends); then a lone quote, which opens no literal the scan models, so it gives up.
_LITERALS = re.compile(
    r"""
      \#[^\r\n]*
    | '''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''
    | \"\"\"[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*\"\"\"
    | '[^'\\\r\n]*(?:\\(?:\r\n|[\s\S])[^'\\\r\n]*)*'
    | "[^"\\\r\n]*(?:\\(?:\r\n|[\s\S])[^"\\\r\n]*)*"
    | ' | "
    """,
    re.VERBOSE,
)
_LINE_START = re.compile(r"^[^ \t\r\n]", re.MULTILINE)
_CLAUSE = re.compile(r"(?:elif|else|except|finally)\b")
_DEF_OR_CLASS = re.compile(r"(?:def|class)\b|async[ \t]+def\b|@")
# From Python 3.12 an f-string may nest quotes of its own kind (f"{d["k"]}"): the scan then
# ends the literal early, which shows as an unbalanced replacement field.
_NESTED_FSTRINGS = sys.version_info >= (3, 12)


def _module_outline(source: str) -> str | None:
    """``source`` with every top-level ``def``/``class`` (decorators included) blanked, or None.

    A top-level statement starts on a line whose first character is code (not a space, a
    comment or the inside of a string literal), outside brackets and not after a backslash
    continuation; ``elif``/``else``/``except``/``finally`` there continue the statement before.
    Blanking whole top-level functions and classes leaves every other line, and its number, as
    it was, so the guards found are those of the whole source. None when the scan meets what it
    does not model exactly (a form feed, a lone carriage return, a NUL, an unterminated literal,
    from 3.12 an f-string that nests quotes): the caller then parses everything.
    """
    if "\f" in source or "\0" in source or "\r" in source.replace("\r\n", ""):
        return None
    pieces: list[str] = []
    end = 0
    for match in _LITERALS.finditer(source):
        text = match.group()
        if text in ("'", '"'):
            return None
        pieces.append(source[end : match.start()])
        end = match.end()
        if text[0] == "#":
            continue  # a comment disappears
        if _NESTED_FSTRINGS and not _literal_ends_here(source, match.start(), text):
            return None
        # A literal becomes a space; one spanning lines keeps its line breaks, and the space
        # keeps the code after its end from looking like the start of a line.
        pieces.append("\n" * text.count("\n") + " ")
    pieces.append(source[end:])
    code = "".join(pieces)
    lines = source.split("\n")
    if code.count("\n") != len(lines) - 1:
        return None
    starts: list[int] = []
    depth = number = last = 0
    for match in _LINE_START.finditer(code):
        at = match.start()
        depth += _bracket_balance(code, last, at)
        number += code.count("\n", last, at)
        last = at
        if depth < 0:
            return None
        if depth or code[max(at - 3, 0) : at].rstrip("\r\n").endswith("\\"):
            continue  # inside brackets, or after a backslash continuation
        if code[at] in ")]}":
            return None
        if not _CLAUSE.match(code, at):
            starts.append(number)
    if depth + _bracket_balance(code, last, len(code)) != 0:
        return None
    starts.append(len(lines))
    for first, after in itertools.pairwise(starts):
        if _DEF_OR_CLASS.match(lines[first]):
            lines[first:after] = [""] * (after - first)
    return "\n".join(lines)


def _bracket_balance(code: str, start: int, end: int) -> int:
    """Brackets opened minus brackets closed in ``code[start:end]``."""
    opened = code.count("(", start, end) + code.count("[", start, end) + code.count("{", start, end)
    closed = code.count(")", start, end) + code.count("]", start, end) + code.count("}", start, end)
    return opened - closed


def _literal_ends_here(source: str, start: int, text: str) -> bool:
    """Whether Python 3.12+ ends this literal where the scan did (not an f-string nesting)."""
    if "f" not in source[max(start - 2, 0) : start].lower():
        return True
    return text.count("{") == text.count("}")


def _guard_bodies(nodes: Iterable[ast.AST]) -> Iterator[tuple[int, int]]:
    """Spans of branches that run only as ``__main__``, reachable without entering a def or
    class (i.e. at module level)."""
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.If):
            branch = _main_branch(node.test)
            for field in ("body", "orelse"):
                body: list[ast.stmt] = getattr(node, field)
                if body and branch == field:
                    yield _span(body)
                else:
                    yield from _guard_bodies(body)
            continue
        if isinstance(node, ast.Match) and _operand(node.subject) == "name":
            for case in node.cases:
                if _case_is_main(case.pattern):
                    yield _span(case.body)
                else:
                    yield from _guard_bodies(case.body)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _guard_bodies(getattr(node, field, ()))


def _span(body: list[ast.stmt]) -> tuple[int, int]:
    return body[0].lineno, body[-1].end_lineno or body[-1].lineno


_Branch = Literal["body", "orelse"] | None


def _main_branch(test: ast.expr) -> _Branch:
    """Which branch of ``if test:`` runs only when ``__name__ == "__main__"`` (never in a child,
    where it is ``"__mp_main__"``).

    ``__name__ == "__main__"`` (either order), ``__name__ in ("__main__",)`` (a tuple, list or
    set of strings without ``"__mp_main__"``) and their negations (``!=``, ``not in``, ``not``:
    the ``else`` branch); ``A and B`` is guarded when one side is, ``A or B`` only when both are.
    """
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _flip(_main_branch(test.operand))
    if isinstance(test, ast.BoolOp):
        branches = [_main_branch(value) for value in test.values]
        is_and = isinstance(test.op, ast.And)
        # not (A and B) == (not A) or (not B): the else branch follows the dual rule.
        if (any if is_and else all)(b == "body" for b in branches):
            return "body"
        if (all if is_and else any)(b == "orelse" for b in branches):
            return "orelse"
        return None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, (ast.Eq, ast.NotEq)) and {_operand(left), _operand(right)} == {
        "name",
        "main",
    }:
        return "body" if isinstance(op, ast.Eq) else "orelse"
    if isinstance(op, (ast.In, ast.NotIn)) and _operand(left) == "name" and _main_set(right):
        return "body" if isinstance(op, ast.In) else "orelse"
    return None


def _flip(branch: _Branch) -> _Branch:
    return {"body": "orelse", "orelse": "body", None: None}[branch]


def _main_set(node: ast.expr) -> bool:
    """A literal tuple/list/set of strings holding ``"__main__"`` and not ``"__mp_main__"``."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return False
    values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    if not all(isinstance(v, str) for v in values):
        return False
    return "__main__" in values and "__mp_main__" not in values


def _case_is_main(pattern: ast.pattern) -> bool:
    """``case "__main__":`` (a guard clause after it only narrows it further)."""
    return (
        isinstance(pattern, ast.MatchValue)
        and isinstance(pattern.value, ast.Constant)
        and pattern.value.value == "__main__"
    )


def _operand(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name) and node.id == "__name__":
        return "name"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "__main__":
        return "main"
    return None
