"""Lent requests: with one worker on the shm channel, the CPU tensors of a request view the ring
chunk they arrived in (no copy in the worker), and a chunk whose tensors the worker keeps is
held until it lets them go; with two workers, each gets copies of its own.

What a worker relies on: an argument it keeps (itself, or a view of it) holds what was sent
while any number of later messages come and go, the ring keeps carrying messages while it
holds chunks (in the chunks it does not hold, then through the spill file), and an argument
it writes in place changes nothing for the caller. Where an argument's memory lies is read from
the worker's own memory map: the channel's ring is the parent's file ``hwlaunch-<pid>-rpc``,
its spill file ``hwlaunch-<pid>-rpc-spill``.
"""

from __future__ import annotations

import gc
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from processes import mp_launch, takes_turns

from hwlaunch.executor.mp._shm_channel import CHUNKS

METHODS = ["fork", "spawn", "forkserver"]
MIB = 1024 * 1024
RANDOM = np.random.default_rng(11).bytes(24 * MIB)
CHANNEL_FILE = re.compile(r"memfd:hwlaunch-\d+-rpc(-spill)?\b")

pytestmark = pytest.mark.timeout(300)


def _tensor(seed: int, n: int = MIB) -> torch.Tensor:
    """``n`` bytes of float32 made from ``seed`` (numpy only: no torch thread pool here)."""
    start = seed * 4099 % (len(RANDOM) - n)
    return torch.from_numpy(np.frombuffer(RANDOM[start : start + n], dtype=np.float32).copy())


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()


