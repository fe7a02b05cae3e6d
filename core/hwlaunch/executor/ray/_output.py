"""Worker output under Ray: collected by the driver from each actor, shown as under mp.

Why not Ray's own forwarding (``log_to_driver``): it prefixes lines in its own format
(``(hwlaunch_cpu_rank0 pid=…)``), it collapses lines that look alike across processes ("[repeated 2x across
cluster]", which is every rank printing the same thing), it only works when this process
started Ray with it on, and its files live on each node. Instead each actor makes its fds 1
and 2 pipes that a thread of its own reads into a buffer (Ray's log files then see nothing of
the rank's output), and the driver keeps one ``collect`` call outstanding per actor, in a
concurrency group of its own: the call returns as soon as output is there, so a flushed
print arrives after one Ray round trip, whichever node the actor is on. The driver assembles
lines exactly as for mp (``hwlaunch.executor._output``): the same prefix, console_ranks and
log files.
"""

from __future__ import annotations

import threading
from typing import Any

from hwlaunch.executor._output import RankStream, WorkerOutput
from hwlaunch.executor.ray._actor_output import OUTPUT_GROUP
from hwlaunch.plan import Plan

__all__ = ["OutputCollector"]

COLLECT_WAIT = 1.0  # seconds one collect call waits for output before it returns empty
DRAIN_WAIT = 2.0  # seconds the driver waits for an actor's last output at shutdown
FINAL_WAIT = 0.05  # seconds a last-round collect waits (for bytes still in the actor's pipe)


class OutputCollector:
    """In the driver: one outstanding ``collect`` per actor, fed into the group's streams.

    One thread feeds the streams. ``drain`` (a polite shutdown, before the actors are killed)
    turns it into its last round: each outstanding call is answered, then each actor is asked
    again, without waiting long, until it has nothing left.
    """

    def __init__(self, ray: Any, plan: Plan) -> None:
        self.ray = ray
        self.output = WorkerOutput(plan)
        self._actors: dict[int, Any] = {}
        self._streams: dict[int, tuple[RankStream, RankStream]] = {}
        self._final = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, actors: list[Any], places: list[dict[str, Any]], local: list[int]) -> None:
        for rank, (actor, place) in enumerate(zip(actors, places, strict=True)):
            self._actors[rank] = actor
            node = str(place.get("host") or place["node_ip"])
            self._streams[rank] = self.output.add_rank(rank, local[rank], place["pid"], node)
        self._thread = threading.Thread(target=self._run, name="hwlaunch-ray-output", daemon=True)
        self._thread.start()

    def _collect(self, rank: int, wait: float) -> Any:
        actor = self._actors[rank]
        return actor.collect_output.options(concurrency_group=OUTPUT_GROUP).remote(wait)

    def _run(self) -> None:
        ray = self.ray
        refs = {self._collect(rank, COLLECT_WAIT): rank for rank in self._actors}
        # Never a call once the program left Ray (its ray.shutdown()): Ray ends the whole
        # process on one; a call in progress then raises SystemExit.
        while refs and ray.is_initialized():
            try:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=COLLECT_WAIT)
            except (Exception, SystemExit):  # Ray is going away
                return
            for ref in ready:
                rank = refs.pop(ref)
                if not ray.is_initialized():
                    return
                try:
                    chunks: list[tuple[int, bytes]] = ray.get(ref)
                except (Exception, SystemExit):  # the actor ended: nothing more will come
                    continue
                for index, data in chunks:
                    self._streams[rank][index].feed(data)
                if not self._final.is_set():
                    refs[self._collect(rank, COLLECT_WAIT)] = rank
                elif chunks:  # the last round: ask until it has nothing left
                    refs[self._collect(rank, FINAL_WAIT)] = rank

    def drain(self) -> None:
        """Before the actors are killed: take what each still holds."""
        self._final.set()
        if self._thread is not None:
            self._thread.join(COLLECT_WAIT + DRAIN_WAIT)

    def close(self) -> None:
        """The actors are gone: each stream's last partial line, and the files closed."""
        self._final.set()
        if self._thread is not None:
            self._thread.join(COLLECT_WAIT + DRAIN_WAIT)
        self.output.end()
