"""A plugin whose module raises a RuntimeError at import."""

from __future__ import annotations

raise RuntimeError("driver version mismatch at import")