def _place(tensor: torch.Tensor) -> str:
    """``ring``, ``spill`` or ``own``: which channel file (if any) this process maps where the
    tensor's memory lies (a worker maps its own channel's; under forkserver its parent
    process is the server, so the file is recognised by its name alone)."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *_, name = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in span.split("-"))
        found = CHANNEL_FILE.search(name)
        if found and start <= address < end:
            return "spill" if found.group(1) else "ring"
    return "own"


class Holder:
    """worker_extension: says where an argument lies, keeps arguments or views of them."""

    kept: list[torch.Tensor]

    def where(self, tensor: torch.Tensor) -> tuple[str, str]:
        return _place(tensor), _digest(tensor)

    def keep(self, tensor: torch.Tensor, view: bool = False) -> str:
        self.kept = [*getattr(self, "kept", []), tensor[1000:2000] if view else tensor]
        return _place(tensor)

    def address(self, tensor: torch.Tensor) -> int:
        return tensor.data_ptr()

    def keep_at(self, tensor: torch.Tensor) -> int:
        self.keep(tensor)
        return tensor.data_ptr()

    def kept_digests(self) -> list[str]:
        return [_digest(t) for t in self.kept]

    def drop(self) -> None:
        self.kept = []
        gc.collect()

    def add_in_place(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.add_(1.0)


@pytest.fixture(scope="module", params=METHODS)
def executor(request: pytest.FixtureRequest) -> Iterator[Any]:
    with mp_launch(Holder, start_method=request.param, world_size=1) as launched:
        yield launched


def test_a_tensor_argument_views_the_ring_while_the_call_runs(executor: Any) -> None:
    tensor = _tensor(1)
    assert executor.collective_rpc("where", (tensor,)) == [("ring", _digest(tensor))]
    # Larger than a chunk: in the spill file, which is reused by the next message: a copy.
    large = _tensor(2, 5 * MIB)
    assert executor.collective_rpc("where", (large,)) == [("own", _digest(large))]
    small = _tensor(3, 1024)  # a message of a few KiB is copied out whole
    assert executor.collective_rpc("where", (small,)) == [("own", _digest(small))]


@pytest.mark.parametrize("view", [False, True], ids=["tensor", "view"])
def test_a_kept_argument_holds_its_chunk_until_dropped(executor: Any, view: bool) -> None:
    kept = _tensor(10)
    expected = _digest(kept[1000:2000] if view else kept)
    assert executor.collective_rpc("keep", (kept, view)) == ["ring"]
    # While it is held, later messages go to the other chunks, lent too, and the kept tensor
    # still holds what was sent.
    places = []
    for seed in range(20, 20 + 2 * CHUNKS):
        tensor = _tensor(seed)
        ((place, digest),) = executor.collective_rpc("where", (tensor,))
        assert digest == _digest(tensor)
        places.append(place)
    assert places == ["ring"] * 2 * CHUNKS, places
    assert executor.collective_rpc("kept_digests") == [[expected]]
    executor.collective_rpc("drop")
    places = [executor.collective_rpc("where", (_tensor(s),))[0][0] for s in range(2 * CHUNKS)]
    assert places == ["ring"] * 2 * CHUNKS, "a chunk comes back once nothing views it"


def test_calls_one_after_another_alternate_between_two_chunks(executor: Any) -> None:
    """Each call's argument lies where the call before the last one's did: two chunks in
    turn rather than round the ring, so that the parent writes memory the worker's CPU has let
    go of meanwhile (a megabyte it read from the chunk just before is still in its cache);
    one that is kept moves the next ones to two other chunks, and once it is given back they
    use the first two again."""
    executor.collective_rpc("drop")  # nothing kept from earlier tests (given back lazily:
    executor.collective_rpc("address", (_tensor(69),))  # a chunk before the next message)
    addresses = [executor.collective_rpc("address", (_tensor(70 + i),))[0] for i in range(6)]
    assert takes_turns(addresses), addresses
    (kept,) = executor.collective_rpc("keep_at", (_tensor(80),))
    later = [executor.collective_rpc("address", (_tensor(90 + i),))[0] for i in range(6)]
    assert takes_turns(later) and kept not in later, (kept, later)
    executor.collective_rpc("drop")
    executor.collective_rpc("address", (_tensor(98),))  # the worker gives the chunk back
    again = [executor.collective_rpc("address", (_tensor(99 + i),))[0] for i in range(4)]
    assert takes_turns(again) and set(again) == set(addresses), (addresses, again)


def test_with_every_chunk_held_messages_still_flow(executor: Any) -> None:
    sent = [_tensor(40 + index) for index in range(CHUNKS + 2)]
    places = [executor.collective_rpc("keep", (tensor,))[0] for tensor in sent]
    assert places[:CHUNKS] == ["ring"] * CHUNKS and places[CHUNKS:] == ["own", "own"]
    for seed in range(60, 66):
        tensor = _tensor(seed)
        assert executor.collective_rpc("where", (tensor,)) == [("own", _digest(tensor))]
    assert executor.collective_rpc("kept_digests") == [[_digest(t) for t in sent]]
    executor.collective_rpc("drop")
    executor.collective_rpc("where", (sent[1],))  # the worker gives the chunks back (lazily:
    assert executor.collective_rpc("where", (sent[0],))[0][0] == "ring"  # before its next recv)


def _counting(n: int = MIB) -> torch.Tensor:
    return torch.from_numpy(np.arange(n // 4, dtype=np.float32))


def test_an_argument_written_in_place_changes_nothing_for_the_caller(executor: Any) -> None:
    tensor = _counting()
    before = _digest(tensor)
    (result,) = executor.collective_rpc("add_in_place", (tensor,))
    assert _digest(tensor) == before
    assert np.array_equal(result.numpy(), tensor.numpy() + np.float32(1.0))
    assert executor.collective_rpc("where", (tensor,)) == [("ring", before)]


def test_two_workers_get_copies_of_their_own() -> None:
    """Both read the same chunk: an in-place write by one must not reach the other."""
    with mp_launch(Holder, start_method="fork", world_size=2) as executor:
        tensor = _counting()
        assert executor.collective_rpc("where", (tensor,)) == [("own", _digest(tensor))] * 2
        results = executor.collective_rpc("add_in_place", (tensor,))
        for result in results:
            assert np.array_equal(result.numpy(), tensor.numpy() + np.float32(1.0))
