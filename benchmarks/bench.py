"""hwlaunch performance, side by side with the alternatives, in one command.

    python benchmarks/bench.py [--quick] [--out benchmarks/results/bench.json]

Measures, in one run and interleaved (a burst of load from elsewhere hits every contender alike):

1. time to ready of N CPU workers (imported torch and the worker class, answered a first RPC;
   ``init_distributed=False``, so no process group is part of it) for hwlaunch's mp executor with
   fork, spawn and forkserver (first launch in a fresh parent, then a later launch in the same
   parent), ``torch.multiprocessing.start_processes`` with spawn, and Ray actors (cluster
   already running, and cold: ``import ray`` + ``ray.init`` included);
2. the summed PSS of 8 idle workers for each start method;
3. collective_rpc round trips to 2 workers (a no-op and a 1 MB echo) against a raw
   ``multiprocessing.Pipe`` round trip to 2 child processes and against Ray actor calls; then
   the RPC channels side by side (``benchmarks/rpc_channel.py``: shared memory against pipes,
   8 workers against 2, idle CPU);
4. ``import hwlaunch``, ``hwlaunch backends``, ``hwlaunch resolve``, ``resolve()`` in-process, and
   main-guard detection on a generated 5,000-line script.

Every parent imports torch before the clock starts, as an inference engine has. Figures are
medians over repeated runs, each in a fresh interpreter where it matters; it prints markdown
tables with ratios and PASS/MISS for each target, and writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _mainguard_script import generate  # noqa: E402  (benchmarks/ is not a package)
from rpc_channel import report as channel_report  # noqa: E402

CONTENDERS = HERE / "_contenders.py"
CHANNELS = HERE / "rpc_channel.py"
MARK = "BENCH-JSON "
METHODS = ("fork", "forkserver", "spawn")


@dataclass(frozen=True)
class Settings:
    repeats: int  # fresh parents per (contender, N)
    sizes: tuple[int, ...]
    ray_sizes: tuple[int, ...]
    later_rounds: int  # per forkserver parent: later launches of forkserver and fork, alternated
    ray_launches: int  # per Ray parent: the first is cold, the others warm
    rpc_rounds: int
    cli_runs: int
    import_runs: int
    mainguard_runs: int


FULL = Settings(
    repeats=3,
    sizes=(2, 4, 8),
    ray_sizes=(2, 4, 8),
    later_rounds=4,
    ray_launches=3,
    rpc_rounds=7,
    cli_runs=7,
    import_runs=15,
    mainguard_runs=5,
)
QUICK = Settings(
    repeats=1,
    sizes=(2, 8),
    ray_sizes=(2,),
    later_rounds=2,
    ray_launches=2,
    rpc_rounds=3,
    cli_runs=3,
    import_runs=5,
    mainguard_runs=3,
)


# -- running things -----------------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    """The caller's environment without hwlaunch settings, which would change the plans."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}


