"""The named no-op to one worker (or N), this hwlaunch against another version, side by side.

    python benchmarks/named_noop.py --baseline DIR [--pairs 6] [--rounds 5] [--calls 2000]
                                    [--pin] [--workers N]

``DIR`` is a directory that holds another version's ``hwlaunch`` package (put first on
``PYTHONPATH``). The two versions run in turn, in fresh parents, ``--pairs`` times each (which
goes first alternates), so that the load of the machine meets both alike; each parent launches
its fork workers (shm channel), calls ``ping`` 1,000 times to warm up, then times ``--rounds``
rounds of ``--calls`` calls. Reported: the median of each version's round medians, and the
ratio. ``--pin`` puts the parent and the (first) worker on two CPUs of their own, so that
where the scheduler places them is not part of the figure. ``--workers N`` launches N workers
instead of one: with 2 on a 2-CPU machine, three processes take turns on two CPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _contenders import env_with_version  # benchmarks/ on sys.path

CHILD = Path(__file__).with_name("_named_child.py")


def _run(pythonpath: str | None, rounds: int, calls: int, pin: bool, workers: int) -> list[float]:
    env = env_with_version(pythonpath)
    command = [sys.executable, str(CHILD), str(rounds), str(calls), "pin" if pin else "free"]
    command.append(str(workers))
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(f"  {result['version']}: " + ", ".join(f"{m * 1e6:.1f}" for m in result["medians"]))
    return list(result["medians"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a directory holding hwlaunch/")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    this: list[float] = []
    baseline: list[float] = []
    for pair in range(args.pairs):
        sides = [(None, this), (args.baseline, baseline)]
        for path, medians in sides if pair % 2 else reversed(sides):
            medians += _run(path, args.rounds, args.calls, args.pin, args.workers)
    now, before = statistics.median(this), statistics.median(baseline)
    print(
        f"named no-op, {args.workers} worker(s){' (pinned)' if args.pin else ''}: "
        f"this {now * 1e6:.1f} µs, "
        f"baseline {before * 1e6:.1f} µs, x{now / before:.2f} "
        f"({'no slower' if now <= before else 'slower'})"
    )


if __name__ == "__main__":
    sys.exit(main())
