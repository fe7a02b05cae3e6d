"""1 MiB calls to one worker, this hwlaunch against another version, side by side.

    python benchmarks/alternate_areas.py --baseline DIR [--pairs 4] [--rounds 12] [--free]

What the shm channel's *alternate areas* are for: a large message is written into the area
the message before the last one used, so that the other side's CPU has let go of that memory
meanwhile. ``DIR`` holds another version's ``hwlaunch`` package (put first on
``PYTHONPATH``), e.g. one that writes every large message into the same area. The two
versions run in turn, in fresh parents, ``--pairs`` times each (which goes first
alternates); each parent launches one fork worker (shm channel), by default with the two on
CPUs of their own (``--free``: placed by the scheduler), and times ``--rounds`` rounds of
each pattern in a new order per round (30 untimed calls, then 15 timed, per pattern and
round): a 1 MiB ``bytes`` echo, a float32 tensor echo, a tensor argument the worker reads
(its sum), a 1 MiB tensor result the caller reads, and the same result dropped unread.
Reported: the median of each version's medians, per pattern, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _contenders import env_with_version  # benchmarks/ on sys.path

CHILD = Path(__file__).with_name("_areas_child.py")


def _run(pythonpath: str | None, rounds: int, pin: bool) -> dict[str, float]:
    command = [sys.executable, str(CHILD), str(rounds), "pin" if pin else "free"]
    done = subprocess.run(
        command, env=env_with_version(pythonpath), capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    medians: dict[str, float] = result["medians"]
    shown = ", ".join(f"{name} {value * 1e6:.1f}" for name, value in medians.items())
    who = "this" if pythonpath is None else "baseline"
    print(
        f"  {who} ({result['version']}): {shown}; on one CPU after {result['shared']:.0%} of turns"
    )
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a directory holding hwlaunch/")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--free", action="store_true", help="no pinning")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for pair in range(args.pairs):
        sides = [("this", None), ("baseline", args.baseline)]
        for who, path in sides if pair % 2 else reversed(sides):
            runs[who].append(_run(path, args.rounds, not args.free))
    print()
    print(f"| 1 MiB, one worker{'' if args.free else ', pinned apart'} | this | baseline | ratio |")
    print("|---|---|---|---|")
    for name in runs["this"][0]:
        now = statistics.median(run[name] for run in runs["this"])
        before = statistics.median(run[name] for run in runs["baseline"])
        print(f"| {name} | {now * 1e6:.1f} µs | {before * 1e6:.1f} µs | x{now / before:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
