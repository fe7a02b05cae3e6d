"""forkserver as the fast safe start method: preloaded once per parent, the fallback when fork is
unsafe, and a warning when something else started the fork server without the preload.

The fork server is a per-parent singleton, so every test that starts one runs its own parent: a
script in a fresh interpreter, which prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest

import hwlaunch
from hwlaunch.executor.mp import _forkserver as hw_forkserver

CPU_PRELOAD = ["torch", "hwlaunch.plugins.cpu.worker"]
GUARDED = {"main_guard": "guarded"}

pytestmark = pytest.mark.timeout(180)


def run_parent(tmp_path: Path, body: str) -> dict[str, Any]:
    """Run ``body`` as the main() of a fresh guarded script; return the JSON it printed last."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import json, os, sys, warnings\n"
        "from multiprocessing import forkserver\n"
        "import psutil\n"
        "import hwlaunch\n\n"
        "def server_pid():\n"
        "    return forkserver._forkserver._forkserver_pid\n\n"
        "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# -- real fork servers ---------------------------------------------------------------------------
def test_server_starts_once_with_the_preload_and_workers_fork_from_it(tmp_path: Path) -> None:
    seen = run_parent(
        tmp_path,
        """
        pids, warned = [], []
        for _ in range(2):
            with hwlaunch.launch(
                backend="cpu", world_size=2, start_method="forkserver", init_distributed=False
            ) as ex:
                warned += ex.warnings
                pids.append(server_pid())
                parents = {psutil.Process(p).ppid() for p in ex.collective_rpc("ping")}
        maps = open(f"/proc/{pids[0]}/maps").read()
        print(json.dumps({
            "pids": pids, "parents": sorted(parents), "warned": warned,
            "preload": forkserver._forkserver._preload_modules,
            "server_has_torch": "libtorch" in maps,
            "parent_has_torch": "torch" in sys.modules,
        }))
        """,
    )
    assert seen["pids"][0] == seen["pids"][1]  # one server for both launches
    assert seen["parents"] == [seen["pids"][0]]  # the workers are its children
    assert seen["warned"] == []
    assert seen["preload"][:2] == CPU_PRELOAD
    assert "hwlaunch.executor.mp._child" in seen["preload"]
    assert seen["server_has_torch"]  # imported by the server, once...
    assert not seen["parent_has_torch"]  # ...and not inherited from this parent


def test_server_started_elsewhere_without_the_preload_is_a_warning(tmp_path: Path) -> None:
    seen = run_parent(
        tmp_path,
        """
        import multiprocessing, time
        other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
        other.start()
        other.join()
        first = server_pid()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with hwlaunch.launch(
                backend="cpu", world_size=2, start_method="forkserver", init_distributed=False
            ) as ex:
                answers = ex.collective_rpc("ping")
                executor_warnings = ex.warnings
        print(json.dumps({
            "same_server": server_pid() == first,
            "answers": len(answers),
            "executor": executor_warnings,
            "issued": [str(w.message) for w in caught],
        }))
        """,
    )
    assert seen["same_server"]
    assert seen["answers"] == 2  # slower to start, but it works
    (warning,) = seen["executor"]
    assert "already running without preloading torch, hwlaunch.plugins.cpu.worker" in warning
    assert any("already running without preloading" in w for w in seen["issued"])


def test_server_started_elsewhere_with_the_preload_is_fine(tmp_path: Path) -> None:
    seen = run_parent(
        tmp_path,
        """
        import multiprocessing, time
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "hwlaunch.plugins.cpu.worker"])
        other = ctx.Process(target=time.sleep, args=(0,))
        other.start()
        other.join()
        with hwlaunch.launch(
            backend="cpu", world_size=2, start_method="forkserver", init_distributed=False
        ) as ex:
            print(json.dumps({"executor": ex.warnings}))
        """,
    )
    assert seen["executor"] == []


def test_fork_unsafe_launch_falls_back_to_the_fork_server(tmp_path: Path) -> None:
    """The default path when fork is unsafe: the plan picks forkserver, and workers start."""
    seen = run_parent(
        tmp_path,
        """
        plan = hwlaunch.resolve(
            backend="cpu", world_size=2, assume={"in_ray_actor": True, "main_guard": "guarded"}
        )
        with hwlaunch.launch(plan, init_distributed=False) as ex:
            print(json.dumps({
                "method": plan.start_method, "preload": list(plan.preload),
                "answers": len(ex.collective_rpc("ping")), "server": server_pid() is not None,
            }))
        """,
    )
    assert seen == {"method": "forkserver", "preload": CPU_PRELOAD, "answers": 2, "server": True}


