"""Property-based tests of every parser of user input: any input gives a plan or a user error.

Bad input must never surface as a crash (a TypeError, a KeyError...) from deep inside hwlaunch:
each input here, however odd, yields a valid Plan or an error of the documented vocabulary whose
message names where the bad value came from (the config file and its line, the environment
variable, the argument). Four parsers are covered: the config file (TOML documents built from
random tables, plus random raw text and bytes), the ``HWLAUNCH_*`` environment and the explicit
arguments (Python and CLI), BackendSpec/StartMethodRule validation and the registry that calls
plugins, and ``--assume KEY=VALUE``.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import re
import sys
import types
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwlaunch
from hwlaunch import (
    BackendSpec,
    BackendUnavailableError,
    ConfigError,
    PluginError,
    StartMethodError,
    StartMethodRule,
    hookimpl,
)
from hwlaunch import _discovery as discovery_module
from hwlaunch.cli import main as cli_main
from hwlaunch.hookspecs import ENTRY_POINT_GROUP
from hwlaunch.planning._config import load_config_file
from hwlaunch.planning.facts import MAIN_GUARD_VALUES
from hwlaunch.planning.registry import load_registry
from hwlaunch.planning.resolver import resolve_with_sources
from hwlaunch.planning.settings import (
    BACKEND_TABLE_KEYS,
    ENV_VARS,
    TOP_LEVEL_KEYS,
)
from hwlaunch.runtime_facts import REIMPORT_UNSAFE

pytestmark = pytest.mark.usefixtures("clean_env")

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The errors a user can get for bad settings; anything else escaping resolve() is a bug.
USER_ERRORS = (ConfigError, StartMethodError, BackendUnavailableError)
# Facts that make plans independent of this machine; main_guard is drawn where it matters.
CPU_ONLY: dict[str, object] = {
    "cuda.available": False,
    "hpu.available": False,
    "xpu.available": False,
    "main_guard": "guarded",
    "daemonic": False,
    "in_ray_actor": False,
    "start_methods": "fork,spawn,forkserver",
}
BACKEND_NAMES = ("cpu", "cuda", "hpu", "xpu", "cdua", "npu", "os:system", "")

# -- values of every type ----------------------------------------------------------------------
text = st.text(max_size=12)
# Keys without quotes, backslashes, brackets or control characters: quoted keys that need those
# are test_quoted_keys_get_their_line's (a known gap of the line finder, kept apart from this).
key_text = st.text(
    st.characters(exclude_characters="\"'\\[]", exclude_categories=["Cs", "Cc"]), max_size=12
)
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.sampled_from(["fork", "spawn", "forkserver", "uni", "mp", "ray", "1", "2", " 3 ", "0"]),
    st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 1, 1)),
    st.dates(),
    st.times(),
)


def values(depth: int = 2) -> st.SearchStrategy[Any]:
    """TOML values: scalars, arrays, tables (nested ``depth`` deep)."""
    if depth == 0:
        return scalars
    inner = values(depth - 1)
    return st.one_of(
        scalars,
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(key_text, st.sampled_from(BACKEND_TABLE_KEYS)), inner, max_size=3
        ),
    )


def setting_value(key: str) -> st.SearchStrategy[Any]:
    """Mostly plausible values for a known key, often wrong ones."""
    plausible: dict[str, st.SearchStrategy[Any]] = {
        "backend": st.sampled_from(BACKEND_NAMES),
        "executor": st.sampled_from(["uni", "mp", "ray", "MP", "mpp", ""]),
        "start_method": st.sampled_from(["fork", "spawn", "forkserver", "spwan", "thread"]),
        "world_size": st.integers(min_value=-2, max_value=9),
        "nnodes": st.integers(min_value=-1, max_value=3),
        "ray_address": st.sampled_from(["auto", "ray://head:10001", " "]),
        "ray_pg_timeout": st.floats(min_value=-1, max_value=1e3) | st.integers(-1, 100),
        "env": st.dictionaries(
            st.sampled_from(["OMP_NUM_THREADS", "A", "1A", "A-B", "PATH"]) | key_text,
            st.sampled_from(["4", "$(touch pwned)", ""]) | scalars,
            max_size=3,
        ),
    }
    return st.one_of(plausible.get(key, scalars), values(1))


@st.composite
def backend_tables(draw: st.DrawFn) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(BACKEND_NAMES) | key_text, max_size=3, unique=True)):
        keys = draw(
            st.lists(st.sampled_from(BACKEND_TABLE_KEYS) | key_text, max_size=4, unique=True)
        )
        tables[name] = (
            {key: draw(setting_value(key)) for key in keys}
            if draw(st.integers(0, 9))  # now and then a backend "table" that is not one
            else draw(scalars)
        )
    return tables


@st.composite
def config_tables(draw: st.DrawFn) -> dict[str, Any]:
    """A config table of known and unknown keys with values of random types."""
    keys = draw(
        st.lists(st.sampled_from(TOP_LEVEL_KEYS) | key_text, min_size=0, max_size=6, unique=True)
    )
    table: dict[str, Any] = {}
    for key in keys:
        if key == "backends" and draw(st.integers(0, 4)):
            table[key] = draw(backend_tables())
        else:
            table[key] = draw(setting_value(key))
    return table


# -- a TOML writer that remembers the line defining each key ------------------------------------
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


# Characters that str.splitlines() takes for line breaks although TOML does not (json.dumps leaves
# them raw): written as escapes here, since test_unicode_line_breaks_do_not_shift_lines pins that
# known gap of the line finder on its own.
_PYTHON_ONLY_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def toml_string(value: str) -> str:
    # JSON string escapes are TOML's, except that TOML also wants DEL escaped.
    encoded = json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")
    for char, escape in _PYTHON_ONLY_BREAKS.items():
        encoded = encoded.replace(char, escape)
    return encoded


def toml_key(key: str) -> str:
    return key if _BARE.match(key) else toml_string(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)  # repr: 'inf', '-inf', '1e+300'
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


class TomlWriter:
    """Tables become ``[a.b]`` sections or inline tables, as drawn; every key's line is kept."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw
        self.lines: list[str] = []
        self.defined: dict[tuple[str, ...], int] = {}

    def inline(self, path: tuple[str, ...], value: Any, line: int) -> None:
        self.defined[path] = line
        if isinstance(value, dict):
            for key, item in value.items():
                self.inline((*path, key), item, line)

    def table(self, path: tuple[str, ...], table: dict[str, Any]) -> None:
        sections = {
            k: v for k, v in table.items() if isinstance(v, dict) and self.draw(st.booleans())
        }
        if path:
            self.lines.append("[" + ".".join(toml_key(p) for p in path) + "]")
            self.defined[path] = len(self.lines)
        for key, value in table.items():
            if key not in sections:
                self.lines.append(f"{toml_key(key)} = {toml_value(value)}")
                self.inline((*path, key), value, len(self.lines))
        for key, value in sections.items():
            self.table((*path, key), value)


