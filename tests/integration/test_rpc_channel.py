"""The mp executor's RPC channels (shared memory, pipes) and the call options of every executor.

The shared-memory channel is tested twice over: on its own, between this process and real
reader processes of each start method (exact payload sizes around a small chunk, a ring that
wraps, readers that sleep and must be woken, a dead or stopped reader), and inside the mp
executor (payloads around the real chunk size, errors, deaths, parent death, leaks). Each runs
with ``spin`` 0 (every wait blocks on a wake pipe) and with a spin window (waits poll), since
which one a machine gets by default depends on its CPU count.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401  imported before forking, as a real parent does
from call_options import CallOptionsProbe, check_call_options
from processes import alive, mp_launch, parent_program, processes, shm_entries, wait_until

import hwlaunch
from hwlaunch import (
    ConfigError,
    ExecutorClosedError,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerError,
)
from hwlaunch.channels import SPIN_WITH_FREE_CPUS
from hwlaunch.executor.mp import _pipe_channel as pipe_channel
from hwlaunch.executor.mp import _shm_wait as shm_wait
from hwlaunch.executor.mp._shm_channel import (
    CHUNK_BYTES,
    ChannelLost,
    ShmChannel,
    ShmEndpoint,
    Spinner,
)
from hwlaunch.executor.mp._shm_wait import run_queue_wait

METHODS = ["fork", "spawn", "forkserver"]
SPINS = [0.0, 0.05]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SMALL_CHUNK = 1024
MIB = 1024 * 1024
HWLAUNCH_CLI = str(Path(sys.executable).with_name("hwlaunch"))

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_env")]


# -- helpers -------------------------------------------------------------------------------
def echo_reader(endpoint: ShmEndpoint) -> None:
    """A reader process: send back every message, until b"stop" or the parent is gone."""
    while True:
        try:
            data = endpoint.recv_bytes()
        except (EOFError, OSError):
            return
        endpoint.send_bytes(data)
        if data == b"stop":
            return


class Readers:
    """A ShmChannel in this process and ``n`` echo readers started with ``method``."""

    def __init__(self, method: str, n: int, spin: float, chunks: int = 3) -> None:
        ctx = multiprocessing.get_context(method)
        self.channel = ShmChannel(
            n, spin=spin, chunk_bytes=SMALL_CHUNK, slot_bytes=SMALL_CHUNK, chunks=chunks
        )
        self.processes: list[Any] = []
        for rank in range(n):
            parent_end, child_end = ctx.Pipe()
            self.channel.conns.append(parent_end)
            process = ctx.Process(
                target=echo_reader, args=(self.channel.endpoint(rank, child_end),)
            )
            process.start()
            child_end.close()
            self.processes.append(process)

    def alive(self) -> None:
        for rank, process in enumerate(self.processes):
            if process.exitcode is not None:
                raise ChannelLost(rank)

    def round_trip(self, data: bytes, timeout: float = 60) -> dict[int, bytes]:
        """``data`` to every reader and back (copied out: nothing lent)."""
        deadline = time.monotonic() + timeout
        self.channel.send(data, self.alive, deadline)
        got: dict[int, bytes] = {}
        sentinels = [p.sentinel for p in self.processes]
        while len(got) < len(self.processes):
            pending = [r for r in range(len(self.processes)) if r not in got]
            replies, ended = self.channel.receive(pending, deadline, sentinels, _copy)
            assert replies and not ended, f"no reply within {timeout}s (ended: {ended})"
            got.update(replies)
        return got

    def close(self) -> None:
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
            process.join(10)
        for conn in self.channel.conns:
            conn.close()
        self.channel.close()


@pytest.fixture
def readers() -> Iterator[Callable[..., Readers]]:
    made: list[Readers] = []

    def make(*args: Any, **kwargs: Any) -> Readers:
        made.append(Readers(*args, **kwargs))
        return made[-1]

    yield make
    for group in made:
        group.close()


class Probe(CallOptionsProbe):
    """Worker extension: named methods that record what ran on each rank."""

    def echo(self, value: Any) -> Any:
        return value


def launch(*, channel: str = "shm", spin: float | None = None, **kwargs: Any) -> Any:
    return mp_launch(Probe, rpc_channel=channel, rpc_spin=spin, **kwargs)


def _copy(view: memoryview | bytes, lent: list[memoryview] | None) -> bytes:
    return bytes(view)


# -- the channel on its own ------------------------------------------------------------------
@pytest.mark.parametrize("spin", SPINS)
@pytest.mark.parametrize("method", METHODS)
def test_payloads_around_a_chunk_and_a_ring_that_wraps(
    method: str, spin: float, readers: Callable[..., Readers]
) -> None:
    group = readers(method, 2, spin)
    sizes = [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, SMALL_CHUNK + 1, 16 * MIB]
    sizes += [SMALL_CHUNK - 1, SMALL_CHUNK + 1] * 4  # more messages than the ring has chunks
    for number, size in enumerate(sizes):
        data = os.urandom(size)
        assert group.round_trip(data) == {0: data, 1: data}, f"message {number} of {size} B"


@pytest.mark.parametrize("spin", SPINS)
def test_sequence_bytes_wrap_many_times(spin: float, readers: Callable[..., Readers]) -> None:
    """A message's sequence byte is its number modulo 256: 1,000 messages through a ring of 3
    chunks reuse every byte value several times, and no reader takes an old message for new."""
    group = readers("fork", 2, spin)
    for number in range(1000):
        data = number.to_bytes(2, "little") * (1 + number % 7)
        assert group.round_trip(data) == {0: data, 1: data}, f"message {number}"


def late_reader(endpoint: ShmEndpoint, go: Any, count: int) -> None:
    """For each ``go``: takes ``count`` messages in a row, and answers the last with the
    digests of them all."""
    while go.recv_bytes():
        digests = []
        for number in range(count):
            digests.append(hashlib.sha256(endpoint.recv_bytes()).digest())
            endpoint.send_bytes(b"".join(digests) if number == count - 1 else b"")


@pytest.mark.parametrize("method", METHODS)
def test_messages_sent_while_a_reader_is_behind_each_get_memory_of_their_own(
    method: str,
) -> None:
    """Calls one after another reuse the first chunk's memory; messages sent before a reader
    took the ones before them must not: each goes where no reader still has to read (three
    in flight through a ring of three chunks), and the reader gets every one whole."""
    ctx = multiprocessing.get_context(method)
    channel = ShmChannel(1, spin=0.0, chunk_bytes=64 * 1024, slot_bytes=SMALL_CHUNK, chunks=3)
    parent_end, child_end = ctx.Pipe()
    go_r, go_w = ctx.Pipe(duplex=False)
    reader = ctx.Process(target=late_reader, args=(channel.endpoint(0, child_end), go_r, 3))
    reader.start()
    child_end.close()

    def alive() -> None:
        if reader.exitcode is not None:
            raise ChannelLost(0)

    try:
        # large ones (a view each, where a small one is copied out at once), then small ones
        # among them, whose place beside their header a large one may still be using
        for sizes in ((20_000, 20_000, 20_000), (20_000, 100, 100), (100, 20_000, 100)):
            sent = [os.urandom(size) for size in sizes]
            for data in sent:
                channel.send(data, alive, time.monotonic() + 30)
            go_w.send_bytes(b"go")
            replies, ended = channel.receive([0], time.monotonic() + 60, [reader.sentinel], _copy)
            assert not ended
            expected = b"".join(hashlib.sha256(d).digest() for d in sent)
            assert replies == [(0, expected)], f"sizes {sizes}"
        go_w.send_bytes(b"")
    finally:
        reader.kill()
        reader.join(10)
        parent_end.close()
        channel.close()


def watching_reader(endpoint: ShmEndpoint, pipe_w: int, looked_w: int) -> None:
    """An echo reader that reports on the pipe behind ``pipe_w`` (as a worker does for its
    stdout and stderr), and writes a byte to ``looked_w`` once each answer's look is done."""
    endpoint.watch_output((pipe_w,))
    while True:
        try:
            data = endpoint.recv_bytes()
        except (EOFError, OSError):
            return
        endpoint.send_bytes(data)  # the look at the pipe is part of the answer
        os.write(looked_w, b".")