# -- prepare_forkserver without processes ----------------------------------------------------------
class FakeServer:
    def __init__(self, pid: int | None, preload: list[str]) -> None:
        self._forkserver_pid = pid
        self._preload_modules = preload


class FakeContext:
    def __init__(self) -> None:
        self.preload: list[str] | None = None

    def set_forkserver_preload(self, modules: list[str]) -> None:
        self.preload = modules


def prepare(
    monkeypatch: pytest.MonkeyPatch,
    server: FakeServer,
    preload: tuple[str, ...],
    earlier: tuple[str, ...] | None = None,
) -> tuple[list[str], FakeContext]:
    monkeypatch.setattr(forkserver, "_forkserver", server)
    monkeypatch.setattr(hw_forkserver, "_preloaded", earlier)
    ctx = FakeContext()
    fake: Any = ctx  # stands in for a multiprocessing context
    return hw_forkserver.prepare_forkserver(fake, preload), ctx


def test_not_started_yet_sets_the_plans_modules_and_the_executors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warnings, ctx = prepare(monkeypatch, FakeServer(None, ["__main__"]), tuple(CPU_PRELOAD))
    assert warnings == []
    assert ctx.preload == [*CPU_PRELOAD, *hw_forkserver.EXECUTOR_MODULES]


def test_started_by_an_earlier_launch_with_other_modules_names_the_missing_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    earlier = (*CPU_PRELOAD, *hw_forkserver.EXECUTOR_MODULES)
    cuda = ("torch", "hwlaunch.plugins.cuda.worker")
    warnings, ctx = prepare(monkeypatch, FakeServer(123, list(earlier)), cuda, earlier)
    assert ctx.preload is None  # too late to change what the running server imported
    (warning,) = warnings
    assert "without preloading hwlaunch.plugins.cuda.worker;" in warning
    assert prepare(monkeypatch, FakeServer(123, []), tuple(CPU_PRELOAD), earlier)[0] == []


def test_started_by_something_else_is_judged_by_its_preload_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (warning,) = prepare(monkeypatch, FakeServer(123, ["__main__"]), tuple(CPU_PRELOAD))[0]
    assert "without preloading torch, hwlaunch.plugins.cpu.worker;" in warning
    assert "Launch through hwlaunch before anything else starts the fork server" in warning
    assert prepare(monkeypatch, FakeServer(123, CPU_PRELOAD), tuple(CPU_PRELOAD))[0] == []


# -- the rule: forkserver when fork is unsafe, and the plan says why ------------------------------
def test_cuda_initialized_plans_forkserver_and_says_why() -> None:
    plan = hwlaunch.resolve(
        world_size=2, assume={**GUARDED, "cuda.initialized": True, "cuda.device_count": 2}
    )
    decision = plan.decision("start_method")
    assert plan.start_method == "forkserver"
    assert plan.preload == ("torch", "hwlaunch.plugins.cuda.worker")
    assert "fork is unsafe: cuda is already initialized" in decision.reason
    assert "using forkserver instead: the fallback of backend cuda" in decision.reason
    assert "imports torch, hwlaunch.plugins.cuda.worker once" in decision.reason
    assert any("'forkserver' instead of fork" in w for w in plan.warnings)


def test_fallback_not_offered_by_the_os_takes_the_next_allowed_method() -> None:
    plan = hwlaunch.resolve(
        world_size=2,
        assume={
            **GUARDED,
            "cuda.initialized": True,
            "cuda.device_count": 2,
            "start_methods": "fork,spawn",
        },
    )
    assert plan.start_method == "spawn"
    reason = plan.decision("start_method").reason
    assert "the rule's fallback 'forkserver' is not offered by this OS (assumed)" in reason
    assert "each worker starts a fresh interpreter" in reason


def test_xpu_stays_spawn_only() -> None:
    plan = hwlaunch.resolve(world_size=2, assume={**GUARDED, "xpu.device_count": 2})
    assert (plan.backend, plan.start_method, plan.preload) == ("xpu", "spawn", ())


def test_the_fork_server_of_this_process_is_untouched_by_planning() -> None:
    """resolve() is pure: planning forkserver neither starts the server nor sets its preload."""
    server: Any = forkserver._forkserver
    before = (server._forkserver_pid, list(server._preload_modules))
    hwlaunch.resolve(world_size=2, assume={**GUARDED, "in_ray_actor": True})
    assert (server._forkserver_pid, list(server._preload_modules)) == before
