"""Running the scripts under ``scripts/`` as users run theirs: ``python script.py``, fresh.

Why subprocesses: what these tests check happens at a program's start or end (its
``__main__``, its first OpenMP op, its death), or needs vLLM's own executor, which spawns
processes of its own; a fresh interpreter per script keeps pytest's process out of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """The JSON object the script printed last on stdout."""
        assert self.returncode == 0, self.stderr[-4000:]
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no JSON line on stdout:\n{self.stdout[-2000:]}\n{self.stderr[-3000:]}"
        return json.loads(lines[-1])


def script_env(**extra: str | None) -> dict[str, str]:
    """This environment without hwlaunch's settings and vLLM's CPU binding, plus ``extra``
    (a None value removes the variable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HWLAUNCH_") and k != "VLLM_CPU_OMP_THREADS_BIND"
    }
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_script(name: str, *args: str, timeout: float = 300, **env: str | None) -> Finished:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=SCRIPTS,
        env=script_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def start_script(name: str, *args: str, **env: str | None) -> subprocess.Popen[str]:
    """The script started, its stdout a pipe read line by line (stderr to a pipe too)."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=SCRIPTS,
        env=script_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def left_behind(ident: str) -> list[str]:
    """What a job's ranks left: vLLM's CPU all-reduce segments in /dev/shm (named after
    ``VLLM_DIST_IDENT``), and the file store's file they met through (that name, in the
    temporary directory)."""
    found = sorted(name for name in os.listdir("/dev/shm") if name.startswith(f"{ident}-"))
    store = Path(tempfile.gettempdir(), ident)
    return found + ([str(store)] if store.exists() else [])
