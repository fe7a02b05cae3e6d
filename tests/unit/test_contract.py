"""Plugin contract v1, the pure parts: versions, the new BackendSpec fields, deprecation, policy
proposals against the rules (table tests of ``apply_proposals``), binding and propagation."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pluggy
import pytest

import hwlaunch
from hwlaunch import contract
from hwlaunch.draft import SETTINGS, PlanDraft, Proposal
from hwlaunch.errors import PluginError
from hwlaunch.executor.base import bound_devices, worker_environment
from hwlaunch.plan import Plan
from hwlaunch.planning.facts import apply_assumptions, gather_facts
from hwlaunch.planning.policy import apply_proposals
from hwlaunch.planning.rules import decide
from hwlaunch.planning.settings import ConfigFile, Overrides, Sourced
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import BackendSpec, StartMethodRule, select_env

SECRET = "never-show-this-3f9c"


def budget(plan: Plan) -> dict[str, str]:
    """The thread budget's variables, which every mp plan's env carries besides the others."""
    n = str(plan.cpu_threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def spec(**changes: Any) -> BackendSpec:
    fields: dict[str, Any] = dict(
        name="npu",
        device_type="npu",
        priority=10,
        is_available=lambda: True,
        device_count=lambda: 4,
        is_initialized=lambda: False,
        start_methods=StartMethodRule(
            allowed=("fork", "spawn", "forkserver"),
            default="fork",
            fork_unsafe_after_init=True,
            fallback="forkserver",
        ),
        dist_backend="gloo",
        worker="hwlaunch.plugins.cpu.worker:CPUWorker",
        device_control_env_var="NPU_VISIBLE_DEVICES",
    )
    fields.update(changes)
    return BackendSpec(**fields)


def facts_for(s: BackendSpec, **assumed: object) -> RuntimeFacts:
    base = gather_facts({s.name: s})
    given: dict[str, object] = {
        "main_guard": "guarded",
        "in_ray_actor": False,
        "daemonic": False,
        "threads": "none",
    }
    given.update({k.replace("__", "."): v for k, v in assumed.items()})
    return apply_assumptions(base, given, "test")


def plan_for(s: BackendSpec, facts: RuntimeFacts, overrides: Overrides | None = None) -> Plan:
    chosen = overrides or Overrides(
        explicit={"backend": Sourced(s.name, "t"), "world_size": Sourced(2, "t")}
    )
    return decide({s.name: s}, facts, chosen)


# --- versions -----------------------------------------------------------------------------------


def test_contract_version_is_exported_lazily() -> None:
    assert hwlaunch.CONTRACT_VERSION == contract.CONTRACT_VERSION == "1.1"
    code = "import sys, hwlaunch; hwlaunch.CONTRACT_VERSION; print(sorted(m for m in ('torch', 'pluggy', 'hwlaunch.planning.policy') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("declared", ["1.0", "1.1", "1.01", "0.9"])
def test_older_or_equal_minor_contract_is_accepted(declared: str) -> None:
    if declared == "0.9":
        with pytest.raises(
            PluginError, match=r"written for plugin contract 0\.9.*upgrade the plugin"
        ):
            contract.require(declared, "plugin 'x'")
    else:
        assert contract.require(declared, "plugin 'x'") == declared.replace("1.01", "1.1")


def test_newer_contract_names_both_versions_and_the_fix() -> None:
    with pytest.raises(PluginError) as caught:
        spec(contract="1.4")
    text = str(caught.value)
    assert "BackendSpec 'npu' needs plugin contract 1.4" in text
    assert f"hwlaunch {hwlaunch.__version__} provides contract 1.1" in text
    assert "pip install --upgrade hwlaunch" in text


@pytest.mark.parametrize("bad", ["1", "v1.0", "1.0.0", 1.0, None])
def test_malformed_contract_is_rejected(bad: object) -> None:
    with pytest.raises(PluginError, match=r"not a version like '1\.1'"):
        spec(contract=bad)


# --- the new BackendSpec fields -------------------------------------------------------------------


def test_binding_defaults_keep_what_existing_plugins_got() -> None:
    assert spec().device_binding == "job_wide"
    assert spec(device_control_env_var=None).device_binding == "none"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"device_binding": "per_rank"}, "'per_rank' is not a binding; allowed: ['per_worker'"),
        (
            {"device_binding": "per_worker", "device_control_env_var": None},
            "device_control_env_var is None",
        ),
        ({"propagate_env": "HABANA_*"}, "must be a tuple of variable names or prefixes"),
        ({"propagate_env": ("HABANA*X",)}, "'HABANA*X' is neither a variable name"),
        ({"propagate_env": ("*",)}, "'*' is neither"),
        ({"ray_noset_visibility_var": "RAY NOSET"}, "'RAY NOSET' must be an environment variable"),
    ],
)
def test_invalid_new_fields_name_the_field_and_value(
    changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(PluginError) as caught:
        spec(**changes)
    field = next(iter(changes)) if "device_binding" not in changes else "device_binding"
    assert f"invalid BackendSpec field {field!r}" in str(caught.value)
    assert fragment in str(caught.value)


def test_propagate_env_accepts_a_list_and_selects_names_and_prefixes() -> None:
    s = spec(propagate_env=["HABANA_*", "NCCL_DEBUG"])
    assert s.propagate_env == ("HABANA_*", "NCCL_DEBUG")
    environ = {"HABANA_LOGS": "a", "HABANA": "b", "NCCL_DEBUG": "c", "NCCL_DEBUG_FILE": "d"}
    assert select_env(environ, s.propagate_env) == {"HABANA_LOGS": "a", "NCCL_DEBUG": "c"}


# --- deprecation -----------------------------------------------------------------------------------


def test_deprecated_field_warns_at_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        contract.DEPRECATED_FIELDS, "worker_env", "use hwlaunch_adjust_plan's env; removed in 2.0"
    )
    with pytest.warns(
        contract.HwlaunchDeprecationWarning, match="sets 'worker_env', which is deprecated"
    ):
        spec(worker_env={"A": "1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec()  # the default value does not warn


def test_deprecated_hook_warns_through_pluggy_warn_on_impl() -> None:
    from hwlaunch.hookspecs import PROJECT_NAME, deprecated_hookspec, hookimpl

    class Specs:
        @deprecated_hookspec("use hwlaunch_worker_setup", since="1.1", removal="2.0")
        def hwlaunch_old_setup(self, worker: object) -> None: ...

    class Plugin:
        @hookimpl
        def hwlaunch_old_setup(self, worker: object) -> None: ...

    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(Specs)
    with pytest.warns(
        contract.HwlaunchDeprecationWarning,
        match="deprecated since plugin contract 1.1, removed in 2.0",
    ):
        manager.register(Plugin())


# --- policy proposals (pure) -----------------------------------------------------------------------


def apply(
    s: BackendSpec,
    facts: RuntimeFacts,
    *proposals: tuple[str, Any],
    overrides: Overrides | None = None,
    environ: tuple[str, ...] = (),
    plugin: str = "site",
) -> tuple[Plan, list[str]]:
    plan = plan_for(s, facts, overrides)
    return apply_proposals(
        plan,
        s,
        overrides or Overrides(),
        [Proposal(plugin, k, v, f"why {k}") for k, v in proposals],
        environ,
    )


def test_accepted_start_method_shows_its_plugin_and_reason_and_sets_preload() -> None:
    s = spec()
    plan, dropped = apply(s, facts_for(s), ("start_method", "forkserver"))
    assert dropped == []
    assert plan.start_method == "forkserver"
    d = plan.decision("start_method")
    assert (d.source, d.reason) == ("plugin site", "why start_method")
    assert plan.preload == ("hwlaunch.plugins.cpu.worker",)


def test_a_plugins_fork_server_is_applied_to_the_draft_before_the_plan_is_made() -> None:
    """The rules' draft, then the proposal, then one Plan: the preload decision the fork server
    brings is there once, and a later proposal back to fork takes it out again."""
    from hwlaunch.planning.drafting import Draft
    from hwlaunch.planning.policy import apply_to_draft
    from hwlaunch.planning.rules import draft_plan

    s = spec()
    overrides = Overrides(explicit={"backend": Sourced("npu", "t"), "world_size": Sourced(2, "t")})
    draft = draft_plan({s.name: s}, facts_for(s), overrides)
    assert draft.values["start_method"] == "fork" and draft.values["preload"] == ()
    served = Proposal("site", "start_method", "forkserver", "site rule")
    assert apply_to_draft(draft, s, overrides, [served]) == []
    plan = draft.freeze()
    assert (plan.start_method, plan.preload) == ("forkserver", ("hwlaunch.plugins.cpu.worker",))
    assert [d.setting for d in plan.decisions].count("preload") == 1
    back = Draft.of(plan)
    apply_to_draft(back, s, overrides, [Proposal("other", "start_method", "fork", "faster")])
    again = back.freeze()
    assert again.preload == () and "preload" not in [d.setting for d in again.decisions]


@pytest.mark.parametrize(
    ("proposal", "assumed", "why"),
    [
        ("fork", {"npu__initialized": True}, "fork is unsafe: npu is already initialized"),
        ("spawn", {"main_guard": "unguarded"}, "would re-import __main__"),
        ("forkserver", {"main_guard": "not-reimportable"}, "which it cannot read"),
        ("forkserver", {"start_methods": "fork,spawn"}, "this OS does not offer it"),
    ],
)
def test_start_method_breaking_the_rule_is_dropped_naming_the_plugin(
    proposal: str, assumed: dict[str, object], why: str
) -> None:
    s = spec()
    facts = facts_for(s, **assumed)
    before = plan_for(s, facts)
    plan, dropped = apply(s, facts, ("start_method", proposal))
    assert plan.start_method == before.start_method
    assert len(dropped) == 1 and dropped[0].startswith(
        f"plugin site: proposal start_method={proposal!r} dropped"
    )
    assert why in dropped[0]


def test_start_method_outside_the_backend_rule_is_dropped() -> None:
    s = spec(start_methods=StartMethodRule(allowed=("spawn",), default="spawn"))
    plan, dropped = apply(s, facts_for(s), ("start_method", "fork"))
    assert plan.start_method == "spawn"
    assert "allows only spawn" in dropped[0]


def test_user_settings_win_over_proposals() -> None:
    s = spec(worker_env={"FROM_RULE": "1"})
    config = ConfigFile(path="site.toml", env=Sourced({"USER_VAR": "mine"}, "site.toml:1"))
    overrides = Overrides(
        explicit={
            "backend": Sourced("npu", "t"),
            "world_size": Sourced(2, "t"),
            "start_method": Sourced("spawn", "--start-method"),
        },
        config=config,
    )
    plan, dropped = apply(
        s,
        facts_for(s),
        ("start_method", "forkserver"),
        ("env", {"USER_VAR": "policy", "SHELL_VAR": "policy", "FROM_RULE": "2", "NEW": "3"}),
        overrides=overrides,
        environ=("SHELL_VAR",),
    )
    assert plan.start_method == "spawn"
    assert plan.env == {"FROM_RULE": "2", "USER_VAR": "mine", "NEW": "3", **budget(plan)}
    assert "plugin site" in plan.decision("env").source
    assert len(dropped) == 3
    assert any("--start-method" in w for w in dropped)
    assert any("USER_VAR" in w and "site.toml:1" in w for w in dropped)
    assert any("SHELL_VAR" in w and "driver's environment" in w for w in dropped)


def test_first_plugin_in_hook_order_wins_a_setting() -> None:
    s = spec()
    facts = facts_for(s)
    plan = plan_for(s, facts)
    claimed: dict[str, str] = {}
    first = [
        Proposal("early", "dist_backend", "ccl", "a"),
        Proposal("early", "env", {"K": "1"}, "a"),
    ]
    plan, dropped = apply_proposals(plan, s, Overrides(), first, (), claimed)
    later = [
        Proposal("late", "dist_backend", "mpi", "b"),
        Proposal("late", "env", {"K": "2", "J": "3"}, "b"),
    ]
    plan, dropped = apply_proposals(plan, s, Overrides(), later, (), claimed)
    assert plan.dist_backend == "ccl" and plan.env == {"K": "1", "J": "3", **budget(plan)}
    assert all("plugin early (earlier in hook order)" in w for w in dropped) and len(dropped) == 2


def test_preload_only_with_the_fork_server() -> None:
    s = spec()
    plan, dropped = apply(s, facts_for(s), ("preload", ("torch",)))
    assert plan.start_method == "fork" and plan.preload == ()
    assert "only the fork server preloads" in dropped[0]
    plan, dropped = apply(s, facts_for(s), ("preload", ("torch",)), ("start_method", "forkserver"))
    assert dropped == [] and plan.preload == ("torch",)


def test_start_method_proposal_ignored_outside_mp() -> None:
    s = spec()
    overrides = Overrides(explicit={"backend": Sourced("npu", "t"), "world_size": Sourced(1, "t")})
    plan, dropped = apply(s, facts_for(s), ("start_method", "spawn"), overrides=overrides)
    assert plan.start_method is None and "the uni executor starts no local processes" in dropped[0]


@pytest.mark.parametrize(
    ("setting", "value", "fragment"),
    [
        ("start_methd", "spawn", "unknown setting 'start_methd'; did you mean 'start_method'?"),
        ("start_method", "thread", "not a start method"),
        ("worker", "pkg.mod.Class", "import path"),
        ("env", {"BAD NAME": "1"}, "environment variable names"),
        ("env", {"GOOD": "a\0b"}, "GOOD = 'a\\x00b' holds a NUL character"),
        ("preload", "torch", "tuple of module names"),
    ],
)
def test_draft_rejects_bad_proposals_naming_the_plugin(
    setting: str, value: Any, fragment: str
) -> None:
    s = spec()
    draft = PlanDraft(plan_for(s, facts_for(s)), s, "site")
    with pytest.raises(PluginError) as caught:
        draft.propose(setting, value, "because")
    assert "plugin 'site'" in str(caught.value) and fragment in str(caught.value)
    assert set(SETTINGS) == {"start_method", "worker", "dist_backend", "env", "preload"}


def test_draft_is_read_only() -> None:
    s = spec()
    draft = PlanDraft(plan_for(s, facts_for(s)), s, "site")
    assert draft.decisions["backend"].value == "npu" and draft.backend is s
    with pytest.raises(TypeError):
        draft.decisions["backend"] = None  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        draft.backend.name = "x"  # type: ignore[misc]


# --- binding and propagation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "expected"),
    [("per_worker", ["0", "1"]), ("job_wide", ["0,1", "0,1"]), ("none", [None, None])],
)
def test_binding_gives_the_documented_variable_per_rank(
    binding: str, expected: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NPU_VISIBLE_DEVICES", raising=False)
    s = spec(device_binding=binding)
    plan = plan_for(s, facts_for(s))
    got = [
        worker_environment(plan, r, r, "127.0.0.1", 1).get("NPU_VISIBLE_DEVICES") for r in (0, 1)
    ]
    assert got == expected
    monkeypatch.setenv("NPU_VISIBLE_DEVICES", "5,7,9")
    narrowed = [
        worker_environment(plan, r, r, "127.0.0.1", 1).get("NPU_VISIBLE_DEVICES") for r in (0, 1)
    ]
    assert (
        narrowed
        == {"per_worker": ["5", "7"], "job_wide": ["5,7", "5,7"], "none": [None, None]}[binding]
    )


def test_ray_node_devices_follow_the_binding() -> None:
    s = spec(device_binding="per_worker")
    plan = plan_for(s, facts_for(s))
    assert [bound_devices(plan, r, "3,6") for r in (0, 1)] == ["3", "6"]
    wide = dataclasses.replace(plan, device_binding="job_wide")
    assert [bound_devices(wide, r, "3,6") for r in (0, 1)] == ["3,6", "3,6"]
    assert bound_devices(plan, 0, None) is None  # Ray reported no device ids: left alone


def test_propagated_names_shown_values_never(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through resolve(): the plan names the variables; explain, to_dict and --json never hold a
    value."""
    monkeypatch.setenv("GLOO_SECRET_TOKEN", SECRET)
    s = spec(propagate_env=("GLOO_SECRET_*",))
    from hwlaunch.planning.drafting import Draft
    from hwlaunch.planning.policy import settle
    from hwlaunch.planning.registry import Registry

    draft = Draft.of(plan_for(s, facts_for(s)))
    settle(draft, Registry(), s, Overrides(), {"GLOO_SECRET_TOKEN": SECRET}, strict=True)
    plan = draft.freeze()
    assert plan.decision("propagate_env").value == ["GLOO_SECRET_TOKEN"]
    assert SECRET not in plan.explain() and SECRET not in json.dumps(plan.to_dict())
    env = worker_environment(plan, 0, 0, "127.0.0.1", 1)
    assert env["GLOO_SECRET_TOKEN"] == SECRET  # the worker gets the value


