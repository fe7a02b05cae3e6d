"""The workers' side of the thread budget and of the plan's env, in real worker processes.

What users rely on: each worker runs the plan's thread count under every start method, also
when the program imports torch at its top (fork inherits a pool sized in the parent; spawn and
the fork server import torch again); and every variable of the plan's env is in the worker's
environment before the program's own imports run there (spawn's re-import of ``__main__``, the
fork server's preload). Each test runs its own parent program from tmp_path, so that
``__main__`` is a real file that spawn and forkserver re-import, and the fork servers are its
own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import private_temp, run_json_script

METHODS = ("fork", "spawn", "forkserver")
pytestmark = pytest.mark.timeout(240)

# Read when first imported, in whichever process imports it first.
PROBE_MODULE = """
import os
SEEN_AT_IMPORT = os.environ.get("HWPROBE_AT_IMPORT")
"""

PROGRAM = """
import json, os, sys
import torch  # at the top: under fork its pool exists before any worker does
import probe_at_import  # the program's own import, which reads the plan's env at import time
import hwlaunch

TORCH_THREADS_AT_IMPORT = torch.get_num_threads()  # in each spawn/forkserver worker too


def report(worker):
    import torch
    main = sys.modules.get("__mp_main__") or sys.modules["__main__"]
    return {
        "torch_threads": torch.get_num_threads(),
        # a Ray actor's __main__ is Ray's, not the program
        "torch_threads_at_import": getattr(main, "TORCH_THREADS_AT_IMPORT", None),
        "seen_at_import": getattr(main, "probe_at_import", main).__dict__.get("SEEN_AT_IMPORT"),
        "env": {k: os.environ.get(k) for k in
                ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HWPROBE_AT_IMPORT")},
        "parent": os.getppid(),
    }


def main():
{body}


if __name__ == "__main__":
    main()
"""


def run_program(tmp_path: Path, body: str, config: str = "") -> dict[str, Any]:
    """Run a program whose main() is ``body``; return the JSON it printed last."""
    (tmp_path / "probe_at_import.py").write_text(PROBE_MODULE)
    (tmp_path / "hwlaunch.toml").write_text(config)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.replace("{body}", textwrap.indent(textwrap.dedent(body), "    ")))
    drop = ("HWLAUNCH_", "HWPROBE_", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return run_json_script(script, drop_env=drop, timeout=200)


@pytest.mark.parametrize("method", METHODS)
def test_budget_and_env_reach_the_workers_before_their_imports(tmp_path: Path, method: str) -> None:
    # 2 CPUs / 2 workers: 1 thread each, where torch alone would run one per CPU. (torch caps
    # OMP_NUM_THREADS at the machine's CPUs, so a count above them is no test of the env.)
    seen = run_program(
        tmp_path,
        f"""
        torch.get_num_threads()
        with hwlaunch.launch(
            backend="cpu", world_size=2, start_method={method!r}, init_distributed=False,
            assume={{"usable_cpus": 2}},
        ) as ex:
            print(json.dumps({{"plan": ex.plan.cpu_threads, "ranks": ex.collective_rpc(report),
                              "parent": {{"threads": torch.get_num_threads(),
                                          "omp": os.environ.get("OMP_NUM_THREADS")}}}}))
        """,
        config='env = { HWPROBE_AT_IMPORT = "from the plan" }\n',
    )
    assert seen["plan"] == 1
    for rank in seen["ranks"]:
        assert rank["torch_threads"] == 1
        assert rank["env"] == {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "HWPROBE_AT_IMPORT": "from the plan",
        }
        if method == "fork":
            # The program's imports ran in the parent, before any plan: the pool is resized.
            assert rank["seen_at_import"] is None
            assert rank["torch_threads_at_import"] == seen["parent"]["threads"]
        else:
            # Re-imported in the worker (spawn) or forked from a server that imported torch
            # (forkserver): both after the plan's env was set.
            assert rank["seen_at_import"] == "from the plan"
            assert rank["torch_threads_at_import"] == 1
    assert seen["parent"]["omp"] is None  # the parent's environment is untouched


def test_each_distinct_env_gets_its_own_fork_server_and_none_outlives_the_program(
    tmp_path: Path,
) -> None:
    seen = run_program(
        tmp_path,
        """
        from hwlaunch.executor.mp._forkserver import running_servers
        ranks = []
        for threads in (1, 2, 1):
            with hwlaunch.launch(
                backend="cpu", world_size=2, start_method="forkserver",
                init_distributed=False, cpu_threads=threads,
            ) as ex:
                ranks.append(ex.collective_rpc(report))
        servers = running_servers()
        files = [bytes.fromhex(s._preload_modules[1].rsplit(".p", 1)[1]).decode()
                 for s in servers]
        print(json.dumps({"ranks": ranks, "servers": [s._forkserver_pid for s in servers],
                          "files": files,
                          "files_exist": [os.path.exists(f) for f in files]}))
        """,
    )
    first, second, third = seen["ranks"]
    assert [r["torch_threads_at_import"] for r in first] == [1, 1]
    assert [r["torch_threads_at_import"] for r in second] == [2, 2]
    assert len(seen["servers"]) == 2  # one per environment: the third launch reused the first's
    assert {r["parent"] for r in first} == {r["parent"] for r in third}
    assert {r["parent"] for r in first} != {r["parent"] for r in second}
    assert all(seen["files_exist"])
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in seen["servers"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in seen["servers"]), "a fork server outlived it"
    assert not any(os.path.exists(f) for f in seen["files"]), "an environment file was left"


def test_what_the_spawn_child_imports_before_the_env_reads_no_thread_variable() -> None:
    """Before ``worker_main`` sets the env, a spawn child unpickles its arguments, which
    imports the worker loop's modules: none of them may be torch or NumPy (both read
    OMP_NUM_THREADS when imported)."""
    code = (
        "import sys, hwlaunch.executor.mp._child, hwlaunch.executor.mp._server_setup; "
        "print([m for m in ('torch', 'numpy', 'mkl') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_under_torchrun_each_rank_runs_its_share_not_torchruns_one(tmp_path: Path) -> None:
    """torchrun sets OMP_NUM_THREADS=1 for its 2 ranks; each rank's worker runs the share of
    the CPUs instead (4 assumed CPUs / torchrun's 2 local ranks = 2), shown in the plan."""
    (tmp_path / "rank.py").write_text(
        textwrap.dedent(
            """
            import json, os
            import torch
            import hwlaunch

            before = torch.get_num_threads()
            with hwlaunch.launch(assume={"usable_cpus": 4}, init_distributed=False) as ex:
                threads = ex.collective_rpc(lambda w: __import__("torch").get_num_threads())
                decision = ex.plan.decision("cpu_threads")
                print(json.dumps({"omp": os.environ.get("OMP_NUM_THREADS"), "before": before,
                                  "threads": threads, "source": decision.source}))
            """
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HWLAUNCH_", "SLURM_")) and k not in ("OMP_NUM_THREADS",)
    }
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "rank.py"],
        cwd=tmp_path,
        env=private_temp(env, tmp_path / "temp"),  # torchrun leaves its log folder there
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr
    ranks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(ranks) == 2
    for rank in ranks:
        assert (rank["omp"], rank["before"]) == ("1", 1)  # torchrun's default, as it set it
        assert rank["threads"] == [2]
        assert rank["source"] == "fact: 4 CPUs (assumed) / 2 workers"


def test_ray_actors_get_the_budget_and_the_env(tmp_path: Path) -> None:
    """Ray actors start from their node's environment (Ray sets OMP_NUM_THREADS to an actor's
    CPUs when nobody did): the budget travels in the runtime environment, and torch runs it."""
    seen = run_program(
        tmp_path,
        """
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        with hwlaunch.launch(
            backend="cpu", world_size=2, executor="ray", init_distributed=False,
            assume={"usable_cpus": 6},
        ) as ex:
            print(json.dumps({"ranks": ex.collective_rpc(report)}))
        """,
        config='env = { HWPROBE_AT_IMPORT = "from the plan" }\n',
    )
    for rank in seen["ranks"]:
        assert rank["torch_threads"] == 3
        assert rank["env"] == {
            "OMP_NUM_THREADS": "3",
            "MKL_NUM_THREADS": "3",
            "HWPROBE_AT_IMPORT": "from the plan",
        }
