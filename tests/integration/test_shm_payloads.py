"""Payloads through the mp executor's shared-memory channel, between real worker processes.

Round trips of every buffer kind the channel writes out of band or by reference (bytes,
bytearray, memoryview, numpy arrays, CPU torch tensors of several dtypes, non-contiguous and
0-d ones) at the sizes where the layout changes (empty, around one ring chunk, 64 MiB through
the spill file) under fork, spawn and forkserver, to two workers and to one (whose tensors
view the ring where they fit in a chunk): what comes back has the contents, type,
dtype and shape that went out, and owns its memory (a value kept past later messages, which
reuse the shared memory, stays as it was). Callables sent again are cached, never stale. A
parent SIGKILLed during a 64 MiB transfer leaves no process and no shared memory behind.
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from processes import (
    alive,
    assert_emptied,
    channel_memory,
    mp_launch,
    parent_program,
    private_temp,
    shm_entries,
    wait_until,
)

from hwlaunch.executor._encoding import encode_method
from hwlaunch.executor.mp._shm_channel import CHUNK_BYTES, SLOT_BYTES
from hwlaunch.executor.transport._callables import CachedPickle
from hwlaunch.executor.transport._messages import CALL, request_head
from hwlaunch.executor.transport._wire import Frame, encode
from hwlaunch.planning.threads import probe_threads

METHODS = ["fork", "spawn", "forkserver"]
MIB = 1024 * 1024
SIZES = [0, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 64 * MIB]
SCRIPTS = Path(__file__).parent.parent / "scripts"
RANDOM = np.random.default_rng(23).bytes(64 * MIB + 64)

pytestmark = pytest.mark.timeout(300)


def openmp_threads() -> list[Any]:
    return [t for t in probe_threads().others if t.known_library == "GNU OpenMP pool"]


@pytest.fixture(scope="module", autouse=True)
def no_openmp_pool_left() -> Iterator[None]:
    """Sending tensors (strided ones included) starts no OpenMP pool in the caller, which
    would keep this process, and every later test in it, from forking workers."""
    before = openmp_threads()
    yield
    assert openmp_threads() == before


class Keeper:
    """Worker extension: echo a value, or keep it for a later call."""

    def echo(self, value: Any) -> Any:
        return value

    def keep(self, value: Any) -> None:
        self.kept = value

    def kept_value(self) -> Any:
        return self.kept


@pytest.fixture(
    scope="module",
    params=[(method, n) for n in (2, 1) for method in METHODS],
    ids=lambda p: f"{p[0]}-{p[1]}w",
)
def executor(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Two workers (every value decoded into a copy of its own) and one (its tensors view
    the ring: lent requests)."""
    method, n = request.param
    with mp_launch(Keeper, start_method=method, world_size=n) as launched:
        yield launched


