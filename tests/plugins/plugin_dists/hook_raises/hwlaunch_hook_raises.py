"""Plugins (one class each) whose hook raises, exits, is missing, or raises after registering."""

from __future__ import annotations

from collections.abc import Generator

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


class Raises:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backends(register: Register) -> None:
        raise ValueError("cannot talk to the npu daemon")


class Exits:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backends(register: Register) -> None:
        raise SystemExit("plugin hook called sys.exit")


class NoHook:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backend(register: Register) -> None:
        """Misspelled (singular): pluggy accepts it as an unknown hook, never calls it."""


class Partial:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backends(register: Register) -> None:
        """Registers a valid backend, then fails: the registry must keep none of it."""
        register(
            BackendSpec(
                name="partialnpu",
                device_type="npu",
                priority=1,
                is_available=lambda: True,
                device_count=lambda: 1,
                is_initialized=lambda: False,
                start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
                dist_backend="gloo",
                worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            )
        )
        raise RuntimeError("second device table is corrupt")


class Wraps:
    @staticmethod
    @hookimpl(wrapper=True)
    def hwlaunch_register_backends(register: Register) -> Generator[None, None, None]:
        """A new-style wrapper: hwlaunch calls each plugin's hooks alone, so it would wrap
        nothing; the registry must reject it with the fix rather than call it."""
        raise AssertionError("a rejected wrapper must never be called")
        yield
