"""The Ray driver's lifeline (real loopback sockets, no Ray): what an actor watching it sees."""

from __future__ import annotations

import threading

from hwlaunch.executor.ray._lifeline import Lifeline, watch


def watched() -> tuple[Lifeline, threading.Event, threading.Thread]:
    """A lifeline, the event its watcher sets on the driver's death, and the watcher's thread."""
    lifeline = Lifeline("127.0.0.1")
    ended = threading.Event()
    before = set(threading.enumerate())
    watch(lifeline.address, ended.set)
    (watcher,) = set(threading.enumerate()) - before
    return lifeline, ended, watcher


def test_an_actor_the_driver_tells_is_left_to_the_driver() -> None:
    lifeline, ended, watcher = watched()
    lifeline.release()
    watcher.join(10.0)
    assert not watcher.is_alive(), "the watcher did not read the lifeline's end"
    assert not ended.is_set(), "told END, the actor waits to be killed instead"
    lifeline.release()  # idempotent


def test_an_abandoned_lifeline_ends_its_actors_as_a_dead_driver_would() -> None:
    lifeline, ended, _ = watched()
    lifeline.abandon()
    assert ended.wait(10.0)
    lifeline.release()  # idempotent after abandon, and tells nobody
    lifeline.abandon()
