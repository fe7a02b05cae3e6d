"""The Acme custom ops, registered once in each worker process by the plugin's setup hook.

A real plugin registers torch custom ops, models or an allocator here (``torch.library``); the
emulation counts registrations, so that its tests can check the hook ran once per worker.
"""

from __future__ import annotations

_registered = 0


def register() -> None:
    global _registered
    _registered += 1


def registrations() -> int:
    return _registered
