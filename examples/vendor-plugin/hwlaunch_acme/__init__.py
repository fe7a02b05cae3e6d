"""hwlaunch plugin for the Acme NPU, a fictional accelerator that this example emulates on the CPU.

Everything hwlaunch needs to know about the device is declared here, as data: one BackendSpec
registered from the ``hwlaunch_register_backends`` hook. hwlaunch imports this module whenever it
lists backends or resolves a plan, so it stays cheap: no torch, no vendor runtime, no device
access. The worker class lives in ``hwlaunch_acme.worker`` and is imported inside workers only.

Emulation: the "devices" are counted from ``ACME_NPU_DEVICES`` (default 2; ``0`` means no Acme
NPU on this machine). A real plugin counts device nodes or asks the driver library instead.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl

if TYPE_CHECKING:  # workers load this module too (for the setup hook): type names only
    from hwlaunch import PlanDraft, Worker

HWLAUNCH_CONTRACT = "1.0"  # the plugin contract this module needs (hwlaunch.CONTRACT_VERSION)

DEVICES_VAR = "ACME_NPU_DEVICES"  # emulation only: how many Acme NPUs this machine "has"
VISIBLE_VAR = "ACME_VISIBLE_DEVICES"  # like CUDA_VISIBLE_DEVICES: which devices a process sees


def device_count() -> int:
    """How many Acme NPUs this process may use; cheap and free of side effects.

    A real plugin would count device nodes (``hwlaunch.probes.device_nodes("/dev/acme*")``) or
    ask the driver's management library, never the runtime that owns the device.
    """
    try:
        installed = max(int(os.environ.get(DEVICES_VAR, "2")), 0)
    except ValueError:
        return 0
    visible = os.environ.get(VISIBLE_VAR)
    if visible is None:
        return installed
    return min(len([v for v in visible.split(",") if v.strip()]), installed)


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    """Whether this process has already initialized the device runtime.

    Ask the runtime only if something has already imported it: importing it here would make
    every ``hwlaunch backends`` pay for it (and might initialize the device).
    """
    runtime = sys.modules.get("acme_runtime")  # the vendor's runtime module (absent here)
    return bool(runtime is not None and runtime.is_initialized())


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="acme",  # what users pass to --backend / HWLAUNCH_BACKEND
            device_type="acme",  # anything but "cpu" counts devices and binds one per worker
            priority=50,  # auto-detection order: above cpu (0), below cuda/hpu/xpu (100/90/80)
            is_available=is_available,
            device_count=device_count,
            is_initialized=is_initialized,
            start_methods=StartMethodRule(
                # The Acme runtime does not survive fork, so fork is not allowed at all.
                allowed=("spawn", "forkserver"),
                # forkserver: workers fork from a clean server that preloaded torch, so they
                # start faster than with spawn, and never inherit the parent's device state.
                default="forkserver",
                # The method to use instead of fork when fork is unsafe. Acme never forks, so
                # the resolver never needs it; declare it if you ever allow fork.
                fallback="spawn",
                preload=("torch",),  # imported once by the fork server
            ),
            dist_backend="gloo",  # a real NPU names its collective library's backend here
            worker="hwlaunch_acme.worker:AcmeWorker",  # imported only inside worker processes
            device_control_env_var=VISIBLE_VAR,  # set per worker by the mp and ray executors
            # Like oneCCL on XPU, the Acme collectives need every worker to see all the job's
            # devices; each worker selects its local rank among them (Worker.device_index).
            device_binding="job_wide",
            # The runtime's tuning variables, copied from the driver into every worker (Ray
            # actors on other nodes too); the plan lists their names, never their values.
            propagate_env=("ACME_RT_*",),
            ray_resource="ACME",  # the Ray resource key a worker actor asks for
            # Ray rewrites the visibility variable of the accelerators it knows; this variable
            # turns that off so the binding above holds (Ray's for CUDA:
            # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES).
            ray_noset_visibility_var="RAY_EXPERIMENTAL_NOSET_ACME_VISIBLE_DEVICES",
            worker_env={"ACME_LOG_LEVEL": "warning"},  # extra environment for every worker
            contract="1.0",
        )
    )


@hookimpl
def hwlaunch_adjust_plan(draft: PlanDraft) -> None:
    """Policy: one Acme comm channel per worker, at most 4. Only a proposal: a user's own
    ACME_COMM_CHANNELS (shell, config file) wins, and the plan shows where the value came from."""
    workers = int(draft.decisions["world_size"].value)
    draft.propose(
        "env",
        {"ACME_COMM_CHANNELS": str(min(workers, 4))},
        "one comm channel per worker, at most 4",
    )


@hookimpl
def hwlaunch_worker_setup(worker: Worker) -> None:
    """Register the Acme custom ops in each worker process, before its device is initialized."""
    from hwlaunch_acme import ops  # imported in workers only

    ops.register()
