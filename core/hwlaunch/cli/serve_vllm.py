"""``hwlaunch serve-vllm``: vLLM's OpenAI-compatible server on hwlaunch's executor.

The arguments go untouched to vLLM's own server parser (``hwlaunch serve-vllm --help`` prints
vLLM's help); the work is in ``hwlaunch.integrations.vllm.serve``, imported when the command runs,
so that ``hwlaunch --help`` and the other commands never import vLLM.
"""

from __future__ import annotations

import click

from hwlaunch.cli._model_check import require_vllm


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
