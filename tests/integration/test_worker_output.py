"""Worker output, with real workers: every line whole and prefixed with its rank and pid, on the
console and in the rank's own log files, under every start method and Ray; console_ranks,
colours, a new log file per restart attempt, prompt flushes, process titles.

Each case runs a driver program in a fresh interpreter whose stdout and stderr are what the test
reads, as a user's terminal would show them (a pseudo-terminal for the colour cases).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from plugin_sites import hwlaunch_cli

from hwlaunch.errors import ConfigError

LINES = 2000  # per rank and per writer: Python and fd-level, stdout and stderr, a subprocess
PAD = "x" * 90  # long lines, so that the pipes' chunks end mid-line
PREFIXED = re.compile(r"^\[rank(\d+) pid=(\d+)\] (.*)$")

HEADER = """
import json, os, subprocess, sys
import hwlaunch

def chatter(worker, lines, pad):
    r = worker.rank
    child = (
        "import sys\\n"
        f"for i in range({lines // 4}): sys.stdout.write(f'sub {r} {{i}} {pad}\\\\n')"
    )
    for i in range(lines):
        print(f"py-out {r} {i} {pad}")
        print(f"py-err {r} {i} {pad}", file=sys.stderr)
        os.write(1, f"fd-out {r} {i} {pad}\\n".encode())
        os.write(2, f"fd-err {r} {i} {pad}\\n".encode())
    sys.stdout.flush()
    subprocess.run([sys.executable, "-c", child], check=True)
    sys.stdout.write(f"unfinished {r}")
    sys.stdout.flush()
    return os.getpid()

def report(**found):
    with open(os.environ["RESULT_FILE"], "w") as out:
        json.dump(found, out)
"""


def run_driver(
    tmp_path: Path,
    body: str,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    merged: bool = False,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``HEADER + body`` as a program; its console (``merged``: stdout and stderr in
    one pipe, in the order they were written), and what it reported."""
    script = tmp_path / "driver.py"
    script.write_text(HEADER + textwrap.dedent(body))
    result = tmp_path / "result.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "NO_COLOR"))}
    environ.pop("FORCE_COLOR", None)
    environ.update(RESULT_FILE=str(result), **(env or {}))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (done.stderr or done.stdout)[-3000:]
    return done, json.loads(result.read_text())


def by_rank(console: str, pids: list[int]) -> dict[int, list[str]]:
    """Each rank's lines, checked: every line prefixed, with the pid of the rank it names."""
    found: dict[int, list[str]] = {rank: [] for rank in range(len(pids))}
    for line in console.splitlines():
        match = PREFIXED.match(line)
        assert match, f"a line without its rank's prefix: {line[:200]!r}"
        rank, pid, text = int(match[1]), int(match[2]), match[3]
        assert pid == pids[rank], line[:200]
        found[rank].append(text)
    return found