# -- the kinds of buffer, each made of ``n`` bytes, and how to compare what came back ------------
# The tensors are made and compared with numpy and views only: a parallel torch operation in
# this process would start torch's OpenMP pool, after which no later test here could fork.
def _tensor(n: int, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    size = torch.empty((), dtype=dtype).element_size()
    if n < size:
        return torch.empty(0, dtype=dtype)
    raw = np.frombuffer(RANDOM[offset : offset + n // size * size], dtype=np.uint8)
    if dtype == torch.bool:
        return torch.from_numpy((raw & 1).astype(np.bool_))
    return torch.from_numpy(raw.copy()).view(dtype)


def _strided(n: int) -> torch.Tensor:
    rows = n // 8
    return _tensor(rows * 8, torch.float32).reshape(rows, 2).t()  # shape (2, rows), strided


KINDS: dict[str, Callable[[int], Any]] = {
    "bytes": lambda n: RANDOM[:n],
    "bytearray": lambda n: bytearray(RANDOM[:n]),
    "memoryview": lambda n: memoryview(bytearray(RANDOM[:n])),
    "memoryview-float32-2d": lambda n: memoryview(
        np.frombuffer(RANDOM[: n // 16 * 16], dtype=np.float32).reshape(-1, 4).copy()
    ),
    "numpy-float64": lambda n: np.frombuffer(RANDOM[: n // 8 * 8], dtype=np.float64).copy(),
    "numpy-strided": lambda n: np.frombuffer(RANDOM[: n // 4 * 4], dtype=np.int32).copy()[::2],
    "tensor-float32": lambda n: _tensor(n, torch.float32),
    "tensor-bfloat16": lambda n: _tensor(n, torch.bfloat16),
    "tensor-bool": lambda n: _tensor(n, torch.bool),
    "tensor-int64": lambda n: _tensor(n, torch.int64),
    "tensor-strided": _strided,
}


def assert_same(got: Any, sent: Any, what: str) -> None:
    """The same type, contents, dtype and shape; a copy of its own (not the sent object)."""
    assert type(got) is type(sent), what
    if isinstance(sent, torch.Tensor):
        assert (got.dtype, got.shape) == (sent.dtype, sent.shape), what
        assert _bytes_of(got) == _bytes_of(sent), what
        assert got.is_contiguous(), what
        assert not sent.numel() or _ptr(got) != _ptr(sent), what
    elif isinstance(sent, np.ndarray):
        assert (got.dtype, got.shape) == (sent.dtype, sent.shape), what
        assert got.tobytes() == sent.tobytes() and got.flags.writeable, what
    elif isinstance(sent, memoryview):
        assert (got.format, got.shape, got.readonly) == (sent.format, sent.shape, sent.readonly)
        assert got.tobytes() == sent.tobytes(), what
    else:
        assert got == sent, what


def _bytes_of(tensor: torch.Tensor) -> bytes:
    """The elements' bytes in order (numpy's copy of a strided tensor, not torch's)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = tensor.detach().resolve_neg()  # small tensors only: no parallel copy
    if flat.dtype.is_complex:
        return flat.resolve_conj().numpy().tobytes()
    return flat.view(ints[flat.element_size()]).numpy().tobytes()


def _ptr(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


# -- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_round_trip_at_edge_sizes(executor: Any, kind: str) -> None:
    for n in SIZES:
        value = KINDS[kind](n)
        replies = executor.collective_rpc("echo", (value,))
        for rank, got in enumerate(replies):
            assert_same(got, value, f"{kind} of {n} B, rank {rank}")


def test_zero_dimensional_and_odd_tensors(executor: Any) -> None:
    values = [
        torch.tensor(3.5),
        torch.tensor(7, dtype=torch.int64),
        torch.tensor(True),
        np.array(2.5),
        torch.ones(2, 3, dtype=torch.complex64).conj(),  # a conjugate bit: resolved once
        torch.full((4,), 1 + 2j, dtype=torch.complex64).conj().imag,  # a real one, negative bit
        torch.arange(12, dtype=torch.int32).reshape(3, 4)[1:, 1:3],  # an offset, strided view
        torch.ones(3, requires_grad=True),  # a leaf that requires grad still does
        torch.nn.Parameter(torch.ones(2)),  # a subclass: torch's own pickling, as before
        memoryview(b"read only"),
    ]
    for value in values:
        got = executor.collective_rpc("echo", (value,))[-1]
        assert type(got) is type(value), repr(value)
        if isinstance(value, torch.Tensor):
            assert got.shape == value.shape and got.dtype == value.dtype
            assert got.requires_grad == value.requires_grad
            assert _bytes_of(got) == _bytes_of(value)
        elif isinstance(value, memoryview):
            assert got.readonly and got.tobytes() == value.tobytes()
        else:
            assert got.shape == () and got == value


def test_values_own_their_memory_past_later_messages(executor: Any) -> None:
    """What a worker keeps, and what the caller got back, stay as they were while later
    messages reuse every chunk of the ring, the spill file and the reply slots."""
    small = _tensor(MIB, torch.float32)
    large = _tensor(8 * MIB, torch.int64)
    executor.collective_rpc("keep", ((small, large, bytearray(RANDOM[:MIB])),))
    echoed = executor.collective_rpc("echo", (small,))[0]
    expected_echo = _bytes_of(echoed)
    for round_number in range(6):  # more messages than the ring has chunks, both sizes
        filler = _tensor(MIB * (1 + 4 * (round_number % 2)), torch.float32, 64 * round_number)
        executor.collective_rpc("echo", (filler,))
    for got_small, got_large, got_bytes in executor.collective_rpc("kept_value"):
        assert _bytes_of(got_small) == _bytes_of(small)
        assert _bytes_of(got_large) == _bytes_of(large)
        assert got_bytes == RANDOM[:MIB]
    assert _bytes_of(echoed) == expected_echo


def _payload_for(target: int, size_of: Callable[[bytes], int]) -> bytes:
    """A byte string whose message is exactly ``target`` bytes (the overhead is the same for
    every string this long)."""
    probe = target - 4096
    n = target - (size_of(RANDOM[:probe]) - probe)
    data = RANDOM[:n]
    assert size_of(data) == target
    return data


def _size(encoded: Frame | bytes) -> int:
    return encoded.size if isinstance(encoded, Frame) else len(encoded)


def test_messages_exactly_around_a_chunk_and_a_slot(executor: Any) -> None:
    """Requests of exactly a chunk -1, 0, +1 bytes (ring or spill file), and replies of
    exactly a slot -1, 0, +1 bytes."""
    head = len(request_head(CALL, 1, None))

    def request(data: bytes) -> int:
        return head + _size(encode(("echo", (data,), {})))

    def reply(data: bytes) -> int:
        return _size(encode((1, True, data)))

    for target, size_of in ((CHUNK_BYTES, request), (SLOT_BYTES, reply)):
        for delta in (-1, 0, 1):
            data = _payload_for(target + delta, size_of)
            expected = [data] * executor.world_size
            assert executor.collective_rpc("echo", (data,)) == expected, f"{target}{delta:+}"


# -- callables -----------------------------------------------------------------------------------
def test_a_closure_whose_cell_changes_is_never_served_stale(executor: Any) -> None:
    counter = 0

    def read(worker: Any) -> int:
        return counter

    for value in (1, 2, 2, 3):
        counter = value
        assert executor.collective_rpc(read) == [value] * executor.world_size
    box = [0]

    def read_box(worker: Any) -> int:
        return box[0]

    for value in (1, 2):  # a list in the cell: changed in place, so never cached
        box[0] = value
        assert type(encode_method(read_box)) is bytes
        assert executor.collective_rpc(read_box) == [value] * executor.world_size


def _by_value(source: str) -> dict[str, Any]:
    """Functions of a ``__main__``-like namespace: cloudpickle sends them (and the globals
    they name) by value, as it does a script's or a notebook's."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(source, namespace)
    return namespace


def test_a_function_whose_global_changes_is_never_served_stale(executor: Any) -> None:
    namespace = _by_value("SCALE = 1\ndef scaled(worker):\n    return SCALE * 10\n")
    for scale in (1, 2, 2, 5):
        namespace["SCALE"] = scale
        assert executor.collective_rpc(namespace["scaled"]) == [scale * 10] * executor.world_size


def test_a_repeated_callable_is_pickled_once_and_kept_by_the_workers(executor: Any) -> None:
    """The parent reuses one pickled form; each worker unpickles it once and keeps the
    function, so what the function stores on itself in a worker stays between calls."""
    count = _by_value(
        "def count(worker):\n"
        "    count.calls = getattr(count, 'calls', 0) + 1\n"
        "    return count.calls\n"
    )["count"]
    first = encode_method(count)
    assert type(first) is CachedPickle and encode_method(count) is first
    calls = [executor.collective_rpc(count) for _ in range(3)]
    assert calls == [[k] * executor.world_size for k in (1, 2, 3)]


# -- a parent SIGKILLed mid-transfer ---------------------------------------------------------------
def _memfd_holders(parent: int) -> list[str]:
    """Every process that still maps or holds the parent's channel memory."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            held = any(channel_memory(process.pid, parent))
        except OSError:  # gone, or not ours to read
            continue
        if held:
            found.append(f"pid {process.pid}")
    return found


@pytest.mark.parametrize("method", METHODS)
def test_parent_sigkill_mid_transfer_leaves_nothing(method: str, clean_env: Path) -> None:
    command = [sys.executable, str(SCRIPTS / "transfer_parent.py"), method]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env = private_temp(env, clean_env / "temp")
    with parent_program(command, env=env) as (proc, workers):
        for _ in range(3):  # 64 MiB round trips under way, one after another
            assert proc.stdout is not None and proc.stdout.readline()
        assert _memfd_holders(proc.pid)
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        wait_until(lambda: not alive(workers), 5.0, "workers to follow their parent")
        wait_until(lambda: not _memfd_holders(proc.pid), 5.0, "the channel memory to go")
        assert shm_entries(proc.pid) == []
        assert_emptied(clean_env / "temp", 5.0)  # a fork server's socket and its folder