def check_user_error(exc: Exception, sources: list[str]) -> None:
    """A user error of the vocabulary whose message names one of ``sources``."""
    assert isinstance(exc, USER_ERRORS), f"{type(exc).__name__}: {exc}"
    assert any(source in str(exc) for source in sources), (str(exc), sources)


# -- (a) the config file -----------------------------------------------------------------------
@PROPERTY
@given(data=st.data(), table=config_tables(), in_pyproject=st.booleans())
def test_config_file_gives_a_plan_or_names_file_and_line(
    data: st.DataObject, table: dict[str, Any], in_pyproject: bool, clean_env: Path
) -> None:
    writer = TomlWriter(data.draw)
    if in_pyproject:
        writer.table((), {"project": {"name": "demo"}, "tool": {"hwlaunch": table}})
        name = "pyproject.toml"
    else:
        writer.table((), table)
        name = "hwlaunch.toml"
    for other in ("hwlaunch.toml", "pyproject.toml"):
        (clean_env / other).unlink(missing_ok=True)
    (clean_env / name).write_text("\n".join(writer.lines) + "\n", encoding="utf-8")
    lines = set(writer.defined.values())
    try:
        plan = hwlaunch.resolve(assume=CPU_ONLY)
    except Exception as exc:
        check_user_error(exc, [name])
        cited = [int(n) for n in re.findall(rf"{re.escape(name)}:(\d+)", str(exc))]
        assert cited, f"no line named in: {exc}"
        assert set(cited) <= lines, (str(exc), writer.lines)
        return
    for decision in plan.decisions:  # every setting read from the file cites a real line
        for n in re.findall(rf"{re.escape(name)}:(\d+)", decision.source):
            assert int(n) in lines, (decision, writer.lines)
    assert plan.world_size >= 1 and plan.nnodes >= 1


