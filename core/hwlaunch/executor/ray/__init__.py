"""The ray executor: one Ray actor per rank in a placement group, across nodes."""

from __future__ import annotations

from hwlaunch.executor.ray._executor import RayExecutor
from hwlaunch.executor.ray._placement import RankNode

__all__ = ["RankNode", "RayExecutor"]
