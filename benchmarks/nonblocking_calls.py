"""A non-blocking call's round trip on the mp executor: sent from the caller's thread against
queued on a thread, beside the blocking call, side by side in one parent, alternating.

    python benchmarks/nonblocking_calls.py [--workers 1] [--rounds 7] [--calls 2000]

Contenders, each ``collective_rpc("ping")`` then (non-blocking) its ``result()``:

- ``blocking``: ``collective_rpc("ping")``;
- ``deferred``: ``collective_rpc("ping", non_block=True).result()``: the mp executor sends at once
  from this thread, and ``result()`` reads the replies here (``hwlaunch.executor._deferred``);
- ``queued``: the same call on an executor that cannot split an exchange (its ``send_request``
  returns None, as uni's, Ray's, a restarting group's): it runs on the background thread, and
  this thread waits for it.

One parent, fork workers on the shm channel, 1,000 warm-up calls, then ``--rounds`` rounds in
which each contender times ``--calls`` calls (the contender that goes first rotates). Reported:
the median of each contender's round medians, in microseconds, and the ratios to ``queued``.
With one worker on a 2-CPU machine, the parent and the worker each have a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import hwlaunch


def timed(call: Callable[[], Any], calls: int) -> float:
    """The median round trip of ``calls`` calls, in seconds."""
    trips = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        trips.append(time.perf_counter() - started)
    return statistics.median(trips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", metavar="FILE", help="Also write the results as JSON here.")
    args = parser.parse_args()
    plan = hwlaunch.resolve(
        world_size=args.workers, executor="mp", start_method="fork", rpc_channel="shm"
    )
    with (
        hwlaunch.launch(plan, init_distributed=False) as deferring,
        hwlaunch.launch(plan, init_distributed=False) as queueing,
    ):
        queueing.send_request = lambda *_args: None  # type: ignore[method-assign]
        contenders: dict[str, Callable[[], Any]] = {
            "blocking": lambda: deferring.collective_rpc("ping"),
            "deferred": lambda: deferring.collective_rpc("ping", non_block=True).result(),
            "queued": lambda: queueing.collective_rpc("ping", non_block=True).result(),
        }
        for call in contenders.values():
            timed(call, 1000)
        medians: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for number in range(args.rounds):
            for name in names[number % 3 :] + names[: number % 3]:
                medians[name].append(timed(contenders[name], args.calls))
    result = {name: statistics.median(values) * 1e6 for name, values in medians.items()}
    for name, value in result.items():
        ratio = value / result["queued"]
        print(
            f"{name:9} {value:7.1f} us   {ratio:.2f}x queued   rounds: "
            + ", ".join(f"{m * 1e6:.1f}" for m in medians[name])
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"workers": args.workers, "median_us": result}, out, indent=2)


if __name__ == "__main__":
    main()
