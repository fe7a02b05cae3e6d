"""The fork server is one per parent process: its preload list must be set before it starts.

Workers forked from a server that has already imported torch and the worker's module start in
milliseconds instead of re-importing them as spawn does. The server is started by the first
forkserver launch and kept for the life of the parent; what it preloads is fixed then.
"""

from __future__ import annotations

from multiprocessing import forkserver
from multiprocessing.context import BaseContext

# What every mp worker runs before the plan's own modules matter: the worker loop (with the
# worker runtime and cloudpickle). Preloaded too, or each worker would import it after the fork.
EXECUTOR_MODULES = ("hwlaunch.executor.mp._child", "multiprocessing.popen_forkserver")

_preloaded: tuple[str, ...] | None = None


def prepare_forkserver(ctx: BaseContext, preload: tuple[str, ...]) -> list[str]:
    """Set the preload list if the server has not started yet; else say what it lacks.

    ``preload`` is the plan's (torch and the worker's module); the executor's own modules are
    added to it. Returns the warnings for the executor: a server that something else started
    earlier imports nothing of ours, so each worker imports the plan's modules itself.
    """
    global _preloaded
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None:
        modules = tuple(dict.fromkeys((*preload, *EXECUTOR_MODULES)))
        ctx.set_forkserver_preload(list(modules))
        _preloaded = modules
        return []
    # Started already: by an earlier launch of ours (we know its list), or by something else,
    # which set its list (if at all) through set_forkserver_preload before starting it.
    known = (
        _preloaded
        if _preloaded is not None
        else tuple(getattr(server, "_preload_modules", None) or ())
    )
    missing = [m for m in preload if m not in known]
    if not missing:
        return []
    return [
        "the fork server was already running without preloading "
        f"{', '.join(missing)}; each worker imports them itself (slower start-up). Launch "
        "through hwlaunch before anything else starts the fork server to get the preload"
    ]
