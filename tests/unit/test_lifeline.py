"""The Ray driver's lifeline (real loopback sockets, no Ray): what an actor watching it sees."""

from __future__ import annotations

import threading

from hwlaunch.executor.ray._lifeline import Lifeline, watch


def watched() -> tuple[Lifeline, threading.Event]:
    lifeline = Lifeline("127.0.0.1")
    ended = threading.Event()
    watch(lifeline.address, ended.set)
    return lifeline, ended


def test_an_actor_the_driver_tells_is_left_to_the_driver() -> None:
    lifeline, ended = watched()
    lifeline.release()
    assert not ended.wait(1.0), "told END, the actor waits to be killed instead"
    lifeline.release()  # idempotent


def test_an_abandoned_lifeline_ends_its_actors_as_a_dead_driver_would() -> None:
    lifeline, ended = watched()
    lifeline.abandon()
    assert ended.wait(10.0)
    lifeline.release()  # idempotent after abandon, and tells nobody
    lifeline.abandon()
