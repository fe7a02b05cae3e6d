"""Small checks every layer shares: close-match hints, environment variable names, booleans.

One place for each, so that "did you mean", what counts as a variable name and which strings
mean true read the same in a spec error, a config error and a plugin error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = ["did_you_mean", "is_env_name", "parse_truthy", "unknown_name_message"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def did_you_mean(value: str, allowed: Iterable[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'cuda'?"`` for the closest allowed value, or ``""``."""
    close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_name_message(kind: str, name: str, known: Iterable[str]) -> str:
    """``unknown backend 'cdua'; did you mean 'cuda'? (known: cpu, cuda)`` style text."""
    names = sorted(known)
    return (
        f"unknown {kind} {name!r}{did_you_mean(name, names)} (known: {', '.join(names) or 'none'})"
    )


def is_env_name(name: object) -> bool:
    """Whether ``name`` can be an environment variable name (letters, digits, ``_``)."""
    return isinstance(name, str) and _ENV_NAME.match(name) is not None


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
