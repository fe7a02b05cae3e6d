"""Fork in a multi-threaded parent: the threads as a fact, the rule that follows, and real
programs that deadlocked under the old default.

A forked child keeps only the thread that forked. After one parallel torch operation in the
parent, GNU libgomp's pool is started, and a forked worker waits for ever in its first matmul
for pool threads it does not have; a Python thread may hold a lock at the fork that then stays
locked in the child; numpy's OpenBLAS server stops itself around a fork and is harmless. (What a
fork really does beside each library's threads: test_fork_beside_libraries.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from processes import run_json_script

import hwlaunch
from hwlaunch.planning.threads import probe_threads

pytestmark = pytest.mark.timeout(240)

GUARDED = {"main_guard": "guarded"}


def plan_with(threads: str, **settings: Any) -> hwlaunch.Plan:
    assume = {"threads": threads, **GUARDED, **settings.pop("assume", {})}
    return hwlaunch.resolve(backend=settings.pop("backend", "cpu"), assume=assume, **settings)


# -- the rule, with assumed threads --------------------------------------------------------------
def test_a_started_openmp_pool_makes_the_default_fall_back_to_the_fork_server() -> None:
    plan = plan_with("openmp:2,my-poller", world_size=2)
    decision = plan.decision("start_method")
    assert plan.start_method == "forkserver"
    assert plan.preload == ("torch", "hwlaunch.plugins.cpu.worker")
    assert decision.source == "fact: threads (assumed)"
    text = "2 threads: 2 of torch's GNU OpenMP pool (libgomp.so.1) (assumed)"
    assert text in decision.reason
    assert any(f"instead of fork: this process has {text}" in w for w in plan.warnings)
    threads = plan.decision("threads")
    assert threads.value == "fatal" and threads.source == "fact: threads (assumed)"
    assert "fatal: 2 of torch's GNU OpenMP pool (libgomp.so.1): GNU libgomp" in threads.reason
    assert "risk: 'my-poller': a lock another thread holds" in threads.reason


def test_a_python_thread_alone_makes_the_default_fall_back_too() -> None:
    plan = plan_with("my-poller", world_size=2)
    assert plan.start_method == "forkserver"
    assert any("1 thread: 'my-poller'" in w and "stays locked" in w for w in plan.warnings)


def test_no_other_thread_keeps_fork_without_a_word() -> None:
    plan = plan_with("none", world_size=2)
    assert plan.start_method == "fork"
    assert not [w for w in plan.warnings if "thread" in w]
    assert plan.decision("threads").value == "none"


@pytest.mark.parametrize(
    ("threads", "shown"),
    [
        ("openblas", "a thread of numpy's OpenBLAS (libscipy_openblas64_.so)"),
        ("openblas:2,iomp:2", "2 of numpy's OpenBLAS (libscipy_openblas64_.so), 2 of Intel"),
    ],
)
def test_known_fork_safe_threads_keep_fork_counted_and_shown_without_a_warning(
    threads: str, shown: str
) -> None:
    plan = plan_with(threads, world_size=2)
    assert plan.start_method == "fork"
    assert plan.decision("start_method").source == "rule of backend cpu"
    assert not [w for w in plan.warnings if "thread" in w]
    decision = plan.decision("threads")
    assert decision.value == "safe" and decision.reason.startswith(f"safe: {shown}")
    assert "OpenBLAS stops its threads in a pthread_atfork handler" in decision.reason


def test_an_explicit_fork_beside_known_fork_safe_threads_says_nothing_either() -> None:
    plan = plan_with("openblas:2,iomp", world_size=2, start_method="fork")
    assert plan.start_method == "fork" and not plan.warnings


def test_safe_threads_beside_a_risky_one_fall_back_naming_only_the_risky_one() -> None:
    plan = plan_with("openblas,grpc:3", world_size=2)
    assert plan.start_method == "forkserver"
    warning = next(w for w in plan.warnings if "instead of fork" in w)
    assert "this process has 3 threads: 3 of grpc's gRPC (cygrpc.so)" in warning
    assert "fails now and then" in warning and "OpenBLAS" not in warning
    assert plan.decision("threads").value == "risk"


def test_a_thread_the_kernel_showed_running_is_a_risk_whatever_its_library() -> None:
    from hwlaunch.planning.fork_safety import at_fork
    from hwlaunch.runtime_facts import ThreadInfo

    busy = ThreadInfo("python", "native", running=True)
    assert at_fork(busy).verdict == "risk" and "busy pool" in at_fork(busy).why
    assert busy.label() == "a native thread (running)"


def test_an_explicit_fork_beside_a_started_openmp_pool_is_an_error_with_the_fix() -> None:
    with pytest.raises(hwlaunch.StartMethodError) as info:
        plan_with("openmp:1", world_size=2, start_method="fork")
    text = str(info.value)
    assert "start method 'fork' from resolve(start_method=) cannot work" in text
    assert "1 thread: a thread of torch's GNU OpenMP pool (libgomp.so.1)" in text
    assert "deadlock in their first parallel operation" in text
    assert "Fix: use start method 'forkserver'" in text
    assert "before the first parallel torch operation" in text


def test_an_explicit_fork_beside_other_threads_is_honoured_with_a_warning() -> None:
    plan = plan_with("my-poller,native:2", world_size=2, start_method="fork")
    assert plan.start_method == "fork"
    warning = next(w for w in plan.warnings if w.startswith("fork was requested"))
    assert "3 threads: 'my-poller', 2 native threads" in warning
    assert "a lock another thread holds at that moment stays locked in the child" in warning


def test_an_unguarded_main_with_threads_keeps_fork_and_says_both() -> None:
    plan = plan_with("my-poller", world_size=2, assume={"main_guard": "unguarded"})
    assert plan.start_method == "fork"
    warning = next(w for w in plan.warnings if "using fork instead" in w)
    assert "although this process has 1 thread: 'my-poller'" in warning
    assert not [w for w in plan.warnings if "instead of fork" in w]  # one story, not two


def test_an_unguarded_main_with_a_started_openmp_pool_is_an_error_naming_both() -> None:
    with pytest.raises(hwlaunch.MissingMainGuardError) as info:
        plan_with("openmp:1", world_size=2, assume={"main_guard": "unguarded"})
    text = str(info.value)
    assert (
        "fork is not an option: this process has 1 thread: a thread of torch's GNU OpenMP" in text
    )
    assert "deadlock" in text


@pytest.mark.parametrize(
    ("backend", "devices", "expected"),
    [
        ("cuda", {"cuda.device_count": 2}, "forkserver"),
        ("hpu", {"hpu.device_count": 2}, "spawn"),
        ("xpu", {"xpu.device_count": 2}, "spawn"),
    ],
)
def test_each_backends_fallback_applies(
    backend: str, devices: dict[str, int], expected: str
) -> None:
    plan = plan_with("openmp:2", backend=backend, world_size=2, assume=devices)
    assert plan.start_method == expected


def test_threads_are_in_the_json_plan() -> None:
    facts = plan_with("openmp:2,my-poller", world_size=2).to_dict()["facts"]
    threads = facts["threads"]
    assert threads["count"] == 3 and threads["source"] == "assumed"
    assert "threads" in facts["assumed"]
    assert [t["kind"] for t in threads["threads"]] == ["native", "native", "python"]
    known = [t["known_library"] for t in threads["threads"]]
    assert known == ["GNU OpenMP pool", "GNU OpenMP pool", None]


@pytest.mark.parametrize("bad", ["openmp:x", "native:-1", "poller:2", "openblas:two"])
def test_a_bad_threads_assumption_names_the_value_and_the_syntax(bad: str) -> None:
    with pytest.raises(hwlaunch.ConfigError, match="expected none, or a comma-separated list"):
        plan_with(bad, world_size=2)


def test_the_cli_shows_the_threads_and_the_fallback() -> None:
    assume = ["--assume", "threads=openmp:2,my-poller", "--assume", "main_guard=guarded"]
    command = [sys.executable, "-m", "hwlaunch.cli", "resolve", "-n", "2", "--backend", "cpu"]
    proc = subprocess.run(
        [*command, *assume, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["start_method"] == "forkserver"
    summary = plan["facts"]["threads"]["summary"]
    assert summary.startswith("3 threads: 2 of torch's GNU OpenMP pool")
    threads = next(d for d in plan["decisions"] if d["setting"] == "threads")
    assert threads["value"] == "fatal" and threads["reason"].startswith("fatal: 2 of torch's")


def test_a_plugin_cannot_propose_fork_where_the_rules_refuse_it() -> None:
    from hwlaunch.planning.policy import Proposal, apply_proposals
    from hwlaunch.planning.registry import default_registry
    from hwlaunch.planning.settings import Overrides

    plan = plan_with("my-poller", world_size=2)
    spec = default_registry().specs["cpu"]
    proposal = Proposal("site", "start_method", "fork", "fork is fastest")
    adjusted, dropped = apply_proposals(plan, spec, Overrides(), [proposal])
    assert adjusted.start_method == "forkserver"
    assert dropped == [
        "plugin site: proposal start_method='fork' dropped: fork is unsafe: this process has "
        "1 thread: 'my-poller' (assumed), and a forked child keeps only the thread that forks: "
        "a lock another thread holds at that moment stays locked in the child for ever"
    ]


# -- the probe, on real threads ------------------------------------------------------------------
def test_the_probe_names_python_threads_and_leaves_hwlaunchs_own_apart() -> None:
    stop = threading.Event()
    mine = threading.Thread(target=stop.wait, name="my-poller", daemon=True)
    ours = threading.Thread(target=stop.wait, name="hwlaunch-monitor", daemon=True)
    before = probe_threads()
    mine.start()
    ours.start()
    try:
        during = probe_threads()
    finally:
        stop.set()
    added = [t for t in during.others if t not in before.others]
    assert [t.label() for t in added] == ["'my-poller'"]
    assert during.own == before.own + 1


PROBE = """
import json, os, sys
from hwlaunch.planning.threads import probe_threads
seen = {"start": probe_threads().to_dict()}
import torch
import time
seen["after_import"] = probe_threads().to_dict()
x = torch.randn(256, 256)
float((x @ x).sum())
# A pool thread is placed once it sleeps in libgomp; one that a busy machine keeps from running
# reads "running" (no registers) for a while: probe until it is placed, for up to 10 s.
deadline = time.monotonic() + 10
while True:
    seen["after_matmul"] = probe_threads().to_dict()
    known = [t["known_library"] for t in seen["after_matmul"]["threads"]]
    if "GNU OpenMP pool" in known or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps(seen))