def expected(rank: int, stream: str, lines: int = LINES) -> list[str]:
    """What ``chatter`` writes to one stream, in order per writer."""
    kinds = ("py-out", "fd-out") if stream == "stdout" else ("py-err", "fd-err")
    found = [f"{kind} {rank} {i} {PAD}" for kind in kinds for i in range(lines)]
    if stream == "stdout":
        found += [f"sub {rank} {i} {PAD}" for i in range(lines // 4)]
        found.append(f"unfinished {rank}")
    return found


def assert_whole(lines: list[str], rank: int, stream: str) -> None:
    """Exactly the lines the rank wrote (each whole: no other rank's bytes inside), and each
    writer's in the order it wrote them."""
    assert sorted(lines) == sorted(expected(rank, stream)), (rank, stream)
    for kind in ("py-out", "fd-out", "sub", "py-err", "fd-err"):
        mine = [line for line in lines if line.startswith(kind + " ")]
        assert mine == [line for line in expected(rank, stream) if line.startswith(kind + " ")]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_line_reaches_the_console_whole_with_its_rank_and_pid_and_its_own_log_file(
    tmp_path: Path, method: str
) -> None:
    done, found = run_driver(
        tmp_path,
        f"""
        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2, start_method={method!r}, log_dir="logs") as ex:
                pids = ex.collective_rpc(chatter, args=({LINES}, {PAD!r}))
                run_dir = ex.plan.log_run_dir
            report(pids=pids, run_dir=run_dir)
        """,
    )
    pids = found["pids"]
    for stream, console in (("stdout", done.stdout), ("stderr", done.stderr)):
        lines = by_rank(console, pids)
        for rank in (0, 1):
            assert_whole(lines[rank], rank, stream)
            log = Path(found["run_dir"]) / f"rank{rank}.attempt0.{stream}"
            text = log.read_text()
            assert sorted(text.split("\n")) == sorted(
                expected(rank, stream) + [""] * (stream == "stderr")
            )
            if stream == "stdout":
                assert text.endswith(f"\nunfinished {rank}")  # as written: no newline added
    assert Path(found["run_dir"]).parent == tmp_path / "logs"


def test_a_crashed_worker_s_last_partial_line_is_shown_and_kept(tmp_path: Path) -> None:
    done, found = run_driver(
        tmp_path,
        """
        def crash(worker):
            if worker.rank == 1:
                sys.stdout.write("last words, no newline")
                sys.stdout.flush()
                os.write(2, b"native partial")
                os._exit(3)
            return os.getpid()

        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2, log_dir="logs") as ex:
                pids = ex.pids
                try:
                    ex.collective_rpc(crash)
                except hwlaunch.WorkerDiedError as exc:
                    died = str(exc)
                run_dir = ex.plan.log_run_dir
            report(pids=pids, died=died, run_dir=run_dir)
        """,
    )
    pid = found["pids"][1]
    assert f"[rank1 pid={pid}] last words, no newline\n" in done.stdout
    assert f"[rank1 pid={pid}] native partial\n" in done.stderr
    run_dir = Path(found["run_dir"])
    assert (run_dir / "rank1.attempt0.stdout").read_text() == "last words, no newline"
    assert (run_dir / "rank1.attempt0.stderr").read_text().endswith("native partial")


def test_console_ranks_chooses_the_ranks_on_the_console_and_the_files_keep_every_rank(
    tmp_path: Path,
) -> None:
    done, found = run_driver(
        tmp_path,
        """
        def hello(worker):
            print(f"hello from {worker.rank}")
            return os.getpid()

        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2, log_dir="logs") as ex:
                pids = ex.collective_rpc(hello)
                run_dir = ex.plan.log_run_dir
                decision = ex.plan.decision("console_ranks")
            report(pids=pids, run_dir=run_dir, source=decision.source, value=decision.value)
        """,
        env={"HWLAUNCH_CONSOLE_RANKS": "1"},
    )
    assert done.stdout == f"[rank1 pid={found['pids'][1]}] hello from 1\n"
    assert (found["source"], found["value"]) == ("env HWLAUNCH_CONSOLE_RANKS", [1])
    for rank in (0, 1):
        log = Path(found["run_dir"]) / f"rank{rank}.attempt0.stdout"
        assert log.read_text() == f"hello from {rank}\n"


def test_a_print_with_flush_reaches_the_console_while_the_worker_is_still_busy(
    tmp_path: Path,
) -> None:
    """The worker prints, then waits until the test has seen its line on the driver's stdout:
    a forwarder that held lines back until the call (or the worker) ended would hang here."""
    go = tmp_path / "go"
    script = tmp_path / "driver.py"
    script.write_text(
        HEADER
        + textwrap.dedent(
            f"""
            import time
            def wait_for_go(worker):
                if worker.rank == 0:
                    print("waiting for go", flush=True)
                    while not os.path.exists({str(go)!r}):
                        time.sleep(0.01)
                return worker.rank

            if __name__ == "__main__":
                with hwlaunch.launch(world_size=2) as ex:
                    ex.collective_rpc(wait_for_go)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the line arrives (the test's timeout)
        assert line.decode().endswith("] waiting for go\n") and line.startswith(b"[rank0 pid=")
        go.touch()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        proc.wait()


def test_what_a_call_printed_comes_before_what_the_caller_prints_after_it(
    tmp_path: Path,
) -> None:
    """Without flush, and with the console a pipe (block-buffered prints): the workers' lines
    of a call are on the console before the call returns."""
    done, _ = run_driver(
        tmp_path,
        """
        def steps(worker):
            for i in range(2000):
                print(f"step {i} of {worker.rank}")

        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2) as ex:
                for call in range(3):
                    ex.collective_rpc(steps)
                    print(f"call {call} returned", flush=True)
            report()
        """,
    )
    lines = done.stdout.splitlines()
    size = 2 * 2000 + 1
    for call in range(3):
        block = lines[call * size : (call + 1) * size]
        assert block[-1] == f"call {call} returned", block[-3:]
        assert sorted(line.split("] ", 1)[1] for line in block[:-1]) == sorted(
            f"step {i} of {r}" for i in range(2000) for r in (0, 1)
        )


def test_a_call_s_descriptor_level_writes_come_before_what_the_caller_prints_after_it(
    tmp_path: Path,
) -> None:
    """Writes to fds 1 and 2 that bypass Python (C code, a child process) right before the
    call returns: on the console before the caller's next line, call after call, with one
    polling worker (whose own report on its pipes lets the parent skip its look) and two."""
    done, _ = run_driver(
        tmp_path,
        """
        import subprocess

        def native(worker, call):
            os.write(1, f"native out {call} of {worker.rank}\\n".encode())
            if call % 10 == 0:
                subprocess.run(["sh", "-c", f"echo child {call} of {worker.rank} >&2"])
            os.write(2, f"native err {call} of {worker.rank}\\n".encode())

        if __name__ == "__main__":
            for n in (1, 2):
                with hwlaunch.launch(world_size=n) as ex:
                    for call in range(100):
                        ex.collective_rpc(native, args=(call,))
                        print(f"call {call} of {n} returned", flush=True)
            report()
        """,
        merged=True,
    )
    seen: set[str] = set()
    for line in done.stdout.splitlines():
        text = line.split("] ", 1)[-1]
        if " returned" in text:
            call, n = int(text.split()[1]), int(text.split()[3])
            for rank in range(n):
                wanted = {f"native out {call} of {rank}", f"native err {call} of {rank}"}
                if call % 10 == 0:
                    wanted.add(f"child {call} of {rank}")
                assert wanted <= seen, (text, wanted - seen)
            seen.clear()
        else:
            seen.add(text)


def run_on_terminal(tmp_path: Path, env: dict[str, str]) -> bytes:
    """The driver's output as its terminal shows it (stdout and stderr on one pty)."""
    script = tmp_path / "driver.py"
    script.write_text(
        HEADER
        + textwrap.dedent(
            """
            def hello(worker):
                print(f"hello {worker.rank}")
                return worker.rank

            if __name__ == "__main__":
                with hwlaunch.launch(world_size=2) as ex:
                    ex.collective_rpc(hello)
            """
        )
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    environ.pop("NO_COLOR", None)
    environ.pop("FORCE_COLOR", None)
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the program ended and closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=120) == 0, out[-2000:]
    finally:
        proc.kill()
        proc.wait()
        os.close(main)
    return out


def test_each_rank_has_its_colour_on_a_terminal_and_none_with_no_color(tmp_path: Path) -> None:
    coloured = run_on_terminal(tmp_path, {})
    assert re.search(rb"\x1b\[36m\[rank0 pid=\d+\] \x1b\[0mhello 0\r\n", coloured), coloured
    assert re.search(rb"\x1b\[33m\[rank1 pid=\d+\] \x1b\[0mhello 1\r\n", coloured), coloured
    plain = run_on_terminal(tmp_path, {"NO_COLOR": "1"})
    assert b"\x1b[" not in plain
    assert re.search(rb"^\[rank0 pid=\d+\] hello 0\r$", plain, re.M), plain


def test_a_restart_writes_new_log_files_for_its_attempt(tmp_path: Path) -> None:
    done, found = run_driver(
        tmp_path,
        """
        def say(worker, what):
            print(f"{what} {worker.rank} restart={os.environ['RESTART_COUNT']}")
            return os.getpid()

        def die(worker):
            if worker.rank == 1:
                os._exit(9)

        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2, max_restarts=1, log_dir="logs") as ex:
                first = ex.collective_rpc(say, args=("before",))
                try:
                    ex.collective_rpc(die)
                except hwlaunch.WorkerDiedError:
                    pass
                second = ex.collective_rpc(say, args=("after",))
                run_dir = ex.plan.log_run_dir
            report(first=first, second=second, run_dir=run_dir)
        """,
    )
    run_dir = Path(found["run_dir"])
    assert sorted(p.name for p in run_dir.iterdir()) == [
        f"rank{r}.attempt{a}.{s}" for r in (0, 1) for a in (0, 1) for s in ("stderr", "stdout")
    ]
    for rank in (0, 1):
        assert (run_dir / f"rank{rank}.attempt0.stdout").read_text() == (
            f"before {rank} restart=0\n"
        )
        assert (run_dir / f"rank{rank}.attempt1.stdout").read_text() == f"after {rank} restart=1\n"
        assert f"[rank{rank} pid={found['first'][rank]}] before {rank} restart=0\n" in done.stdout
        assert f"[rank{rank} pid={found['second'][rank]}] after {rank} restart=1\n" in done.stdout


def test_the_prefix_template_names_the_rank_s_fields(tmp_path: Path) -> None:
    done, found = run_driver(
        tmp_path,
        """
        import socket
        def hello(worker):
            print("hi")
            return os.getpid()

        if __name__ == "__main__":
            template = "{backend}:{node}:{rank}/{local_rank}:{pid}| "
            with hwlaunch.launch(world_size=2, console_prefix=template) as ex:
                pids = ex.collective_rpc(hello)
            report(pids=pids, host=socket.gethostname())
        """,
    )
    host, pids = found["host"], found["pids"]
    assert sorted(done.stdout.splitlines()) == [f"cpu:{host}:{r}/{r}:{pids[r]}| hi" for r in (0, 1)]


def test_a_driver_s_own_sys_stdout_gets_the_workers_lines(tmp_path: Path) -> None:
    """A program that replaced sys.stdout (a notebook, a redirect) sees the workers' lines
    there, also under fork, where the worker inherits the replaced object."""
    done, found = run_driver(
        tmp_path,
        """
        import io
        def hello(worker):
            print(f"hello {worker.rank}")
            os.write(1, f"native {worker.rank}\\n".encode())
            return worker.rank

        if __name__ == "__main__":
            captured = open("captured.txt", "w")
            sys.stdout = captured
            with hwlaunch.launch(world_size=2, start_method="fork") as ex:
                ex.collective_rpc(hello)
            sys.stdout = sys.__stdout__
            captured.close()
            report(captured=open("captured.txt").read())
        """,
    )
    assert done.stdout == ""
    texts = sorted(line.split("] ", 1)[1] for line in found["captured"].splitlines())
    assert texts == ["hello 0", "hello 1", "native 0", "native 1"]


def test_the_output_thread_of_an_open_executor_does_not_make_the_next_launch_leave_fork(
    tmp_path: Path,
) -> None:
    """The forwarding thread is one of hwlaunch's own: forked workers never use a lock it
    holds (they get streams of their own), so it is no reason to fall back from fork."""
    _, found = run_driver(
        tmp_path,
        """
        def hello(worker):
            print(f"second {worker.rank}", flush=True)
            return os.getpid()

        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2) as first:
                plan = hwlaunch.resolve(world_size=2)
                with hwlaunch.launch(plan) as second:
                    pids = second.collective_rpc(hello)
            report(method=plan.start_method, warnings=list(plan.warnings), pids=pids)
        """,
    )
    assert (found["method"], found["warnings"]) == ("fork", [])


# -- process titles ---------------------------------------------------------------------------
TITLES = """
def titles(worker):
    pid = os.getpid()
    with open(f"/proc/{pid}/comm") as comm, open(f"/proc/{pid}/cmdline", "rb") as cmd:
        return comm.read().strip(), cmd.read().replace(b"\\0", b" ").decode().strip()

if __name__ == "__main__":
    if os.environ.get("BLOCK_SETPROCTITLE"):
        sys.modules["setproctitle"] = None  # as where it is not installed
    with hwlaunch.launch(world_size=2, start_method="fork") as ex:
        report(titles=ex.collective_rpc(titles))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc names the processes")
def test_each_worker_s_title_names_hwlaunch_the_backend_and_the_rank(tmp_path: Path) -> None:
    pytest.importorskip("setproctitle")
    _, found = run_driver(tmp_path, TITLES)
    assert found["titles"] == [
        ["hwl cpu rank0", "hwlaunch cpu rank0"],
        ["hwl cpu rank1", "hwlaunch cpu rank1"],
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc names the processes")
def test_without_setproctitle_the_kernel_s_name_still_names_the_rank(tmp_path: Path) -> None:
    _, found = run_driver(tmp_path, TITLES, env={"BLOCK_SETPROCTITLE": "1"})
    (comm0, cmd0), (comm1, _) = found["titles"]
    assert (comm0, comm1) == ("hwl cpu rank0", "hwl cpu rank1")
    assert "driver.py" in cmd0  # the command line is the interpreter's, untouched


# -- settings and the plan --------------------------------------------------------------------
def test_a_log_dir_that_cannot_be_made_fails_before_any_worker_starts(clean_env: Path) -> None:
    import hwlaunch

    blocker = clean_env / "a-file"
    blocker.write_text("")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ConfigError) as caught:
        hwlaunch.launch(world_size=2, log_dir=str(blocker / "logs"))
    message = str(caught.value)
    assert "resolve(log_dir=)" in message and str(blocker / "logs") in message, message
    assert "Fix:" in message
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_the_plan_shows_the_log_directory_with_its_source(tmp_path: Path) -> None:
    done = hwlaunch_cli(
        None, "resolve", "-n", "2", "--log-dir", "logs", "--json", cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["log_dir"] == str(tmp_path / "logs")
    (decision,) = [d for d in plan["decisions"] if d["setting"] == "log_dir"]
    assert (decision["value"], decision["source"]) == (str(tmp_path / "logs"), "--log-dir")
    assert "rank<R>.attempt<N>.stdout" in decision["reason"]
    table = hwlaunch_cli(
        None, "resolve", "-n", "2", cwd=tmp_path, timeout=120, HWLAUNCH_LOG_DIR="logs"
    )
    assert "env HWLAUNCH_LOG_DIR" in table.stdout and "log_dir" in table.stdout


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ("--console-prefix", "[{rnk}] "),
            {},
            "invalid console_prefix '[{rnk}] ' from --console-prefix: unknown field {rnk} (fields: {rank}, {local_rank}, {pid}, {backend}, {node})",
        ),
        (
            (),
            {"HWLAUNCH_CONSOLE_RANKS": "0,x"},
            "invalid console_ranks '0,x' from env HWLAUNCH_CONSOLE_RANKS: 'x' is not a rank or a range like 2-3 (allowed: 'all', or ranks and ranges",
        ),
        (
            ("--console-ranks", "3"),
            {},
            "invalid console_ranks '3' from --console-ranks: rank 3 is not in a world of 2 (ranks 0-1)",
        ),
    ],
)
def test_a_bad_output_setting_is_an_error_naming_its_source_and_the_allowed_form(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    done = hwlaunch_cli(None, "resolve", "-n", "2", *args, cwd=tmp_path, timeout=120, **env)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_in_process_executors_say_the_output_settings_are_not_used(clean_env: Path) -> None:
    import hwlaunch

    plan = hwlaunch.resolve(world_size=1, log_dir="logs", console_ranks="0")
    (warning,) = [w for w in plan.warnings if "not used" in w]
    assert warning.startswith("console_ranks (from resolve(console_ranks=)), log_dir (from")
    assert "uni executor runs the worker in this process" in warning
    assert plan.log_dir is None


# -- Ray ---------------------------------------------------------------------------------------
@pytest.mark.ray
def test_ray_actors_print_the_same_prefixed_lines_and_log_files(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    lines = 300
    done, found = run_driver(
        tmp_path,
        f"""
        if __name__ == "__main__":
            with hwlaunch.launch(world_size=2, executor="ray", log_dir="logs") as ex:
                pids = ex.collective_rpc(chatter, args=({lines}, {PAD!r}))
                run_dir = ex.plan.log_run_dir
                titles = []
                for pid in pids:  # "ray::<actor class>.<method>" while a call runs
                    with open(f"/proc/{{pid}}/cmdline", "rb") as cmd:
                        titles.append(cmd.read().split(b"\\0")[0].decode().partition(".")[0] + ".")
            report(pids=pids, run_dir=run_dir, titles=titles)
        """,
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
    )
    pids = found["pids"]
    assert found["titles"] == [f"ray::hwlaunch_cpu_rank{rank}." for rank in (0, 1)]
    stdout = by_rank(done.stdout, pids)
    for rank in (0, 1):
        assert sorted(stdout[rank]) == sorted(expected(rank, "stdout", lines))
        log = Path(found["run_dir"]) / f"rank{rank}.attempt0.stderr"
        assert sorted(log.read_text().splitlines()) == sorted(expected(rank, "stderr", lines))
    # Ray's own lines (its start-up messages) are on stderr; none of the ranks' lines is there
    # twice or with Ray's "(hwlaunch_cpu_rank0 pid=...)" prefix.
    assert "hwlaunch_cpu" not in done.stderr and "repeated" not in done.stderr
    for rank in (0, 1):
        theirs = by_rank(
            "\n".join(line for line in done.stderr.splitlines() if PREFIXED.match(line)), pids
        )[rank]
        assert sorted(theirs) == sorted(expected(rank, "stderr", lines))
