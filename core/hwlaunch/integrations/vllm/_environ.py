"""``os.environ`` changed for the span of a block, then as it was.

Why: vLLM reads some of its settings from the environment when its engine is built (and its
CPU platform writes some back); the caller's environment must be the caller's again afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

__all__ = ["environment"]


@contextmanager
def environment(values: Mapping[str, str], restore: Iterable[str] = ()) -> Iterator[None]:
    """``values`` set in ``os.environ`` for the block; afterwards they, and the variables named
    in ``restore`` (ones the block may write), are as they were, unset ones unset."""
    before = {name: os.environ.get(name) for name in (*values, *restore)}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
