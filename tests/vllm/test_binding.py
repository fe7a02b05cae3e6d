"""TP=2 on one NUMA node without VLLM_CPU_OMP_THREADS_BIND: each rank on its share of CPUs.

vLLM's own executor refuses this ("Not enough allowed NUMA nodes to bind threads of 2 local
CPUWorkers") until the user sets a binding; hwlaunch's thread budget gives each rank its
CPUs. (A binding the user set wins: tests/vllm/test_main_guard.py.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_engines import executor_of

from hwlaunch.integrations.vllm._binding import BIND_VAR, binding_text, share_cpus


def _affinity(worker: Any) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_tp2_without_a_binding_runs_each_rank_on_its_share(engine_tp2: Any) -> None:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    print(f"NUMA nodes here: {len(nodes)}")
    plan = engine_tp2.plan
    expected = share_cpus(sorted(os.sched_getaffinity(0)), 2, plan.cpu_threads or 1)
    assert executor_of(engine_tp2).collective_rpc(_affinity) == expected
    assert plan.env[BIND_VAR] == binding_text(expected)
    # no cpu_threads chosen by the user: the binding is this process's CPUs shared by rank
    assert plan.decision(BIND_VAR).source == "fact: CPUs / world size"
