"""User overrides with provenance: explicit arguments > environment > config file.

Every value carries the place it came from (``--start-method``, ``env HWLAUNCH_START_METHOD``,
``hwlaunch.toml:3``) so that both a plan's reasons and an error for a bad value can name it.
Reading settings has no side effects: nothing here writes the environment or any file.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from hwlaunch.errors import ConfigError
from hwlaunch.spec import START_METHODS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

T = TypeVar("T")

EXECUTORS = ("uni", "mp", "ray")
ENV_VARS: dict[str, str] = {
    "backend": "HWLAUNCH_BACKEND",
    "executor": "HWLAUNCH_EXECUTOR",
    "start_method": "HWLAUNCH_START_METHOD",
    "world_size": "HWLAUNCH_WORLD_SIZE",
    "nnodes": "HWLAUNCH_NNODES",
    "ray_address": "HWLAUNCH_RAY_ADDRESS",
    "ray_pg_timeout": "HWLAUNCH_RAY_PG_TIMEOUT",
    "max_restarts": "HWLAUNCH_MAX_RESTARTS",
}
ENV_CONFIG = "HWLAUNCH_CONFIG"
TOP_LEVEL_KEYS = (*ENV_VARS, "env", "backends")
BACKEND_TABLE_KEYS = ("executor", "start_method", "world_size", "nnodes", "env")


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A value and where it came from."""

    value: T
    source: str


def did_you_mean(value: str, allowed: tuple[str, ...] | list[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'cuda'?"`` for the closest allowed value, or ``""``."""
    close = difflib.get_close_matches(value, list(allowed), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def _choice(name: str, raw: object, source: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(raw, str) or raw not in allowed:
        hint = did_you_mean(raw, allowed) if isinstance(raw, str) else ""
        raise ConfigError(
            f"invalid {name} {raw!r} from {source}{hint} (allowed: {', '.join(allowed)})"
        )
    return raw


def _number(name: str, raw: object, source: str, kind: type, minimum: float) -> Any:
    value: Any = raw
    if isinstance(raw, str):
        try:
            value = kind(raw.strip())
        except ValueError:
            value = None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
    ):
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"invalid {name} {raw!r} from {source}: must be {what} >= {minimum:g}")
    if value < minimum or value != value or value == float("inf"):
        raise ConfigError(f"invalid {name} {raw!r} from {source}: must be >= {minimum:g}")
    return value


def parse_setting(name: str, raw: object, source: str) -> Any:
    """Validate one setting's raw value (a string from env/CLI, or a native TOML/Python value)."""
    if name == "executor":
        return _choice(name, raw, source, EXECUTORS)
    if name == "start_method":
        return _choice(name, raw, source, START_METHODS)
    if name in ("world_size", "nnodes"):
        return _number(name, raw, source, int, 1)
    if name == "max_restarts":
        return _number(name, raw, source, int, 0)
    if name == "ray_pg_timeout":
        return float(_number(name, raw, source, float, 0.001))
    if name in ("backend", "ray_address"):
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"invalid {name} {raw!r} from {source}: must be a non-empty string")
        return raw.strip()
    raise ConfigError(f"unknown setting {name!r} from {source}{did_you_mean(name, list(ENV_VARS))}")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parse_env_table(raw: object, source: str) -> dict[str, str]:
    example = 'e.g. env = { OMP_NUM_THREADS = "4" }'
    if not isinstance(raw, dict):
        raise ConfigError(
            f"invalid env at {source}: must be a table mapping environment variable names to "
            f"strings, {example}"
        )
    for key, value in raw.items():
        if not _ENV_NAME.match(key):
            raise ConfigError(
                f"invalid env table at {source}: {key!r} is not an environment variable name"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"invalid env table at {source}: {key} = {value!r} must be a string "
                f"(environment values are text), {example}"
            )
    return dict(raw)


@dataclass
class ConfigFile:
    """A parsed config file: top-level settings and per-backend tables, each value sourced.

    ``backend_tables`` maps each ``[backends.<name>]`` to where it is written, so that a table
    naming no registered backend can be reported at its line.
    """

    path: Path
    settings: dict[str, Sourced[Any]] = field(default_factory=dict)
    env: Sourced[dict[str, str]] | None = None
    backends: dict[str, dict[str, Sourced[Any]]] = field(default_factory=dict)
    backend_env: dict[str, Sourced[dict[str, str]]] = field(default_factory=dict)
    backend_tables: dict[str, str] = field(default_factory=dict)


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


def load_config_file(path: Path, table_prefix: tuple[str, ...] = ()) -> ConfigFile:
    """Parse ``path`` (``hwlaunch.toml``, or ``[tool.hwlaunch]`` of a pyproject.toml)."""
    label = path.name if path.parent.resolve() == Path.cwd().resolve() else str(path)
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
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
    explicit: str | os.PathLike[str] | None, explicit_source: str, environ: Mapping[str, str]
) -> ConfigFile | None:
    """``--config``/``config=`` > ``HWLAUNCH_CONFIG`` > ./hwlaunch.toml > ./pyproject.toml."""
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
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            return None  # not ours to judge unless it has our table
        if isinstance(data.get("tool"), dict) and "hwlaunch" in data["tool"]:
            return load_config_file(pyproject, ("tool", "hwlaunch"))
    return None


@dataclass(frozen=True)
class Overrides:
    """All user-supplied settings, by layer."""

    explicit: dict[str, Sourced[Any]] = field(default_factory=dict)
    environment: dict[str, Sourced[Any]] = field(default_factory=dict)
    config: ConfigFile | None = None
    defaults: dict[str, Sourced[Any]] = field(default_factory=dict)

    def lookup(self, name: str, backend: str | None = None) -> Sourced[Any] | None:
        """The winning value for ``name``: explicit > env > [backends.<b>] > top-level file >
        the caller's defaults (``hwlaunch run`` defaults to world size 2)."""
        if name in self.explicit:
            return self.explicit[name]
        if name in self.environment:
            return self.environment[name]
        if self.config is not None:
            if backend is not None and name in self.config.backends.get(backend, {}):
                return self.config.backends[backend][name]
            if name in self.config.settings:
                return self.config.settings[name]
        return self.defaults.get(name)


def read_environment(environ: Mapping[str, str]) -> dict[str, Sourced[Any]]:
    """The ``HWLAUNCH_*`` settings present (empty values count as unset)."""
    found: dict[str, Sourced[Any]] = {}
    for name, var in ENV_VARS.items():
        raw = environ.get(var, "")
        if raw.strip():
            source = f"env {var}"
            found[name] = Sourced(parse_setting(name, raw, source), source)
    return found


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
    return Overrides(
        explicit=parsed,
        environment=read_environment(env),
        config=find_config_file(config, config_source, env),
        defaults=dict(defaults or {}),
    )
