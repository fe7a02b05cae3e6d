"""What a worker starts with must pickle: the error names the object and the attribute path
that does not, before any process starts.

The worker extension of a script travels by value (cloudpickle; an importable one by
reference); spawn and forkserver (the Linux default from Python 3.14) also pickle the plan,
which fork does not. The cases run as a real script, whose ``__main__`` classes are what
cloudpickle sends by value; each checks the path in the message, that it is a ConfigError
(CLI exit 2), and that nothing was started: no child process and no fork server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent(
    """\
    import dataclasses, json, sys, threading
    from multiprocessing import forkserver
    import psutil
    import hwlaunch

    LOCK = threading.Lock()

    class Config:
        def __init__(self):
            self.lock = threading.Lock()

    class NoTorch:
        def init_device(self):
            self.device = None  # no torch: these workers run on Pythons without it

    class LockAttribute(NoTorch):
        pool = threading.Lock()

    class NestedLock(NoTorch):
        config = Config()

    class ReadsGlobalLock(NoTorch):
        def work(self):
            with LOCK:
                return 1

    def extension_with_closure():
        lock = threading.Lock()
        class Closure(NoTorch):
            def work(self):
                return lock.locked()
        return Closure

    def outcome(launch):
        try:
            with launch() as executor:
                return {"ok": executor.collective_rpc(lambda worker: worker.rank)}
        except hwlaunch.HwlaunchError as exc:
            return {
                "error": type(exc).__name__,
                "config_error": isinstance(exc, hwlaunch.ConfigError),
                "exit_code": exc.exit_code,
                "text": str(exc),
                "children": len(psutil.Process().children()),
                "forkserver": getattr(forkserver._forkserver, "_forkserver_pid", None) is not None,
            }

    def main():
        method = sys.argv[1]
        extensions = {
            "class attribute": LockAttribute,
            "attribute of an attribute": NestedLock,
            "global of a method": ReadsGlobalLock,
            "closure": extension_with_closure(),
        }
        results = {
            name: outcome(lambda: hwlaunch.launch(
                backend="cpu", world_size=2, init_distributed=False, start_method=method,
                worker_extension=extension,
            ))
            for name, extension in extensions.items()
        }
        plan = hwlaunch.resolve(backend="cpu", world_size=2, start_method=method)
        odd = dataclasses.replace(plan, warnings=(*plan.warnings, LOCK))
        results["plan"] = outcome(
            lambda: hwlaunch.launch(odd, init_distributed=False, worker_extension=NoTorch)
        )
        print("RESULTS " + json.dumps(results), flush=True)

    if __name__ == "__main__":
        main()
    """
)
EXTENSION_PATHS = {
    "class attribute": "worker_extension LockAttribute.pool: ",
    "attribute of an attribute": "worker_extension NestedLock.config.lock: ",
    "global of a method": "worker_extension ReadsGlobalLock.work.__globals__['LOCK']: ",
    "closure": "worker_extension extension_with_closure.<locals>.Closure.work "
    "(closure variable lock): ",
}


def run_cases(tmp_path: Path, method: str) -> dict[str, dict[str, object]]:
    script = tmp_path / "job.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(script), method],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HWLAUNCH_STARTUP_TIMEOUT": "60"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS "))
    results: dict[str, dict[str, object]] = json.loads(line.removeprefix("RESULTS "))
    return results


def assert_refused_before_starting(result: dict[str, object]) -> str:
    assert result.get("error") == "NotPicklableError", result
    assert (result["config_error"], result["exit_code"]) == (True, 2), result
    assert (result["children"], result["forkserver"]) == (0, False), result  # nothing started
    return str(result["text"])


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_unpicklable_launch_arguments_are_named_before_anything_starts(
    tmp_path: Path, method: str
) -> None:
    results = run_cases(tmp_path, method)
    for case, path in EXTENSION_PATHS.items():
        text = assert_refused_before_starting(results[case])
        assert text.startswith(path + "TypeError: cannot pickle '_thread.lock' object"), text
        assert "travels to each worker by value" in text and "Fix: create it in the worker" in text
    if method == "fork":  # fork does not pickle the plan: its workers start
        assert results["plan"] == {"ok": [0, 1]}, results["plan"]
    else:
        text = assert_refused_before_starting(results["plan"])
        assert text.startswith("plan.warnings[0]: TypeError: cannot pickle"), text
        assert f"{method} pickles the plan for each worker; nothing was started" in text
