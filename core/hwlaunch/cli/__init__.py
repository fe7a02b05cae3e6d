"""The ``hwlaunch`` command line.

``main`` loads the click application on first call, so that importing a module of this package
in a worker (the ``run`` job's worker extension) does not import click or the planning layer.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn user errors into exit code 2 without a traceback."""
    from hwlaunch.cli._app import run_cli

    return run_cli(argv)
