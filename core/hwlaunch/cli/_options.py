"""Click options generated from the settings table, shared by ``resolve`` and ``run``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from hwlaunch.planning.settings import SETTINGS

F = TypeVar("F", bound=Callable[..., Any])


def setting_options(defaults: Mapping[str, object] | None = None) -> Callable[[F], F]:
    """One option per setting (values are validated by resolve, which names the flag), plus
    ``--config``; ``defaults`` are the command's own defaults, shown in the help."""
    defaults = defaults or {}

    def decorate(func: F) -> F:
        options = []
        for setting in SETTINGS:
            names = [setting.flag, *([setting.short] if setting.short else []), setting.name]
            note = f" (default: {defaults[setting.name]})" if setting.name in defaults else ""
            options.append(click.option(*names, metavar=setting.metavar, help=setting.help + note))
        options.append(
            click.option(
                "--config",
                "config_file",
                metavar="FILE",
                help="Config file (default: ./hwlaunch.toml or [tool.hwlaunch]).",
            )
        )
        for option in reversed(options):
            func = option(func)
        return func

    return decorate
