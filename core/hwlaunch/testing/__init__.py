"""hwlaunch.testing: the conformance suite a backend plugin runs from its own pytest suite.

Subclass :class:`BackendConformance` in a test module and name the backend (see its docstring).
An executor plugin subclasses :class:`ExecutorConformance` the same way (``executor =
"acme-sub"``).
This package imports pytest; ``import hwlaunch`` never imports it.
"""

from __future__ import annotations

from hwlaunch.testing._conformance import BackendConformance, LifecycleProbe
from hwlaunch.testing._executor import ExecutorConformance

__all__ = ["BackendConformance", "ExecutorConformance", "LifecycleProbe"]
