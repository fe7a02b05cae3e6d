"""The built-in executors, registered through the same hook and entry points as a vendor's.

Only data here: each class is imported when a plan that names it is launched (the ray executor
imports Ray then, and never when hwlaunch lists executors or resolves a plan).
"""

from __future__ import annotations

from hwlaunch import ExecutorSpec, RegisterExecutor, hookimpl


@hookimpl
def hwlaunch_register_executors(register: RegisterExecutor) -> None:
    register(
        ExecutorSpec(
            name="uni",
            executor="hwlaunch.executor.uni:UniExecutor",
            description="one worker in this process, on a thread of its own",
            max_world_size=1,
            max_nodes=1,
            in_process=True,
        )
    )
    register(
        ExecutorSpec(
            name="mp",
            executor="hwlaunch.executor.mp:MultiprocExecutor",
            description="local worker processes (fork, spawn or forkserver)",
            max_nodes=1,
            start_method=True,
            restarts=True,
            rpc_channel=True,
            worker_output=True,
        )
    )
    register(
        ExecutorSpec(
            name="ray",
            executor="hwlaunch.executor.ray:RayExecutor",
            description="Ray actors in a placement group, across nodes",
            restarts=True,
            ray=True,
            worker_output=True,
        )
    )
    register(
        ExecutorSpec(
            name="external",
            executor="hwlaunch.executor.external:ExternalExecutor",
            description="this process is one rank that torchrun, srun or mpirun started",
            needs_launcher=True,
            in_process=True,
        )
    )