@pytest.mark.parametrize("spin", SPINS)
def test_a_reader_reports_its_output_pipe_drained_only_when_it_was_empty(spin: float) -> None:
    """After its answer, a polling reader tells whether its output pipe still held bytes: the
    parent may skip its own look only for an answer after which the pipe was empty, never
    for an earlier answer's report, and never where the reader does not poll (spin 0)."""
    pipe_r, pipe_w = os.pipe()
    looked_r, looked_w = os.pipe()
    ctx = multiprocessing.get_context("fork")
    channel = ShmChannel(1, spin=spin, chunk_bytes=SMALL_CHUNK, slot_bytes=SMALL_CHUNK)
    parent_end, child_end = ctx.Pipe()
    channel.conns.append(parent_end)
    endpoint = channel.endpoint(0, child_end)
    reader = ctx.Process(target=watching_reader, args=(endpoint, pipe_w, looked_w))
    reader.start()
    child_end.close()

    def round_trip(number: int) -> None:
        data = number.to_bytes(2, "little")
        channel.send(data, lambda: None, time.monotonic() + 30)
        replies, _ = channel.receive([0], time.monotonic() + 30, [reader.sentinel], _copy)
        assert replies == [(0, data)]
        assert os.read(looked_r, 1) == b"."  # the reader's look after this answer is done

    try:
        for number in range(600):  # every sequence byte twice: no old report passes for new
            unread = number % 3 == 1
            if unread:  # what the reader's output would be, not yet read by the parent
                os.write(pipe_w, b"line\n")
            round_trip(number)
            wanted = bool(spin) and not unread
            assert channel.output_drained() is wanted, f"message {number}, unread {unread}"
            if unread:
                assert os.read(pipe_r, 100) == b"line\n"
    finally:
        reader.kill()
        reader.join(10)
        parent_end.close()
        channel.close()
        for fd in (pipe_r, pipe_w, looked_r, looked_w):
            os.close(fd)


