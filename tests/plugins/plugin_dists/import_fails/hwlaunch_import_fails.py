"""A plugin whose vendor library is missing: importing it raises ImportError."""

from __future__ import annotations

raise ImportError("vendor runtime libnpu.so.7 not found")
