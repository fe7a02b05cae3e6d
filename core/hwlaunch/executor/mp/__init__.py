"""The mp executor: local worker processes (executor, child entry point, fork server)."""

from __future__ import annotations

from hwlaunch.executor.mp._executor import MultiprocExecutor

__all__ = ["MultiprocExecutor"]
