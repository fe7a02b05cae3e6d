"""A tiny random Llama with a word-level tokenizer, built offline for the vLLM tests.

Why these sizes: vLLM's CPU attention rejects a head size of 16, so hidden 256 with 4 heads
(2 KV heads) gives 64; two layers keep an engine's start and each step short. The weights
come from a fixed seed, so every build of the directory is the same model.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
    "and",
    "or",
    "is",
    "was",
    "be",
    "it",
    "this",
    "that",
    "with",
    "for",
    "as",
    "by",
    "at",
    "from",
    "hello",
    "world",
    "model",
    "token",
    "engine",
    "worker",
    "rank",
    "process",
    "fork",
    "spawn",
    "thread",
    "plan",
    "cpu",
    "gpu",
    "tensor",
    "parallel",
    "greedy",
    "sample",
    "prompt",
    "reply",
    "fast",
    "slow",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "bird",
    "sun",
    "moon",
    "star",
    "sea",
]
SPECIAL = ("[UNK]", "<s>", "</s>")
PROMPTS = [
    "hello world the model is",
    "one two three four five",
    "the cat and the dog",
    "a fork of the process",
]


def build(path: Path) -> Path:
    """Write the model and its tokenizer to ``path`` (a directory) and return it."""
    import tokenizers
    import torch
    import transformers

    vocab = {word: index for index, word in enumerate((*SPECIAL, *WORDS))}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
