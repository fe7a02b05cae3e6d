"""Settings and their provenance: kwargs > env > config file ([backends.<name>] > top level) >
rule, config-file discovery, and bad input in every layer named by its source."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hwlaunch
from hwlaunch import BackendUnavailableError, ConfigError, MissingMainGuardError

pytestmark = pytest.mark.usefixtures("clean_env")

# Facts that make the plan independent of this machine: cpu only, guarded main, all methods.
CPU_ONLY = {
    "cuda.available": False,
    "hpu.available": False,
    "xpu.available": False,
    "main_guard": "guarded",
    "daemonic": False,
    "in_ray_actor": False,
    "start_methods": "fork,spawn,forkserver",
}


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def resolve(**kwargs: Any) -> hwlaunch.Plan:
    """hwlaunch.resolve on CPU_ONLY facts, except for backends that ``assume`` mentions."""
    extra = kwargs.pop("assume", {})
    mentioned = {key.partition(".")[0] for key in extra}
    base = {k: v for k, v in CPU_ONLY.items() if k.partition(".")[0] not in mentioned}
    return hwlaunch.resolve(assume={**base, **extra}, **kwargs)


# -- precedence ------------------------------------------------------------------------------
LAYERS = ("kwargs", "env", "backend table", "top level")


@pytest.mark.parametrize(
    "present",
    [p for p in itertools.product([True, False], repeat=4)],
    ids=lambda p: "+".join(name for name, on in zip(LAYERS, p, strict=True) if on) or "none",
)
def test_world_size_precedence(
    present: tuple[bool, bool, bool, bool], clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs_on, env_on, table_on, top_on = present
    lines = []
    if top_on:
        lines.append("world_size = 2")
    if table_on:
        lines += ["[backends.cpu]", "world_size = 3"]
    if lines:
        write(clean_env / "hwlaunch.toml", "\n".join(lines) + "\n")
    if env_on:
        monkeypatch.setenv("HWLAUNCH_WORLD_SIZE", "4")
    plan = resolve(world_size=5 if kwargs_on else None)
    table_line = 3 if top_on else 2
    expected = (
        (5, "resolve(world_size=)")
        if kwargs_on
        else (4, "env HWLAUNCH_WORLD_SIZE")
        if env_on
        else (3, f"hwlaunch.toml:{table_line} [backends.cpu]")
        if table_on
        else (2, "hwlaunch.toml:1")
        if top_on
        else (1, "built-in default")
    )
    decision = plan.decision("world_size")
    assert (plan.world_size, decision.source) == expected
    assert (decision.value, decision.source) == expected


def test_start_method_layers_name_their_source(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        clean_env / "hwlaunch.toml",
        """
        world_size = 2
        start_method = "forkserver"

        [backends.cpu]
        start_method = "spawn"
        """,
    )
    plan = resolve()
    assert (plan.start_method, plan.decision("start_method").source) == (
        "spawn",
        "hwlaunch.toml:5 [backends.cpu]",
    )
    monkeypatch.setenv("HWLAUNCH_START_METHOD", "fork")
    plan = resolve()
    assert (plan.start_method, plan.decision("start_method").source) == (
        "fork",
        "env HWLAUNCH_START_METHOD",
    )
    plan = resolve(start_method="forkserver")
    assert (plan.start_method, plan.decision("start_method").source) == (
        "forkserver",
        "resolve(start_method=)",
    )


def test_backend_table_applies_only_to_its_backend(clean_env: Path) -> None:
    write(
        clean_env / "hwlaunch.toml",
        """
        world_size = 2
        start_method = "forkserver"
        [backends.cuda]
        start_method = "spawn"
        world_size = 8
        """,
    )
    plan = resolve()
    assert (plan.backend, plan.world_size, plan.start_method) == ("cpu", 2, "forkserver")
    assert plan.decision("start_method").source == "hwlaunch.toml:2"
    plan = resolve(assume={"cuda.device_count": 8})
    assert (plan.backend, plan.world_size, plan.start_method) == ("cuda", 8, "spawn")
    assert plan.decision("world_size").source == "hwlaunch.toml:5 [backends.cuda]"


@pytest.mark.parametrize(
    ("var", "value", "setting", "expected"),
    [
        ("HWLAUNCH_BACKEND", "cpu", "backend", "cpu"),
        ("HWLAUNCH_EXECUTOR", "ray", "executor", "ray"),
        ("HWLAUNCH_START_METHOD", "spawn", "start_method", "spawn"),
        ("HWLAUNCH_WORLD_SIZE", " 3 ", "world_size", 3),
        ("HWLAUNCH_NNODES", "2", "nnodes", 2),
    ],
)
def test_environment_variables(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, setting: str, expected: object
) -> None:
    monkeypatch.setenv(var, value)
    plan = resolve(world_size=None if setting == "world_size" else 2)
    decision = plan.decision(setting)
    assert (decision.value, decision.source) == (expected, f"env {var}")


def test_empty_environment_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_WORLD_SIZE", "")
    monkeypatch.setenv("HWLAUNCH_START_METHOD", "  ")
    plan = resolve()
    assert plan.decision("world_size").source == "built-in default"


def test_ray_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_RAY_ADDRESS", "ray://head:10001")
    monkeypatch.setenv("HWLAUNCH_RAY_PG_TIMEOUT", "5")
    plan = resolve(world_size=2, executor="ray")
    assert (plan.ray_address, plan.ray_pg_timeout) == ("ray://head:10001", 5.0)
    assert plan.decision("ray_address").source == "env HWLAUNCH_RAY_ADDRESS"
    assert plan.decision("ray_pg_timeout").source == "env HWLAUNCH_RAY_PG_TIMEOUT"


def test_user_set_spawn_with_unguarded_main_names_each_source(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unguarded = {"main_guard": "unguarded"}
    with pytest.raises(MissingMainGuardError, match=r"\(from resolve\(start_method=\)\)"):
        resolve(world_size=2, start_method="spawn", assume=unguarded)
    write(clean_env / "hwlaunch.toml", 'start_method = "forkserver"\n')
    with pytest.raises(MissingMainGuardError, match=r"\(from hwlaunch.toml:1\)"):
        resolve(world_size=2, assume=unguarded)
    monkeypatch.setenv("HWLAUNCH_START_METHOD", "spawn")
    with pytest.raises(MissingMainGuardError, match=r"\(from env HWLAUNCH_START_METHOD\)"):
        resolve(world_size=2, assume=unguarded)


# -- config file discovery -------------------------------------------------------------------
PYPROJECT = """
[project]
name = "demo"

