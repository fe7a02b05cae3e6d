"""A worker extension importable by path ("hwl_ext:Greeter"): tests put this folder on sys.path."""

from __future__ import annotations


class Greeter:
    def greet(self, name: str, *, punctuation: str = "!") -> str:
        return f"hello {name} from rank {self.rank}{punctuation}"  # type: ignore[attr-defined]
