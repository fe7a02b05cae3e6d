"""What the conformance suite runs in a fresh interpreter, started as ``python <this file> ...``.

Why a fresh interpreter: a probe must be measured where nothing else (pytest, other plugins,
torch) is imported yet, with the exact ``sys.path`` of the caller. Run as a file, not with
``-m``: ``sys.path`` is replaced before anything of hwlaunch is imported. Each command prints
one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def probe_backend(args: dict[str, Any]) -> dict[str, Any]:
    """Load the plugins, call each probe of one backend ``calls`` times; what each imported."""
    from hwlaunch.planning.registry import load_registry

    before_load = set(sys.modules)
    registry = load_registry(environ=args["environ"], strict=True)
    after_load = set(sys.modules)
    spec = registry.get(args["backend"])
    values: dict[str, Any] = {}
    times: dict[str, list[float]] = {}
    for probe in args["probes"]:
        fn = getattr(spec, probe)
        runs = []
        for _ in range(args["calls"]):
            start = time.perf_counter()
            values[probe] = fn()
            runs.append(time.perf_counter() - start)
        times[probe] = runs
    after_probes = set(sys.modules)
    return {
        "loaded": sorted(after_load - before_load),
        "probed": sorted(after_probes - after_load),
        "values": values,
        "times": times,
        "initialized_after": bool(spec.is_initialized()),
    }


def worker_import(target: str) -> dict[str, Any]:
    """Whether ``target`` ("package.module:Class") imports as a hwlaunch.Worker subclass."""
    from hwlaunch import Worker
    from hwlaunch.executor._runtime import import_object

    cls = import_object(target)
    return {"is_worker": isinstance(cls, type) and issubclass(cls, Worker)}


def main(argv: list[str]) -> None:
    command, payload = argv[0], json.loads(argv[1])
    if command == "probe":
        sys.path[:] = payload["path"]
        print(json.dumps(probe_backend(payload)))
    elif command == "worker":
        sys.path[:] = payload
        print(json.dumps(worker_import(argv[2])))
    else:
        raise SystemExit(f"unknown command {command!r}: use probe or worker")


if __name__ == "__main__":
    main(sys.argv[1:])
