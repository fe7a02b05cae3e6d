"""Config files: ``hwlaunch.toml``, or ``[tool.hwlaunch]`` in a pyproject.toml.

Each value keeps the line it was written on (``hwlaunch.toml:3``), so that a plan's sources
and an error for a bad value can point at it. The keys are the settings table's.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwlaunch._checks import did_you_mean, env_value_problem, is_env_name
from hwlaunch.errors import ConfigError
from hwlaunch.planning.settings import (
    BACKEND_TABLE_KEYS,
    ENV_CONFIG,
    TOP_LEVEL_KEYS,
    ConfigFile,
    Overrides,
    Sourced,
    parse_setting,
    read_environment,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def _parse_env_table(raw: object, source: str) -> dict[str, str]:
    example = 'e.g. env = { OMP_NUM_THREADS = "4" }'
    if not isinstance(raw, dict):
        raise ConfigError(
            f"invalid env at {source}: must be a table mapping environment variable names to "
            f"strings, {example}"
        )
    for key, value in raw.items():
        if not is_env_name(key):
            raise ConfigError(
                f"invalid env table at {source}: {key!r} is not an environment variable name"
            )
        problem = env_value_problem(value)
        if problem is not None:
            raise ConfigError(f"invalid env table at {source}: {key} = {problem}, {example}")
    return dict(raw)


_KEY_PART = r"""(?:"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|[A-Za-z0-9_-]+)"""


def _key_part(token: str) -> str:
    """One key as TOML reads it: basic strings decode their escapes, literal strings do not."""
    if token.startswith('"'):
        try:
            return str(tomllib.loads(f"k = {token}")["k"])
        except tomllib.TOMLDecodeError:
            return token.strip('"')
    if token.startswith("'"):
        return token[1:-1]
    return token


def _key_path(text: str) -> tuple[str, ...]:
    return tuple(_key_part(p) for p in re.findall(_KEY_PART, text))


class _LineFinder:
    """Finds the line that defines a dotted key path of a TOML text, for messages.

    TOML parsers drop line numbers, so this scans the text: table headers (``[a.b]``,
    ``[[a.b]]``) and keys (``k =``, dotted ``a.b.k =``) each define a path. A path defined
    nowhere on its own line (a key inside an inline table) gets the line of its nearest
    ancestor that is.
    """

    _HEADER = re.compile(rf"^\s*\[\[?\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]\]?\s*(#.*)?$")
    _KEY = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")

    def __init__(self, text: str, label: str) -> None:
        self.label = label
        self.defined: list[tuple[tuple[str, ...], int]] = []
        current: tuple[str, ...] = ()
        # TOML breaks lines at LF only; str.splitlines() would also break at U+0085/U+2028.
        for number, line in enumerate(text.split("\n"), start=1):
            header = self._HEADER.match(line)
            if header:
                current = _key_path(header.group(1))
                self.defined.append((current, number))
                continue
            key = self._KEY.match(line)
            if key:
                self.defined.append(((*current, *_key_path(key.group(1))), number))

    def source(self, path: tuple[str, ...]) -> str:
        """``label:line`` of the line defining ``path`` (or its nearest ancestor), else label."""
        best: tuple[int, int] | None = None  # (depth, line)
        for defined, number in self.defined:
            if defined == path:
                return f"{self.label}:{number}"
            if (
                defined
                and path[: len(defined)] == defined
                and (best is None or len(defined) > best[0])
            ):
                best = (len(defined), number)
        return f"{self.label}:{best[1]}" if best else self.label


def _table_name(path: tuple[str, ...]) -> str:
    return f"[{'.'.join(path)}]"


def _check_keys(
    table: Mapping[str, Any], allowed: tuple[str, ...], where: tuple[str, ...], finder: _LineFinder
) -> None:
    inside = f" in {_table_name(where)}" if where else ""
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"unknown key {key!r}{inside} at {finder.source((*where, key))}"
                f"{did_you_mean(key, allowed)} (allowed: {', '.join(allowed)})"
            )


_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_AT_END = re.compile(r"\s*\(at end of document\)\s*$")
_OURS = ("tool", "hwlaunch")  # where a pyproject.toml keeps hwlaunch's settings
# An inline table (``tool = { hwlaunch = {...} }``) that _LineFinder does not take apart.
_OURS_INLINE = re.compile(r"\bhwlaunch\s*=\s*\{")


