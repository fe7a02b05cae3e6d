"""Small checks every layer shares: close-match hints, environment variable names, booleans,
numbers written as text.

One place for each, so that "did you mean", what counts as a variable name, which strings
mean true and what a number written as text may look like read the same in a spec error, a
config error and a plugin error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "ASCII_NUMBER_RULE",
    "closest",
    "did_you_mean",
    "env_value_problem",
    "is_env_name",
    "parse_truthy",
    "text_float",
    "text_int",
    "unknown_name_message",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Python's int() and float() also take "2_0" (20) and the digits of every script (a full-width
# two is 2): a number written as text here is ASCII digits, an optional sign, and for a float a
# decimal point and an exponent, as every other tool that reads the same variable reads it.
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
ASCII_NUMBER_RULE = "written with the ASCII digits 0-9 (no '_', no other script's digits)"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def closest(value: str, allowed: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The allowed value ``value`` most likely meant: the same name in another case first
    (``CPU`` is ``cpu``), else the closest by spelling, compared without case; or None."""
    names = list(allowed)
    by_case = {name.lower(): name for name in names}
    if value.lower() in by_case:
        return by_case[value.lower()]
    close = difflib.get_close_matches(value.lower(), list(by_case), n=1, cutoff=cutoff)
    return by_case[close[0]] if close else None


def did_you_mean(value: str, allowed: Iterable[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'cuda'?"`` for the closest allowed value, or ``""``."""
    close = closest(value, allowed, cutoff)
    return f"; did you mean {close!r}?" if close is not None else ""


def unknown_name_message(
    kind: str,
    name: str,
    known: Iterable[str],
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """``unknown backend 'cdua'; did you mean 'cuda'? (known: cpu, cuda)`` style text.

    ``aliases`` maps other words for a kind of name (``gpu``, any case) to the names it may
    mean (``cuda``, ``xpu``): a word that is no name but an alias suggests every one of them.
    """
    names = sorted(known)
    meant = [] if name.lower() in (n.lower() for n in names) else (aliases or {}).get(name.lower())
    hint = (
        f"; did you mean {' or '.join(repr(m) for m in meant)}?"
        if meant
        else did_you_mean(name, names)
    )
    return f"unknown {kind} {name!r}{hint} (known: {', '.join(names) or 'none'})"


def is_env_name(name: object) -> bool:
    """Whether ``name`` can be an environment variable name (letters, digits, ``_``)."""
    return isinstance(name, str) and _ENV_NAME.match(name) is not None


def text_int(text: str) -> int | None:
    """The integer ``text`` spells in ASCII digits (an optional sign, blanks around), or None."""
    stripped = text.strip()
    if not _INT_TEXT.fullmatch(stripped):
        return None
    try:
        return int(stripped)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits())
        return None


def text_float(text: str) -> float | None:
    """The decimal number ``text`` spells in ASCII (``1.5``, ``.5``, ``2e-3``), or None; no
    ``inf`` or ``nan``, which no setting takes."""
    stripped = text.strip()
    return float(stripped) if _FLOAT_TEXT.fullmatch(stripped) else None


def env_value_problem(value: object) -> str | None:
    """Why ``value`` cannot be an environment variable's value, or None: text, without the
    NUL character, which ends a value in the C environment (``execve`` refuses it)."""
    if not isinstance(value, str):
        return f"{value!r} must be a string (environment values are text)"
    if "\0" in value:
        return f"{value!r} holds a NUL character (\\0), which no environment value can hold"
    return None


def parse_truthy(raw: object) -> bool | None:
    """``True`` for 1/true/yes/on, ``False`` for 0/false/no/off (any case), else ``None``."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    return None
