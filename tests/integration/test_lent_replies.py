"""Lent replies: large tensors in a result view the shared-memory reply area they arrived in
(no copy), for as long as the caller holds them, under every start method; numpy arrays are
copied.

What the caller relies on: a result keeps what its call returned while later calls come and
go, whether the caller keeps one result or many, writes into it or not, and after the executor
is shut down; and a reply area comes back into use once nothing views it. Which results are
lent is read from the process's own memory map (the channel's memory file is named
``hwlaunch-<pid>-rpc``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from processes import channel_memory, mp_launch, takes_turns

METHODS = ["fork", "spawn", "forkserver"]
MIB = 1024 * 1024
RANDOM = np.random.default_rng(5).bytes(8 * MIB)

pytestmark = pytest.mark.timeout(300)


class Source:
    """worker_extension: results made in the worker, from the rank and a seed."""

    def tensor(self, seed: int, n: int = MIB) -> torch.Tensor:
        return torch.from_numpy(_content(self.rank, seed, n).copy()).view(torch.float32)

    def array(self, seed: int, n: int = MIB) -> np.ndarray:
        return _content(self.rank, seed, n).copy().view(np.int32).reshape(-1, 4)

    def echo(self, value: Any) -> Any:
        return value


def _content(rank: int, seed: int, n: int) -> np.ndarray:
    start = (rank * 7919 + seed * 104729) % (len(RANDOM) - n)
    return np.frombuffer(RANDOM[start : start + n], dtype=np.uint8)


def _bytes(value: Any) -> bytes:
    return (value.numpy() if isinstance(value, torch.Tensor) else value).tobytes()


def _in_channel_memory(value: Any) -> bool:
    """Whether ``value``'s memory lies in this process's mapping of its channel's file."""
    address = value.data_ptr() if isinstance(value, torch.Tensor) else value.ctypes.data
    mark = f"memfd:hwlaunch-{os.getpid()}-rpc"
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *_, name = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in span.split("-"))
        if mark in name and start <= address < end:
            return True
    return False


@pytest.fixture(scope="module", params=METHODS)
def executor(request: pytest.FixtureRequest) -> Iterator[Any]:
    with mp_launch(Source, start_method=request.param) as launched:
        yield launched


def test_a_large_result_is_lent_and_its_area_comes_back(executor: Any) -> None:
    first = executor.collective_rpc("tensor", (1,))
    assert all(_in_channel_memory(t) for t in first), "a 1 MiB tensor result is lent"
    assert [_bytes(t) for t in first] == [_content(r, 1, MIB).tobytes() for r in (0, 1)]
    # While the caller holds the first results, each rank's other area answers, copied.
    second = executor.collective_rpc("tensor", (2,))
    assert not any(_in_channel_memory(t) for t in second)
    assert executor.collective_rpc("echo", (7,)) == [7, 7]  # small replies there too
    assert [_bytes(t) for t in first] == [_content(r, 1, MIB).tobytes() for r in (0, 1)]
    del first, second
    gc.collect()
    again = executor.collective_rpc("tensor", (3,))
    assert all(_in_channel_memory(t) for t in again), "the area is lent again once free"


def test_results_one_after_another_alternate_between_the_two_areas(executor: Any) -> None:
    """A large result the caller drops before the next call: the next one comes in the rank's
    other reply area, so that the worker writes memory the caller's CPU has let go of
    meanwhile (a megabyte it read from the area just before is still in its cache)."""
    addresses = []
    for seed in range(6):
        results = executor.collective_rpc("tensor", (seed,))
        assert all(_in_channel_memory(t) for t in results), seed
        assert [_bytes(t) for t in results] == [_content(r, seed, MIB).tobytes() for r in (0, 1)]
        addresses.append([t.data_ptr() for t in results])
        del results
    for rank in (0, 1):
        mine = [pair[rank] for pair in addresses]
        assert takes_turns(mine), mine


@pytest.mark.parametrize("kind", ["tensor", "array"])
def test_results_kept_and_written_stay_as_returned(executor: Any, kind: str) -> None:
    """Ten results kept (for tensors one lent per rank, the others copies), one of them
    overwritten in place: every other result still holds what its call returned."""
    kept = [executor.collective_rpc(kind, (seed,)) for seed in range(10)]
    np.asarray(kept[0][0]).reshape(-1)[:] = 0  # numpy: no torch operation in this process
    for seed, results in enumerate(kept[1:], start=1):
        for rank, value in enumerate(results):
            assert _bytes(value) == _content(rank, seed, MIB).tobytes(), (seed, rank)
    assert not np.asarray(kept[0][0]).any()
    lent = [v for results in kept for v in results if _in_channel_memory(v)]
    assert len(lent) == (2 if kind == "tensor" else 0), "one lent tensor per rank at a time"


def test_an_echoed_tensor_sent_again_comes_back_whole(executor: Any) -> None:
    """A lent result used as the next call's argument: written into the request ring while
    the worker answers into its other area."""
    value = executor.collective_rpc("tensor", (4,))[0]
    assert _in_channel_memory(value)
    for _ in range(3):
        value = executor.collective_rpc("echo", (value,))[1]
    assert _bytes(value) == _content(0, 4, MIB).tobytes()


@pytest.mark.parametrize("method", METHODS)
def test_a_lent_result_outlives_the_executor(method: str) -> None:
    """Readable after shutdown, with every worker gone; its memory goes with it."""
    before = channel_memory(os.getpid(), os.getpid())
    with mp_launch(Source, start_method=method, world_size=1) as launched:
        (result,) = launched.collective_rpc("tensor", (6, 2 * MIB))
        pids = launched.pids
    assert _in_channel_memory(result)
    assert not any(psutil.pid_exists(pid) for pid in pids if pid is not None)
    assert _bytes(result) == _content(0, 6, 2 * MIB).tobytes()
    del result
    gc.collect()
    assert channel_memory(os.getpid(), os.getpid()) == before
