"""Which entry points of the plugin group this process loads: the one place that reads the
allow and block lists, used by the registry (in the parent) and by worker setup (in each worker)
so that both see the same plugins."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from hwlaunch._checks import did_you_mean

ENTRY_POINT_GROUP = "hwlaunch.backends"
OWN_DISTRIBUTION = "hwlaunch"
ENV_ALLOW = "HWLAUNCH_PLUGINS"
ENV_BLOCK = "HWLAUNCH_DISABLE_PLUGINS"
ENV_STRICT = "HWLAUNCH_STRICT_PLUGINS"
PLUGIN_VARIABLES = (ENV_ALLOW, ENV_BLOCK, ENV_STRICT)  # every variable of plugin selection
PLUGIN_SLOW = 5.0  # seconds a plugin's load may take before it is named, while it goes on
SLOW_PLUGIN_THREAD = "hwlaunch-plugin-watch"
log = logging.getLogger("hwlaunch")
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _split_env(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def distribution_of(ep: EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def _load_order(ep: EntryPoint) -> tuple[int, str]:
    """Built-ins first, then third parties by name: clashes are decided the same every time."""
    return (0 if distribution_of(ep) == OWN_DISTRIBUTION else 1, ep.name)


@dataclass(frozen=True)
class Selection:
    """What the allow and block lists make of the installed plugins: the entry points to load
    (in load order), the variable that excluded each other one, and a warning for each listed
    name that matches no installed plugin (a typo would otherwise drop a plugin silently)."""

    chosen: list[EntryPoint] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)


def select_plugins(environ: Mapping[str, str] | None = None) -> Selection:
    """Apply ``HWLAUNCH_PLUGINS`` and ``HWLAUNCH_DISABLE_PLUGINS`` to the group's entry points.
    Built-ins ignore the allow list (it picks third parties); the block list applies to all."""
    env = os.environ if environ is None else environ
    allow = _split_env(env[ENV_ALLOW]) if ENV_ALLOW in env else None
    block = _split_env(env.get(ENV_BLOCK, ""))
    selection = Selection()
    installed = sorted(entry_points(group=ENTRY_POINT_GROUP), key=_load_order)
    for ep in installed:
        builtin = distribution_of(ep) == OWN_DISTRIBUTION
        if ep.name in block or (allow is not None and not builtin and ep.name not in allow):
            selection.excluded[ep.name] = ENV_BLOCK if ep.name in block else ENV_ALLOW
        else:
            selection.chosen.append(ep)
    names = sorted({ep.name for ep in installed})
    for variable, listed in ((ENV_ALLOW, allow or []), (ENV_BLOCK, block)):
        for name in dict.fromkeys(listed):
            if name not in names:
                selection.unmatched.append(
                    f"{variable} names {name!r}, which matches no installed plugin"
                    f"{did_you_mean(name, names)} (installed: {', '.join(names) or 'none'})"
                )
    return selection


def selected_entry_points(
    environ: Mapping[str, str] | None = None,
) -> tuple[list[EntryPoint], list[str]]:
    """The group's entry points in load order, without those the lists exclude, and a line for
    each excluded one."""
    selection = select_plugins(environ)
    skipped = [f"{name} (excluded by {why})" for name, why in selection.excluded.items()]
    return selection.chosen, skipped


@dataclass(frozen=True)
class _Load:
    ep: EntryPoint
    who: str
    started: float
    thread: int  # ident of the thread loading it
    number: int


class SlowLoads:
    """Names a plugin whose load (import and hook) has taken ``PLUGIN_SLOW`` seconds, where it
    is and how to skip it, while the load goes on: a plugin that hangs at import would
    otherwise hang every command that loads plugins, with no word of which one.

    One thread for a whole round of loads (``with SlowLoads() as loads``, then each plugin in
    ``loads.loading(ep, who)``), ended before the ``with`` block does, even when a load raises,
    and waited for until the kernel no longer lists it: no thread is left in this process to
    change what a later fork would inherit (``planning.threads`` reads ``/proc/self/task``).
    It imports nothing while a plugin loads (that module's import lock may be held) and writes
    one log record per slow plugin.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._current: _Load | None = None
        self._loads = 0
        self._done = False
        self._thread = threading.Thread(target=self._run, name=SLOW_PLUGIN_THREAD, daemon=True)

    def __enter__(self) -> SlowLoads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()
        self._thread.join()
        _wait_gone(self._thread.native_id)

    @contextlib.contextmanager
    def loading(self, ep: EntryPoint, who: str) -> Iterator[None]:
        """Load the plugin of ``ep`` (described as ``who``) in the block."""
        with self._cond:
            self._loads += 1
            self._current = _Load(ep, who, time.monotonic(), threading.get_ident(), self._loads)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._current = None

    def _run(self) -> None:
        warned = 0
        with self._cond:
            while not self._done:
                load = self._current
                if load is None or load.number == warned:
                    self._cond.wait()
                    continue
                left = load.started + PLUGIN_SLOW - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                warned = load.number
                _name(load)


def _name(load: _Load) -> None:
    frame = sys._current_frames().get(load.thread)
    where = ""
    if frame is not None:
        stack = traceback.extract_stack(frame)
        # The innermost frame of code of its own (the plugin's, its SDK's), past the standard
        # library's waits and the import machinery.
        own = [f for f in stack if not _standard(f.filename)]
        last = (own or stack)[-1]
        where = f", now at {last.filename}:{last.lineno} in {last.name}"
    log.warning(
        "hwlaunch: %s has been loading (%s) for %gs and goes on%s. If it hangs, skip it: %s=%s",
        load.who,
        load.ep.value,
        PLUGIN_SLOW,
        where,
        ENV_BLOCK,
        load.ep.name,
    )


def _wait_gone(native_id: int | None, limit: float = 0.1) -> None:
    """Until the kernel no longer lists the thread (it lingers a moment after ``join``)."""
    if native_id is None:
        return
    deadline = time.monotonic() + limit
    while os.path.exists(f"/proc/self/task/{native_id}") and time.monotonic() < deadline:
        time.sleep(0.0005)


def _standard(path: str) -> bool:
    """Whether ``path`` is the standard library's (not a site-packages folder inside it)."""
    if path.startswith("<frozen"):
        return True
    return path.startswith(_STDLIB) and f"-packages{os.sep}" not in path
