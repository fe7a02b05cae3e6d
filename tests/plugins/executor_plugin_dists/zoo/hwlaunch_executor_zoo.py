"""Executor plugins for the tests: two that work, and four broken in different ways."""

from __future__ import annotations

from hwlaunch import ExecutorSpec, RegisterExecutor, hookimpl


class Inline:
    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(
            ExecutorSpec(
                name="inline",
                executor="hwlaunch_executor_zoo_inline:InlineExecutor",
                description="the worker on the caller's own thread",
                max_world_size=1,
                max_nodes=1,
                in_process=True,
            )
        )


class Liar:
    """The inline executor under a spec that does not declare ``in_process``: it promises a
    process of its own for its rank and keeps it in the caller's. The conformance suite's
    worker contract, driven by the declared capabilities, must catch it."""

    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(
            ExecutorSpec(
                name="zoo-liar",
                executor="hwlaunch_executor_zoo_inline:InlineExecutor",
                description="claims a process per rank, runs the worker inline",
                max_world_size=1,
                max_nodes=1,
            )
        )


class Restarting:
    """Local processes under a name of its own, declaring what mp declares: the rules must give
    it the start method, the rpc channel and restarts by its capabilities, not by its name."""

    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(
            ExecutorSpec(
                name="zoo-procs",
                executor="hwlaunch.executor.mp:MultiprocExecutor",
                description="local processes, restartable",
                max_nodes=1,
                start_method=True,
                restarts=True,
                rpc_channel=True,
            )
        )


class BrokenImport:
    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(ExecutorSpec(name="broken-import", executor="hwlaunch_zoo_gone:GoneExecutor"))


class NotAnExecutor:
    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(ExecutorSpec(name="not-executor", executor="hwlaunch_executor_zoo:Inline"))


class BadSpec:
    @staticmethod
    @hookimpl
    def hwlaunch_register_executors(register: RegisterExecutor) -> None:
        register(ExecutorSpec(name="badspec", executor="no import path"))