@PROPERTY
@given(
    raw=st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.lists(
            st.sampled_from(
                [
                    "world_size = 2",
                    "[backends.cpu]",
                    "[backends]",
                    'start_method = "spawn"',
                    "env = { A = '1' }",
                    "[env]",
                    "A = 1",
                    "backends.cpu.nnodes = 1",
                    "[[backends.cpu]]",
                    'x = """',
                    "# comment",
                    "",
                    "nnodes = 0x10",
                    'backend = "os:system"',
                ]
            )
            | st.text(max_size=20),
            max_size=8,
        ).map("\n".join),
    )
)
def test_raw_config_text_gives_a_plan_or_names_the_file(raw: str | bytes, clean_env: Path) -> None:
    path = clean_env / "hwlaunch.toml"
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    else:
        path.write_text(raw, encoding="utf-8")
    try:
        config = load_config_file(path)
    except ConfigError as exc:
        assert "hwlaunch.toml" in str(exc)
        return
    assert config.path == path
    try:
        hwlaunch.resolve(config=path, assume=CPU_ONLY)
    except Exception as exc:
        check_user_error(exc, ["hwlaunch.toml"])


@pytest.mark.parametrize(
    ("document", "line"),
    [
        ('world_size = 2\n"\'" = 1\n', 2),
        ('world_size = 2\n"tab\\there" = 1\n', 2),
        ('world_size = 2\n"a\\"b" = 1\n', 2),
        ('[backends.cpu]\nnnodes = 1\n"w\\u006frld_size" = 0\n', 3),
        ('world_size = 2\n["[x]"]\n', 2),
    ],
    ids=[
        "lone-quote",
        "escape",
        "escaped-quote",
        "unicode",
        "bracket-in-header",
    ],
)
def test_quoted_keys_get_their_line(clean_env: Path, document: str, line: int) -> None:
    """Found by the property above: keys spelled with quotes or escapes lose their line.

    ``_key_path`` in core/hwlaunch/planning/settings.py strips every quote character from both ends of a key part
    (``.strip("\"'")``, so the key ``"'"`` reads as the empty key) and never decodes escapes,
    and ``_KEY_PART`` ends a basic-string key at an escaped quote; ``_HEADER`` refuses a header
    whose quoted key holds a bracket. The error then names the file without a line, or (the
    unicode case) the line of the enclosing table header instead.
    """
    (clean_env / "hwlaunch.toml").write_text(document, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        hwlaunch.resolve(assume=CPU_ONLY)
    assert f"hwlaunch.toml:{line}" in str(info.value), str(info.value)


@pytest.mark.parametrize(("char", "where"), [("\x85", "value"), ("\u2028", "comment")])
def test_unicode_line_breaks_do_not_shift_lines(clean_env: Path, char: str, where: str) -> None:
    """Found by the property above: the line finder counts lines with ``str.splitlines()``,
    which also breaks at U+0085, U+2028 and U+2029; TOML breaks lines only at LF (CRLF). One
    such character in a string or a comment shifts every later line number, so the error below
    cites hwlaunch.toml:3 in a two-line file. Fix: ``text.split("\\n")`` in ``_LineFinder``.
    """
    first = f'backend = "cpu{char}"' if where == "value" else f"# see{char}below"
    (clean_env / "hwlaunch.toml").write_text(f"{first}\nworld_size = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        hwlaunch.resolve(assume=CPU_ONLY)
    assert "from hwlaunch.toml:2:" in str(info.value), str(info.value)


# -- (b) environment and explicit arguments ----------------------------------------------------
env_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))
env_values = st.one_of(
    env_text,
    st.sampled_from(["cpu", "cuda", "mp", "uni", "ray", "fork", "spawn", "forkserver", "2", "1"]),
    st.integers(-3, 10**30).map(str),
    st.floats().map(str),
    st.sampled_from(["nan", "inf", "1e400", "١٢", "1_000", "0x10", " 2 ", "9" * 5000]),
)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    text,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(text, st.integers(), max_size=2),
    st.builds(object),
)
KWARG_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "backend": st.sampled_from(BACKEND_NAMES) | junk,
    "world_size": st.integers(-1, 5) | junk,
    "nnodes": st.integers(-1, 3) | junk,
    "executor": st.sampled_from(["uni", "mp", "ray"]) | junk,
    "start_method": st.sampled_from(["fork", "spawn", "forkserver"]) | junk,
    "ray_address": st.sampled_from(["auto", "ray://h:1"]) | junk,
}
GUARDS = st.sampled_from([g for g in MAIN_GUARD_VALUES if g != "reimporting"])


