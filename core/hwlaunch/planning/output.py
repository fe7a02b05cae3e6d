"""The worker-output rule: console prefix, console ranks and log directory, for an executor that
declares ``worker_output``; for any other, a setting given is reported as unused."""

from __future__ import annotations

import os
from typing import Any

from hwlaunch.errors import ConfigError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.settings import Overrides

__all__ = ["LOG_FILES", "OUTPUT_SETTINGS", "worker_output"]

OUTPUT_SETTINGS = ("console_prefix", "console_ranks", "log_dir")
LOG_FILES = "<log_dir>/<run id>/rank<R>.attempt<N>.stdout and .stderr"


def worker_output(
    executor: ExecutorSpec, overrides: Overrides, notes: Notes, world_size: int
) -> dict[str, Any]:
    """The plan's ``console_prefix``, ``console_ranks`` and ``log_dir``; log_dir made absolute
    here, so that the files land where the setting meant when it was resolved."""
    prefix = overrides.value("console_prefix")
    ranks = overrides.value("console_ranks")
    log_dir = overrides.lookup("log_dir")
    if not executor.worker_output:
        _unused(executor, overrides, notes)
        return {"console_prefix": str(prefix.value), "console_ranks": None, "log_dir": None}
    shown: tuple[int, ...] | None = ranks.value
    if shown is not None and shown[-1] >= world_size:
        raise ConfigError(
            f"invalid console_ranks {','.join(map(str, shown))!r} from {ranks.source}: rank "
            f"{shown[-1]} is "
            f"not in a world of {world_size} (ranks 0-{world_size - 1})"
        )
    notes.note(
        "console_prefix",
        prefix.value,
        prefix.source,
        "each line a worker prints reaches this process's stdout or stderr whole, after this",
    )
    notes.note(
        "console_ranks",
        "all" if shown is None else list(shown),
        ranks.source,
        "ranks whose lines reach the console (log files get every rank)",
    )
    path = None if log_dir is None else os.path.abspath(os.path.expanduser(log_dir.value))
    notes.note(
        "log_dir",
        path,
        "default" if log_dir is None else log_dir.source,
        "no log files" if path is None else f"each rank's output also goes to {LOG_FILES}",
    )
    return {"console_prefix": str(prefix.value), "console_ranks": shown, "log_dir": path}


def _unused(executor: ExecutorSpec, overrides: Overrides, notes: Notes) -> None:
    given = {name: found for name in OUTPUT_SETTINGS if (found := overrides.lookup(name))}
    if not given:
        return
    if executor.needs_launcher:
        why = (
            "leaves the workers' output to the launcher that started them (torchrun: "
            "--log-dir, --tee, --local-ranks-filter)"
        )
    elif executor.in_process:
        why = "runs the worker in this process: its output is this process's own"
    else:
        why = "does not forward worker output"
    sources = ", ".join(f"{name} (from {found.source})" for name, found in given.items())
    notes.warn(f"{sources}: not used, the {executor.name} executor {why}")
