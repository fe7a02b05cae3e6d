"""The ``hwlaunch`` click group: ``backends``, ``resolve``, ``run`` and ``serve-vllm``.

User errors (HwlaunchError with exit_code 2, click usage errors) print one message on stderr and
exit 2 without a traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import click

from hwlaunch.cli._inspect import backends, resolve
from hwlaunch.cli._job import result_of
from hwlaunch.cli.run import run
from hwlaunch.cli.serve_vllm import serve_vllm
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
cli.add_command(serve_vllm)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI and turn user errors into exit code 2 without a traceback. With ``--json``,
    a failure also prints ``{"error": {"type", "message", "exit_code"}}`` on stdout, so that a
    program reading stdout always gets one JSON object."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    as_json = "--json" in (args[: args.index("--")] if "--" in args else args)
    try:
        cli.main(args=args, prog_name="hwlaunch", standalone_mode=False)
    except click.exceptions.Abort:
        return _failed(as_json, "Abort", "aborted", 130, "aborted")
    except click.ClickException as exc:
        exc.show()
        return _failed(as_json, type(exc).__name__, exc.format_message(), exc.exit_code, "")
    except HwlaunchError as exc:
        if debug:
            traceback.print_exc()
        return _failed(as_json, type(exc).__name__, str(exc), exc.exit_code, result=result_of(exc))
    except KeyboardInterrupt:
        return _failed(as_json, "KeyboardInterrupt", "interrupted", 130, "interrupted")
    except Exception as exc:  # a bug or an environment problem: its traceback follows
        if as_json:
            _print_json_error(type(exc).__name__, str(exc), 1, None)
        raise
    return 0


def _failed(
    as_json: bool,
    kind: str,
    message: str,
    exit_code: int,
    stderr: str | None = None,
    result: dict[str, Any] | None = None,
) -> int:
    """Report a failure: ``stderr`` (by default ``hwlaunch: error: MESSAGE``; "" when already
    shown) on stderr and, with ``--json``, the error object on stdout; returns the exit code."""
    text = f"hwlaunch: error: {message}" if stderr is None else stderr
    if text:
        click.echo(text, err=True)
    if as_json:
        _print_json_error(kind, message, exit_code, result)
    return int(exit_code)


def _print_json_error(
    kind: str, message: str, exit_code: int, result: dict[str, Any] | None
) -> None:
    payload: dict[str, Any] = {
        "error": {"type": kind, "message": message, "exit_code": int(exit_code)}
    }
    if result is not None:
        payload["result"] = result
    click.echo(json.dumps(payload, indent=2))
