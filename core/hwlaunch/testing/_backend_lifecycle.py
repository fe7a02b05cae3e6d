"""The checks of a backend's worker lifecycle: real workers under each executor that the
test class names, chosen by what each executor declares (``_capabilities``), never its name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hwlaunch._start_methods import kind_of
from hwlaunch.errors import StartMethodError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import Plan
from hwlaunch.planning.facts import gather_facts
from hwlaunch.testing._backend_setup import (
    MARKER_VAR,
    PROPAGATED_VAR,
    RPC_TIMEOUT,
    BackendSetup,
    documented_visibility,
    same_fields,
)
from hwlaunch.testing._capabilities import (
    local_rank_of,
    own_processes,
    sets_binding,
    two_node_cluster,
    world_size_for,
)
from hwlaunch.worker import Worker

__all__ = ["LifecycleChecks", "LifecycleProbe"]


class LifecycleProbe(Worker):
    """Worker extension mixed in front of the backend's worker class by the lifecycle checks.

    It reports what the worker looks like after start-up, and records (in a file per rank) that
    ``shutdown()`` ran, whether it raised, and whether it left the process group.
    """

    def conformance_report(self) -> dict[str, Any]:
        import torch.distributed as dist

        from hwlaunch.executor._runtime import import_object

        joined = bool(dist.is_available() and dist.is_initialized())
        var = self.plan.device_control_env_var
        names = self.plan.env.get(PROPAGATED_VAR, "")
        return {
            "pid": os.getpid(),
            "setup_plugins": list(self.setup_plugins),
            "propagated": {n: os.environ.get(n) for n in names.split(",") if n},
            "ray_noset": os.environ.get(self.plan.ray_noset_visibility_var or "", None),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "is_backend_worker": isinstance(self, import_object(self.plan.worker)),
            "device": None if self.device is None else str(self.device),
            "dist_initialized": joined,
            "dist_backend": str(dist.get_backend()) if joined else None,
            "visible": os.environ.get(var) if var else None,
        }

    def shutdown(self) -> None:
        error: str | None = None
        try:
            super().shutdown()
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            dist = sys.modules.get("torch.distributed")
            joined = bool(dist is not None and dist.is_available() and dist.is_initialized())
            folder = self.plan.env.get(MARKER_VAR)
            if folder:
                marker = Path(folder, f"rank{self.rank}.json")
                marker.write_text(json.dumps({"error": error, "dist_initialized": joined}))
            if joined and dist is not None:  # recorded; now leave, so the next test starts clean
                dist.destroy_process_group()


class LifecycleChecks(BackendSetup):
    """The lifecycle checks of ``BackendConformance``."""

    # -- the worker lifecycle ------------------------------------------------------------------
    def run_lifecycle(
        self,
        executor: str,
        method: str | None,
        markers: Path,
        monkeypatch: pytest.MonkeyPatch,
        **extra: object,
    ) -> None:
        """Start the workers, check what they report and an all-reduce, shut them down."""
        from hwlaunch.executor.launcher import launch

        spec = self.spec()
        chosen = self.executor_spec(executor)
        facts = gather_facts({spec.name: spec})
        device = facts.devices[spec.name]
        if not device.available:
            why = f" (probe failed: {device.probe_error})" if device.probe_error else ""
            pytest.skip(
                f"no {spec.name} device on this machine{why}: the worker lifecycle needs the "
                "hardware; the rule and resolver checks ran with the device assumed"
            )
        if method is not None and not chosen.start_method:
            pytest.skip(f"executor {executor!r} does not declare start_method")
        if method is not None and method not in spec.start_methods.allowed:
            pytest.skip(f"backend {spec.name} does not allow start method {method!r}")
        if method is not None and method not in facts.os_start_methods:
            pytest.skip(f"this OS does not offer start method {method!r}")
        world = world_size_for(chosen, spec, device.device_count)
        propagated = self.propagation_env()
        for name, value in propagated.items():
            monkeypatch.setenv(name, value)
        parent_visible = os.environ.get(spec.device_control_env_var or "")
        try:
            plan = self.plan(
                facts,
                plugins=True,
                backend=spec.name,
                world_size=world,
                executor=executor,
                start_method=method,
                **extra,
            )
        except StartMethodError as exc:
            if method is not None and kind_of(method).copies_parent and device.initialized:
                pytest.skip(f"fork is unsafe in this test process: {exc}")
            raise
        plan = dataclasses.replace(
            plan, env={**plan.env, MARKER_VAR: str(markers), PROPAGATED_VAR: ",".join(propagated)}
        )
        with launch(plan, worker_extension=LifecycleProbe, startup_timeout=RPC_TIMEOUT) as workers:
            reports = workers.collective_rpc("conformance_report", timeout=RPC_TIMEOUT)
            sums = workers.collective_rpc("all_reduce_rank", timeout=RPC_TIMEOUT)
            workers.check_health()
        self.check_lifecycle(plan, reports, sums, markers)
        visible = [
            documented_visibility(spec, r, world, parent_visible, facts) for r in range(world)
        ]
        self.check_contract(plan, chosen, reports, visible, propagated)

    def check_contract(
        self,
        plan: Plan,
        executor: ExecutorSpec,
        reports: list[Any],
        visible: list[str | None],
        propagated: dict[str, str],
    ) -> None:
        """Contract v1 in the workers, as the executor's capabilities promise: the binding's
        variable where hwlaunch sets it, each setup hook once per worker, the propagated
        variables, Ray's opt-out variable (``ray``), one process per rank (not ``in_process``)."""
        spec, world = self.spec(), plan.world_size
        for rank, report in enumerate(reports):
            if sets_binding(executor):
                assert report["visible"] == visible[rank], (
                    f"rank {rank}: {spec.device_control_env_var} is {report['visible']!r}; binding "
                    f"{spec.device_binding!r} documents {visible[rank]!r}"
                )
            assert report["setup_plugins"] == list(plan.worker_setup), (
                f"rank {rank}: hwlaunch_worker_setup ran for {report['setup_plugins']}, expected "
                f"once for each of {list(plan.worker_setup)}"
            )
            assert report["propagated"] == propagated, (
                f"rank {rank}: propagated variables arrived as {report['propagated']}, "
                f"expected {propagated}"
            )
        if executor.ray and plan.ray_noset_visibility_var:
            noset = [r["ray_noset"] for r in reports]
            assert noset == ["1"] * world, f"{plan.ray_noset_visibility_var} in the actors: {noset}"
        if own_processes(executor):
            pids = [r["pid"] for r in reports]
            assert len(set(pids)) == world and os.getpid() not in pids, (
                f"worker pids {pids}, this process {os.getpid()}: executor {executor.name!r} "
                "does not declare in_process, so each rank must run in a process of its own"
            )

    def check_lifecycle(
        self, plan: Plan, reports: list[Any], sums: list[Any], markers: Path
    ) -> None:
        """What every rank reported after start-up, the all-reduce, and its shutdown marker."""
        world = plan.world_size
        for rank, report in enumerate(reports):
            expected = {"rank": rank, "world_size": world, "is_backend_worker": True}
            local = local_rank_of(rank, world, plan.nnodes)
            if local is not None:  # the ranks of a node are contiguous
                expected["local_rank"] = local
            same_fields(f"rank {rank} after start-up", report, expected)
            assert report["device"] is not None, "init_device() must set self.device"
            assert report["dist_initialized"], "init_distributed() did not join a process group"
            assert report["dist_backend"] == plan.dist_backend, (
                f"rank {rank} joined a {report['dist_backend']!r} group, not {plan.dist_backend!r}"
            )
        assert sums == [world * (world - 1) // 2] * world, f"all-reduce of rank ids gave {sums}"
        for rank in range(world):
            marker = markers / f"rank{rank}.json"
            assert marker.is_file(), f"rank {rank}: shutdown() was not called"
            ended = json.loads(marker.read_text())
            assert ended["error"] is None, f"rank {rank}: shutdown() raised {ended['error']}"
            assert not ended["dist_initialized"], (
                f"rank {rank}: shutdown() did not leave the process group (call super().shutdown())"
            )

    def test_lifecycle(
        self,
        lifecycle_executor: str,
        lifecycle_method: str | None,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Each executor of ``executors`` that starts workers here, under each start method the
        backend allows where it declares ``start_method``."""
        self.run_lifecycle(lifecycle_executor, lifecycle_method, tmp_path, monkeypatch)

    def test_lifecycle_ray_two_nodes(
        self, ray_executor: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Two ranks on two Ray nodes (a real cluster on 127.0.0.1), for each executor of
        ``executors`` that declares ``ray``: setup once per actor, and the propagated variables
        arrive through Ray's runtime environment, not inheritance (they are set only after the
        nodes started)."""
        spec = self.spec()
        if not gather_facts({spec.name: spec}).devices[spec.name].available:
            pytest.skip(f"no {spec.name} device on this machine")
        with two_node_cluster(spec) as address:
            self.run_lifecycle(
                ray_executor, None, tmp_path, monkeypatch, nnodes=2, ray_address=address
            )
