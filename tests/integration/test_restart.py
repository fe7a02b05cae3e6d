"""Restarts (``max_restarts``) with real worker processes and real torch.distributed groups.

A worker is SIGKILLed (by the test) or ends itself during a setup call; the executor replaces
the whole group, replays the setup calls, and later calls reach the new group. Every test
checks that no process it started (workers of every generation) is left.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch  # noqa: F401  (fork workers inherit it instead of importing it each)
from processes import processes, running, wait_until

import hwlaunch
from hwlaunch import Plan, WorkerDiedError
from hwlaunch.errors import ConfigError

METHODS = ["fork", "forkserver", "spawn"]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

pytestmark = pytest.mark.timeout(240)


# -- what the workers run (module functions: sent by reference) ----------------------------
def load_model(worker: Any, value: int) -> int:
    """A setup call: the state it leaves must be there again after a restart."""
    worker.model = value * 10 + worker.rank
    return int(os.environ["RESTART_COUNT"])


def use_model(worker: Any) -> tuple[int, str, str, str]:
    return (
        worker.model,
        os.environ["RESTART_COUNT"],
        os.environ["TORCHELASTIC_RESTART_COUNT"],
        os.environ["MASTER_PORT"],
    )


def fail_setup_on_restart(worker: Any) -> None:
    if os.environ["RESTART_COUNT"] != "0" and worker.rank == 1:
        raise RuntimeError("the checkpoint is gone")


def die_in_setup_on_first_restart(worker: Any) -> None:
    if os.environ["RESTART_COUNT"] == "1" and worker.rank == 1:
        os._exit(5)


def block(worker: Any, marker_dir: str) -> None:
    Path(marker_dir, f"rank{worker.rank}").touch()
    time.sleep(120)


# -- helpers -------------------------------------------------------------------------------


def clean_plan(**kwargs: Any) -> Plan:
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("HWLAUNCH_"):
                mp.delenv(name)
        mp.chdir(SCRIPTS)
        return hwlaunch.resolve(backend="cpu", **kwargs)


class Tracker:
    """Launches executors and remembers every worker of every generation."""

    def __init__(self) -> None:
        self.executors: list[Any] = []
        self.procs: list[psutil.Process] = []

    def launch(self, method: str, max_restarts: int, world_size: int = 2) -> Any:
        plan = clean_plan(
            world_size=world_size, executor="mp", start_method=method, max_restarts=max_restarts
        )
        executor = hwlaunch.launch(plan)
        self.executors.append(executor)
        self.seen(executor)
        return executor

    def seen(self, executor: Any) -> list[int]:
        pids = list(executor.pids)
        self.procs += processes(pids)
        return pids

    def close(self) -> None:
        for executor in self.executors:
            executor.shutdown()
        left = [p.pid for p in self.procs if running(p)]
        for proc in self.procs:
            if running(proc):
                proc.kill()
        assert not left, f"workers left after shutdown: {left}"


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker()
    yield t
    t.close()


def kill_during_rpc(executor: Any, rank: int, markers: Path) -> WorkerDiedError:
    pid = executor.pids[rank]

    def killer() -> None:
        wait_until(lambda: len(list(markers.iterdir())) == 2, 60, "both ranks in the RPC")
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with pytest.raises(WorkerDiedError) as info:
        executor.collective_rpc(block, args=(str(markers),), timeout=90)
    thread.join()
    return info.value


# -- the setting ---------------------------------------------------------------------------
def test_max_restarts_from_keyword_env_and_config(clean_env: Path) -> None:
    assert hwlaunch.resolve(backend="cpu").decision("max_restarts").value == 0
    plan = hwlaunch.resolve(backend="cpu", executor="mp", max_restarts=2)
    assert (plan.max_restarts, plan.decision("max_restarts").source) == (
        2,
        "resolve(max_restarts=)",
    )
    (clean_env / "hwlaunch.toml").write_text("max_restarts = 3\n")
    plan = hwlaunch.resolve(backend="cpu", executor="mp")
    assert (plan.max_restarts, plan.decision("max_restarts").source) == (3, "hwlaunch.toml:1")
    os.environ["HWLAUNCH_MAX_RESTARTS"] = "4"
    try:
        plan = hwlaunch.resolve(backend="cpu", executor="mp")
        assert plan.decision("max_restarts").source == "env HWLAUNCH_MAX_RESTARTS"
        assert plan.to_dict()["max_restarts"] == 4
        os.environ["HWLAUNCH_MAX_RESTARTS"] = "-1"
        with pytest.raises(ConfigError, match=r"HWLAUNCH_MAX_RESTARTS.*>= 0"):
            hwlaunch.resolve(backend="cpu")
    finally:
        del os.environ["HWLAUNCH_MAX_RESTARTS"]


def test_uni_stays_fail_stop_and_says_so(clean_env: Path) -> None:
    plan = hwlaunch.resolve(backend="cpu", executor="uni", max_restarts=2)
    assert plan.max_restarts == 0
    assert any("uni executor" in w and "max_restarts 2" in w for w in plan.warnings)


# -- restarts ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_restart_replays_setup_then_budget_runs_out(
    method: str, tracker: Tracker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    executor = tracker.launch(method, max_restarts=1)
    assert executor.collective_rpc(load_model, args=(7,), setup=True) == [0, 0]
    before = executor.collective_rpc(use_model)
    assert [b[:3] for b in before] == [(70, "0", "0"), (71, "0", "0")]
    old_pids = list(executor.pids)
    markers = tmp_path / "m1"
    markers.mkdir()
    with caplog.at_level(logging.WARNING, logger="hwlaunch"):
        err = kill_during_rpc(executor, 1, markers)
    assert err.restarted and err.rank == 1 and err.pid == old_pids[1]
    assert "killed by signal SIGKILL" in str(err) and "restart 1" in str(err)
    assert executor.restarts == 1
    new_pids = tracker.seen(executor)
    assert set(new_pids).isdisjoint(old_pids)
    after = executor.collective_rpc(use_model)
    assert [a[:3] for a in after] == [(70, "1", "1"), (71, "1", "1")]
    assert after[0][3] != before[0][3]  # a fresh rendezvous
    assert executor.collective_rpc("all_reduce_rank") == [1, 1]
    note = f"restart 1 of 1: worker rank 1 (pid {old_pids[1]}) failed: killed by signal SIGKILL"
    assert note in executor.plan.warnings
    assert any(note in r.getMessage() for r in caplog.records)
    assert not any(running(p) for p in processes(old_pids))

    markers = tmp_path / "m2"
    markers.mkdir()
    final = kill_during_rpc(executor, 0, markers)
    assert not final.restarted and final.rank == 0
    assert "no restart left (max_restarts 1)" in str(final)
    assert note in str(final) and final.restarts == (note,)
    with pytest.raises(WorkerDiedError) as again:
        executor.collective_rpc("ping")
    assert again.value is final
    assert executor.closed  # as every call says
    assert not any(running(p) for p in processes(new_pids))


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_an_executor_whose_budget_is_spent_says_it_is_closed(
    max_restarts: int, tracker: Tracker
) -> None:
    """Deaths between calls, one more than the budget: ``closed`` turns True by itself, before
    any call asks, and every call then raises the WorkerDiedError that ended it."""
    executor = tracker.launch("fork", max_restarts=max_restarts)
    for restart in range(max_restarts + 1):
        wait_until(lambda n=restart: executor.restarts == n, 60, f"restart {restart}")
        assert not executor.closed
        pids = tracker.seen(executor)
        os.kill(pids[1], signal.SIGKILL)
    wait_until(lambda: executor.closed, 60, "the executor to say it is closed")
    with pytest.raises(WorkerDiedError) as info:
        executor.collective_rpc("ping")
    assert info.value.rank == 1 and not info.value.restarted


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_death_between_calls_restarts_in_the_background(method: str, tracker: Tracker) -> None:
    executor = tracker.launch(method, max_restarts=2)
    executor.collective_rpc(load_model, args=(3,), setup=True)
    old = list(executor.pids)
    os.kill(old[0], signal.SIGKILL)
    wait_until(lambda: executor.restarts == 1, 60, "the restart")
    tracker.seen(executor)
    assert executor.collective_rpc(use_model)[1][:2] == (31, "1")  # no error: already replaced
    executor.check_health()
    assert executor.restarts == 1


def test_setup_call_failing_during_restart_ends_the_executor(tracker: Tracker) -> None:
    executor = tracker.launch("fork", max_restarts=3)
    executor.collective_rpc(fail_setup_on_restart, setup=True)
    old = list(executor.pids)
    os.kill(old[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        wait_until(lambda: executor.check_health() is not None, 60, "the failed restart")
    err = info.value
    assert not err.restarted and executor.restarts == 1
    assert "a setup call failed during restart 1" in str(err)
    assert "the checkpoint is gone" in str(err)
    assert len(err.restarts) == 1


def test_worker_dying_during_a_restart_uses_the_next_restart(tracker: Tracker) -> None:
    executor = tracker.launch("fork", max_restarts=2)
    executor.collective_rpc(die_in_setup_on_first_restart, setup=True)
    executor.collective_rpc(load_model, args=(5,), setup=True)
    os.kill(executor.pids[1], signal.SIGKILL)
    wait_until(lambda: executor.restarts == 2, 60, "two restarts")
    tracker.seen(executor)
    assert executor.collective_rpc(use_model)[1][:2] == (51, "2")
    notes = [w for w in executor.plan.warnings if w.startswith("restart ")]
    assert len(notes) == 2 and "exited with code 5" in notes[1]


def test_worker_dying_during_the_last_restart_ends_with_every_note(tracker: Tracker) -> None:
    executor = tracker.launch("fork", max_restarts=1)
    executor.collective_rpc(die_in_setup_on_first_restart, setup=True)
    os.kill(executor.pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        wait_until(lambda: executor.check_health() is not None, 60, "the end")
    err = info.value
    assert executor.restarts == 1 and not err.restarted
    assert "exited with code 5" in str(err) and "no restart left" in str(err)
    assert len(err.restarts) == 1 and "killed by signal SIGKILL" in err.restarts[0]


def test_call_past_its_timeout_restarts_the_group(tracker: Tracker, tmp_path: Path) -> None:
    from hwlaunch import RpcTimeoutError

    executor = tracker.launch("fork", max_restarts=1)
    old = list(executor.pids)
    with pytest.raises(RpcTimeoutError) as info:
        executor.collective_rpc(block, args=(str(tmp_path),), timeout=1.0)
    assert info.value.restarted and executor.restarts == 1
    assert set(tracker.seen(executor)).isdisjoint(old)
    assert executor.collective_rpc("all_reduce_rank") == [1, 1]
    note = executor.plan.warnings[-1]
    assert "did not answer collective_rpc 'block' within 1s" in note
    assert f"worker rank 0 (pid {old[0]}) failed" in note  # the real pid, not None