[tool.hwlaunch]
world_size = 5

[tool.hwlaunch.backends.cpu]
start_method = "spawn"
env = { A = "1" }
"""


@pytest.mark.parametrize(
    ("files", "use_kwarg", "use_env", "expected"),
    [
        (["pyproject"], False, False, (5, "pyproject.toml:5")),
        (["pyproject", "hwlaunch"], False, False, (2, "hwlaunch.toml:1")),
        (["pyproject", "hwlaunch", "env"], False, True, (3, "env.toml:1")),
        (["pyproject", "hwlaunch", "env", "explicit"], True, True, (4, "explicit.toml:1")),
        (["hwlaunch", "explicit"], True, False, (4, "explicit.toml:1")),
        ([], False, False, (1, "built-in default")),
    ],
)
def test_config_file_discovery_order(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: list[str],
    use_kwarg: bool,
    use_env: bool,
    expected: tuple[int, str],
) -> None:
    if "pyproject" in files:
        write(clean_env / "pyproject.toml", PYPROJECT)
    if "hwlaunch" in files:
        write(clean_env / "hwlaunch.toml", "world_size = 2\n")
    if "env" in files:
        write(clean_env / "env.toml", "world_size = 3\n")
    if "explicit" in files:
        write(clean_env / "explicit.toml", "world_size = 4\n")
    if use_env:
        monkeypatch.setenv("HWLAUNCH_CONFIG", str(clean_env / "env.toml"))
    plan = resolve(config="explicit.toml" if use_kwarg else None)
    decision = plan.decision("world_size")
    assert (decision.value, decision.source) == expected


def test_pyproject_backend_table_and_env(clean_env: Path) -> None:
    write(clean_env / "pyproject.toml", PYPROJECT)
    plan = resolve()
    assert plan.decision("start_method").source == ("pyproject.toml:8 [tool.hwlaunch.backends.cpu]")
    assert plan.env["A"] == "1"
    assert plan.decision("env").source == (
        "pyproject.toml:9 [tool.hwlaunch.backends.cpu] < cpu_threads"
    )


def test_pyproject_without_our_table_is_not_a_config(clean_env: Path) -> None:
    write(clean_env / "pyproject.toml", '[project]\nname = "demo"\n[tool.ruff]\nline-length = 1\n')
    assert resolve().decision("world_size").source == "built-in default"


def test_config_outside_cwd_is_named_by_path(
    clean_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = tmp_path_factory.mktemp("elsewhere") / "site.toml"
    write(other, "world_size = 3\n")
    plan = resolve(config=other)
    assert plan.decision("world_size").source == f"{other}:1"


def test_env_tables_merge_backend_over_top_level(clean_env: Path) -> None:
    write(
        clean_env / "hwlaunch.toml",
        """
        env = { OMP_NUM_THREADS = "4", KEEP = "top" }

        [backends.cpu]
        env = { OMP_NUM_THREADS = "8" }
        """,
    )
    plan = resolve()
    assert plan.env == {"OMP_NUM_THREADS": "8", "KEEP": "top"}
    assert plan.decision("env").source == "hwlaunch.toml:1 < hwlaunch.toml:4 [backends.cpu]"


def test_dotted_keys_and_subtables_get_lines(clean_env: Path) -> None:
    write(
        clean_env / "hwlaunch.toml",
        """
        # comment
        backends.cpu.world_size = 3
        "backends" . 'cpu'.nnodes = 1

        [backends.cpu.env]
        B = "2"
        """,
    )
    plan = resolve()
    assert plan.decision("world_size").source == "hwlaunch.toml:2 [backends.cpu]"
    assert plan.decision("nnodes").source == "hwlaunch.toml:3 [backends.cpu]"
    assert plan.decision("env").source == "hwlaunch.toml:5 [backends.cpu] < cpu_threads"


# -- bad input, each naming its source --------------------------------------------------------
@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("HWLAUNCH_WORLD_SIZE", "zero", "invalid world_size 'zero' from env HWLAUNCH_WORLD_SIZE"),
        ("HWLAUNCH_WORLD_SIZE", "0", "'0' from env HWLAUNCH_WORLD_SIZE: must be >= 1"),
        ("HWLAUNCH_NNODES", "1.5", "invalid nnodes '1.5' from env HWLAUNCH_NNODES"),
        ("HWLAUNCH_EXECUTOR", "mpp", "from env HWLAUNCH_EXECUTOR; did you mean 'mp'?"),
        ("HWLAUNCH_START_METHOD", "spwan", "HWLAUNCH_START_METHOD; did you mean 'spawn'?"),
        ("HWLAUNCH_RAY_PG_TIMEOUT", "soon", "from env HWLAUNCH_RAY_PG_TIMEOUT"),
    ],
)
def test_bad_environment_values(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        resolve()
    assert message in str(info.value)


def test_bad_executor_lists_allowed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_EXECUTOR", "mpp")
    with pytest.raises(ConfigError, match=r"\(allowed: uni, mp, ray, external;"):
        resolve()


def test_bad_backend_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_BACKEND", "cdua")
    with pytest.raises(BackendUnavailableError, match=r"did you mean 'cuda'.* from env"):
        resolve()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "invalid world_size 0 from resolve(world_size=): must be >= 1"),
        ({"world_size": True}, "invalid world_size True from resolve(world_size=)"),
        ({"world_size": 2.0}, "must be an integer"),
        ({"nnodes": "x"}, "from resolve(nnodes=)"),
        ({"executor": "MP"}, "invalid executor 'MP' from resolve(executor=)"),
        ({"start_method": "vfork"}, "from resolve(start_method=)"),
        ({"backend": " "}, "invalid backend ' ' from resolve(backend=)"),
    ],
)
def test_bad_keyword_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('world_size = "two"', "invalid world_size 'two' from hwlaunch.toml:1"),
        ("world_size = 2.0", "from hwlaunch.toml:1: must be an integer"),
        ('# c\nstart_method = "spwan"', "from hwlaunch.toml:2; did you mean 'spawn'?"),
        ('[backends.cuda]\nexecutor = "rayy"', "from hwlaunch.toml:2 [backends.cuda]"),
        (
            'strat_method = "spawn"',
            "unknown key 'strat_method' at hwlaunch.toml:1; did you mean 'start_method'?",
        ),
        (
            "[backends.cpu]\nworldsize = 2",
            "unknown key 'worldsize' in [backends.cpu] at hwlaunch.toml:2; did you mean "
            "'world_size'?",
        ),
        ('[backends.cpu]\nbackend = "cuda"', "unknown key 'backend' in [backends.cpu]"),
        ("world_size =", "hwlaunch.toml:1:13: not valid TOML"),
        ("env = { OMP_NUM_THREADS = 4 }", "invalid env table at hwlaunch.toml:1: OMP_NUM_THREADS"),
        ('env = "A=1"', "invalid env at hwlaunch.toml:1: must be a table"),
        ('env = { "A-B" = "1" }', "'A-B' is not an environment variable name"),
        ("[backends.cpu.env]\nA = 1", "invalid env table at hwlaunch.toml:1 [backends.cpu]"),
        ("backends = 3", "'backends' at hwlaunch.toml:1 must be a table"),
        ("[backends]\ncuda = 3", "[backends.cuda] at hwlaunch.toml:2 must be a table"),
        ("backends = { cpu = { nnodes = 0 } }", "invalid nnodes 0 from hwlaunch.toml:1"),
        ("[backends.cdua]\nworld_size = 2", "[backends.cdua] names no registered backend"),
    ],
)
def test_bad_config_file(clean_env: Path, text: str, message: str) -> None:
    write(clean_env / "hwlaunch.toml", text + "\n")
    with pytest.raises(ConfigError) as info:
        resolve()
    assert message in str(info.value)


def test_invalid_toml_message_has_the_line(clean_env: Path) -> None:
    write(clean_env / "hwlaunch.toml", "world_size = 2\nstart_method = spawn\n")
    with pytest.raises(
        ConfigError,
        match=r"^hwlaunch.toml:2:16: not valid TOML: Invalid value; none of the settings",
    ):
        resolve()


def test_backend_table_typo_is_an_error_with_suggestion(clean_env: Path) -> None:
    write(
        clean_env / "hwlaunch.toml", 'world_size = 2\n\n[backends.cdua]\nstart_method = "spawn"\n'
    )
    with pytest.raises(ConfigError) as info:
        resolve()
    assert str(info.value) == (
        "hwlaunch.toml:3 [backends.cdua] names no registered backend; did you mean 'cuda'? "
        "(registered: cpu, cuda, hpu, xpu)"
    )


@pytest.mark.parametrize("vendor", ["unknownvendor", "npu", "tpu"])
def test_backend_table_of_another_vendor_is_a_warning(clean_env: Path, vendor: str) -> None:
    write(clean_env / "hwlaunch.toml", f'[backends.{vendor}]\nstart_method = "spawn"\n')
    plan = resolve()
    assert plan.backend == "cpu"
    assert any(
        f"hwlaunch.toml:1 [backends.{vendor}] names no registered backend, so it is ignored" in w
        for w in plan.warnings
    )


def test_missing_config_file(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"'nope.toml' from resolve\(config=\) does not exist"):
        resolve(config="nope.toml")
    monkeypatch.setenv("HWLAUNCH_CONFIG", "gone.toml")
    with pytest.raises(ConfigError, match=r"'gone.toml' from env HWLAUNCH_CONFIG does not exist"):
        resolve()
    with pytest.raises(ConfigError, match="is not a file"):
        resolve(config=clean_env)


def test_pyproject_tool_hwlaunch_not_a_table(clean_env: Path) -> None:
    write(clean_env / "pyproject.toml", "[tool]\nhwlaunch = 1\n")
    with pytest.raises(ConfigError, match=r"\[tool.hwlaunch\] in pyproject.toml must be a table"):
        resolve()


def test_pyproject_unknown_key_names_its_table(clean_env: Path) -> None:
    write(clean_env / "pyproject.toml", "[tool.hwlaunch]\nworld = 2\n")
    with pytest.raises(ConfigError, match=r"'world' in \[tool.hwlaunch\] at pyproject.toml:2"):
        resolve()


# -- assumed facts ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("assume", "message"),
    [
        ({"cdua.available": True}, "unknown fact 'cdua.available' in resolve(assume=); did you"),
        ({"cuda.available": "maybe"}, "invalid value 'maybe' for cuda.available"),
        ({"cuda.device_count": -1}, "expected an integer >= 0"),
        ({"cuda.device_count": "two"}, "expected an integer >= 0"),
        ({"main_guard": "guardd"}, "did you mean 'guarded'?"),
        ({"start_methods": "fork,vfork"}, "invalid value 'fork,vfork' for start_methods"),
        ({"daemonic": "sometimes"}, "expected true or false"),
        ({"cuda.available": False, "cuda.device_count": 2}, "contradictory assumptions"),
        ({"cuda.device_count": 0, "cuda.initialized": True}, "contradictory assumptions"),
        (["cuda.available"], "invalid resolve(assume=) 'cuda.available': expected KEY=VALUE"),
    ],
)
def test_bad_assumptions(assume: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        hwlaunch.resolve(assume=assume)
    assert message in str(info.value)


def test_assumptions_as_key_value_strings() -> None:
    plan = hwlaunch.resolve(
        world_size=2,
        assume=["cuda.device_count=2", "main_guard=guarded", "in_ray_actor=0", "threads=none"],
    )
    assert (plan.backend, plan.executor, plan.start_method) == ("cuda", "mp", "fork")
    one = hwlaunch.resolve(assume="cuda.device_count=2")
    assert one.backend == "cuda"


def test_implied_facts_are_marked_assumed() -> None:
    plan = hwlaunch.resolve(assume={"cuda.device_count": 2})
    assert plan.facts is not None
    assert {"cuda.available", "cuda.device_count"} <= plan.facts.assumed
    assert plan.facts.devices["cuda"].available
    assert "(assumed)" in plan.decision("backend").reason


def test_assumed_zero_devices_makes_backend_unavailable() -> None:
    plan = resolve(assume={"cuda.device_count": 0})
    assert plan.backend == "cpu"
    with pytest.raises(BackendUnavailableError, match=r"not available on this machine \(assumed\)"):
        resolve(backend="cuda", assume={"cuda.available": False})
