"""Bad inputs a new user gives: each gets one clear answer, never silence or a raw error.

One test (or parametrized case) per kind of mistake: misspelt variables (item 1), plugin
selection values and names (items 2, 3), collective_rpc arguments (item 4), a plan of assumed
facts launched (item 5), remote tracebacks of functions sent by value (item 6), backend names
in another case or a generic word (item 7), ``--json`` failures (item 8), a worker extension
path that cannot be imported (item 9), and how tables and messages read (item 10). The CLI is
run as a user runs it, in a subprocess; executors are real, with real worker processes.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import plugin_sites
import psutil
import pytest
from plugin_sites import PLUGIN_DISTS, install

import hwlaunch
from hwlaunch.errors import ConfigError, WorkerError
from hwlaunch.executor.base import Executor
from hwlaunch.planning.facts import probe_device
from hwlaunch.planning.registry import default_registry

pytestmark = pytest.mark.usefixtures("clean_env")

# good_npu works; import_fails holds two plugins that fail; hook_raises has a misspelt hook.
SITE_DISTS = ("good_npu", "import_fails", "hook_raises")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test distributions of ``SITE_DISTS``, pip-installed once into a ``--target``."""
    root = tmp_path_factory.mktemp("bad_input_plugins")
    return install([PLUGIN_DISTS / name for name in SITE_DISTS], root / "site")