@PROPERTY
@given(
    env=st.dictionaries(st.sampled_from(sorted(ENV_VARS.values())), env_values),
    kwargs=st.fixed_dictionaries({}, optional=KWARG_VALUES),
    guard=GUARDS,
)
def test_environment_and_arguments_give_a_plan_or_name_the_source(
    env: dict[str, str],
    kwargs: dict[str, Any],
    guard: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ENV_VARS.values():
        if var in env:
            monkeypatch.setenv(var, env[var])
        else:
            monkeypatch.delenv(var, raising=False)
    sources = [f"env {var}" for var, value in env.items() if value.strip()]
    sources += [f"resolve({name}=)" for name, value in kwargs.items() if value is not None]
    try:
        plan = hwlaunch.resolve(**kwargs, assume={**CPU_ONLY, "main_guard": guard})
    except Exception as exc:
        check_user_error(exc, sources)
        return
    assert plan.executor in ("uni", "mp", "ray")
    assert plan.world_size >= 1 and 1 <= plan.nnodes <= plan.world_size
    if plan.executor == "mp" and guard in REIMPORT_UNSAFE:
        assert plan.start_method == "fork"  # never a method that re-imports an unguarded main


CLI_FLAGS = ("--world-size", "--backend", "--nnodes", "--executor", "--start-method", "--assume")


@PROPERTY
@given(
    flags=st.lists(
        st.tuples(st.sampled_from(CLI_FLAGS), env_values | st.sampled_from(["cpu.available=1"])),
        max_size=5,
    )
)
def test_cli_flags_exit_0_or_2_without_a_traceback(flags: list[tuple[str, str]]) -> None:
    args = ["resolve", "--json", *(f"{flag}={value}" for flag, value in flags)]
    args += [f"--assume={k}={v}" for k, v in CPU_ONLY.items()]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(args)
    assert code in (0, 2), (code, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if code == 0:
        assert json.loads(out.getvalue())["world_size"] >= 1
    else:
        assert err.getvalue().strip(), "an error without a message"


# -- (c) BackendSpec / StartMethodRule validation and the registry -----------------------------
methods = st.sampled_from(["fork", "spawn", "forkserver"])
method_or_junk = methods | st.sampled_from(["vfork", "", "Fork"]) | junk


@st.composite
def rule_fields(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "allowed": draw(
            st.lists(methods, min_size=1, max_size=3, unique=True).map(tuple)
            | st.lists(method_or_junk, max_size=4).map(tuple)
            | st.lists(methods, max_size=2)  # a list, not a tuple
            | junk
        ),
        "default": draw(method_or_junk),
        "fork_unsafe_after_init": draw(st.booleans() | junk),
        "fallback": draw(st.none() | method_or_junk),
        "fork_warning": draw(st.none() | text | junk),
        "preload": draw(
            st.lists(st.sampled_from(["torch", "x.y"]) | text, max_size=2).map(tuple) | junk
        ),
    }


def _probe() -> bool:
    return False


callables = st.sampled_from([_probe, lambda: 1, len, int, dict]) | junk
valid_rule = st.builds(
    lambda m: StartMethodRule(allowed=(m,), default=m),
    methods,
)


@st.composite
def spec_fields(draw: st.DrawFn) -> dict[str, Any]:
    names = st.sampled_from(["cpu", "my-npu", "npu_2", "CPU", "1npu", "a" * 65, "", "n p u"])
    return {
        "name": draw(names | text | junk),
        "device_type": draw(st.sampled_from(["cpu", "npu"]) | text | junk),
        "priority": draw(st.integers() | junk),
        "is_available": draw(callables),
        "device_count": draw(callables),
        "is_initialized": draw(callables),
        "start_methods": draw(valid_rule | st.builds(lambda f: _try_rule(f), rule_fields()) | junk),
        "dist_backend": draw(st.sampled_from(["gloo", "hccl"]) | text | junk),
        "worker": draw(st.sampled_from(["a.b:C", "a:C", "a.b.C", "a:", ":C"]) | text | junk),
        "device_control_env_var": draw(st.sampled_from([None, "NPU_VISIBLE", "A-B"]) | junk),
        "ray_resource": draw(st.sampled_from(["CPU", "NPU"]) | text | junk),
        "worker_env": draw(
            st.dictionaries(st.sampled_from(["A", "1A", "B_C"]) | text, text | junk, max_size=3)
            | junk
        ),
    }


def _try_rule(fields: dict[str, Any]) -> object:
    try:
        return StartMethodRule(**fields)
    except PluginError:
        return fields  # not a rule: the spec must reject it


@PROPERTY
@given(fields=rule_fields())
def test_start_method_rule_is_valid_or_a_plugin_error(fields: dict[str, Any]) -> None:
    try:
        rule = StartMethodRule(**fields)
    except PluginError as exc:
        assert str(exc).startswith("invalid BackendSpec field 'start_methods.")
        return
    assert rule.default in rule.allowed and len(set(rule.allowed)) == len(rule.allowed)
    assert rule.fallback is None or (rule.fallback != "fork" and rule.fallback in rule.allowed)


@PROPERTY
@given(fields=spec_fields())
def test_backend_spec_is_valid_or_a_plugin_error(fields: dict[str, Any]) -> None:
    try:
        spec = BackendSpec(**fields)
    except PluginError as exc:
        assert str(exc).startswith("invalid BackendSpec field ")
        return
    assert re.fullmatch(r"[a-z][a-z0-9_-]{0,63}", spec.name)
    assert isinstance(spec.priority, int) and not isinstance(spec.priority, bool)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.worker_env.items())
    assert not any("\0" in v for v in spec.worker_env.values())


class Boom(Exception):
    pass


# What a plugin's hook may do: register a drawn spec (valid or not), register junk, or fail.
HOOK_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("spec"), spec_fields()),
        st.tuples(st.just("junk"), junk),
        st.tuples(
            st.just("raise"),
            st.sampled_from(
                [Boom("npu daemon down"), SystemExit(3), GeneratorExit(), ImportError()]
            ),
        ),
    ),
    max_size=4,
)