"""


def test_the_probe_sees_numpys_openblas_at_import_and_torchs_openmp_pool_after_an_op() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["start"]["count"] == 0 and seen["start"]["source"] == "/proc/self/task"
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: neither OpenBLAS nor torch starts a pool")
    blas = [t for t in seen["after_import"]["threads"] if t["known_library"] == "OpenBLAS"]
    assert blas and all(t["owner"] == "numpy" and t["kind"] == "native" for t in blas)
    assert blas[0]["library"].startswith(("libscipy_openblas", "libopenblas"))
    pool = [t for t in seen["after_matmul"]["threads"] if t["known_library"] == "GNU OpenMP pool"]
    assert pool and all(t["owner"] == "torch" for t in pool)
    assert pool[0]["library"].startswith("libgomp")


SPINNING = """
import json
import numpy as np
from hwlaunch.planning.threads import probe_threads
a = np.random.rand(600, 600)
float((a @ a).sum())  # OpenBLAS's threads spin about 2**28 CPU cycles before they sleep
print(json.dumps(probe_threads().to_dict()))
"""


def test_the_probe_waits_for_openblas_threads_spinning_after_a_matmul() -> None:
    """Probed at once after the matmul, OpenBLAS's threads are still on a CPU (the kernel
    shows ``running``, no registers); the probe looks again until they sleep, and places them."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: OpenBLAS starts no thread")
    proc = subprocess.run(
        [sys.executable, "-c", SPINNING], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    threads = json.loads(proc.stdout)["threads"]
    assert threads and all(t["known_library"] == "OpenBLAS" for t in threads), threads
    assert not any(t["running"] for t in threads)


# -- real programs -------------------------------------------------------------------------------
ISSUE_PROGRAM = """
import json, sys, warnings
import torch, hwlaunch

def mm(worker):
    x = torch.randn(64, 256); w = torch.randn(512, 256)
    return float((x @ w.T).sum())

if __name__ == "__main__":
    x = torch.randn(64, 256); w = torch.randn(512, 256); float((x @ w.T).sum())
    method = sys.argv[1] if len(sys.argv) > 1 else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plan = hwlaunch.resolve(world_size=2, backend="cpu", start_method=method)
        except hwlaunch.StartMethodError as exc:
            print(json.dumps({"error": str(exc)}))
            sys.exit(0)
        with hwlaunch.launch(plan) as ex:
            results = ex.collective_rpc(mm, timeout=60)
    print(json.dumps({
        "method": plan.start_method, "results": results, "warnings": list(plan.warnings),
        "fork_warnings": [str(w.message) for w in caught if "fork" in str(w.message)],
    }))
"""


def run_program(tmp_path: Path, source: str, *args: str) -> dict[str, Any]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return run_json_script(script, *args, drop_env=("HWLAUNCH_", "OMP_"))


def need_two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: torch starts no OpenMP pool, so there is nothing to deadlock")


def test_the_issue_program_with_the_defaults_runs_on_the_fork_server(tmp_path: Path) -> None:
    need_two_cpus()
    seen = run_program(tmp_path, ISSUE_PROGRAM)
    assert seen["method"] == "forkserver"
    assert len(seen["results"]) == 2 and seen["results"][0] == seen["results"][1]
    assert any("OpenMP pool" in w and "instead of fork" in w for w in seen["warnings"])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_issue_program_runs_under_the_safe_methods(tmp_path: Path, method: str) -> None:
    seen = run_program(tmp_path, ISSUE_PROGRAM, method)
    assert seen["method"] == method and len(seen["results"]) == 2


def test_the_issue_program_asking_for_fork_is_refused_before_any_process(
    tmp_path: Path,
) -> None:
    need_two_cpus()
    seen = run_program(tmp_path, ISSUE_PROGRAM, "fork")
    assert "cannot work" in seen["error"] and "OpenMP pool" in seen["error"]


SAFE_THREADS_PROGRAM = """
import json, sys, warnings
import torch, hwlaunch

def mm(worker):
    x = torch.randn(64, 256)
    return float((x @ x.T).sum())

if __name__ == "__main__":
    if sys.argv[1] == "numpy-matmul":
        import numpy as np
        a = np.random.rand(600, 600)
        float((a @ a).sum())  # OpenBLAS's threads work, spin a while, then sleep
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = hwlaunch.resolve(world_size=2, backend="cpu")  # at once, while they may spin
        with hwlaunch.launch(plan, init_distributed=False) as ex:
            results = ex.collective_rpc(mm, timeout=60)
    print(json.dumps({
        "method": plan.start_method, "results": results, "warnings": list(plan.warnings),
        "threads": plan.decision("threads").value, "reason": plan.decision("threads").reason,
        "caught": [str(w.message) for w in caught],
    }))
"""


@pytest.mark.parametrize("case", ["imported-torch", "numpy-matmul"])
def test_a_driver_with_numpys_openblas_threads_forks_without_a_warning(
    tmp_path: Path, case: str
) -> None:
    """``import torch`` starts numpy's OpenBLAS server (numpy is installed); a numpy matmul
    just before the launch leaves its threads spinning for about 0.1 s. Either way: fork,
    and not a word."""
    seen = run_program(tmp_path, SAFE_THREADS_PROGRAM, case)
    assert seen["method"] == "fork" and len(seen["results"]) == 2
    assert seen["warnings"] == [] and seen["caught"] == []
    if len(os.sched_getaffinity(0)) > 1:  # one CPU: OpenBLAS starts no thread
        assert seen["threads"] == "safe" and "numpy's OpenBLAS" in seen["reason"]


THREADED_PARENT = """
import json, sys, threading, time
import hwlaunch

def poll(stop):
    while not stop.is_set():
        with lock:
            time.sleep(0.001)

lock = threading.Lock()

if __name__ == "__main__":
    stop = threading.Event()
    threading.Thread(target=poll, args=(stop,), name="my-poller", daemon=True).start()
    method = sys.argv[1] if len(sys.argv) > 1 else None
    plan = hwlaunch.resolve(world_size=2, backend="cpu", start_method=method)
    with hwlaunch.launch(plan, init_distributed=False) as ex:
        ranks = ex.collective_rpc(lambda w: w.rank, timeout=60)
    stop.set()
    print(json.dumps({"method": plan.start_method, "ranks": ranks,
                      "warnings": list(plan.warnings)}))
"""


def test_a_parent_with_a_live_python_thread_launches_on_the_fork_server(tmp_path: Path) -> None:
    seen = run_program(tmp_path, THREADED_PARENT)
    assert seen["method"] == "forkserver" and seen["ranks"] == [0, 1]
    assert any("'my-poller'" in w for w in seen["warnings"])


def test_a_parent_with_a_live_python_thread_may_still_ask_for_fork(tmp_path: Path) -> None:
    seen = run_program(tmp_path, THREADED_PARENT, "fork")
    assert seen["method"] == "fork" and seen["ranks"] == [0, 1]
    assert any(w.startswith("fork was requested") and "'my-poller'" in w for w in seen["warnings"])


REFUSED = """
import json, sys
import torch, hwlaunch

if __name__ == "__main__":
    x = torch.randn(256, 256); float((x @ x).sum())  # torch's OpenMP pool starts
    plan = hwlaunch.resolve(world_size=2, backend="cpu", assume={"threads": "none"})
    try:
        hwlaunch.launch(plan)
    except hwlaunch.ConfigError as exc:
        print(json.dumps({"method": plan.start_method, "error": str(exc)}))
"""


def test_a_plan_that_assumed_away_a_started_openmp_pool_is_not_launched(tmp_path: Path) -> None:
    need_two_cpus()
    seen = run_program(tmp_path, REFUSED)
    assert seen["method"] == "fork"
    assert "threads (assumed no other threads; this process has" in seen["error"]
    assert "OpenMP pool" in seen["error"] and "forked workers would hang" in seen["error"]
