"""What the fork-safety fallback costs: the default plan of a driver that already ran torch.

    python benchmarks/fork_fallback.py [--rounds 5] [--workers 2]

A driver that ran one parallel torch operation has started torch's OpenMP pool; fork would
deadlock its workers in their first matmul, so the default plan falls back to forkserver with
torch preloaded. This measures that plan beside fork in a driver that ran no torch operation
(where fork is still safe), each in fresh parents, interleaved round by round so that load
from elsewhere hits both alike:

- *first launch*: launch() until every worker has answered one matmul (for forkserver this
  includes starting the fork server, which imports torch);
- *second launch* and *third launch*: later launches in the same parent (the fork server is
  running).

``init_distributed=False``: no process group, so the figures are the start method's cost.
Prints a markdown table of medians with the ratio to fork.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

PARENT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import hwlaunch

    def mm(worker):
        x = torch.randn(64, 256)
        return float((x @ x.T).sum())

    if __name__ == "__main__":
        case, workers = sys.argv[1], int(sys.argv[2])
        if case == "fallback":
            x = torch.randn(256, 256)
            float((x @ x).sum())  # torch's OpenMP pool starts
        method = "fork" if case == "fork" else None
        times = []
        for _ in range(3):
            start = time.perf_counter()
            plan = hwlaunch.resolve(backend="cpu", world_size=workers, start_method=method)
            with hwlaunch.launch(plan, init_distributed=False) as ex:
                ex.collective_rpc(mm, timeout=120)
                times.append(time.perf_counter() - start)
        print(json.dumps({"method": plan.start_method, "first": times[0], "second": times[1],
                          "third": times[2]}))
    """
)
PHASES = ("first", "second", "third")
CASES = {"fork": "fork, driver ran no torch op", "fallback": "default after a torch op"}


def one_parent(case: str, workers: int) -> dict[str, float | str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "OMP_"))}
    proc = subprocess.run(
        [sys.executable, "-c", PARENT, case, str(workers)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {case} parent failed:\n{proc.stderr[-2000:]}")
    result: dict[str, float | str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh parents per case")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float | str]]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            samples[case].append(one_parent(case, args.workers))
    fork = {phase: statistics.median(float(s[phase]) for s in samples["fork"]) for phase in PHASES}
    print(f"{args.workers} CPU workers, medians of {args.rounds} fresh parents each\n")
    print("| plan | start method | first launch | second launch | third launch |")
    print("|---|---|---|---|---|")
    for case, label in CASES.items():
        method = samples[case][0]["method"]
        cells = []
        for phase in PHASES:
            value = statistics.median(float(s[phase]) for s in samples[case])
            cells.append(f"{value * 1000:.0f} ms (x{value / fork[phase]:.2f})")
        print(f"| {label} | {method} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
