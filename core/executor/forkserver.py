"""The fork server is one per parent process: its preload list must be set before it starts."""

from __future__ import annotations

from multiprocessing import forkserver
from multiprocessing.context import BaseContext

_preloaded: tuple[str, ...] | None = None


def prepare_forkserver(ctx: BaseContext, preload: tuple[str, ...]) -> list[str]:
    """Set the preload list if the server has not started yet; else say what it lacks."""
    global _preloaded
    running = getattr(forkserver._forkserver, "_forkserver_pid", None) is not None
    if not running:
        ctx.set_forkserver_preload(list(preload))
        _preloaded = preload
        return []
    missing = [m for m in preload if m not in (_preloaded or ())]
    if not missing:
        return []
    return [
        "the fork server was already running without preloading "
        f"{', '.join(missing)}; each worker imports them itself (slower start-up). Launch "
        "through hwlaunch before anything else starts the fork server to get the preload"
    ]
