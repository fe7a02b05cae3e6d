"""forkserver as the fast safe start method: hwlaunch's own fork server per worker environment,
preloaded once, the fallback when fork is unsafe, and indifferent to a fork server that something
else started.

A fork server lives as long as its parent, so every test that starts one runs its own parent: a
script in a fresh interpreter, which prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import textwrap
from multiprocessing import forkserver, util
from pathlib import Path
from typing import Any

import pytest
from processes import run_json_script

import hwlaunch
from hwlaunch.executor.mp import _forkserver as hw_forkserver
from hwlaunch.executor.mp import _server_setup

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
        "from hwlaunch.executor.mp._forkserver import running_servers\n\n"
        "def server_pid():\n"
        "    (server,) = running_servers()\n"
        "    return server._forkserver_pid\n\n"
        "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    return run_json_script(script, timeout=150)


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
            "preload": running_servers()[0]._preload_modules,
            "stdlib_server": forkserver._forkserver._forkserver_pid,
            "server_has_torch": "libtorch" in maps,
            "parent_has_torch": "torch" in sys.modules,
        }))
        """,
    )
    assert seen["pids"][0] == seen["pids"][1]  # one server for both launches
    assert seen["parents"] == [seen["pids"][0]]  # the workers are its children
    assert seen["warned"] == []
    assert seen["preload"][0].startswith(hw_forkserver.SETUP_MODULE + ".t")  # clean-up, first
    assert seen["preload"][1].startswith(hw_forkserver.SETUP_MODULE + ".p")  # then the env
    assert seen["preload"][2:4] == CPU_PRELOAD
    assert "hwlaunch.executor.mp._child" in seen["preload"]
    assert seen["stdlib_server"] is None  # the standard library's own is not started
    assert seen["server_has_torch"]  # imported by the server, once...
    assert not seen["parent_has_torch"]  # ...and not inherited from this parent


def test_server_started_elsewhere_is_left_alone(tmp_path: Path) -> None:
    """The standard library's fork server, started by the program without any preload, neither
    serves hwlaunch's workers nor costs them the preload: no warning, torch preloaded."""
    seen = run_parent(
        tmp_path,
        """
        import multiprocessing, time
        other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
        other.start()
        other.join()
        first = forkserver._forkserver._forkserver_pid
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with hwlaunch.launch(
                backend="cpu", world_size=2, start_method="forkserver", init_distributed=False
            ) as ex:
                parents = {psutil.Process(p).ppid() for p in ex.collective_rpc("ping")}
                executor_warnings = ex.warnings
        ours = server_pid()
        print(json.dumps({
            "stdlib_kept": forkserver._forkserver._forkserver_pid == first,
            "parents": sorted(parents), "ours": ours, "other": first,
            "ours_has_torch": "libtorch" in open(f"/proc/{ours}/maps").read(),
            "executor": executor_warnings,
            "issued": [str(w.message) for w in caught],
        }))
        """,
    )
    assert seen["stdlib_kept"]
    assert seen["parents"] == [seen["ours"]] and seen["ours"] != seen["other"]
    assert seen["ours_has_torch"]
    assert seen["executor"] == [] and seen["issued"] == []


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


# -- one server per (environment, preload), without processes -----------------------------------
def test_one_server_per_environment_and_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw_forkserver, "_servers", {})
    cpu = tuple(CPU_PRELOAD)
    one = hw_forkserver.server_for({"OMP_NUM_THREADS": "1"}, cpu)
    assert hw_forkserver.server_for({"OMP_NUM_THREADS": "1"}, cpu) is one  # reused
    assert hw_forkserver.server_for({"OMP_NUM_THREADS": "2"}, cpu) is not one
    assert hw_forkserver.server_for({"OMP_NUM_THREADS": "1"}, ("torch",)) is not one
    preload: list[str] = one._preload_modules  # type: ignore[attr-defined]
    clean_up = f"{hw_forkserver.SETUP_MODULE}.t{util.get_temp_dir().encode().hex()}"
    assert preload[0] == clean_up
    assert preload[1].startswith(hw_forkserver.SETUP_MODULE + ".p")
    assert preload[2:] == [*CPU_PRELOAD, *hw_forkserver.EXECUTOR_MODULES]
    bare = hw_forkserver.server_for({}, cpu)
    assert bare._preload_modules == [clean_up, *CPU_PRELOAD, *hw_forkserver.EXECUTOR_MODULES]  # type: ignore[attr-defined]
    assert hw_forkserver.running_servers() == []  # none started: that is the first worker's


def test_a_temporary_folder_inherited_from_another_process_is_not_the_servers_to_remove(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process forked from this one shares its ``multiprocessing`` folder, which this one
    removes at its exit: a server the child starts gets no clean-up module for it."""
    monkeypatch.setattr(hw_forkserver, "_servers", {})
    util.get_temp_dir()  # made (and owned) here, before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its server's preload, then leave at once
        try:
            preload = hw_forkserver.server_for({}, ("torch",))._preload_modules  # type: ignore[attr-defined]
            os.write(write, json.dumps(preload).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        preload = json.loads(reader.read())
    os.waitpid(pid, 0)
    assert preload == ["torch", *hw_forkserver.EXECUTOR_MODULES]
    here = hw_forkserver.server_for({}, ("torch",))
    first: str = here._preload_modules[0]  # type: ignore[attr-defined]
    assert first.startswith(hw_forkserver.SETUP_MODULE + ".t")  # here, the owner: one


def test_the_server_removes_the_folder_only_once_its_parent_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "pymp-x"
    (folder / "sub").mkdir(parents=True)
    (folder / "listener-1").touch()
    _server_setup._remove_orphaned(str(folder), os.getppid())  # the parent lives: its folder
    assert folder.exists()
    _server_setup._remove_orphaned(str(folder), os.getpid())  # another parent: gone
    assert not folder.exists()


def test_the_environment_travels_in_a_private_file_not_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The preload list is the server's command line, which other users can read: it names
    a file that only this user can read, and holds no value."""
    monkeypatch.setattr(hw_forkserver, "_servers", {})
    server = hw_forkserver.server_for({"SECRET_TOKEN": "s3cr3t"}, ("torch",))
    name: str = server._preload_modules[1]  # type: ignore[attr-defined]
    assert "s3cr3t" not in name and b"s3cr3t".hex() not in name
    path = bytes.fromhex(name.removeprefix(hw_forkserver.SETUP_MODULE + ".p")).decode()
    assert json.loads(Path(path).read_text()) == {"SECRET_TOKEN": "s3cr3t"}
    assert os.stat(path).st_mode & 0o077 == 0
    os.unlink(path)


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