def hwlaunch_cli(
    *args: str, site: Path | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m hwlaunch.cli ARGS`` with only the given HWLAUNCH_* variables (and the
    plugins of ``site``), in the test's empty working directory."""
    return plugin_sites.hwlaunch_cli(site, *args, timeout=timeout, **env)


def user_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one message of a user error (exit 2, no traceback)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("hwlaunch: error: "), done.stderr
    return done.stderr


def plan_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def children() -> set[int]:
    """Pids of this process's children (the module's executor's workers among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


# --- item 1: a misspelt HWLAUNCH_* variable -----------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "meant"),
    [
        ("HWLAUNCH_WORLDSIZE", "4", "HWLAUNCH_WORLD_SIZE"),
        ("HWLAUNCH_START_METOD", "spawn", "HWLAUNCH_START_METHOD"),
        ("hwlaunch_backend", "cpu", "HWLAUNCH_BACKEND"),
        ("HWLAUNCH_DISABLE_PLUGIN", "xpu", "HWLAUNCH_DISABLE_PLUGINS"),
    ],
)
def test_item1_misspelt_variable_warns_with_did_you_mean(
    variable: str, value: str, meant: str
) -> None:
    plan = plan_of(hwlaunch_cli("resolve", "--json", **{variable: value}))
    found = [w for w in plan["warnings"] if variable in w]
    assert len(found) == 1, plan["warnings"]
    assert "is not one hwlaunch reads, so it is ignored" in found[0]
    assert f"did you mean {meant}?" in found[0]
    shown = hwlaunch_cli("resolve", **{variable: value})
    assert f"warning: environment variable {variable} is not one hwlaunch reads" in shown.stdout


def test_item1_every_variable_hwlaunch_reads_is_known() -> None:
    """No warning for any variable hwlaunch reads, settings and plugin selection alike."""
    env = {
        "HWLAUNCH_WORLD_SIZE": "2",
        "HWLAUNCH_START_METHOD": "spawn",
        "HWLAUNCH_PLUGINS": "",
        "HWLAUNCH_DISABLE_PLUGINS": "",
        "HWLAUNCH_STRICT_PLUGINS": "0",
        "HWLAUNCH_RPC_CHANNEL": "pipe",
        "HWLAUNCH_MAX_RESTARTS": "0",
    }
    plan = plan_of(hwlaunch_cli("resolve", "--json", "--backend", "cpu", **env))
    assert not [w for w in plan["warnings"] if "environment variable" in w], plan["warnings"]
    assert plan["world_size"] == 2


# --- item 2: HWLAUNCH_STRICT_PLUGINS values, and every failure in strict mode --------------------


@pytest.mark.parametrize("command", [("backends",), ("resolve", "--backend", "cpu")])
def test_item2_strict_value_that_is_no_yes_or_no_is_exit_2(command: tuple[str, ...]) -> None:
    message = user_error(hwlaunch_cli(*command, HWLAUNCH_STRICT_PLUGINS="banana"))
    assert "invalid HWLAUNCH_STRICT_PLUGINS 'banana' from env HWLAUNCH_STRICT_PLUGINS" in message
    assert "1, true, yes, on" in message and "0, false, no, off" in message


@pytest.mark.parametrize("value", ["1", "TRUE", "yes", "on"])
def test_item2_strict_accepts_the_documented_values(plugin_site: Path, value: str) -> None:
    done = hwlaunch_cli(
        "backends",
        site=plugin_site,
        HWLAUNCH_STRICT_PLUGINS=value,
        HWLAUNCH_PLUGINS="importfails",
    )
    assert "plugin 'importfails'" in user_error(done)


def test_item2_strict_mode_reports_every_failing_plugin(plugin_site: Path) -> None:
    done = hwlaunch_cli(
        "backends",
        site=plugin_site,
        HWLAUNCH_STRICT_PLUGINS="1",
        HWLAUNCH_PLUGINS="importfails,runtimefails,goodnpu",
    )
    message = user_error(done)
    assert "2 plugins failed to load" in message
    assert "ImportError: vendor runtime libnpu.so.7 not found" in message
    assert "RuntimeError: driver version mismatch at import" in message
    assert "HWLAUNCH_DISABLE_PLUGINS=importfails,runtimefails" in message


# --- item 3: plugin names that match nothing; a backend the variables excluded -------------------


def test_item3_allowlist_name_matching_no_plugin_warns(plugin_site: Path) -> None:
    plan = plan_of(hwlaunch_cli("resolve", "--json", site=plugin_site, HWLAUNCH_PLUGINS="godnpu"))
    (warning,) = [w for w in plan["warnings"] if "HWLAUNCH_PLUGINS" in w]
    assert "HWLAUNCH_PLUGINS names 'godnpu', which matches no installed plugin" in warning
    assert "did you mean 'goodnpu'?" in warning
    listing = hwlaunch_cli("backends", site=plugin_site, HWLAUNCH_PLUGINS="godnpu")
    assert listing.returncode == 0
    assert "warning: HWLAUNCH_PLUGINS names 'godnpu'" in listing.stdout


def test_item3_blocklist_name_matching_no_plugin_warns() -> None:
    plan = plan_of(hwlaunch_cli("resolve", "--json", HWLAUNCH_DISABLE_PLUGINS="xpu,cdua"))
    (warning,) = [w for w in plan["warnings"] if "HWLAUNCH_DISABLE_PLUGINS" in w]
    assert "'cdua', which matches no installed plugin; did you mean 'cuda'?" in warning


def test_item3_backend_excluded_by_the_allowlist_says_so(plugin_site: Path) -> None:
    done = hwlaunch_cli(
        "resolve", "--backend", "goodnpu", site=plugin_site, HWLAUNCH_PLUGINS="gooodnpu"
    )
    message = user_error(done)
    assert "backend 'goodnpu' from --backend is installed but excluded by HWLAUNCH_PLUGINS" in (
        message
    )
    assert "unknown backend" not in message


def test_item3_backend_excluded_by_the_blocklist_says_so() -> None:
    message = user_error(
        hwlaunch_cli("resolve", "--backend", "xpu", HWLAUNCH_DISABLE_PLUGINS="xpu")
    )
    assert "backend 'xpu' from --backend is installed but excluded by HWLAUNCH_DISABLE_PLUGINS" in (
        message
    )
    assert "did you mean" not in message


# --- item 4: collective_rpc arguments -----------------------------------------------------------


@pytest.fixture(scope="module")
def executor() -> Any:
    with hwlaunch.launch(world_size=2, backend="cpu", executor="mp", init_distributed=False) as ex:
        yield ex


BAD_CALLS = [
    ({"timeout": 0}, ValueError, "timeout must be > 0 seconds"),
    ({"timeout": -1}, ValueError, "timeout must be > 0 seconds"),
    ({"timeout": math.nan}, ValueError, "got nan"),
    ({"timeout": "5"}, TypeError, "timeout must be a number of seconds or None, got '5' (str)"),
    ({"timeout": True}, TypeError, "got True (bool)"),
    ({"args": 5}, TypeError, "args must be a tuple of positional arguments, got 5 (int)"),
    ({"args": "ab"}, TypeError, "for one argument write args=('ab',)"),
    ({"kwargs": [1]}, TypeError, "kwargs must be a dict of keyword arguments or None"),
    ({"kwargs": {1: 2}}, TypeError, "kwargs keys must be strings, got 1"),
    ({"method": 5}, TypeError, "method must be a worker method name (str) or a callable"),
    ({"method": ""}, ValueError, "method name is empty"),
    ({"unique_reply_rank": 7}, ValueError, "unique_reply_rank=7 is not a rank"),
]


@pytest.mark.parametrize(("given", "error", "text"), BAD_CALLS, ids=lambda v: repr(v)[:30])
def test_item4_bad_rpc_argument_raises_before_sending(
    executor: Executor, given: dict[str, Any], error: type[Exception], text: str
) -> None:
    call = {"method": "ping", **given}
    with pytest.raises(error) as info:
        executor.collective_rpc(**call)
    assert text in str(info.value)
    assert "collective_rpc" in str(info.value) or "unique_reply_rank" in str(info.value)
    assert not executor.closed
    assert len(executor.collective_rpc("ping", timeout=60)) == 2  # still usable


def test_item4_infinite_timeout_means_no_timeout(executor: Executor) -> None:
    assert len(executor.collective_rpc("ping", timeout=math.inf)) == 2
    assert executor.collective_rpc(lambda w, x: w.rank + x, args=[10]) == [10, 11]


# --- item 5: a plan of assumed facts is not launched ---------------------------------------------


def test_item5_plan_with_assumed_devices_is_refused_before_any_process() -> None:
    probed = probe_device(default_registry().get("cuda"))  # 0 here; any count on a GPU machine
    count = probed.device_count + 2
    plan = hwlaunch.resolve(backend="cuda", world_size=2, assume={"cuda.device_count": count})
    before = children()
    with pytest.raises(ConfigError) as info:
        hwlaunch.launch(plan)
    message = str(info.value)
    assert "launch() refuses this plan" in message
    assert f"cuda.device_count (assumed {count}, probed {probed.device_count})" in message
    if not probed.available:
        assert "cuda.available (assumed true, probed false)" in message
    assert children() == before


def test_item5_assumed_launcher_is_refused() -> None:
    plan = hwlaunch.resolve(backend="cpu", assume={"launcher": "torchrun"})
    assert plan.executor == "external"
    with pytest.raises(ConfigError, match=r"launcher \(assumed torchrun, detected none\)"):
        hwlaunch.launch(plan)


def test_item5_assumptions_this_machine_meets_still_launch() -> None:
    """Assuming what is true here (the cpu is available, the main is guarded) is no claim."""
    plan = hwlaunch.resolve(
        backend="cpu", world_size=2, assume={"cpu.available": True, "main_guard": "guarded"}
    )
    with hwlaunch.launch(plan, init_distributed=False) as ex:
        assert len(ex.collective_rpc("ping")) == 2


# --- item 6: remote tracebacks of functions sent by value ----------------------------------------


def test_item6_remote_traceback_names_the_users_file_and_line(executor: Executor) -> None:
    def explode(worker: Any) -> None:  # nested: cloudpickle sends it by value
        raise ValueError(f"boom on rank {worker.rank}")

    line = inspect.getsourcelines(explode)[1] + 1
    with pytest.raises(WorkerError) as info:
        executor.collective_rpc(explode)
    remote = info.value.remote_traceback
    assert "<dynamic-code>" not in remote
    assert f'File "{__file__}", line {line}, in explode' in remote
    assert 'raise ValueError(f"boom on rank {worker.rank}")' in remote  # the source line


# --- item 7: did-you-mean for backend names ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "hint"),
    [
        (("--backend", "CPU"), {}, "unknown backend 'CPU'; did you mean 'cpu'?"),
        (("--backend", "Cuda"), {}, "did you mean 'cuda'?"),
        ((), {"HWLAUNCH_BACKEND": "gpu"}, "unknown backend 'gpu'; did you mean 'cuda' or 'xpu'?"),
        (("--backend", "GPU"), {}, "did you mean 'cuda' or 'xpu'?"),
    ],
)
def test_item7_backend_name_hint(args: tuple[str, ...], env: dict[str, str], hint: str) -> None:
    assert hint in user_error(hwlaunch_cli("resolve", *args, **env))


# --- item 8: --json failures print one JSON object ------------------------------------------------


def json_error(done: subprocess.CompletedProcess[str], code: int) -> dict[str, Any]:
    assert done.returncode == code, (done.stdout, done.stderr)
    payload: dict[str, Any] = json.loads(done.stdout)
    error: dict[str, Any] = payload["error"]
    assert set(error) >= {"type", "message", "exit_code"}
    assert error["exit_code"] == code
    return error


@pytest.mark.parametrize(
    ("args", "env", "kind", "text"),
    [
        (("run", "--json", "--backend", "cdua"), {}, "BackendUnavailableError", "'cuda'"),
        (("run", "--json", "--max-new-tokens", "0"), {}, "BadParameter", "--max-new-tokens"),
        (("run", "--json", "-n", "2", "--executor", "uni"), {}, "ConfigError", "at most 1"),
        (("resolve", "--json", "--start-method", "spwan"), {}, "ConfigError", "'spawn'"),
        (("backends", "--json"), {"HWLAUNCH_STRICT_PLUGINS": "maybe"}, "ConfigError", "maybe"),
    ],
)
def test_item8_json_user_error_is_a_json_object_and_exit_2(
    args: tuple[str, ...], env: dict[str, str], kind: str, text: str
) -> None:
    done = hwlaunch_cli(*args, **env)
    error = json_error(done, 2)
    assert error["type"] == kind
    assert text in error["message"]
    assert "Traceback" not in done.stderr


def test_item8_json_worker_error_is_a_json_object_and_exit_1(tmp_path: Path) -> None:
    # A directory that passes the driver's checks (config.json of a Llama) but whose weights
    # file is not one: the workers fail to load it.
    model = tmp_path / "broken-weights"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "num_attention_heads": 2}')
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    done = hwlaunch_cli("run", "--json", "--model", str(model), "--max-new-tokens", "1")
    error = json_error(done, 1)
    assert error["type"] == "WorkerError"
    assert error["message"].startswith("rank 0 raised ")


# --- item 9: a worker extension path that cannot be imported -------------------------------------


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("no_such_pkg.mod:Extension", "no module named 'no_such_pkg.mod' is installed"),
        ("json.no_such_mod:Extension", "no module named 'json.no_such_mod'"),
        ("json:JSONDecoderr", "module 'json' ("),
        ("json:JSONDecoderr", "defines no 'JSONDecoderr'; did you mean 'JSONDecoder'?"),
        ("hwlaunch.cli._job:GenerationWorkr", "did you mean 'GenerationWorker'?"),
        ("json.NoColon", "is not an import path; write 'package.module:ClassName'"),
    ],
)
def test_item9_unimportable_extension_is_a_config_error_in_the_driver(path: str, text: str) -> None:
    before = children()
    with pytest.raises(ConfigError) as info:
        hwlaunch.launch(world_size=2, backend="cpu", executor="mp", worker_extension=path)
    assert f"worker_extension {path!r}" in str(info.value)
    assert text in str(info.value)
    assert children() == before


# --- item 10: tables and messages ----------------------------------------------------------------


def value_cell(explained: str, setting: str) -> list[str]:
    """The lines of the value column in ``setting``'s row of a plan table."""
    lines, inside = [], False
    for row in explained.splitlines():
        columns = [c.strip() for c in row.split("│")]
        if len(columns) < 4:
            continue
        if columns[1]:
            inside = columns[1] == setting
        if inside and columns[2]:
            lines.append(columns[2])
    return lines


@pytest.mark.parametrize("width", [80, 100, 140])
def test_item10_plan_table_never_splits_an_identifier(width: int) -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=2)
    worker = value_cell(plan.explain(width=width), "worker")
    assert "".join(worker) == plan.worker
    for line in worker[:-1]:
        assert line[-1] in ".:", worker  # broken after a separator, never inside a name