def wall(cmd: Sequence[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=clean_env(), check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def helper(args: Sequence[str], cwd: str, timeout: float = 600) -> dict[str, Any]:
    """Run benchmarks/_contenders.py in a fresh interpreter; its BENCH-JSON line, parsed."""
    cmd = [sys.executable, str(CONTENDERS), *args]
    proc = subprocess.run(
        cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    result: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    return result


def progress(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- the measurements ---------------------------------------------------------------------------
def measure_ready(settings: Settings, cwd: str) -> dict[str, Any]:
    """Time to ready: samples by contender and N, plus the PSS of 8 idle workers."""
    samples: dict[str, dict[int, list[float]]] = {}
    pss: dict[str, list[dict[str, int]]] = {m: [] for m in METHODS}
    shutdown: dict[str, list[float]] = {m: [] for m in METHODS}
    warnings: list[str] = []

    def add(name: str, n: int, values: Sequence[float]) -> None:
        samples.setdefault(name, {}).setdefault(n, []).extend(values)

    for repeat in range(settings.repeats):
        for n in settings.sizes:
            for method in METHODS:
                progress(f"ready: hwlaunch {method} N={n} (run {repeat + 1}/{settings.repeats})")
                args = ["ready", "--who", "hwlaunch", "--method", method, "--n", str(n)]
                args += ["--pss"] if n == 8 else []
                if method == "forkserver":
                    # after the first launch (fresh parent), later launches of forkserver and
                    # fork alternate in the same parent: side by side, under the same load
                    args += ["--launches", str(1 + settings.later_rounds), "--interleave", "fork"]
                result = helper(args, cwd)  # fork, spawn: one launch, in a fresh parent
                add(f"{method}/first", n, result["times"][:1])
                add(f"{method}/later", n, result["times"][1:])
                add("fork/later", n, result["interleaved"])
                shutdown[method] += result["shutdown"]
                warnings += result["warnings"]
                if result["pss"]:
                    pss[method].append(result["pss"])
            if n == 8:  # reference: what multiprocessing itself costs, without hwlaunch
                progress(f"ready: multiprocessing alone, forkserver and fork N={n}")
                args = ["ready", "--who", "mp", "--method", "forkserver", "--n", str(n)]
                args += ["--launches", str(1 + settings.later_rounds), "--interleave", "fork"]
                result = helper(args, cwd)
                add("mp-forkserver/later", n, result["times"][1:])
                add("mp-fork/later", n, result["interleaved"])
            progress(f"ready: torch.multiprocessing spawn N={n}")
            result = helper(["ready", "--who", "torch", "--n", str(n)], cwd)
            add("torch/first", n, result["times"])
    ray_init: list[float] = []
    for n in settings.ray_sizes:
        progress(f"ready: Ray actors N={n} (cold, then {settings.ray_launches - 1} warm)")
        args = ["ready", "--who", "ray", "--n", str(n), "--launches", str(settings.ray_launches)]
        result = helper(args, cwd, timeout=900)
        add("ray/cold", n, result["times"][:1])
        add("ray/warm", n, result["times"][1:])
        ray_init.append(result["init"])
    return {
        "samples": samples,
        "median": {k: {n: median(v) for n, v in by_n.items()} for k, by_n in samples.items()},
        "pss": pss,
        "pss_median": {
            m: {key: median([p[key] for p in pss[m]]) for key in ("workers_kib", "server_kib")}
            for m in METHODS
            if pss[m]
        },
        "shutdown_median": {m: median(v) for m, v in shutdown.items()},
        "ray_init": ray_init,
        "warnings": sorted(set(warnings)),
    }


def measure_rpc(settings: Settings, cwd: str) -> dict[str, Any]:
    progress(f"rpc: {settings.rpc_rounds} interleaved rounds (Pipe floor, hwlaunch, Ray)")
    return helper(["rpc", "--rounds", str(settings.rpc_rounds)], cwd, timeout=900)


def measure_channels(settings: Settings, cwd: str) -> dict[str, Any]:
    progress(f"rpc channels: {settings.rpc_rounds} interleaved rounds (shm, pipe, floor)")
    out = Path(cwd) / "rpc_channel.json"
    cmd = [sys.executable, str(CHANNELS), "--rounds", str(settings.rpc_rounds), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"rpc_channel.py failed (exit {proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(out.read_text())
    result.pop("samples")  # the medians and means are kept; the samples are in the helper's file
    return result


def importtime_us(cwd: str) -> float:
    """``python -X importtime``: the cumulative microseconds of the ``hwlaunch`` line."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import hwlaunch"],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    for line in proc.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "hwlaunch":
            return float(parts[1])
    raise RuntimeError(f"no hwlaunch line in -X importtime output:\n{proc.stderr}")


def measure_startup(settings: Settings, cwd: str) -> dict[str, Any]:
    progress("start-up: import hwlaunch, hwlaunch backends/resolve, resolve(), main guard")
    bare, imported = [], []
    for _ in range(settings.import_runs):  # interleaved
        bare.append(wall([sys.executable, "-c", "pass"], cwd))
        imported.append(wall([sys.executable, "-c", "import hwlaunch"], cwd))
    importtime = [importtime_us(cwd) / 1e6 for _ in range(5)]
    modules = subprocess.run(
        [sys.executable, "-c", "import sys, hwlaunch; print(sorted(sys.modules))"],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    script = Path(sys.executable).with_name("hwlaunch")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "hwlaunch.cli"]
    backends = [wall([*cli, "backends"], cwd) for _ in range(settings.cli_runs)]
    resolve_cli = [wall([*cli, "resolve", "-n", "2"], cwd) for _ in range(settings.cli_runs)]
    resolve_py = helper(["resolve", "--calls", "2000"], cwd)
    train = Path(cwd) / "train.py"
    train.write_text(generate(5000))
    guard = []
    for _ in range(settings.mainguard_runs):
        proc = subprocess.run(
            [sys.executable, str(train)],
            cwd=cwd,
            env=clean_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(MARK))
        guard.append(json.loads(line[len(MARK) :]))
    return {
        "python_pass": bare,
        "import_hwlaunch": imported,
        "import_raw": median(imported),
        "import_net": median(imported) - median(bare),
        "importtime": median(importtime),
        "torch_imported": "'torch'" in modules,
        "backends": median(backends),
        "backends_samples": backends,
        "resolve_cli": median(resolve_cli),
        "resolve_cli_samples": resolve_cli,
        "resolve_call": resolve_py["median"],
        "resolve_first_call": resolve_py["first"],
        "mainguard_samples": guard,
        "mainguard_first": median([g["first"] for g in guard]),
        "mainguard_cached": median([g["cached"] for g in guard]),
        "mainguard_whole_parse": median([g["whole_parse"] for g in guard]),
        "mainguard_ok": all(g["status"] == "guarded" and g["same_spans"] for g in guard),
        "mainguard_lines": guard[0]["lines"] if guard else 0,
    }


# -- the report ---------------------------------------------------------------------------------
def seconds(value: float) -> str:
    if value != value:  # NaN: not measured
        return "-"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def ratio(value: float, base: float) -> str:
    if value != value or base != base or base == 0:
        return "-"
    return f"x{value / base:.2f}"


@dataclass(frozen=True)
class Target:
    name: str
    passed: bool | None  # None: this machine cannot measure it (the detail says why)
    detail: str


def channel_targets(channels: dict[str, Any]) -> list[Target]:
    """The channel's own targets, as ``benchmarks/rpc_channel.py`` checked them."""
    return [Target(t["name"], t["passed"], t["detail"]) for t in channels["targets"]]


def launch_targets(ready: dict[str, Any]) -> list[Target]:
    """Time to ready and memory of 8 workers: forkserver against spawn and fork."""
    med = ready["median"]

    def at8(key: str) -> float:
        return float(med.get(key, {}).get(8, float("nan")))

    fs_first, spawn_first = at8("forkserver/first"), at8("spawn/first")
    fs_later, fork_later = at8("forkserver/later"), at8("fork/later")
    pss = ready["pss_median"]
    fs_pss = pss.get("forkserver", {}).get("workers_kib", float("nan"))
    spawn_pss = pss.get("spawn", {}).get("workers_kib", float("nan"))
    return [
        Target(
            "forkserver first launch of 8 workers <= 1/2 of spawn's",
            fs_first <= 0.5 * spawn_first,
            f"{seconds(fs_first)} vs {seconds(spawn_first)} ({ratio(fs_first, spawn_first)})",
        ),
        Target(
            "later forkserver launch of 8 workers <= 2x fork's",
            fs_later <= 2 * fork_later,
            f"{seconds(fs_later)} vs {seconds(fork_later)} ({ratio(fs_later, fork_later)}; "
            f"multiprocessing alone: {ratio(at8('mp-forkserver/later'), at8('mp-fork/later'))})",
        ),
        Target(
            "forkserver summed PSS of 8 workers <= 1/2 of spawn's",
            fs_pss <= 0.5 * spawn_pss,
            f"{fs_pss / 1024:.0f} MiB vs {spawn_pss / 1024:.0f} MiB ({ratio(fs_pss, spawn_pss)})",
        ),
    ]


def rpc_targets(rpc: dict[str, Any]) -> list[Target]:
    """A collective_rpc no-op against the raw Pipe floor and against a Ray actor call."""
    rpc_med = rpc["median"]
    hw, floor = rpc_med["hwlaunch/noop"], rpc_med["pipe/noop"]
    ray = rpc_med.get("ray/noop", float("nan"))
    return [
        Target(
            "collective_rpc no-op <= 2x the raw Pipe floor",
            hw <= 2 * floor,
            f"{seconds(hw)} vs {seconds(floor)} ({ratio(hw, floor)})",
        ),
        Target(
            "collective_rpc no-op at least 10x faster than a Ray actor call",
            ray >= 10 * hw,
            f"{seconds(hw)} vs {seconds(ray)} (Ray {ratio(ray, hw)})",
        ),
    ]


def startup_targets(startup: dict[str, Any]) -> list[Target]:
    """What a user waits for before any worker: the import, the CLI, resolve(), the guard."""
    return [
        Target(
            "import hwlaunch < 50 ms (net of python -c pass)",
            startup["import_net"] < 0.050 and not startup["torch_imported"],
            f"{seconds(startup['import_net'])} net, {seconds(startup['import_raw'])} raw, "
            f"-X importtime {seconds(startup['importtime'])}"
            + ("; torch imported!" if startup["torch_imported"] else "; no torch"),
        ),
        Target(
            "hwlaunch backends < 0.5 s",
            startup["backends"] < 0.5,
            seconds(startup["backends"]),
        ),
        Target(
            "resolve() < 1 ms", startup["resolve_call"] < 1e-3, seconds(startup["resolve_call"])
        ),
        Target(
            "main-guard detection (first, 5,000 lines) < 20 ms",
            startup["mainguard_first"] < 0.020 and startup["mainguard_ok"],
            f"{seconds(startup['mainguard_first'])}"
            + ("" if startup["mainguard_ok"] else " (WRONG ANSWER)"),
        ),
    ]


def targets(ready: dict[str, Any], rpc: dict[str, Any], startup: dict[str, Any]) -> list[Target]:
    return [*launch_targets(ready), *rpc_targets(rpc), *startup_targets(startup)]


READY_ROWS = (
    ("hwlaunch fork, first launch", "fork/first"),
    ("hwlaunch fork, later launch (alternated with forkserver's)", "fork/later"),
    ("hwlaunch forkserver, first launch (fresh parent)", "forkserver/first"),
    ("hwlaunch forkserver, later launch", "forkserver/later"),
    ("hwlaunch spawn", "spawn/first"),
    ("torch.multiprocessing.start_processes (spawn)", "torch/first"),
    ("multiprocessing alone, fork, later launch (reference)", "mp-fork/later"),
    ("multiprocessing alone, forkserver, later launch (reference)", "mp-forkserver/later"),
    ("Ray actors, cluster running", "ray/warm"),
    ("Ray actors, cold (import ray + ray.init)", "ray/cold"),
)
RPC_ROWS = (
    ("raw multiprocessing.Pipe, 2 children (floor)", "pipe"),
    ("Pipe + pickle (Connection.send/recv)", "pipe+pickle"),
    ("hwlaunch collective_rpc (mp, fork, shm channel)", "hwlaunch"),
    ("Ray: ray.get on 2 actor calls", "ray"),
)


def header_section(result: dict[str, Any]) -> list[str]:
    machine = result["machine"]
    return [
        f"hwlaunch benchmark — {machine['cpus']} CPUs, Python "
        f"{machine['python']}, torch {machine['torch']}, Ray "
        f"{machine['ray']}; load average {machine['load_before']} before, "
        f"{machine['load_after']} after; {result['duration_s']:.0f} s in all"
        + (" (--quick)" if result["quick"] else ""),
    ]


def ready_section(settings: dict[str, Any], ready: dict[str, Any]) -> list[str]:
    """Time to ready of every contender at each N, as a ratio to hwlaunch spawn's."""
    med = ready["median"]
    sizes = sorted({n for by_n in med.values() for n in by_n})
    out = [
        "",
        f"### Time to ready (medians: first launches of {settings['repeats']} fresh parents, "
        f"later launches {settings['later_rounds']} per forkserver parent, fork and forkserver "
        "alternated; init_distributed=False; ratio to hwlaunch spawn at the same N)",
        "",
        "| contender | " + " | ".join(f"N={n}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for label, key in READY_ROWS:
        cells = []
        for n in sizes:
            value = med.get(key, {}).get(n, float("nan"))
            base = med.get("spawn/first", {}).get(n, float("nan"))
            cells.append("-" if value != value else f"{seconds(value)} ({ratio(value, base)})")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return [
        *out,
        "",
        f"Ray: ray.init alone {seconds(median(ready['ray_init']))}; Ray's runs: one parent per N "
        f"(1 cold launch, {settings['ray_launches'] - 1} warm). Shutdown of the hwlaunch "
        "workers (median): "
        + ", ".join(f"{m} {seconds(v)}" for m, v in ready["shutdown_median"].items()),
    ]


def memory_section(ready: dict[str, Any]) -> list[str]:
    out = [
        "",
        "### Memory: summed PSS of 8 idle workers (/proc/PID/smaps_rollup)",
        "",
        "| start method | 8 workers | + fork server | workers vs spawn |",
        "|---|---|---|---|",
    ]
    spawn_pss = ready["pss_median"].get("spawn", {}).get("workers_kib", float("nan"))
    for method, pss in ready["pss_median"].items():
        server = pss["server_kib"]
        out.append(
            f"| {method} | {pss['workers_kib'] / 1024:.0f} MiB | "
            + (f"{(pss['workers_kib'] + server) / 1024:.0f} MiB" if server else "-")
            + f" | {ratio(pss['workers_kib'], spawn_pss)} |"
        )
    return out


def rpc_section(settings: dict[str, Any], rpc: dict[str, Any]) -> list[str]:
    rmed = rpc["median"]
    out = [
        "",
        f"### collective_rpc round trip to 2 workers (median of {settings['rpc_rounds']} "
        "interleaved rounds)",
        "",
        "| path | no-op | vs Pipe floor | 1 MB echo | vs Pipe floor |",
        "|---|---|---|---|---|",
    ]
    for label, key in RPC_ROWS:
        noop, big = rmed.get(f"{key}/noop", float("nan")), rmed.get(f"{key}/1MB", float("nan"))
        out.append(
            f"| {label} | {seconds(noop)} | {ratio(noop, rmed['pipe/noop'])} | {seconds(big)} | "
            f"{ratio(big, rmed['pipe/1MB'])} |"
        )
    return out


def startup_section(startup: dict[str, Any]) -> list[str]:
    return [
        "",
        "### Start-up costs",
        "",
        "| figure | median |",
        "|---|---|",
        f"| `import hwlaunch`, wall, net of `python -c pass` | {seconds(startup['import_net'])} |",
        f"| `import hwlaunch`, wall, raw | {seconds(startup['import_raw'])} |",
        f"| `import hwlaunch`, `-X importtime` | {seconds(startup['importtime'])} |",
        f"| `hwlaunch backends`, wall | {seconds(startup['backends'])} |",
        f"| `hwlaunch resolve -n 2`, wall | {seconds(startup['resolve_cli'])} |",
        f"| `resolve()` in-process (2,000 calls) | {seconds(startup['resolve_call'])} |",
        f"| `resolve()` first call in a process | {seconds(startup['resolve_first_call'])} |",
        f"| main-guard detection, {startup['mainguard_lines']}-line script, first | "
        f"{seconds(startup['mainguard_first'])} |",
        f"| main-guard detection, cached | {seconds(startup['mainguard_cached'])} |",
        f"| whole-file `ast.parse` of that script (for reference) | "
        f"{seconds(startup['mainguard_whole_parse'])} |",
    ]


def targets_section(result: dict[str, Any]) -> list[str]:
    out = ["", "### Targets", ""]
    for target in result["targets"]:
        status = {True: "PASS", False: "MISS", None: "N/A"}[target["passed"]]
        out.append(f"- **{status}** {target['name']}: {target['detail']}")
    warnings = result["ready"]["warnings"]
    if warnings:
        out += ["", "Executor warnings seen: " + "; ".join(warnings)]
    return out


def report(result: dict[str, Any]) -> str:
    settings, ready = result["settings"], result["ready"]
    out = [
        *header_section(result),
        *ready_section(settings, ready),
        *memory_section(ready),
        *rpc_section(settings, result["rpc"]),
        "",
        "### RPC channels side by side",
        "",
        channel_report(result["channels"]),
        *startup_section(result["startup"]),
        *targets_section(result),
    ]
    return "\n".join(out) + "\n"


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and sizes (~2 min)")
    parser.add_argument("--out", default=str(HERE / "results" / "bench.json"), metavar="FILE")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    began = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hwlaunch-bench-") as cwd:
        startup = measure_startup(settings, cwd)
        rpc = measure_rpc(settings, cwd)
        channels = measure_channels(settings, cwd)
        ready = measure_ready(settings, cwd)
    result: dict[str, Any] = {
        "quick": args.quick,
        "settings": asdict(settings),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": version("torch"),
            "ray": version("ray"),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "duration_s": time.perf_counter() - began,
        "startup": startup,
        "rpc": rpc,
        "channels": channels,
        "ready": ready,
    }
    found = targets(ready, rpc, startup) + channel_targets(channels)
    result["targets"] = [asdict(t) for t in found]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result), end="")
    progress(f"wrote {out}")


if __name__ == "__main__":
    main()
