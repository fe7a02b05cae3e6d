"""Plugin discovery, checked through real distributions installed with pip.

Why real distributions: discovery is importlib.metadata reading ``.dist-info`` entry points, and
what the user sees (distribution name, version, the reason a plugin failed) comes from there. The
small distributions under ``tests/plugins/plugin_dists/`` are built and installed once per session into a
temporary ``--target`` directory; each check runs ``python -m hwlaunch.cli`` in a subprocess with
that directory on PYTHONPATH, so the entry points are visible exactly as after ``pip install``.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from plugin_sites import PLUGIN_DISTS as DISTS
from plugin_sites import distributions, hwlaunch_cli, install

from hwlaunch import _discovery as discovery_module
from hwlaunch.contract import CONTRACT_VERSION
from hwlaunch.errors import BackendUnavailableError, PluginError
from hwlaunch.planning.registry import PluginRecord, default_registry, load_registry

BUILTINS = ("cpu", "cuda", "hpu", "xpu")
BUILTIN_PLUGINS = ("cpu", "cuda", "executors", "hpu", "xpu")  # by name; executors are a plugin
HWLAUNCH_VERSION = importlib.metadata.version("hwlaunch")
GOOD = {"plugin": "goodnpu", "distribution": "hwlaunch-good-npu", "version": "1.2.3"}
ALLOW, BLOCK, STRICT = "HWLAUNCH_PLUGINS", "HWLAUNCH_DISABLE_PLUGINS", "HWLAUNCH_STRICT_PLUGINS"

# (entry-point name, distribution) -> (version, fragments the failure reason must contain)
FAILURES: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("importfails", "hwlaunch-import-fails"): (
        "0.0.1",
        (
            "cannot load 'hwlaunch_import_fails'",
            "ImportError: vendor runtime libnpu.so.7 not found",
        ),
    ),
    ("runtimefails", "hwlaunch-import-fails"): (
        "0.0.1",
        ("RuntimeError: driver version mismatch at import",),
    ),
    ("hookraises", "hwlaunch-hook-raises"): (
        "0.2.0",
        ("hwlaunch_register_backends raised", "ValueError: cannot talk to the npu daemon"),
    ),
    ("hookexits", "hwlaunch-hook-raises"): (
        "0.2.0",
        ("hwlaunch_register_backends raised", "sys.exit('plugin hook called sys.exit')"),
    ),
    ("hookpartial", "hwlaunch-hook-raises"): (
        "0.2.0",
        ("RuntimeError: second device table is corrupt",),
    ),
    ("nohook", "hwlaunch-hook-raises"): (
        "0.2.0",
        (
            "implements no hwlaunch hook",
            "'hwlaunch_register_backend' (did you mean 'hwlaunch_register_backends'?)",
        ),
    ),
    ("hookwraps", "hwlaunch-hook-raises"): (
        "0.2.0",
        (
            "declares hwlaunch_register_backends as a hook wrapper",
            "use a plain @hwlaunch.hookimpl",
        ),
    ),
    ("badspec", "hwlaunch-bad-spec"): (
        "0.3.0",
        ("invalid BackendSpec field 'worker'", "'not an import path'"),
    ),
    ("badregister", "hwlaunch-bad-spec"): (
        "0.3.0",
        ("register() takes a hwlaunch.BackendSpec, got dict",),
    ),
    ("clashcpu", "hwlaunch-clash"): (
        "0.4.0",
        (
            "backend name 'cpu'",
            f"plugin 'cpu' (hwlaunch {HWLAUNCH_VERSION})",
            "plugin 'clashcpu' (hwlaunch-clash 0.4.0)",
            f"{BLOCK}=clashcpu",
        ),
    ),
    ("cpu", "hwlaunch-clash"): (
        "0.4.0",
        (
            "entry-point name 'cpu' is already taken",
            f"plugin 'cpu' (hwlaunch {HWLAUNCH_VERSION})",
            "hwlaunch-clash",
        ),
    ),
    ("exitsatimport", "hwlaunch-exits-at-import"): (
        "0.5.0",
        ("cannot load 'hwlaunch_exits_at_import'", "hwlaunch-exits-at-import refuses to load"),
    ),
}
THIRD_PARTY = sorted({name for name, _ in FAILURES} - {"cpu"} | {"goodnpu"})


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build and install every test distribution, once, into one ``pip --target`` directory."""
    return install(distributions(DISTS), tmp_path_factory.mktemp("plugin_dists") / "site")