# --- hook order between plugins follows pluggy --------------------------------------------------

POLICY = """
from hwlaunch import hookimpl

@hookimpl{marker}
def hwlaunch_adjust_plan(draft):
    draft.propose("dist_backend", "{value}", "policy of {value}")
"""


def test_tryfirst_plugin_is_called_first_and_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib.metadata import EntryPoint, entry_points

    from hwlaunch import _discovery as discovery
    from hwlaunch.planning.registry import load_registry
    from hwlaunch.planning.resolver import resolve_with_sources

    (tmp_path / "policy_plain.py").write_text(POLICY.format(marker="", value="plainccl"))
    (tmp_path / "policy_first.py").write_text(
        POLICY.format(marker="(tryfirst=True)", value="firstccl")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    builtins = list(entry_points(group="hwlaunch.backends"))
    points = [
        *builtins,
        EntryPoint("aplain", "policy_plain", "hwlaunch.backends"),
        EntryPoint("zfirst", "policy_first", "hwlaunch.backends"),
    ]
    monkeypatch.setattr(discovery, "entry_points", lambda group: points)
    try:
        registry = load_registry(environ={})
        assert registry.hook_order()["hwlaunch_adjust_plan"] == ["zfirst", "aplain"]
        monkeypatch.chdir(tmp_path)
        plan = resolve_with_sources({"backend": "cpu"}, {"backend": "t"}, registry=registry)
    finally:
        for name in ("policy_plain", "policy_first"):
            sys.modules.pop(name, None)
    assert plan.dist_backend == "firstccl"
    assert plan.decision("dist_backend").source == "plugin zfirst"
    assert any(
        w.startswith("plugin aplain: proposal dist_backend='plainccl' dropped: plugin zfirst")
        for w in plan.warnings
    )