def _plugin_module(name: str, actions: list[tuple[str, Any]]) -> types.ModuleType:
    module = types.ModuleType(name)

    def hwlaunch_register_backends(register: Callable[[object], None]) -> None:
        for kind, value in actions:
            if kind == "spec":
                register(BackendSpec(**value))
            elif kind == "junk":
                register(value)
            else:
                raise value

    module.hwlaunch_register_backends = hookimpl(hwlaunch_register_backends)  # type: ignore[attr-defined]
    return module


BUILTIN_POINTS = list(entry_points(group=ENTRY_POINT_GROUP))


@contextlib.contextmanager
def plugins_installed(
    monkeypatch: pytest.MonkeyPatch, plugins: dict[str, list[tuple[str, Any]]]
) -> Iterator[None]:
    """Entry points of in-memory plugin modules, beside the real (built-in) ones."""
    points = list(BUILTIN_POINTS)
    for index, (name, actions) in enumerate(plugins.items()):
        module = f"hwlaunch_property_plugin_{index}"
        sys.modules[module] = _plugin_module(module, actions)
        points.append(EntryPoint(name, module, ENTRY_POINT_GROUP))
    with monkeypatch.context() as patch:
        patch.setattr(discovery_module, "entry_points", lambda group: points)
        try:
            yield
        finally:
            for index in range(len(plugins)):
                sys.modules.pop(f"hwlaunch_property_plugin_{index}", None)