class _NotToml(Exception):
    """A config file that is no TOML document: ``where`` is ``label:line:column``."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: not valid TOML: {why}")
        self.where = where


def _label(path: Path) -> str:
    return path.name if path.parent.resolve() == Path.cwd().resolve() else str(path)


def _read_toml(path: Path) -> tuple[str, Any]:
    """The text and the document of ``path``; ``_NotToml`` naming the line and column where it
    stops being TOML (a TOML error, or a byte that is not UTF-8), ConfigError if unreadable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    label = _label(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(raw[: exc.start].decode("utf-8"))
        why = f"byte 0x{raw[exc.start]:02x} is not UTF-8, the encoding TOML files are written in"
        raise _NotToml(f"{label}:{line}:{column}", why) from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _AT.search(message)
        if found:
            line, column = int(found.group(1)), int(found.group(2))
        else:  # "(at end of document)": the last character
            line, column = _position(text)
        why = _AT_END.sub("", _AT.sub("", message))
        raise _NotToml(f"{label}:{line}:{column}", why) from None


def _position(text: str) -> tuple[int, int]:
    """The line and column (from 1) just after ``text``."""
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _has_our_table(text: str, label: str) -> int | None:
    """The line of ``[tool.hwlaunch]`` (or a key under it) in a pyproject.toml's text, read line
    by line, so it works on a text that is not valid TOML; None where there is none."""
    for path, number in _LineFinder(text, label).defined:
        if path[: len(_OURS)] == _OURS:
            return number
    for number, line in enumerate(text.split("\n"), start=1):
        if _OURS_INLINE.search(line.split("#", 1)[0]):
            return number
    return None


def load_config_file(path: Path, table_prefix: tuple[str, ...] = ()) -> ConfigFile:
    """Parse ``path`` (``hwlaunch.toml``, or ``[tool.hwlaunch]`` of a pyproject.toml)."""
    label = _label(path)
    try:
        text, data = _read_toml(path)
    except _NotToml as exc:
        raise ConfigError(
            f"{exc}; none of the settings in {path} is used until that line is fixed"
        ) from None
    for part in table_prefix:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        raise ConfigError(f"[{'.'.join(table_prefix)}] in {path} must be a table")
    finder = _LineFinder(text, label)
    config = ConfigFile(path=path)
    _check_keys(data, TOP_LEVEL_KEYS, table_prefix, finder)
    for key, raw in data.items():
        source = finder.source((*table_prefix, key))
        if key == "env":
            config.env = Sourced(_parse_env_table(raw, source), source)
        elif key != "backends":
            config.settings[key] = Sourced(parse_setting(key, raw, source), source)
    backends = data.get("backends", {})
    if not isinstance(backends, dict):
        raise ConfigError(
            f"'backends' at {finder.source((*table_prefix, 'backends'))} must be a table of "
            "[backends.<name>] tables"
        )
    for name, table in backends.items():
        where = (*table_prefix, "backends", name)
        if not isinstance(table, dict):
            raise ConfigError(f"{_table_name(where)} at {finder.source(where)} must be a table")
        config.backend_tables[name] = f"{finder.source(where)} {_table_name(where)}"
        _check_keys(table, BACKEND_TABLE_KEYS, where, finder)
        values: dict[str, Sourced[Any]] = {}
        for key, raw in table.items():
            source = f"{finder.source((*where, key))} {_table_name(where)}"
            if key == "env":
                config.backend_env[name] = Sourced(_parse_env_table(raw, source), source)
            else:
                values[key] = Sourced(parse_setting(key, raw, source), source)
        config.backends[name] = values
    return config


def find_config_file(
    explicit: str | os.PathLike[str] | None,
    explicit_source: str,
    environ: Mapping[str, str],
    notes: list[str],
) -> ConfigFile | None:
    """``--config``/``config=`` > ``HWLAUNCH_CONFIG`` > ./hwlaunch.toml > ./pyproject.toml.
    ``notes`` receives a warning for a file that was skipped."""
    named: tuple[object, str] | None = None
    if explicit is not None:
        named = (explicit, explicit_source)
    elif environ.get(ENV_CONFIG):
        named = (environ[ENV_CONFIG], f"env {ENV_CONFIG}")
    if named is not None:
        path = Path(str(named[0])).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} from {named[1]} does not exist or is not a file"
            )
        return load_config_file(path)
    local = Path("hwlaunch.toml")
    if local.is_file():
        return load_config_file(local)
    pyproject = Path("pyproject.toml")
    if pyproject.is_file():
        try:
            _, data = _read_toml(pyproject)
        except _NotToml as exc:
            _broken_pyproject(pyproject, exc, notes)
            return None
        if isinstance(data.get("tool"), dict) and "hwlaunch" in data["tool"]:
            return load_config_file(pyproject, _OURS)
    return None


def _broken_pyproject(path: Path, exc: _NotToml, notes: list[str]) -> None:
    """A pyproject.toml in the working directory that is not valid TOML: an error when it holds
    a ``[tool.hwlaunch]`` table (its settings would be lost), else a warning in ``notes``: it
    belongs to a project that has no hwlaunch settings, and must not stop every command."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    ours = _has_our_table(text, _label(path))
    if ours is not None:
        raise ConfigError(
            f"{exc}. It holds [tool.hwlaunch] (line {ours}), whose settings would be lost: fix "
            f"that line of {path}, or move the settings into hwlaunch.toml"
        )
    notes.append(
        f"{exc}; it has no [tool.hwlaunch] table, so it holds no hwlaunch settings and is "
        "skipped (any other tool that reads it will fail on that line too)"
    )


def collect_overrides(
    explicit: Mapping[str, object | None],
    explicit_sources: Mapping[str, str],
    config: str | os.PathLike[str] | None,
    config_source: str,
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, Sourced[Any]] | None = None,
) -> Overrides:
    """Validate every layer; ``explicit_sources`` names each argument (``--world-size``)."""
    env = os.environ if environ is None else environ
    parsed = {
        name: Sourced(parse_setting(name, raw, explicit_sources[name]), explicit_sources[name])
        for name, raw in explicit.items()
        if raw is not None
    }
    notes: list[str] = []
    return Overrides(
        explicit=parsed,
        environment=read_environment(env),
        config=find_config_file(config, config_source, env, notes),
        defaults=dict(defaults or {}),
        warnings=tuple(notes),
    )
