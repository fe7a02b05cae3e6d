"""The ``hwlaunch`` click group: ``backends``, ``resolve`` and ``run``.

User errors (HwlaunchError with exit_code 2, click usage errors) print one message on stderr and
exit 2 without a traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import sys
import traceback

import click

from hwlaunch.cli._inspect import backends, resolve
from hwlaunch.cli.run import run
from hwlaunch.errors import HwlaunchError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="hwlaunch")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Decide how to start accelerator workers, explain why, and run them."""
    ctx.obj = {"debug": debug}


cli.add_command(backends)
cli.add_command(resolve)
cli.add_command(run)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI and turn user errors into exit code 2 without a traceback."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="hwlaunch", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except HwlaunchError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"hwlaunch: error: {exc}", err=True)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return 0
