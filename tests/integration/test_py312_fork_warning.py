"""Python 3.12+ warns on every fork of a multi-threaded process; hwlaunch's own fork of workers
beside only its own threads must not show it, and one beside a thread of the program must.

Run on 3.12 and 3.13 by ``.ci/other-pythons`` (torch-free workers), with
``-W always::DeprecationWarning`` so that CPython shows the warning wherever it is issued
(it cannot be raised: it is issued after the fork, and an error there is only printed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="the fork warning exists from Python 3.12"
)
WARNING = "is multi-threaded, use of fork() may lead to deadlocks"
PROGRAM = textwrap.dedent(
    """\
    import sys, threading, time
    import hwlaunch

    class NoTorch:
        def init_device(self):
            self.device = None  # no torch: these workers run on Pythons without it

    def launch(**options):
        return hwlaunch.launch(
            backend="cpu", world_size=2, init_distributed=False, worker_extension=NoTorch,
            **options,
        )

    def main(case):
        first = launch(start_method="fork")  # its monitor thread stays alive
        slow = first.collective_rpc(lambda worker: time.sleep(1), non_block=True)  # and hwlaunch-collect
        stop = threading.Event()
        if case in ("program-thread", "default-plan"):
            threading.Thread(target=stop.wait, name="the-program's").start()
        method = {} if case == "default-plan" else {"start_method": "fork"}
        threads = sorted(t.name for t in threading.enumerate())
        print("THREADS", *threads, file=sys.stderr, flush=True)
        print("FORKING", file=sys.stderr, flush=True)  # the warnings of interest come after this
        with launch(**method) as second:
            print("METHOD", second.plan.start_method, file=sys.stderr, flush=True)
            print("RESULT", second.collective_rpc(lambda worker: worker.rank), flush=True)
        stop.set()
        slow.result()
        first.shutdown()

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


def run_case(tmp_path: Path, case: str) -> tuple[str, str]:
    script = tmp_path / "job.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", str(script), case],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HWLAUNCH_STARTUP_TIMEOUT": "60"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT [0, 1]" in done.stdout, done.stdout
    threads, _, after = done.stderr.partition("FORKING")
    return threads, after


def test_fork_beside_only_hwlaunch_threads_shows_no_warning(tmp_path: Path) -> None:
    threads, after = run_case(tmp_path, "own-threads")
    assert "hwlaunch-monitor" in threads and "hwlaunch-collect" in threads, threads
    assert WARNING not in after, after


def test_fork_beside_a_program_thread_shows_the_warning(tmp_path: Path) -> None:
    """The warning is true there, and the check above could fail: it is left to CPython."""
    threads, after = run_case(tmp_path, "program-thread")
    assert "the-program's" in threads, threads
    assert WARNING in after, after


def test_the_default_plan_beside_a_program_thread_never_forks(tmp_path: Path) -> None:
    """hwlaunch's own choice beside a thread of the program is the fork server: no warning."""
    threads, after = run_case(tmp_path, "default-plan")
    assert "the-program's" in threads, threads
    assert "METHOD forkserver" in after, after
    assert WARNING not in after, after
