"""Lent shared memory (``hwlaunch.executor.transport._loans``) and the release of the views a
decoded message gave out (``hwlaunch.executor.transport._wire.decode``), on plain buffers: what keeps
a flag byte set, what clears it, and that no view of the memory outlives its use."""

from __future__ import annotations

import struct

import pytest

from hwlaunch.executor.transport._loans import Loans, referenced
from hwlaunch.executor.transport._wire import Frame, decode, encode

FLAG = 8


def _exported(backing: bytearray) -> bool:
    """Whether a view of ``backing`` is still alive (a bytearray cannot grow while one is)."""
    try:
        backing.append(0)
    except BufferError:
        return True
    backing.pop()
    return False


def test_views_nobody_holds_are_released_at_once_and_leave_the_flag_clear() -> None:
    flags, backing = bytearray(64), bytearray(1000)
    with memoryview(backing) as whole:
        views = [whole[0:10], whole[10:20]]
    loans = Loans()
    loans.settle(flags, FLAG, views)
    assert flags[FLAG] == 0 and not loans and FLAG not in loans
    assert not _exported(backing)


def test_a_held_view_keeps_its_flag_until_its_holder_lets_go() -> None:
    flags, backing = bytearray(64), bytearray(1000)
    with memoryview(backing) as whole:
        views = [whole[0:10], whole[10:20]]
    holder = views[1]  # what a tensor made from the view would be
    loans = Loans()
    loans.settle(flags, FLAG, views)
    assert flags[FLAG] == 1 and loans and FLAG in loans
    loans.take_back(flags)
    assert flags[FLAG] == 1 and _exported(backing)
    del holder
    loans.take_back(flags)
    assert flags[FLAG] == 0 and not loans
    assert not _exported(backing)


def test_loans_under_two_flags_come_back_apart() -> None:
    flags, backing = bytearray(64), bytearray(1000)
    with memoryview(backing) as whole:
        first, second = [whole[0:10]], [whole[10:20]]
    held_first, held_second = first[0], second[0]
    loans = Loans()
    loans.settle(flags, FLAG, first)
    loans.settle(flags, FLAG + 1, second)
    del held_first
    loans.take_back(flags)
    assert (flags[FLAG], flags[FLAG + 1]) == (0, 1)
    assert FLAG not in loans and FLAG + 1 in loans
    del held_second
    loans.take_back(flags)
    assert flags[FLAG + 1] == 0 and not loans


def test_a_tensor_made_from_a_view_references_it() -> None:
    torch = pytest.importorskip("torch")
    backing = bytearray(64)
    with memoryview(backing) as whole:
        views = [whole[0:64]]
    tensor = torch.frombuffer(views[0], dtype=torch.float32)
    assert referenced(views)
    del tensor
    assert not referenced(views)


def test_a_message_that_fails_to_decode_leaves_no_view_of_its_memory() -> None:
    frame = encode((memoryview(bytes(70_000)), memoryview(bytes(70_000))))
    assert isinstance(frame, Frame) and len(frame.buffers) == 2
    backing = frame.to_bytes()
    backing[4:8] = (2**31).to_bytes(4, "little")  # a buffer count far beyond the message
    view = memoryview(backing)
    with pytest.raises(struct.error) as failure:
        decode(view)
    view.release()
    assert failure.value is not None  # the traceback (and its frames) is still alive here
    assert not _exported(backing)


def test_a_lent_decode_hands_over_every_view_it_made() -> None:
    frame = encode([memoryview(bytes(70_000))])
    assert isinstance(frame, Frame)
    backing = frame.to_bytes()
    lent: list[memoryview] = []
    with memoryview(backing) as view:
        value = decode(view, lent)
    assert value[0].nbytes == 70_000
    assert len(lent) == 1  # the memoryview rebuild copies: the lent view is not referenced
    assert not referenced(lent)
