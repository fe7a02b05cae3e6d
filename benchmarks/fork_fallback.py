"""What the fork-safety fallback costs, and what fork saves where it is safe.

    python benchmarks/fork_fallback.py [--rounds 5] [--workers 2]

Launches: a driver that imported torch (numpy installed, so numpy's OpenBLAS server runs) gets
fork, since an idle OpenBLAS thread is fork-safe; one that ran one parallel torch operation has
started torch's GNU OpenMP pool, which would deadlock forked workers, and gets the fallback,
forkserver with torch preloaded. Each is timed in fresh parents:

- *first launch*: launch() until every worker has answered one matmul (for forkserver this
  includes starting the fork server, which imports torch);
- *second launch* and *third launch*: later launches in the same parent (the fork server is
  running).

A worker's own DataLoader: ``DataLoader(range(8), num_workers=2)`` until its first batch, inside
a worker started by fork, by forkserver (its children start with the platform's default, fork),
and by forkserver with the loader asking for forkserver: CPython's default in such a worker,
which hwlaunch resets.

Every case runs in fresh parents, interleaved round by round so that load from elsewhere hits
them alike. ``init_distributed=False``: no process group, so the figures are the start
method's cost. Prints markdown tables of medians with the ratio to the first row.
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

    def loader_start(worker, context):
        from torch.utils.data import DataLoader
        start = time.perf_counter()
        next(iter(DataLoader(range(8), num_workers=2, multiprocessing_context=context)))
        return time.perf_counter() - start

    def launches(workers, ran_torch_op):
        if ran_torch_op:
            x = torch.randn(256, 256)
            float((x @ x).sum())  # torch's OpenMP pool starts
        times = []
        for _ in range(3):
            start = time.perf_counter()
            plan = hwlaunch.resolve(backend="cpu", world_size=workers)
            with hwlaunch.launch(plan, init_distributed=False) as ex:
                ex.collective_rpc(mm, timeout=120)
                times.append(time.perf_counter() - start)
        return {"method": plan.start_method, "first": times[0], "second": times[1],
                "third": times[2]}

    def loader(workers, method, context):
        plan = hwlaunch.resolve(backend="cpu", world_size=workers, executor="mp",
                                start_method=method)
        with hwlaunch.launch(plan, init_distributed=False) as ex:
            return {"method": method, "loader": max(ex.collective_rpc(
                loader_start, args=(context or None,), timeout=120))}

    if __name__ == "__main__":
        case, workers = sys.argv[1], int(sys.argv[2])
        if case in ("imported", "ran_op"):
            print(json.dumps(launches(workers, case == "ran_op")))
        else:
            method, _, context = case.partition(":")
            print(json.dumps(loader(workers, method, context)))
    """
)
PHASES = ("first", "second", "third")
LAUNCHES = {
    "imported": "default, driver imported torch",
    "ran_op": "default after a parallel torch op",
}
LOADERS = {
    "fork": "in a worker started by fork",
    "forkserver": "in a worker started by forkserver",
    "forkserver:forkserver": "in a forkserver worker, loader by forkserver (CPython's default)",
}


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


def table(
    samples: dict[str, list[dict[str, float | str]]],
    labels: dict[str, str],
    phases: tuple[str, ...],
) -> None:
    """One row per case: the medians, and their ratio to the first row's."""
    first = next(iter(labels))
    base = {p: statistics.median(float(s[p]) for s in samples[first]) for p in phases}
    print(f"| case | start method | {' | '.join(phases)} |")
    print(f"|---|---|{'---|' * len(phases)}")
    for case, label in labels.items():
        cells = []
        for phase in phases:
            value = statistics.median(float(s[phase]) for s in samples[case])
            cells.append(f"{value * 1000:.0f} ms (x{value / base[phase]:.2f})")
        print(f"| {label} | {samples[case][0]['method']} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh parents per case")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    cases = [*LAUNCHES, *LOADERS]
    samples: dict[str, list[dict[str, float | str]]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            samples[case].append(one_parent(case, args.workers))
    print(f"{args.workers} CPU workers, medians of {args.rounds} fresh parents each\n")
    table(samples, LAUNCHES, PHASES)
    print()
    table(samples, LOADERS, ("loader",))


if __name__ == "__main__":
    main()
