"""Find out whether the running line of ``__main__`` is protected by ``if __name__ == "__main__":``.

Why: the spawn and forkserver start methods re-run the main file in every child (as
``__mp_main__``). When the launch sits at module level the child launches again, and Python dies
with the cryptic "bootstrapping phase" RuntimeError. Knowing this *before* starting processes lets
the planner choose fork, or stop with the exact line to move under a guard.
"""

from __future__ import annotations

import ast
import functools
import itertools
import linecache
import os
import re
import sys
import threading
import tokenize
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, TypeGuard

from hwlaunch.plan import MainGuard

_Spans = tuple[tuple[int, int], ...]


def detect_main_guard() -> MainGuard:
    """Inspect the main thread's stack and the main file's source; never raises.

    Of the module-level frames of ``__main__``, the *innermost* one that runs the code of its own
    ``__file__`` decides. Why innermost: under ``runpy.run_path(script, run_name="__main__")``
    ``sys.modules["__main__"]`` is the inner script while it runs, and that is the file a spawned
    child re-runs. Why "its own file": code compiled from a string (``exec``) is not re-run by the
    child, the line of the main file that called it is; trusting the string's (or a borrowed)
    file name could give a wrong "guarded", which is the one answer that must never be wrong.
    """
    try:
        return _detect()
    except Exception as exc:  # a diagnostic must never break a launch
        return MainGuard("unknown", detail=f"detection failed: {type(exc).__name__}: {exc}")


def line_is_guarded(source: str, lineno: int) -> bool | None:
    """Whether line ``lineno`` of ``source`` lies in the body of a module-level main guard.

    ``None`` when the source cannot be parsed (the bodies of top-level functions and classes are
    skipped, so a syntax error inside one may go unnoticed). Only a plain ``__name__ ==
    "__main__"`` test (either order) counts; ``elif``/``else`` branches and compound tests are not
    trusted (conservative).
    """
    try:
        spans, _ = _analyse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return any(start <= lineno <= end for start, end in spans)


def _detect() -> MainGuard:
    frames = _main_module_frames(_main_thread_frame())
    for index, frame in enumerate(frames):
        own_file = frame.f_globals.get("__file__")
        if _is_file(own_file) and _same_path(own_file, frame.f_code.co_filename):
            # exec(compile(src, __file__, "exec")) nests a <module> frame under the same file
            # name, with line numbers of the string: the outermost frame of such a run is the
            # file's own line.
            while (
                index + 1 < len(frames)
                and frames[index + 1].f_code.co_filename == frame.f_code.co_filename
            ):
                index += 1
                frame = frames[index]
            return _check(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not _is_file(main_file):
        return MainGuard("no-main-file", detail=_no_file_reason(frames))
    running = frames[0].f_code.co_filename if frames else "nothing at module level"
    return MainGuard(
        "unknown",
        file=main_file,
        detail=f"__main__ is not running its file {os.path.basename(main_file)} ({running})",
    )


def _main_thread_frame() -> FrameType | None:
    """The main thread's current frame, so that a call from a worker thread still works."""
    if threading.current_thread() is threading.main_thread():
        return sys._getframe()
    ident = threading.main_thread().ident
    return None if ident is None else sys._current_frames().get(ident)


def _main_module_frames(frame: FrameType | None) -> list[FrameType]:
    """Module-level frames of ``__main__`` on the stack, innermost first."""
    found = []
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            found.append(frame)
        frame = frame.f_back
    return found


def _is_file(name: object) -> TypeGuard[str]:
    """A file name, not a pseudo one such as ``<stdin>`` (``python -`` sets that as ``__file__``).

    Python also deletes ``__main__.__file__`` once the main script has finished: a spawned child
    then re-runs nothing, which is why that case reads as "no-main-file" too.
    """
    return isinstance(name, str) and not (name.startswith("<") and name.endswith(">"))


def _same_path(a: str, b: str) -> bool:
    return os.path.normcase(os.path.normpath(a)) == os.path.normcase(os.path.normpath(b))


def _no_file_reason(frames: list[FrameType]) -> str:
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return "interactive interpreter"
    running = frames[0].f_code.co_filename if frames else ""
    return {"<string>": "python -c", "<stdin>": "code read from stdin"}.get(
        running, "__main__ has no file"
    )


def _check(filename: str, lineno: int | None, module_globals: dict[str, Any]) -> MainGuard:
    name = os.path.basename(filename)
    if lineno is None:
        return MainGuard("unknown", filename, None, "the running line of __main__ is unknown")
    try:
        spans, nlines = _analyse_main_file(filename, module_globals)
    except (OSError, SyntaxError, ValueError) as exc:
        detail = f"cannot read or parse {name}: {type(exc).__name__}: {exc}"
        return MainGuard("unknown", filename, lineno, detail)
    if lineno > nlines:
        return MainGuard("unknown", filename, lineno, f"{name} changed on disk since it started")
    guarded = any(start <= lineno <= end for start, end in spans)
    return MainGuard("guarded" if guarded else "unguarded", filename, lineno)


def _analyse_main_file(filename: str, module_globals: dict[str, Any]) -> tuple[_Spans, int]:
    try:
        stat = os.stat(filename)
    except OSError:
        # Not a plain file (a member of a zip archive) or gone: ask the module's loader, as
        # tracebacks do. checkcache first so that a deleted file's stale lines are not trusted.
        linecache.checkcache(filename)
        source = "".join(linecache.getlines(filename, module_globals))
        if not source:
            raise OSError(f"no source available for {filename}") from None
        return _analyse(source)
    return _analyse_file(filename, stat.st_mtime_ns, stat.st_size)


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
    """Spans of guard bodies reachable without entering a def or class, i.e. at module level."""
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.If) and _is_main_test(node.test):
            last = node.body[-1]
            yield node.body[0].lineno, last.end_lineno or last.lineno
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _guard_bodies(getattr(node, field, ()))


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` in either order; anything fancier is not trusted."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = {_operand(test.left), _operand(test.comparators[0])}
    return isinstance(test.ops[0], ast.Eq) and sides == {"name", "main"}


def _operand(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name) and node.id == "__name__":
        return "name"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "__main__":
        return "main"
    return None