@pytest.mark.parametrize("width", [110, 140])
def test_item10_a_long_variable_name_widens_its_column(width: int) -> None:
    plan = hwlaunch.resolve(world_size=4, executor="ray", assume={"cuda.device_count": 2})
    noset = value_cell(plan.explain(width=width), "ray_noset_visibility_var")
    assert noset == ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]


def test_item10_plan_explain_ends_with_one_newline_and_no_padding() -> None:
    explained = hwlaunch.resolve(world_size=1, max_restarts=1).explain(width=100)
    assert explained.endswith("\n") and not explained.endswith("\n\n")
    assert all(line == line.rstrip() for line in explained.split("\n"))
    assert explained.startswith("hwlaunch plan: ")


def test_item10_executors_table_keeps_class_names_whole() -> None:
    done = hwlaunch_cli("backends", "--verbose")
    assert done.returncode == 0, done.stderr
    for name in ("UniExecutor", "MultiprocExecutor", "RayExecutor", "ExternalExecutor"):
        assert name in done.stdout


def test_item10_misspelt_hook_message_reads_cleanly(plugin_site: Path) -> None:
    done = hwlaunch_cli("backends", "--json", site=plugin_site, HWLAUNCH_PLUGINS="nohook")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["plugin"] == "nohook"]
    error = row["error"]
    assert "(did you mean 'hwlaunch_register_backends'?)" in error
    assert "?." not in error and "?:" not in error
