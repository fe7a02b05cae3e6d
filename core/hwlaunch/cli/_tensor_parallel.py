"""Worker side of tensor parallelism: transformers shards the model over the job's process group.

Each rank loads the model through ``from_pretrained(distributed_config=DistributedConfig(
tp_plan="auto", tp_size=world_size))``: transformers builds its device mesh on the process group
hwlaunch already joined, applies the model's own tensor-parallel plan (column- and row-wise
linear layers, held as DTensor shards) and hooks the forward passes with the collectives.
``generate`` must then run on every rank with the same inputs, in lockstep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hwlaunch.cli._demo_model import (
    BUILTIN_NAME,
    LoadedModel,
    build_builtin,
    load_tokenizer,
    quiet_progress_bars,
)


def cannot_load_sharded(path: str | None, device: Any) -> str | None:
    """Why transformers cannot shard this model onto this worker's device; None if it can.

    transformers builds its device mesh on torch's current accelerator, not on the device the
    worker was given: where the two differ (``--backend cpu`` on a machine with a GPU), the
    shards would land on the wrong device.
    """
    import torch

    accelerator = torch.accelerator.current_accelerator()
    mesh_type = "cpu" if accelerator is None else accelerator.type
    if mesh_type != torch.device(device).type:
        return (
            f"transformers would place the shards on {mesh_type}, not on this worker's "
            f"device {device}"
        )
    if path is None:
        return None  # a Llama: transformers ships its plan
    import transformers

    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if not getattr(config, "base_model_tp_plan", None):
        return f"transformers has no tensor-parallel plan for {path}"
    return None


def load_sharded(path: str | None, world_size: int, device_index: int) -> LoadedModel:
    """This rank's shard of every sharded weight (the norms and other small tensors whole).

    The built-in model has no files: every rank builds the same weights from the fixed seed
    and hands them to ``from_pretrained`` as a state dict, which keeps only this rank's shard.
    """
    import transformers
    from transformers.distributed.configuration_utils import DistributedConfig

    quiet_progress_bars()
    distributed = DistributedConfig(tp_plan="auto", tp_size=world_size)
    model: Any
    with _local_rank(device_index):
        if path is None:
            whole = build_builtin()
            model = transformers.LlamaForCausalLM.from_pretrained(
                None,
                config=whole.config,
                state_dict=whole.state_dict(),
                distributed_config=distributed,
            )
            del whole
            loaded = LoadedModel(model=model, tokenizer=None, name=BUILTIN_NAME)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, distributed_config=distributed
            )
            loaded = LoadedModel(model=model, tokenizer=load_tokenizer(path), name=path)
    loaded.model.eval()
    return loaded


@contextmanager
def _local_rank(device_index: int) -> Iterator[None]:
    """transformers binds the rank to device ``LOCAL_RANK``; a worker that sees only its own
    device (CUDA_VISIBLE_DEVICES set per worker) has it at index 0, not at its local rank."""
    saved = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(device_index)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["LOCAL_RANK"]
        else:
            os.environ["LOCAL_RANK"] = saved


def parameter_elements(model: Any) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole model): a DTensor's ``numel`` is its
    global size, its local shard is ``to_local()``."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    for parameter in model.parameters():
        whole += parameter.numel()
        held += (parameter.to_local() if isinstance(parameter, DTensor) else parameter).numel()
    return held, whole
