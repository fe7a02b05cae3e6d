"""collective_rpc through the mp executor's channels, against the raw shared-memory floor.

    python benchmarks/rpc_channel.py [--rounds 7] [--method fork] [--out FILE.json]
                                     [--baseline EARLIER.json] [--pin]

In one parent (torch imported first, as an engine has), interleaved round by round in a new
(seeded) random order each round, so that a burst of load from elsewhere hits every contender
alike, and call by call where two contenders are compared on one executor or one CPU pair (an
executor's named and lambda no-ops; the floor and the one-worker echoes of a size: see
``batches``); every call timed on its own, medians reported:

- the floor (``_floor.py``): a parent and a forked child copying the same bytes through an
  ``mmap`` with a sequence byte, polling with ``sched_yield`` as the channel does: 1 byte,
  1 MiB and 16 MiB;
- one shm worker (the default spin window): a no-op by method name, the same no-op as a
  lambda (sent again on every call), and an echo of 1 MiB and 16 MiB as ``bytes`` and as a
  float32 torch tensor (the payload goes out and comes back);
- 2 and 4 workers, shm channel against pipe channel, named and lambda no-ops (on a 2-CPU
  machine, 4 workers and their parent contend for the CPUs);
- the CPU time of idle shm workers over 5 s (1 and 4 workers), after the spin window.

The floor and the one-worker echoes of a size take turns (``_time_turns``), each turn timed
once it runs as calls do on every step of an engine, one after another: after ``WARM`` calls
that are not timed (after a pause of 60 ms, a 1 MiB echo comes down to within 10 % of its
steady cost over some 20 calls and goes on falling slowly until 60 or so; the floor, with far
less code and memory, takes 3). ``--pin`` puts the parent
on one CPU and the worker (or the floor's child) on another during those turns too (on this
2-CPU VM, pinned, the floor's 1 MiB round trip takes ~1 ms instead of ~0.1 ms in about half
of its turns, so by default the scheduler places them). The one-worker no-ops always run
pinned so: placed by the scheduler, a whole batch of them costs 15 or 45 µs a call depending
on where it put the two processes.

Between two contenders the parent waits out the spin window, so that workers still polling
after one contender's calls do not take CPU from the next, and the quiet time that a sign of
contention starts (``QUIET_AFTER_CONTENTION``: the channel blocks instead of polling), so that
one contender's calls on an executor do not decide how the next contender's calls on the same
executor wait. The targets are checked on the
medians of this one run; ``--baseline`` names the JSON of an earlier run (``--out``), whose
named no-op the named no-op must not be slower than. ``--out`` writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _contenders import Echo, channel_executor  # benchmarks/ on sys.path
from _floor import Floor

try:
    from hwlaunch.executor.mp._shm_wait import QUIET_AFTER_CONTENTION
except ImportError:  # a --baseline run of a version without it
    QUIET_AFTER_CONTENTION = 0.25

MIB = 1024 * 1024
CALLS = {"noop": 200, "1MiB": 30, "16MiB": 5}  # per contender and round
TURN = 15  # timed calls per turn where the floor and the echoes of a size take turns
WARM = {"1MiB": 50, "16MiB": 5}  # calls before each turn, not timed (see _time_turns)
IDLE_SECONDS = 5.0
SIZES = {"1MiB": MIB, "16MiB": 16 * MIB}
GROUPS = {"shm-1": ("shm", 1), "shm-2": ("shm", 2), "pipe-2": ("pipe", 2)}
GROUPS |= {"shm-4": ("shm", 4), "pipe-4": ("pipe", 4)}
Case = Callable[[], tuple[Callable[[], Any], Callable[[], None]]]  # -> (one call, batch end)


def noop(worker: Any) -> None:
    """The callable no-op: a function of this script, which travels by value (cloudpickle),
    as a script's or notebook's lambda does."""


def _call(executor: Any, method: Any, *args: Any) -> Case:
    def start() -> tuple[Callable[[], Any], Callable[[], None]]:
        return (lambda: executor.collective_rpc(method, args)), (lambda: None)

    return start


def _floor_case(floor: Floor, data: bytes) -> Case:
    def start() -> tuple[Callable[[], Any], Callable[[], None]]:
        return floor.begin(data), floor.end

    return start


def make_cases(executors: dict[str, Any], floor: Floor) -> dict[str, Case]:
    """Every contender, named ``group/what`` (``what`` starts with the size it moves)."""
    import torch

    cases = {"floor/noop-1B": _floor_case(floor, b"x")}
    one = executors["shm-1"]
    cases["shm-1/noop-named"] = _call(one, "ping")
    cases["shm-1/noop-lambda"] = _call(one, noop)
    for size, n in SIZES.items():
        data = os.urandom(n)
        cases[f"floor/{size}"] = _floor_case(floor, data)
        cases[f"shm-1/{size}-bytes"] = _call(one, "echo", data)
        cases[f"shm-1/{size}-tensor"] = _call(one, "echo", torch.rand(n // 4))
    for group in ("shm-2", "pipe-2", "shm-4", "pipe-4"):
        cases[f"{group}/noop-named"] = _call(executors[group], "ping")
        cases[f"{group}/noop-lambda"] = _call(executors[group], noop)
    return cases


def _calls(name: str) -> int:
    what = name.split("/")[1]
    return next(count for prefix, count in CALLS.items() if what.startswith(prefix))


def batches(cases: dict[str, Case]) -> list[list[str]]:
    """The contenders that run interleaved, call by call, so that whatever state the machine
    is in during a batch (where the scheduler put the processes, what runs beside them, what
    the host takes) is the same for both sides of a ratio: one executor's named and lambda
    no-ops; the floor and the one-worker echoes of one payload size, in short turns
    (``_time_turns``). Every other contender runs in a batch of its own."""
    grouped: dict[str, list[str]] = {}
    for name in cases:
        group, what = name.split("/")
        if what.startswith("noop-"):
            key = f"{group}/noop"
        elif group in ("floor", "shm-1"):
            key = f"payload/{what.split('-')[0]}"
        else:
            key = name
        grouped.setdefault(key, []).append(name)
    return list(grouped.values())


Placement = Callable[[str], None]  # puts the parent where a contender's group runs


def time_rounds(
    cases: dict[str, Case], rounds: int, window: float, place: Placement
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for name, start in cases.items():  # warm-up: every path once (the callable's first trip)
        place(name)
        call, end = start()
        call()
        end()
    order = batches(cases)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)  # no batch always runs right after the same other one
        for names in order:
            place(names[0])
            time.sleep(max(window, QUIET_AFTER_CONTENTION) + 0.02)  # see the docstring
            if names[0].startswith("floor/") and len(names) > 1:
                _time_turns(cases, names, samples, window)
            else:
                _time_batch(cases, names, samples)
    return samples


def placement(executors: dict[str, Any], floor: Floor, pin: bool) -> Placement:
    """Where a contender runs (on two CPUs or more): the one-worker no-ops (and the floor's
    1-byte round trip) with the parent on the first CPU and the worker (the floor's child)
    on the last, so that where the scheduler happens to put the two does not decide them;
    the payload turns likewise with ``pin``; everything else on every CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return lambda name: None
    everywhere, last = set(cpus), {cpus[-1]}
    children = (executors["shm-1"].pids[0], floor.pid)

    def place(name: str) -> None:
        group, _, what = name.partition("/")
        apart = group in ("shm-1", "floor") and (pin or what.startswith("noop"))
        os.sched_setaffinity(0, {cpus[0]} if apart else everywhere)
        for pid in children:
            os.sched_setaffinity(pid, last if apart else everywhere)

    return place


def _time_batch(cases: dict[str, Case], names: list[str], samples: dict[str, list[float]]) -> None:
    started = [(samples[name], *cases[name]()) for name in names]
    for index in range(_calls(names[0])):
        for times, call, _ in started if index % 2 else reversed(started):  # ABBA...
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
    for _, _, end in started:
        end()


def _time_turns(
    cases: dict[str, Case], names: list[str], samples: dict[str, list[float]], window: float
) -> None:
    """The floor and the echoes of one size in turns of ``TURN`` calls each (in a new order
    each time), after the worker's spin window, so that the floor's child and the worker
    never poll at once; each turn starts with ``WARM`` calls that are not timed, so that it
    is timed as calls run one after another (the worker polling, the caches holding the
    code and the memory of a call, as on every step of an engine)."""
    size = names[0].split("/")[1].split("-")[0]
    order, timed, warm = list(names), min(TURN, _calls(names[0])), WARM[size]
    for turn in range(_calls(names[0]) // timed):
        random.Random(turn).shuffle(order)
        for name in order:
            time.sleep(window + 0.005)  # the worker stopped polling
            call, end = cases[name]()
            for _ in range(warm):
                call()
            times = samples[name]
            for _ in range(timed):
                began = time.perf_counter()
                call()
                times.append(time.perf_counter() - began)
            end()


def idle_fractions(executor: Any, window: float) -> list[float]:
    """Each worker's CPU time over IDLE_SECONDS, as a fraction of a core, after a last call."""
    import psutil

    executor.collective_rpc("ping")
    time.sleep(window + 0.05)
    workers = [psutil.Process(pid) for pid in executor.pids if pid is not None]
    before = [sum(w.cpu_times()[:2]) for w in workers]
    time.sleep(IDLE_SECONDS)
    after = [sum(w.cpu_times()[:2]) for w in workers]
    return [(a - b) / IDLE_SECONDS for a, b in zip(after, before, strict=True)]


def measure(rounds: int, method: str, pin: bool) -> dict[str, Any]:
    import torch  # noqa: F401  (the parent has torch, as an engine has)

    floor = Floor(max(SIZES.values()))
    executors = {
        name: channel_executor(Echo, channel=channel, n=n, method=method)
        for name, (channel, n) in GROUPS.items()
    }
    window = max(e.rpc_spin or 0.0 for e in executors.values())
    try:
        place = placement(executors, floor, pin)
        samples = time_rounds(make_cases(executors, floor), rounds, window, place)
        place("idle/all")
        idle = {name: idle_fractions(executors[name], window) for name in ("shm-1", "shm-4")}
        spins = {name: e.rpc_spin for name, e in executors.items()}
    finally:
        for executor in executors.values():
            executor.shutdown()
        floor.close()
    return {
        "method": method,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "spin": spins,
        "rounds": rounds,
        "pinned": pin and len(os.sched_getaffinity(0)) >= 2,
        "samples": samples,
        "median": {k: statistics.median(v) for k, v in samples.items()},
        "idle_core_fraction": idle,
    }


def _target(name: str, value: float, base: float, limit: float, what: str) -> dict[str, Any]:
    return {
        "name": f"{name} <= {limit:g}x {what}",
        "passed": value <= limit * base,
        "detail": f"{value * 1e6:,.1f} µs vs {base * 1e6:,.1f} µs (x{value / base:.2f})",
    }


def targets(result: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    med = result["median"]
    out = []
    for size, limit in (("1MiB", 1.5), ("16MiB", 2.0)):
        for kind in ("bytes", "tensor"):
            key = f"shm-1/{size}-{kind}"
            out.append(
                _target(f"{size} {kind} echo", med[key], med[f"floor/{size}"], limit, "floor")
            )
    lam, named = med["shm-1/noop-lambda"], med["shm-1/noop-named"]
    out.append(_target("repeated lambda no-op", lam, named, 1.5, "the named no-op"))
    for n in (2, 4):
        for how in ("named", "lambda"):
            shm, pipe = med[f"shm-{n}/noop-{how}"], med[f"pipe-{n}/noop-{how}"]
            out.append(_target(f"{how} no-op to {n} workers, shm", shm, pipe, 1.1, "pipe"))
    busiest = max(max(v) for v in result["idle_core_fraction"].values())
    out.append(
        {
            "name": "idle shm workers < 1% of a core",
            "passed": busiest < 0.01,
            "detail": f"busiest idle worker: {busiest * 100:.2f}% of a core over {IDLE_SECONDS:g} s",
        }
    )
    if baseline is None:
        out.append(
            {"name": "named no-op no slower than before", "passed": None, "detail": "no --baseline"}
        )
    else:
        before = baseline["median"]["shm-1/noop-named"]
        out.append(_target("named no-op", named, before, 1.0, "the baseline run's"))
    return out


def report(result: dict[str, Any]) -> str:
    med, spin = result["median"], result["spin"]
    lines = [
        f"collective_rpc, mp executor ({result['method']}), {result['cpus']} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in result['load_average'])} at the end; every call timed, "
        f"{result['rounds']} interleaved rounds; one-worker contenders "
        f"{'pinned apart' if result.get('pinned') else 'unpinned'}; spin windows: "
        + ", ".join(f"{k} {v:g} s" for k, v in spin.items() if v is not None),
        "",
        "| case | median per call | ratio |",
        "|---|---|---|",
    ]
    for name, value in med.items():
        group, what = name.split("/")
        base = _base_of(group, what, med)
        ratio = f"x{value / med[base]:.2f} {base}" if base else ""
        lines.append(f"| {name} | {value * 1e6:,.1f} µs | {ratio} |")
    idle = result["idle_core_fraction"]
    for name, fractions in idle.items():
        shown = ", ".join(f"{f * 100:.2f}%" for f in fractions)
        lines.append(f"| idle {name} workers, CPU over {IDLE_SECONDS:g} s | {shown} of a core | |")
    lines += ["", "Targets:", ""]
    for target in result["targets"]:
        status = {True: "PASS", False: "MISS", None: "N/A"}[target["passed"]]
        lines.append(f"- **{status}** {target['name']}: {target['detail']}")
    return "\n".join(lines)


def _base_of(group: str, what: str, med: dict[str, float]) -> str | None:
    """What a case is compared with: the floor of its size, the named no-op, the pipe."""
    if group == "shm-1" and not what.startswith("noop"):
        return f"floor/{what.split('-')[0]}"
    if group == "shm-1" and what == "noop-lambda":
        return "shm-1/noop-named"
    if group.startswith("shm-") and group != "shm-1":
        return f"pipe-{group.split('-')[1]}/{what}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--method", default="fork", choices=("fork", "spawn", "forkserver"))
    parser.add_argument("--out", help="write every sample as JSON here")
    parser.add_argument("--baseline", help="the --out JSON of an earlier run to compare with")
    parser.add_argument("--pin", action="store_true", help="one-worker contenders pinned apart")
    args = parser.parse_args()
    result = measure(args.rounds, args.method, args.pin)
    baseline = None
    if args.baseline:
        with open(args.baseline) as earlier:
            baseline = json.load(earlier)
    result["targets"] = targets(result, baseline)
    print(report(result))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