def hwlaunch(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hwlaunch.cli ARGS`` with the plugins of ``site`` and only the given
    HWLAUNCH_* variables, in an empty directory (no hwlaunch.toml to pick up)."""
    return hwlaunch_cli(site, *args, cwd=site.parent, timeout=60, **env)


def json_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


def rows_by_backend(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows if row["name"] is not None}


def failed_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["plugin"], row["distribution"]): row for row in rows if row["name"] is None}


def plugin_names(verbose: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["name"], p["distribution"]) for p in verbose["plugins"]]


@pytest.fixture(scope="session")
def all_rows(plugin_site: Path) -> list[dict[str, Any]]:
    """``hwlaunch backends --json`` with every test distribution installed and no filter."""
    rows: list[dict[str, Any]] = json_of(hwlaunch(plugin_site, "backends", "--json"))
    return rows


@pytest.fixture(scope="session")
def verbose(plugin_site: Path) -> dict[str, Any]:
    payload: dict[str, Any] = json_of(hwlaunch(plugin_site, "backends", "--verbose", "--json"))
    return payload


# --- hwlaunch backends, every distribution installed -------------------------------------------


def test_working_backends_survive_every_broken_plugin(all_rows: list[dict[str, Any]]) -> None:
    backends = rows_by_backend(all_rows)
    assert sorted(backends) == sorted([*BUILTINS, "goodnpu"])
    for name in BUILTINS:
        assert backends[name]["plugin"] == name
        assert backends[name]["distribution"] == "hwlaunch"
        assert backends[name]["version"] == HWLAUNCH_VERSION
        assert backends[name]["error"] is None


def test_third_party_backend_is_listed_with_its_distribution(
    all_rows: list[dict[str, Any]],
) -> None:
    good = rows_by_backend(all_rows)["goodnpu"]
    assert {k: good[k] for k in GOOD} == GOOD
    assert good["available"] is True
    assert good["device_count"] == 2
    assert good["initialized"] is False
    assert good["start_methods"] == {"allowed": ["spawn"], "default": "spawn"}
    assert good["dist_backend"] == "gloo"
    assert good["device_control_env_var"] == "GOODNPU_VISIBLE_DEVICES"
    assert good["ray_resource"] == "NPU"
    assert good["worker"] == "hwlaunch.plugins.cpu.worker:CPUWorker"
    assert good["error"] is None


def test_every_failed_plugin_is_listed_once(all_rows: list[dict[str, Any]]) -> None:
    names = [(row["plugin"], row["distribution"]) for row in all_rows if row["name"] is None]
    assert sorted(names) == sorted(FAILURES)


@pytest.mark.parametrize("key", sorted(FAILURES), ids=lambda key: f"{key[0]}@{key[1]}")
def test_failed_plugin_row_names_the_cause(
    all_rows: list[dict[str, Any]], key: tuple[str, str]
) -> None:
    row = failed_rows(all_rows)[key]
    version, fragments = FAILURES[key]
    assert row["version"] == version
    assert row["available"] is False
    assert row["start_methods"] is None
    for fragment in fragments:
        assert fragment in row["error"]
    assert "\n" not in row["error"]


def test_backend_name_clash_keeps_the_builtin(all_rows: list[dict[str, Any]]) -> None:
    cpu = rows_by_backend(all_rows)["cpu"]
    assert (cpu["plugin"], cpu["distribution"]) == ("cpu", "hwlaunch")
    assert cpu["worker"] == "hwlaunch.plugins.cpu.worker:CPUWorker"
    reason = failed_rows(all_rows)["clashcpu", "hwlaunch-clash"]["error"]
    assert f"{BLOCK}=clashcpu" in reason  # keep the built-in
    assert f"{BLOCK}=cpu" in reason  # or take the third party instead


def test_a_plugin_that_fails_midway_registers_nothing(all_rows: list[dict[str, Any]]) -> None:
    names = {row["name"] for row in all_rows}
    assert not names & {"partialnpu", "badnpu", "dictnpu", "samename"}


def test_table_output_lists_backends_and_failures(plugin_site: Path) -> None:
    done = hwlaunch(plugin_site, "backends")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    for word in ("goodnpu", "hwlaunch-good-npu", "importfails", "clashcpu", "exitsatimport"):
        assert word in done.stdout


# --- hwlaunch backends --verbose --json ---------------------------------------------------------


def test_verbose_lists_each_plugin_module_distribution_version_hooks(
    verbose: dict[str, Any], all_rows: list[dict[str, Any]]
) -> None:
    plugins = {(p["name"], p["distribution"]): p for p in verbose["plugins"]}
    assert sorted(plugins) == sorted(
        [
            *((b, "hwlaunch") for b in BUILTIN_PLUGINS),
            ("goodnpu", GOOD["distribution"]),
            *FAILURES,
        ]
    )
    assert plugin_names(verbose)[:5] == [
        (b, "hwlaunch") for b in BUILTIN_PLUGINS
    ]  # built-ins first
    good = plugins["goodnpu", "hwlaunch-good-npu"]
    assert good == {
        "name": "goodnpu",
        "module": "hwlaunch_good_npu",
        "distribution": "hwlaunch-good-npu",
        "version": "1.2.3",
        "hooks": ["hwlaunch_register_backends"],
        "backends": ["goodnpu"],
        "executors": [],
        "contract": CONTRACT_VERSION,  # its spec declares none: the installed one
        "warnings": [],
        "error": None,
    }
    for name in BUILTINS:
        builtin = plugins[name, "hwlaunch"]
        assert builtin["module"] == f"hwlaunch.plugins.{name}"
        assert builtin["version"] == HWLAUNCH_VERSION
        assert builtin["hooks"] == ["hwlaunch_register_backends"]
        assert builtin["backends"] == [name]
    executors = plugins["executors", "hwlaunch"]
    assert executors["hooks"] == ["hwlaunch_register_executors"]
    assert executors["executors"] == ["uni", "mp", "ray", "external"]
    assert [e["name"] for e in verbose["executors"]] == ["uni", "mp", "ray", "external"]
    assert {e["plugin"] for e in verbose["executors"]} == {"executors"}
    assert plugins["badspec", "hwlaunch-bad-spec"]["module"] == "hwlaunch_bad_spec:BadField"
    assert plugins["badspec", "hwlaunch-bad-spec"]["hooks"] == ["hwlaunch_register_backends"]
    assert plugins["importfails", "hwlaunch-import-fails"]["hooks"] == []
    assert plugins["nohook", "hwlaunch-hook-raises"]["hooks"] == ["hwlaunch_register_backend"]
    for key in FAILURES:
        assert plugins[key]["backends"] == []
        assert plugins[key]["error"]
    assert verbose["backends"] == all_rows  # the plain --json list, unchanged


# --- strict mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        ("importfails", "hwlaunch-import-fails"),
        ("hookraises", "hwlaunch-hook-raises"),
        ("badspec", "hwlaunch-bad-spec"),
        ("clashcpu", "hwlaunch-clash"),
        ("cpu", "hwlaunch-clash"),
        ("exitsatimport", "hwlaunch-exits-at-import"),
    ],
    ids=lambda key: key[0],
)
def test_strict_turns_a_failure_into_exit_2(plugin_site: Path, key: tuple[str, str]) -> None:
    name, distribution = key
    done = hwlaunch(plugin_site, "backends", "--json", **{STRICT: "1", ALLOW: name})
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]  # --json: the error as one JSON object
    assert (error["type"], error["exit_code"]) == ("PluginError", 2)
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("hwlaunch: error: ")
    assert f"plugin {name!r} ({distribution} {FAILURES[key][0]})" in done.stderr
    for fragment in FAILURES[key][1]:
        assert fragment in done.stderr
    assert STRICT in done.stderr


def test_strict_resolve_fails_too_and_debug_shows_the_traceback(plugin_site: Path) -> None:
    env = {STRICT: "true", ALLOW: "hookraises"}
    done = hwlaunch(plugin_site, "resolve", "--backend", "cpu", **env)
    assert done.returncode == 2
    assert "ValueError: cannot talk to the npu daemon" in done.stderr
    assert "Traceback" not in done.stderr
    debug = hwlaunch(plugin_site, "--debug", "resolve", "--backend", "cpu", **env)
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr


def test_strict_with_only_working_plugins_succeeds(plugin_site: Path) -> None:
    rows = json_of(hwlaunch(plugin_site, "backends", "--json", **{STRICT: "1", ALLOW: "goodnpu"}))
    assert sorted(rows_by_backend(rows)) == sorted([*BUILTINS, "goodnpu"])


# --- allowlist and blocklist --------------------------------------------------------------------


def test_allowlist_loads_only_the_named_third_party_and_every_builtin(plugin_site: Path) -> None:
    payload = json_of(
        hwlaunch(plugin_site, "backends", "--verbose", "--json", **{ALLOW: "goodnpu"})
    )
    assert plugin_names(payload) == [
        *((b, "hwlaunch") for b in BUILTIN_PLUGINS),
        ("goodnpu", GOOD["distribution"]),
    ]
    assert sorted(rows_by_backend(payload["backends"])) == sorted([*BUILTINS, "goodnpu"])
    assert not failed_rows(payload["backends"])


def test_empty_allowlist_loads_no_third_party(plugin_site: Path) -> None:
    payload = json_of(hwlaunch(plugin_site, "backends", "--verbose", "--json", **{ALLOW: ""}))
    assert plugin_names(payload) == [(b, "hwlaunch") for b in BUILTIN_PLUGINS]
    assert sorted(rows_by_backend(payload["backends"])) == sorted(BUILTINS)


def test_allowlist_takes_several_names_with_spaces(plugin_site: Path) -> None:
    payload = json_of(
        hwlaunch(
            plugin_site, "backends", "--verbose", "--json", **{ALLOW: " goodnpu , hookraises,"}
        )
    )
    assert plugin_names(payload)[len(BUILTIN_PLUGINS) :] == [
        ("goodnpu", GOOD["distribution"]),
        ("hookraises", "hwlaunch-hook-raises"),
    ]
    assert list(failed_rows(payload["backends"])) == [("hookraises", "hwlaunch-hook-raises")]


def test_blocklist_blocks_a_third_party_and_a_builtin(plugin_site: Path) -> None:
    payload = json_of(
        hwlaunch(plugin_site, "backends", "--verbose", "--json", **{BLOCK: "goodnpu,hpu"})
    )
    names = plugin_names(payload)
    assert ("goodnpu", GOOD["distribution"]) not in names
    assert ("hpu", "hwlaunch") not in names
    assert sorted(rows_by_backend(payload["backends"])) == ["cpu", "cuda", "xpu"]
    assert sorted(failed_rows(payload["backends"])) == sorted(FAILURES)  # the rest still load
    table = hwlaunch(plugin_site, "backends", **{BLOCK: "goodnpu,hpu"})
    assert f"skipped plugin goodnpu (excluded by {BLOCK})" in table.stdout
    assert f"skipped plugin hpu (excluded by {BLOCK})" in table.stdout


def test_blocklist_beats_allowlist(plugin_site: Path) -> None:
    payload = json_of(
        hwlaunch(
            plugin_site, "backends", "--verbose", "--json", **{ALLOW: "goodnpu", BLOCK: "goodnpu"}
        )
    )
    assert plugin_names(payload) == [(b, "hwlaunch") for b in BUILTIN_PLUGINS]


def test_blocking_the_builtin_hands_its_name_to_the_clashing_plugin(plugin_site: Path) -> None:
    rows = json_of(hwlaunch(plugin_site, "backends", "--json", **{ALLOW: "clashcpu", BLOCK: "cpu"}))
    cpu = rows_by_backend(rows)["cpu"]
    assert (cpu["plugin"], cpu["distribution"], cpu["version"]) == (
        "clashcpu",
        "hwlaunch-clash",
        "0.4.0",
    )
    assert cpu["worker"] == "hwlaunch_clash:ImpostorWorker"
    assert not failed_rows(rows)


# --- hwlaunch resolve ---------------------------------------------------------------------------


def test_resolve_cpu_still_works_beside_the_clash(plugin_site: Path) -> None:
    plan = json_of(hwlaunch(plugin_site, "resolve", "--backend", "cpu", "--json"))
    assert plan["backend"] == "cpu"
    assert plan["worker"] == "hwlaunch.plugins.cpu.worker:CPUWorker"
    assert any("clashcpu" in warning for warning in plan["warnings"])


def test_resolve_chooses_the_third_party_backend(plugin_site: Path) -> None:
    plan = json_of(
        hwlaunch(
            plugin_site,
            "resolve",
            "--backend",
            "goodnpu",
            "--world-size",
            "2",
            "--json",
            **{ALLOW: "goodnpu"},
        )
    )
    assert plan["backend"] == "goodnpu"
    assert plan["executor"] == "mp"
    assert plan["start_method"] == "spawn"  # the plugin's own rule
    assert plan["device_control_env_var"] == "GOODNPU_VISIBLE_DEVICES"
    assert plan["ray_resource"] == "NPU"
    assert plan["worker"] == "hwlaunch.plugins.cpu.worker:CPUWorker"
    backend = next(d for d in plan["decisions"] if d["setting"] == "backend")
    assert (backend["value"], backend["source"]) == ("goodnpu", "--backend")
    assert not any("failed to load" in warning for warning in plan["warnings"])


def test_resolve_auto_detects_the_third_party_by_priority(plugin_site: Path) -> None:
    plan = json_of(hwlaunch(plugin_site, "resolve", "--json", **{ALLOW: "goodnpu"}))
    assert plan["backend"] == "goodnpu"
    assert (
        json_of(hwlaunch(plugin_site, "resolve", "--json", **{BLOCK: "goodnpu"}))["backend"]
        == "cpu"
    )


def test_resolve_a_blocked_backend_says_it_is_excluded(plugin_site: Path) -> None:
    done = hwlaunch(plugin_site, "resolve", "--backend", "goodnpu", **{BLOCK: "goodnpu"})
    assert done.returncode == 2
    assert f"backend 'goodnpu' from --backend is installed but excluded by {BLOCK}" in done.stderr
    assert "Traceback" not in done.stderr


# --- the registry in-process --------------------------------------------------------------------


@pytest.fixture
def on_path(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test distributions visible in this process; their modules are forgotten afterwards."""
    for var in (ALLOW, BLOCK, STRICT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(plugin_site))
    before = set(sys.modules)
    yield plugin_site
    for module in set(sys.modules) - before:
        if module.startswith("hwlaunch_"):
            del sys.modules[module]


def test_load_registry_reads_the_given_environ_not_os_environ(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW, "")
    registry = load_registry(environ={})
    assert "goodnpu" in registry.backends
    assert registry.backends["goodnpu"].plugin.distribution == GOOD["distribution"]
    assert {(p.name, p.distribution) for p in registry.failures} == set(FAILURES)
    assert registry.skipped == []


def test_load_registry_filters_record_what_was_skipped(on_path: Path) -> None:
    registry = load_registry(environ={ALLOW: "goodnpu", BLOCK: "cuda"})
    assert sorted(registry.backends) == ["cpu", "goodnpu", "hpu", "xpu"]
    assert f"cuda (excluded by {BLOCK})" in registry.skipped
    assert f"importfails (excluded by {ALLOW})" in registry.skipped
    assert f"cpu (excluded by {ALLOW})" in registry.skipped  # the third party's "cpu" entry point
    assert registry.failures == []


def test_load_registry_strict_argument_beats_the_environment(on_path: Path) -> None:
    env = {ALLOW: "badspec", STRICT: "0"}
    with pytest.raises(PluginError, match=r"plugin 'badspec' \(hwlaunch-bad-spec 0.3.0\)") as info:
        load_registry(environ=env, strict=True)
    assert "invalid BackendSpec field 'worker'" in str(info.value)
    assert load_registry(environ={**env, STRICT: "1"}, strict=False).failures


def test_registry_get_lists_known_names(on_path: Path) -> None:
    registry = load_registry(environ={ALLOW: "goodnpu"})
    assert registry.get("goodnpu").device_type == "npu"
    with pytest.raises(BackendUnavailableError, match=r"did you mean 'goodnpu'\?.*goodnpu"):
        registry.get("goodnpv")


def test_default_registry_follows_the_plugin_variables(
    on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW, "goodnpu")
    assert "goodnpu" in default_registry().backends
    monkeypatch.setenv(BLOCK, "goodnpu")
    assert "goodnpu" not in default_registry().backends
    monkeypatch.setenv(STRICT, "1")
    monkeypatch.setenv(ALLOW, "hookraises")
    with pytest.raises(PluginError, match="cannot talk to the npu daemon"):
        default_registry()


def test_hookimpl_arguments_follow_pluggy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hookimpl may take fewer arguments than the hookspec, as pluggy allows."""
    (tmp_path / "hwlaunch_noargs_plugin.py").write_text(
        "from hwlaunch import hookimpl\n\n@hookimpl\ndef hwlaunch_register_backends():\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hwlaunch_noargs_plugin", raising=False)
    point = EntryPoint("noargs", "hwlaunch_noargs_plugin", "hwlaunch.backends")
    monkeypatch.setattr(discovery_module, "entry_points", lambda group: [point])
    try:
        registry = load_registry(environ={})
    finally:
        sys.modules.pop("hwlaunch_noargs_plugin", None)
    assert [(p.name, p.distribution, p.error) for p in registry.plugins] == [("noargs", None, None)]
    assert registry.plugins[0].describe() == "plugin 'noargs' (unknown distribution)"


def test_plugin_record_describe() -> None:
    record = PluginRecord("goodnpu", "hwlaunch_good_npu", "hwlaunch-good-npu", "1.2.3")
    assert record.describe() == "plugin 'goodnpu' (hwlaunch-good-npu 1.2.3)"
    assert not record.builtin
