"""The model that ``hwlaunch run`` generates with: a local model directory, or a tiny fixed one.

The built-in model is a two-layer Llama built from a fixed config and a fixed seed, with a byte
tokenizer, so that the main job needs no download and every process builds the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 0
BYTE_VOCAB = 256
BUILTIN_NAME = "built-in tiny llama (seed 0)"


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any | None
    name: str

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer(prompt)["input_ids"])
        return list(prompt.encode("utf-8"))

    def decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return None  # a random byte model produces no meaningful text: report token ids


def builtin_config() -> Any:
    """The built-in model's config: 4 attention heads (and 4 key/value heads), so that its
    tensor-parallel plan shards over 1, 2 or 4 workers."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=BYTE_VOCAB + 4,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=BYTE_VOCAB,
        eos_token_id=BYTE_VOCAB + 1,
        pad_token_id=BYTE_VOCAB + 2,
        tie_word_embeddings=False,
    )


def build_builtin() -> Any:
    """The built-in model's weights, the same in every process (fixed seed, built on the CPU)."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    return transformers.LlamaForCausalLM(builtin_config())


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str) -> Any | None:
    """The directory's tokenizer, or None where it has none (bytes are then its token ids, shown
    as ids). Why look for the files first: given a directory without them, transformers 5 builds
    an empty tokenizer of the model's type, which encodes every prompt to no tokens at all."""
    import transformers

    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None


def quiet_progress_bars() -> None:
    """No "Loading weights" bar: one per rank, interleaved, would garble stderr."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def load(path: str | None, device: Any = "cpu") -> LoadedModel:
    """Load ``path`` offline (local_files_only), or build the fixed tiny model: a whole copy."""
    import torch
    import transformers

    quiet_progress_bars()
    torch.manual_seed(SEED)
    if path is None:
        loaded = LoadedModel(model=build_builtin(), tokenizer=None, name=BUILTIN_NAME)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        loaded = LoadedModel(model=model, tokenizer=load_tokenizer(path), name=path)
    loaded.model.to(device).eval()
    return loaded


def generate(loaded: LoadedModel, prompts: list[str], max_new_tokens: int) -> list[dict[str, Any]]:
    """Greedy generation, one prompt at a time (no padding, so results do not depend on batching)."""
    import torch

    outputs = []
    device = next(loaded.model.parameters()).device
    config = loaded.model.config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    with torch.inference_mode():
        for prompt in prompts:
            ids = loaded.encode(prompt)
            input_ids = torch.tensor([ids], dtype=torch.long, device=device)
            out = loaded.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            new = [int(t) for t in out[0, len(ids) :].tolist()]
            outputs.append({"prompt": prompt, "token_ids": new, "text": loaded.decode(new)})
    return outputs


def timed_generate(
    loaded: LoadedModel, prompts: list[str], max_new_tokens: int
) -> tuple[list[dict[str, Any]], float]:
    """``generate`` and its wall time in seconds (the model already loaded: tokens/s)."""
    import time

    started = time.perf_counter()
    outputs = generate(loaded, prompts, max_new_tokens)
    return outputs, time.perf_counter() - started