@PROPERTY
@given(
    plugins=st.dictionaries(
        st.sampled_from(["npu", "cpu", "cuda", "acme"]), HOOK_ACTIONS, min_size=1, max_size=3
    ),
    strict=st.booleans(),
)
def test_random_plugins_never_break_the_registry(
    plugins: dict[str, list[tuple[str, Any]]], strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with plugins_installed(monkeypatch, plugins):
        try:
            registry = load_registry(environ={}, strict=strict)
        except PluginError as exc:
            assert strict, exc
            assert "failed to load" in str(exc)
            return
    builtins = {"cpu", "cuda", "hpu", "xpu"}
    assert builtins <= set(registry.backends)
    for name in builtins:  # a third party never takes a built-in's name or entry point
        assert registry.backends[name].plugin.builtin
    for record in registry.plugins:
        if record.error is None:
            assert all(registry.backends[b].plugin == record for b in record.backends)
        else:
            assert not record.backends and isinstance(record.error, str)
    assert strict is False or not registry.failures
    plan = resolve_with_sources({}, {}, registry=registry, assume=CPU_ONLY)
    assert plan.backend in registry.backends


# -- (d) --assume KEY=VALUE ---------------------------------------------------------------------
FACT_KEYS = (
    "main_guard",
    "daemonic",
    "in_ray_actor",
    "start_methods",
    *(
        f"{b}.{a}"
        for b in ("cpu", "cuda", "hpu", "xpu")
        for a in ("available", "device_count", "initialized")
    ),
)
FACT_VALUES = st.sampled_from(
    ["true", "false", "1", "0", "2", "-1", "yes", "maybe", "guarded", "unguarded", "fork,spawn",
     "spawn", "fork,vfork", "", " , "]
)  # fmt: skip
assume_items = st.one_of(
    st.tuples(st.sampled_from(FACT_KEYS) | text, FACT_VALUES | text).map("=".join),
    text,  # no '=' at all, or an empty key
)


@PROPERTY
@given(
    items=st.lists(assume_items, max_size=5) | assume_items,
    world_size=st.sampled_from([None, 2]),
)
def test_assume_strings_give_a_plan_or_a_config_error(
    items: list[str] | str, world_size: int | None
) -> None:
    try:
        plan = hwlaunch.resolve(world_size=world_size, assume=items)
    except ConfigError as exc:
        assert "resolve(assume=)" in str(exc), exc
        return
    except StartMethodError as exc:  # what an assumed fact implies, e.g. a daemonic parent
        assert "(assumed)" in str(exc), exc
        return
    assert plan.facts is not None
    parsed = [items] if isinstance(items, str) else items
    for item in parsed:
        assert item.partition("=")[0].strip() in plan.facts.assumed


@PROPERTY
@given(
    facts=st.dictionaries(
        st.sampled_from(FACT_KEYS) | text, FACT_VALUES | junk, min_size=1, max_size=4
    )
)
def test_assume_mapping_of_any_values_gives_a_plan_or_a_config_error(
    facts: dict[str, object],
) -> None:
    try:
        plan = hwlaunch.resolve(assume=facts)
    except ConfigError as exc:
        assert "resolve(assume=)" in str(exc), exc
        return
    assert plan.facts is not None and set(facts) <= plan.facts.assumed
