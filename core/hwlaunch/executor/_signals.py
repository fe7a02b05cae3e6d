"""forward_signals: the named signals, received by this process, reach every worker too.

hwlaunch installs no signal handler in the caller's process unless the plan names signals
(``forward_signals``). Then ``install`` (at launch, from the main thread, where Python allows
handlers) replaces each one's handler with one that sends the signal to every worker and then
calls the handler that was there before when it is a Python function (the program's own);
``restore`` (at shutdown) puts the previous handlers back. A previous default or ignore stays
out of the way: with forwarding, this process does not die of a forwarded SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from hwlaunch.errors import ConfigError

__all__ = ["SignalForwarding"]


class SignalForwarding:
    """The handlers of one executor; ``send(signum)`` is its ``signal_ranks``, held weakly."""

    def __init__(self, names: tuple[str, ...], send: Callable[[int], None]) -> None:
        self._signals = [signal.Signals[name] for name in names]
        self._send = weakref.WeakMethod(send)
        self._previous: dict[int, Any] = {}

    @staticmethod
    def check_thread(names: tuple[str, ...]) -> None:
        """Before any worker starts: handlers can be installed from the main thread only."""
        if names and threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                f"forward_signals {', '.join(names)} needs launch() in the main thread, where "
                "Python installs signal handlers; launch from the main thread, or unset "
                "forward_signals (HWLAUNCH_FORWARD_SIGNALS, --forward-signals)"
            )

    def install(self) -> None:
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._forward)

    def restore(self) -> None:
        """Put back each handler that is still ours; off the main thread nothing can change,
        and the handlers left forward to nothing once the workers are gone."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(signum) == self._forward:
                    signal.signal(signum, previous)
        self._previous.clear()

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        send = self._send()
        if send is not None:
            with contextlib.suppress(Exception):
                send(signum)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