@pytest.mark.serial  # it measures how the CPUs are shared
def test_polling_gives_way_to_a_busy_neighbour() -> None:
    """A yield that comes back late means another task needed the CPU: the spinner stops
    polling long before its window ends (the caller blocks instead), and does not poll again
    for a while."""
    memory = mmap.mmap(-1, 64)
    never = (0,)  # a flag that never becomes 1
    cpu = min(os.sched_getaffinity(0))
    spinner = Spinner(window=5.0)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.05)  # the hog is running on this CPU
        start = time.monotonic()
        assert not spinner.poll(memory, never, 1, None)
        gave_way = time.monotonic() - start
        assert gave_way < 1.0, f"polled {gave_way:.3f}s next to a busy process (window 5 s)"
        assert spinner.quiet_until > time.monotonic()
        start = time.monotonic()
        assert not spinner.poll(memory, never, 1, None)  # quiet: no polling at all
        assert time.monotonic() - start < 0.05
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait(10)
    memory[0] = 1
    assert Spinner(window=5.0).poll(memory, never, 1, None)  # ready: True at once
    assert not Spinner(window=0.0).poll(memory, never, 1, None)  # no window: never polls


def test_eager_looks_come_before_the_first_yield_only_where_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ready flag is seen without a yield by a spinner that looks first, and after one by a
    spinner that does not (where a party shares its CPU, a yield lets the other one run)."""
    yields: list[int] = []
    monkeypatch.setattr(shm_wait, "_sched_yield", lambda: yields.append(1))
    memory = mmap.mmap(-1, 64)
    memory[0] = 1
    assert Spinner(window=5.0, eager_looks=100).poll(memory, (0,), 1, None)
    assert yields == []
    assert Spinner(window=5.0, eager_looks=0).poll(memory, (0,), 1, None)
    assert yields == [1]


@pytest.mark.parametrize(
    ("cpus", "workers", "spin", "eager_looks"),
    [
        (2, 1, SPIN_WITH_FREE_CPUS, shm_wait.EAGER_LOOKS),  # a CPU each, the parent's too
        (2, 2, SPIN_WITH_FREE_CPUS, 0),  # the parent shares a CPU with a worker: no looks
        (16, 8, SPIN_WITH_FREE_CPUS, shm_wait.EAGER_LOOKS),
        (2, 4, 0.0, 0),  # workers share CPUs: no polling at all
    ],
)
def test_the_channel_polls_and_looks_by_the_cpus_there_are(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int, spin: float, eager_looks: int
) -> None:
    monkeypatch.setattr(pipe_channel, "usable_cpus", lambda: cpus)
    channel = pipe_channel.open_channel("shm", workers, None)
    try:
        assert isinstance(channel, ShmChannel)
        assert (channel.spin, channel.eager_looks) == (spin, eager_looks)
        endpoint = channel.endpoint(0)
        assert (endpoint.spin, endpoint.eager_looks) == (spin, eager_looks)  # the worker's
    finally:
        channel.close()


HICCUP = """
import os, signal, sys, time
pid, pause, count, how = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("ready", flush=True)
sys.stdin.readline()  # the parent polls from here on
time.sleep(0.1)
for _ in range(count):
    if how == "stop":  # what the host taking the CPU away looks like from inside
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.005)
        os.kill(pid, signal.SIGCONT)
    else:  # a task of this machine that needs the parent's CPU (it shares it) for 1.5 ms,
        began = time.perf_counter()  # less than a time slice: one late yield each
        while time.perf_counter() - began < 0.0015:
            pass
    time.sleep(pause)
