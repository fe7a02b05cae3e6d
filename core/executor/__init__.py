"""Executors: uni (in-process), mp (local processes), ray (a cluster)."""

from __future__ import annotations

from hwlaunch.executor.base import Executor

__all__ = ["Executor"]
