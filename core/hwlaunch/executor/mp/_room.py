"""A worker that could not be started for lack of room: which limit ran out, in the error.

The resolver refuses a world size beyond the limits it probed (``hwlaunch.planning.room``), but
the room can run out between the plan and the start (other programs start processes), or in a
way no limit names. ``fork`` then fails with EAGAIN (``BlockingIOError``), a pipe with EMFILE,
a thread with "can't start new thread": the error names the limit as it is now. (The probes are
imported when a start fails: the mp package is also imported in workers, which load no
planning module.)
"""

from __future__ import annotations

import errno

from hwlaunch.errors import WorkerStartupError
from hwlaunch.runtime_facts import Limit, Room

__all__ = ["out_of_room", "room_note"]

_TASKS = (errno.EAGAIN,)
_FDS = (errno.EMFILE, errno.ENFILE)


def out_of_room(rank: int, exc: BaseException) -> WorkerStartupError | None:
    """The WorkerStartupError of a worker that could not be started for lack of tasks,
    descriptors or memory (None: ``exc`` is another failure)."""
    from hwlaunch.planning.room import probe_room  # the driver's, once a start failed

    room = probe_room()
    code = getattr(exc, "errno", None)
    limit: Limit | None
    if code in _TASKS or "can't start new thread" in str(exc) or _server_could_not_fork(exc, room):
        limit, what = room.tasks, "processes or threads"
    elif code in _FDS:
        limit, what = room.fds, "file descriptors"
    elif code == errno.ENOMEM:
        limit, what = room.memory, "memory"
    else:
        return None
    named = f": {limit.name}" if limit is not None else ""
    return WorkerStartupError(
        rank,
        f"the worker's process could not be started, this machine has no room for more "
        f"{what} ({type(exc).__name__}: {exc}){named}. Every worker started before it was "
        "stopped. Fix: a smaller world_size, or raise that limit",
    )


def _server_could_not_fork(exc: BaseException, room: Room) -> bool:
    """The fork server ends a request without a pid when its fork fails: with no room left for
    a worker's tasks, that is why."""
    return isinstance(exc, EOFError) and _no_room_for_a_worker(room)


def _no_room_for_a_worker(room: Room) -> bool:
    from hwlaunch.planning.room import RANK_TASKS

    return room.tasks is not None and room.tasks.free < RANK_TASKS


def room_note() -> str:
    """For a worker that failed while starting: that this machine has no room for another
    worker's tasks now, naming the limit ("" when it has)."""
    from hwlaunch.planning.room import probe_room

    room = probe_room()
    if not _no_room_for_a_worker(room) or room.tasks is None:
        return ""
    return (
        f"; this machine has no room for more processes or threads ({room.tasks.name}): "
        "a smaller world_size, or raise that limit"
    )
