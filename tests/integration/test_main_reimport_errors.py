"""A spawn/forkserver worker whose re-import of ``__main__`` fails reports why, with its traceback.

CPython re-imports the program's ``__main__`` (as ``__mp_main__``) in ``spawn.prepare()``,
before any hwlaunch code exists in the child; hwlaunch's own workers do it inside their start-up
handshake instead, so the parent's WorkerStartupError carries the worker's traceback and rank
rather than "ended ... without a Python exception". Each case is a real program in a
subprocess: its top level misbehaves in the child only. Every worker writes its pid when it
re-imports the program, so the program can check, right after the error, that none is left
running, and that each worker re-imported the program exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each program starts its workers with spawn and forkserver

METHODS = ("spawn", "forkserver")
PREFIX = "OUTCOME "

# The program's top level, above its main guard. CHILD_TOP is what a worker meets on re-import.
PROGRAM = """\
import json, os, sys, time, types
import psutil
import hwlaunch

if __name__ == "__mp_main__":
    with open(os.path.join(os.environ["PIDS_DIR"], str(os.getpid())), "a") as f:
        f.write("imported\\n")
{child_top}

def main_name(worker):
    return sys.modules["__main__"].__name__

def outcome(method):
    before = set(os.listdir(os.environ["PIDS_DIR"]))
    result = {{"method": method}}
    try:
        with hwlaunch.launch(
            backend="cpu", world_size=2, init_distributed=False, start_method=method
        ) as executor:
            result["ok"] = executor.collective_rpc(main_name)
    except hwlaunch.HwlaunchError as exc:
        result["error"] = type(exc).__name__
        result["text"] = str(exc)
        result["rank"] = getattr(exc, "rank", None)
    pids = [int(p) for p in set(os.listdir(os.environ["PIDS_DIR"])) - before]
    result["left_running"] = [
        p for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    result["imports"] = [
        open(os.path.join(os.environ["PIDS_DIR"], str(p))).read().count("imported")
        for p in pids
    ]
    result["main_class_restored"] = type(sys.modules["__main__"]) is types.ModuleType
    return result

if __name__ == "__main__":
    for method in sys.argv[1:]:
        print("OUTCOME " + json.dumps(outcome(method)), flush=True)
"""


def outcomes(tmp_path: Path, child_top: str, *, as_module: bool = False) -> list[dict[str, Any]]:
    """Run the program (a script, or ``-m prog``) launching with each method; its outcomes."""
    top = textwrap.indent(textwrap.dedent(child_top), "    ")
    (tmp_path / "prog.py").write_text(PROGRAM.format(child_top=top))
    pids = tmp_path / "pids"
    pids.mkdir()
    start = ["-m", "prog"] if as_module else ["prog.py"]
    done = subprocess.run(
        [sys.executable, *start, *METHODS],
        cwd=tmp_path,
        env={**os.environ, "PIDS_DIR": str(pids)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    found = [
        json.loads(ln[len(PREFIX) :]) for ln in done.stdout.splitlines() if ln.startswith(PREFIX)
    ]
    assert [o["method"] for o in found] == list(METHODS), done.stdout + done.stderr
    return found


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "dash-m"])
def test_error_at_the_programs_top_level_comes_back_with_the_workers_traceback(
    tmp_path: Path, as_module: bool
) -> None:
    found = outcomes(tmp_path, 'raise RuntimeError("boom at import")', as_module=as_module)
    what = "module prog" if as_module else f"file {tmp_path / 'prog.py'}"
    for o in found:
        assert o["error"] == "WorkerStartupError", o
        text = o["text"]
        assert f"worker rank {o['rank']} failed to start: RuntimeError: boom at import" in text
        assert f"{what}, as __mp_main__, as {o['method']} does" in text
        assert f"--- remote traceback (rank {o['rank']}) ---" in text
        assert f'File "{tmp_path / "prog.py"}", line ' in text  # the worker's own frames
        assert 'raise RuntimeError("boom at import")' in text
        assert "without a Python exception" not in text
        assert o["left_running"] == [], o
        assert o["main_class_restored"], o


def test_a_process_started_while_reimporting_gets_the_bootstrapping_error(tmp_path: Path) -> None:
    """The re-import runs with ``_inheriting`` set, as in ``prepare()``: the same check applies."""
    child_top = """\
    import multiprocessing
    multiprocessing.get_context("spawn").Process(target=print).start()
    """
    for o in outcomes(tmp_path, child_top):
        assert o["error"] == "WorkerStartupError", o
        assert "bootstrapping phase" in o["text"], o
        assert f'File "{tmp_path / "prog.py"}", line ' in o["text"]
        assert o["left_running"] == [], o


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "dash-m"])
def test_a_clean_program_is_reimported_once_per_worker(tmp_path: Path, as_module: bool) -> None:
    """Nothing else changes: each worker's __main__ is the program, imported once, as __mp_main__."""
    for o in outcomes(tmp_path, "pass", as_module=as_module):
        assert o["ok"] == ["__mp_main__", "__mp_main__"], o
        assert sorted(o["imports"]) == [1, 1], o  # prepare() did not import it a second time
        assert o["main_class_restored"], o