sys.stdin.read()  # stays, idle, until the poll has ended: its exit takes no CPU from it
"""


def _poll_through_hiccups(
    count: int, pause: float, how: str
) -> tuple[Spinner, float, float, float]:
    """Poll a flag that never comes for a 1 s window while another process, started and idle
    before the poll begins, takes this one's CPU ``count`` times, ``pause`` s apart (``how``:
    ``stop``, stopping this process for 5 ms, as the host does; ``busy``, running on its CPU
    for 1.5 ms, as a busy task does): the spinner, when the poll began, how long it polled, and how long
    it stays quiet from the moment it stopped."""
    memory = mmap.mmap(-1, 64)
    spinner = Spinner(window=1.0)
    hiccups = subprocess.Popen(
        [sys.executable, "-c", HICCUP, str(os.getpid()), str(pause), str(count), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hiccups.stdin is not None and hiccups.stdout is not None
    before = os.sched_getaffinity(0)
    try:
        assert hiccups.stdout.readline() == "ready\n"
        if how == "busy":  # the two share a CPU
            os.sched_setaffinity(0, {min(before)})
            os.sched_setaffinity(hiccups.pid, {min(before)})
        time.sleep(0.05)  # its start-up is over
        hiccups.stdin.write("go\n")
        hiccups.stdin.flush()
        start = time.monotonic()
        assert not spinner.poll(memory, (0,), 1, None)
        stopped = time.monotonic()
    finally:
        os.sched_setaffinity(0, before)
        hiccups.stdin.close()
        hiccups.wait(30)
    return spinner, start, stopped - start, spinner.quiet_until - stopped


def _polls_through_the_window(count: int, pause: float, how: str) -> None:
    """The spinner polls a 1 s window to its end through these hiccups and stays ready to
    poll, in one of three tries (a busy machine can bring a task of its own)."""
    tries = []
    for _ in range(3):
        spinner, start, polled, quiet = _poll_through_hiccups(count, pause, how)
        assert spinner.late_at > start, "the hiccups came after the window: nothing was tested"
        tries.append(f"{polled:.3f}s")
        if polled >= 0.95 and quiet < 0:
            return
    pytest.fail(f"stopped polling a 1 s window after {', '.join(tries)}")


@pytest.mark.skipif(run_queue_wait() is None, reason="no schedstat: every late yield counts")
@pytest.mark.serial  # it measures how the CPUs are shared
def test_the_host_taking_the_cpu_away_does_not_stop_polling() -> None:
    """A CPU taken away by the host (steal time on a virtual machine, here: this process
    stopped for 5 ms, three times 20 ms apart) is no neighbour that needs it: nothing of this
    machine waited for the CPU meanwhile, so the spinner polls on to the end of its window and
    stays ready to poll. Up to three tries, as a busy machine can bring a task of its own: a
    spinner that counts every late yield fails every try."""
    _polls_through_the_window(3, 0.02, "stop")


@pytest.mark.serial  # it measures how the CPUs are shared
def test_one_late_yield_alone_does_not_stop_polling() -> None:
    """A task that takes the CPU once is not yet one that needs it at every yield."""
    _polls_through_the_window(1, 0.0, "busy")


@pytest.mark.serial  # it measures how the CPUs are shared
def test_a_task_taking_the_cpu_again_and_again_stops_polling() -> None:
    """Late yields within ``CONFIRM_WITHIN`` of each other, this thread waiting on its run
    queue in the last two (what the first waited is not known: the host may have taken the
    CPU then): another task takes the CPU at every yield."""
    _, _, polled, quiet = _poll_through_hiccups(3, 0.02, "busy")
    assert polled < 0.5, f"polled {polled:.3f}s through a task that took the CPU three times"
    assert quiet > 0.2  # QUIET_AFTER_CONTENTION from the third late yield


@pytest.mark.parametrize("method", METHODS)
def test_a_dead_reader_never_blocks_the_writer(
    method: str, readers: Callable[..., Readers]
) -> None:
    group = readers(method, 2, 0.0, chunks=2)
    assert group.round_trip(b"x") == {0: b"x", 1: b"x"}
    group.processes[1].kill()
    group.processes[1].join(10)
    with pytest.raises(ChannelLost) as info:
        for _ in range(3):  # the third message needs the chunk that rank 1 never read
            group.channel.send(b"y", group.alive, time.monotonic() + 60)
    assert info.value.rank == 1


def test_a_stopped_reader_makes_the_writer_give_up_at_its_deadline(
    readers: Callable[..., Readers],
) -> None:
    group = readers("fork", 2, 0.0, chunks=2)
    assert group.round_trip(b"x") == {0: b"x", 1: b"x"}
    pid = group.processes[1].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            for _ in range(3):
                group.channel.send(b"y", group.alive, time.monotonic() + 0.5)
        assert time.monotonic() - start < 30  # bounded: it did not wait for the reader
    finally:
        os.kill(pid, signal.SIGCONT)


def test_the_memory_has_no_name_and_goes_with_its_last_holder() -> None:
    channel = ShmChannel(2, spin=0.0, chunk_bytes=SMALL_CHUNK, slot_bytes=SMALL_CHUNK)

    def memfds() -> list[str]:
        links = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return [link for link in links if f"hwlaunch-{os.getpid()}-rpc" in link]

    try:
        assert memfds() and all(link.startswith("/memfd:") for link in memfds())
        assert shm_entries(os.getpid()) == []
    finally:
        channel.close()
    assert memfds() == []


# -- inside the mp executor ------------------------------------------------------------------
@pytest.mark.parametrize("spin", SPINS)
@pytest.mark.parametrize("method", METHODS)
def test_shm_executor_rank_order_payloads_and_errors(method: str, spin: float) -> None:
    with launch(world_size=3, start_method=method, spin=spin) as executor:
        assert executor.plan.rpc_channel == "shm" and executor.rpc_spin == spin
        assert executor.collective_rpc("record", ("a",)) == [["a"]] * 3
        assert executor.collective_rpc(lambda w: w.rank) == [0, 1, 2]
        for size in (0, CHUNK_BYTES - 1, CHUNK_BYTES + 1, 16 * MIB):
            data = os.urandom(size)
            assert executor.collective_rpc("echo", (data,)) == [data] * 3, f"{size} B"
        with pytest.raises(WorkerError) as info:
            executor.collective_rpc("fail_on", (1,))
        assert info.value.rank == 1 and "rank 1 fails on purpose" in str(info.value)
        assert "in fail_on" in info.value.remote_traceback
        assert executor.collective_rpc("echo", ("still usable",)) == ["still usable"] * 3
        for number in range(600):  # past the 256 values of the sequence byte, twice
            assert executor.collective_rpc("echo", (number,)) == [number] * 3


@pytest.mark.parametrize(("channel", "spin"), [("shm", 0.05), ("pipe", None)])
@pytest.mark.parametrize("method", METHODS)
def test_worker_killed_mid_call_fails_it_within_a_second(
    method: str, channel: str, spin: float | None
) -> None:
    executor = launch(world_size=2, start_method=method, channel=channel, spin=spin)
    pids = executor.pids
    try:
        future = executor.collective_rpc("record", ("long", 60.0), non_block=True)
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            future.result(timeout=30)
        took = time.monotonic() - killed_at
        print(f"figure: {method} {channel}: WorkerDiedError {took * 1000:.0f} ms after SIGKILL")
        assert info.value.rank == 1 and info.value.exitcode == -signal.SIGKILL
        assert took < 1.0  # the call itself would have taken 60 s
        assert not alive(processes(pids))
    finally:
        executor.shutdown()


@pytest.mark.parametrize("method", METHODS)
def test_parent_sigkill_leaves_no_worker_and_no_shm(method: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env |= {"HWLAUNCH_RPC_CHANNEL": "shm", "HWLAUNCH_RPC_SPIN": "0.05"}
    command = [sys.executable, str(SCRIPTS / "busy_parent.py"), method, str(tmp_path)]
    with parent_program(command, cwd=tmp_path, env=env) as (proc, workers):
        wait_until(lambda: len(os.listdir(tmp_path)) == 2, 60, "both workers in the RPC")
        for worker in workers:  # the workers do map the channel's memory
            maps = Path(f"/proc/{worker.pid}/maps").read_text()
            assert f"memfd:hwlaunch-{proc.pid}-rpc" in maps
        assert shm_entries(proc.pid) == []
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        took = wait_until(lambda: not alive(workers), 3.0, "workers to follow")
        print(f"figure: {method} shm: workers gone {took * 1000:.0f} ms after parent SIGKILL")
        assert shm_entries(proc.pid) == []


@pytest.mark.parametrize("method", METHODS)
def test_late_reply_to_a_timed_out_call_is_never_taken(method: str) -> None:
    executor = launch(world_size=2, start_method=method, spin=0.05)
    try:
        with pytest.raises(RpcTimeoutError) as info:
            executor.collective_rpc("record", ("slow", 30.0), timeout=0.5)
        assert info.value.ranks == [0, 1]
        with pytest.raises(ExecutorClosedError, match="timed out"):
            executor.collective_rpc("echo", ("next",))
    finally:
        executor.shutdown()


# -- non_block and unique_reply_rank, on every executor ----------------------------------------
def test_call_options_uni() -> None:
    with hwlaunch.launch(
        backend="cpu", world_size=1, init_distributed=False, worker_extension=Probe
    ) as executor:
        assert type(executor).__name__ == "UniExecutor"
        check_call_options(executor)


@pytest.mark.parametrize(("channel", "spin"), [("shm", 0.0), ("shm", 0.05), ("pipe", None)])
def test_call_options_mp(channel: str, spin: float | None) -> None:
    with launch(world_size=2, start_method="fork", channel=channel, spin=spin) as executor:
        check_call_options(executor)


def test_non_block_timeout_is_the_futures_exception() -> None:
    executor = launch(world_size=2, start_method="fork")
    try:
        future = executor.collective_rpc("record", ("slow", 30.0), timeout=0.5, non_block=True)
        assert isinstance(future.exception(30), RpcTimeoutError)
    finally:
        executor.shutdown()


# -- the setting --------------------------------------------------------------------------------
def test_rpc_channel_setting_sources(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def decided(**kwargs: Any) -> tuple[Any, str]:
        plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", **kwargs)
        decision = plan.decision("rpc_channel")
        assert decision.value == plan.rpc_channel
        return decision.value, decision.source

    assert decided() == ("shm", "default")
    (clean_env / "hwlaunch.toml").write_text('rpc_channel = "pipe"\nrpc_spin = 0.01\n')
    assert decided() == ("pipe", "hwlaunch.toml:1")
    monkeypatch.setenv("HWLAUNCH_RPC_CHANNEL", "shm")
    assert decided() == ("shm", "env HWLAUNCH_RPC_CHANNEL")
    plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", rpc_spin=0.2)
    assert (plan.rpc_spin, plan.decision("rpc_spin").source) == (0.2, "resolve(rpc_spin=)")
    assert decided(rpc_channel="pipe") == ("pipe", "resolve(rpc_channel=)")
    assert "rpc_channel" in plan.explain() and plan.to_dict()["rpc_channel"] == "shm"
    uni = hwlaunch.resolve(backend="cpu", world_size=1, executor="uni")
    assert "rpc_channel" not in [d.setting for d in uni.decisions]  # not the uni executor's


def test_bad_rpc_settings_name_value_source_and_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_RPC_CHANNEL", "shared")
    with pytest.raises(ConfigError) as info:
        hwlaunch.resolve(backend="cpu", world_size=2, executor="mp")
    text = str(info.value)
    assert "'shared'" in text and "env HWLAUNCH_RPC_CHANNEL" in text and "shm, pipe" in text
    monkeypatch.delenv("HWLAUNCH_RPC_CHANNEL")
    with pytest.raises(ConfigError, match=r"rpc_spin -1.*resolve\(rpc_spin=\).*>= 0"):
        hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", rpc_spin=-1)


def test_cli_exit_code_for_a_bad_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env["HWLAUNCH_RPC_CHANNEL"] = "tcp"
    result = subprocess.run(
        [HWLAUNCH_CLI, "resolve", "--backend", "cpu", "--executor", "mp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "'tcp'" in result.stderr and "Traceback" not in result.stderr
