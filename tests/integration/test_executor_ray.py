"""The ray executor against real Ray: a local instance it starts, and a two-node cluster.

Every Ray service listens on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set before Ray is
imported). One two-node cluster (``ray.cluster_utils.Cluster``, two CPUs per node) serves the
whole module; each test starts its own executor on it, except the non-destructive ones, which
share one. Whatever Ray process this module started must be gone at its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import cloudpickle
import psutil
import pytest

import hwlaunch
from hwlaunch import resolve
from hwlaunch.errors import (
    BackendUnavailableError,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerError,
    WorkerStartupError,
)
from hwlaunch.plan import Plan

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from call_options import CallOptionsProbe, check_call_options  # noqa: E402
from processes import wait_until  # noqa: E402

from hwlaunch.executor.base import free_port  # noqa: E402
from hwlaunch.executor.ray import (  # noqa: E402
    RayExecutor,
    _cluster,
    _placement,
)

pytestmark = pytest.mark.ray

# Classes and functions of this module travel to the actors by value: the actors cannot
# import a test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(sys.modules[CallOptionsProbe.__module__])

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
NODE_ARGS: dict[str, Any] = {
    "num_cpus": 2,
    "object_store_memory": 100 * 1024**2,
    "node_ip_address": "127.0.0.1",
}


# -- Ray processes of ours -----------------------------------------------------------------
def is_ray_process(proc: psutil.Process) -> bool:
    """A Ray service, agent or worker: by its title or by the program it runs.

    Only the program part of the command line counts: a multiprocessing fork server started
    after ``import ray`` carries Ray's paths in its arguments without being Ray's.
    """
    try:
        name, program = proc.name(), proc.cmdline()[:3]
    except psutil.Error:
        return False
    return (
        name.startswith("ray::")
        or name in ("raylet", "gcs_server")
        or any(f"{os.sep}ray{os.sep}" in part for part in program if not part.startswith("-"))
    )


def ray_descendants() -> list[psutil.Process]:
    """This process's descendants that belong to Ray (services, agents, actors)."""
    return [p for p in psutil.Process().children(recursive=True) if is_ray_process(p)]


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """The pids still running after ``timeout`` seconds (none, normally)."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in procs):
        time.sleep(0.1)
    return [p.pid for p in procs if alive(p)]


def listen_addresses(proc: psutil.Process) -> list[str]:
    try:
        conns = proc.net_connections("inet")
    except psutil.Error:
        return []
    return [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]


def our_placement_groups() -> dict[str, str]:
    """hwlaunch's placement groups in the connected cluster: name -> state."""
    table = ray.util.placement_group_table()
    return {pg["name"]: pg["state"] for pg in table.values() if pg["name"].startswith("hwlaunch-")}


def assert_released(executor: RayExecutor) -> None:
    """The executor's actors are gone and its placement groups removed."""
    assert wait_gone(executor.pids) == []
    assert set(our_placement_groups().values()) <= {"REMOVED"}


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two Ray nodes on this machine, every service on 127.0.0.1, two CPUs each."""
    if ray.is_initialized():
        ray.shutdown()
    started = cluster_utils.Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
    )
    try:
        started.add_node(**NODE_ARGS)
        started.wait_for_nodes()
        ray.init(address=started.address)
        yield started
    finally:
        ours = ray_descendants()
        ray.shutdown()
        started.shutdown()
        left = wait_gone([p.pid for p in ours])
        left += [p.pid for p in ray_descendants() if alive(p)]
        assert left == [], f"Ray processes left after the cluster shut down: {left}"


@pytest.fixture
def connected(cluster: Any, clean_env: Path) -> Any:
    """The test process is a driver of the module's cluster (as a user's program would be)."""
    if not ray.is_initialized():
        ray.init(address=cluster.address)
    return cluster


def cluster_plan(**overrides: Any) -> Plan:
    return resolve(backend="cpu", **overrides)


class Extension(CallOptionsProbe):
    """Mixed into the worker class: its methods are callable by name."""

    def where(self) -> dict[str, Any]:
        import ray as inner

        return {
            "node_id": inner.get_runtime_context().get_node_id(),
            "rank": self.rank,  # type: ignore[attr-defined]
            "local_rank": self.local_rank,  # type: ignore[attr-defined]
        }

    def fail(self, message: str) -> None:
        raise ValueError(message)


class BrokenDevice:
    """A worker extension whose device initialization fails on rank 1."""

    def init_device(self) -> None:
        if self.rank == 1:  # type: ignore[attr-defined]
            raise RuntimeError("no device for rank 1")
        super().init_device()  # type: ignore[misc]


# -- without Ray ---------------------------------------------------------------------------
def test_missing_ray_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = resolve(backend="cpu", world_size=2, executor="ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(BackendUnavailableError, match=r"pip install 'hwlaunch\[ray\]'") as info:
        RayExecutor(plan).start()
    assert info.value.exit_code == 2


def test_resolve_explains_that_the_world_size_exceeds_local_devices(
    clean_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hwlaunch.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # a table row per setting, unwrapped

    args = ["--assume", "cuda.available=true", "--assume", "cuda.device_count=2"]
    assert main(["resolve", *args, "--world-size", "4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["executor"] == "ray"
    assert plan["ray_resource"] == "GPU"
    executor = next(d for d in plan["decisions"] if d["setting"] == "executor")
    assert "world size 4 exceeds the 2 local cuda devices" in executor["reason"]
    assert main(["resolve", *args, "--world-size", "4"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "│ executor" in line)
    assert "world size 4 exceeds the 2 local cuda devices (assumed)" in row


def test_an_address_nothing_listens_at_fails_fast(clean_env: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()  # `connected` reconnects the tests that need the cluster
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="cannot connect to the Ray cluster") as info:
        RayExecutor(
            resolve(backend="cpu", world_size=2, executor="ray", ray_address=address)
        ).start()
    assert time.monotonic() - started < 5
    assert f"{address!r} (from resolve(ray_address=))" in str(info.value)
    assert not ray.is_initialized()


# -- pure helpers ----------------------------------------------------------------------------
class FakeRay:
    """Just enough of the ``ray`` module for connect() and release()."""

    def __init__(self) -> None:
        self.up = False
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **kwargs: Any) -> None:
        self.up = True
        self.inits.append(kwargs)

    def shutdown(self) -> None:
        self.up = False
        self.shutdowns += 1

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(gcs_address="10.0.0.1:6379", get_job_id=lambda: "01000000")


def test_the_connection_hwlaunch_made_ends_with_its_last_executor(clean_env: Path) -> None:
    fake = FakeRay()
    warnings: list[str] = []
    plan = resolve(backend="cpu", world_size=2, executor="ray")
    assert _cluster.connect(fake, plan, warnings) is True
    assert fake.inits == [
        {"address": "local", "include_dashboard": False, "_node_ip_address": "127.0.0.1"}
    ]
    assert _cluster.connect(fake, plan, warnings) is True  # a second executor shares it
    _cluster.release(fake)
    assert fake.up and fake.shutdowns == 0
    _cluster.release(fake)
    assert not fake.up and fake.shutdowns == 1
    assert warnings == []


def test_a_connection_the_caller_made_is_left_alone(clean_env: Path) -> None:
    fake = FakeRay()
    warnings: list[str] = []
    fake.up = True  # the caller ran ray.init()
    plan = resolve(backend="cpu", world_size=2, executor="ray", ray_address="10.0.0.2:6379")
    assert _cluster.connect(fake, plan, warnings) is False
    assert fake.inits == [] and fake.up
    assert warnings == [
        "ray_address '10.0.0.2:6379' is not used: this process is already connected to the "
        "Ray cluster at 10.0.0.1:6379"
    ]


def test_placement_helpers() -> None:
    plans = {
        (4, 1): "PACK",
        (2, 2): "STRICT_SPREAD",
        (4, 2): "SPREAD",
    }
    base = resolve(backend="cpu", world_size=2, executor="ray")
    for (world, nodes), strategy in plans.items():
        plan = dataclasses.replace(base, world_size=world, nnodes=nodes)
        assert _placement.placement_strategy(plan) == strategy
    assert _placement.rank_order({0: "a", 1: "b", 2: "a", 3: "b"}) == [0, 2, 1, 3]
    assert _placement.local_ranks(["a", "a", "b"]) == [(0, 2), (1, 2), (0, 1)]
    assert _placement.actor_resources("CPU") == {"num_cpus": 1}
    assert _placement.actor_resources("GPU") == {"num_cpus": 0, "num_gpus": 1}
    assert _placement.actor_resources("HPU") == {"num_cpus": 0, "resources": {"HPU": 1}}


def test_each_rank_sees_its_nodes_devices_with_its_own_at_local_rank() -> None:
    # Ray gives each GPU actor one device; workers bind to device `local_rank`.
    visible = _placement.node_visibility(["a", "a", "b", "c"], [["3"], ["1"], ["0"], []])
    assert visible == {"a": "3,1", "b": "0", "c": None}


# -- a local instance ------------------------------------------------------------------------
def test_starts_a_local_instance_on_loopback_and_shuts_it_down(clean_env: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()  # the module's cluster, if it runs already; `connected` reconnects
    before = {p.pid for p in ray_descendants()}
    statuses: list[tuple[int, str]] = []
    plan = resolve(backend="cpu", world_size=2, executor="ray")
    with RayExecutor(
        plan, on_status=lambda rank, status: statuses.append((rank, status))
    ).start() as ex:
        assert ray.is_initialized()
        assert ex.collective_rpc("all_reduce_rank") == [1, 1]
        assert [n.node_ip for n in ex.nodes] == ["127.0.0.1"] * 2
        assert [n.local_rank for n in ex.nodes] == [0, 1]
        assert sorted(statuses) == [(0, "ready"), (0, "started"), (1, "ready"), (1, "started")]
        started = [p for p in ray_descendants() if p.pid not in before]
        services = [p for p in started if p.pid not in ex.pids]
        listening = {(p.name(), ip) for p in services for ip in listen_addresses(p)}
        assert listening, "found no Ray service listening"
        assert {ip for _, ip in listening} <= LOOPBACK, listening
    assert not ray.is_initialized(), "the local instance hwlaunch started must end with it"
    assert wait_gone([p.pid for p in started]) == []


def test_connecting_by_address_leaves_the_cluster_running(connected: Any) -> None:
    ray.shutdown()
    plan = cluster_plan(world_size=2, executor="ray", ray_address=connected.address)
    assert plan.ray_address == connected.address
    with RayExecutor(plan).start() as ex:
        assert ex.collective_rpc("all_reduce_rank") == [1, 1]
        pids = ex.pids
    assert not ray.is_initialized(), "hwlaunch ends the connection it made"
    assert wait_gone(pids) == []
    ray.init(address=connected.address)  # the cluster is still there
    assert len([node for node in ray.nodes() if node["Alive"]]) == 2
    assert connected.remaining_processes_alive()


# -- a two-node cluster -----------------------------------------------------------------------
def test_pack_fills_nodes_with_contiguous_ranks_and_timeout_shuts_down(connected: Any) -> None:
    ex = RayExecutor(cluster_plan(world_size=4, executor="ray")).start()
    try:
        nodes = ex.nodes
        assert [n.local_rank for n in nodes] == [0, 1, 0, 1]
        assert nodes[0].node_id == nodes[1].node_id != nodes[2].node_id == nodes[3].node_id
        assert ex.collective_rpc("all_reduce_rank") == [6] * 4
        started = time.monotonic()
        with pytest.raises(RpcTimeoutError) as info:
            ex.collective_rpc(lambda worker: time.sleep(60), timeout=1.0)
        assert time.monotonic() - started < 10
        assert info.value.ranks == [0, 1, 2, 3]
        with pytest.raises(hwlaunch.ExecutorClosedError, match="shut down"):
            ex.collective_rpc("ping")
        assert_released(ex)
        assert ray.is_initialized(), "the caller's connection must stay open"
    finally:
        ex.shutdown()


def test_killed_actor_gives_worker_died_error_promptly(connected: Any) -> None:
    ex = RayExecutor(cluster_plan(world_size=2, nnodes=2)).start()
    try:
        victim = ex.nodes[1]
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(victim.pid, signal.SIGKILL)

        timer = threading.Timer(1.0, kill)
        timer.start()
        with pytest.raises(WorkerDiedError) as info:
            ex.collective_rpc(lambda worker: time.sleep(60), timeout=120)
        detected = time.monotonic() - killed_at[0]
        timer.join()
        print(f"actor death detected in {detected:.2f}s: {info.value}")
        assert detected < 5.0
        assert info.value.rank == 1 and info.value.pid == victim.pid
        assert victim.node_ip in str(info.value)
        with pytest.raises(WorkerDiedError):
            ex.collective_rpc("ping")
        assert_released(ex)
    finally:
        ex.shutdown()


def test_startup_failure_gives_remote_traceback_and_cleans_up(connected: Any) -> None:
    before = {p.pid for p in ray_descendants()}
    with pytest.raises(WorkerStartupError) as info:
        RayExecutor(cluster_plan(world_size=2, nnodes=2), worker_extension=BrokenDevice).start()
    assert info.value.rank == 1
    assert "RuntimeError: no device for rank 1" in str(info.value)
    assert "in init_device" in info.value.remote_traceback
    actors = [
        p.pid
        for p in ray_descendants()
        if p.pid not in before and p.name().startswith("ray::hwlaunch_")
    ]
    assert wait_gone(actors) == []
    assert set(our_placement_groups().values()) <= {"REMOVED"}
    # The GCS shows a removed group's CPUs free once the raylets report them (asynchronously).
    wait_until(lambda: ray.available_resources().get("CPU") == 4, 10, "the group's CPUs free")
    assert ray.cluster_resources().get("CPU") == 4


@pytest.mark.parametrize(
    ("overrides", "resource", "expected"),
    [
        ({"world_size": 5, "executor": "ray"}, None, "4 CPU in total on 2 node(s): 1 CPU missing"),
        ({"world_size": 10**9, "executor": "ray"}, None, "use world_size <= 4"),
        ({"world_size": 2, "executor": "ray"}, "HPU", "the cluster has no 'HPU' resource at all"),
    ],
    ids=["too-few-cpus", "far-too-many", "no-such-resource"],
)
def test_a_world_size_the_cluster_cannot_hold_is_refused_at_once(
    connected: Any, overrides: dict[str, Any], resource: str | None, expected: str
) -> None:
    """Fewer of the resource in the whole cluster than ranks: refused before any placement
    group (or a bundle per rank) is made, without waiting out ray_pg_timeout."""
    plan = cluster_plan(**overrides)
    if resource:
        plan = dataclasses.replace(plan, ray_resource=resource)
    groups = set(our_placement_groups())
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError) as info:
        RayExecutor(plan).start()
    assert time.monotonic() - started < 3.0
    message = str(info.value)
    world = overrides["world_size"]
    assert message.startswith(f"Ray cannot place world_size {world} (from ") and expected in message
    assert "Fix:" in message
    assert set(our_placement_groups()) == groups  # none made


@pytest.mark.parametrize(
    ("overrides", "resource", "expected"),
    [
        ({"world_size": 3, "nnodes": 3}, None, "needs 3 distinct nodes with CPU"),
    ],
    ids=["too-few-nodes"],
)
def test_unsatisfiable_placement_group_fails_clearly_within_its_timeout(
    connected: Any,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any],
    resource: str | None,
    expected: str,
) -> None:
    monkeypatch.setenv("HWLAUNCH_RAY_PG_TIMEOUT", "3")
    plan = cluster_plan(**overrides)
    if resource:
        plan = dataclasses.replace(plan, ray_resource=resource)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError) as info:
        RayExecutor(plan).start()
    elapsed = time.monotonic() - started
    print(f"placement group error after {elapsed:.2f}s")
    assert 3.0 <= elapsed < 8.0
    message = str(info.value)
    assert expected in message
    assert "within 3s (ray_pg_timeout from env HWLAUNCH_RAY_PG_TIMEOUT)" in message
    assert "Fix:" in message
    assert set(our_placement_groups().values()) <= {"REMOVED"}


@pytest.fixture(scope="class")
def two_nodes(cluster: Any) -> Iterator[RayExecutor]:
    """One rank on each of the two nodes; shared by the tests that leave it usable."""
    if not ray.is_initialized():
        ray.init(address=cluster.address)
    plan = dataclasses.replace(
        resolve(backend="cpu", world_size=2, nnodes=2), env={"HWLAUNCH_TEST_PLAN_ENV": "plan"}
    )
    executor = RayExecutor(plan, worker_extension=Extension).start()
    yield executor
    executor.shutdown()


class TestTwoNodes:
    """One rank on each node; the tests share one executor, which they leave usable."""

    def test_non_block_and_unique_reply_rank(self, two_nodes: RayExecutor, connected: Any) -> None:
        check_call_options(two_nodes)

    def test_ranks_on_two_nodes_all_reduce_across_them(
        self, two_nodes: RayExecutor, connected: Any
    ) -> None:
        ex = two_nodes
        assert ex.plan.nnodes == 2 and ex.warnings == []
        nodes = ex.nodes
        assert len({n.node_id for n in nodes}) == 2
        assert [n.local_rank for n in nodes] == [0, 0]
        assert ex.collective_rpc("all_reduce_rank") == [1, 1]
        where = ex.collective_rpc("where")
        assert [w["node_id"] for w in where] == [n.node_id for n in nodes]
        assert [(w["rank"], w["local_rank"]) for w in where] == [(0, 0), (1, 0)]

    def test_actors_get_the_plan_env_and_the_rendezvous_variables(
        self, two_nodes: RayExecutor, connected: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        names = (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
        envs = two_nodes.collective_rpc(
            lambda worker, keys: {k: os.environ.get(k) for k in keys},
            args=((*names, "HWLAUNCH_TEST_PLAN_ENV"),),
        )
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "0"]
        assert {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
        assert {e["MASTER_ADDR"] for e in envs} == {two_nodes.nodes[0].node_ip}
        assert len({e["MASTER_PORT"] for e in envs}) == 1
        assert {e["HWLAUNCH_TEST_PLAN_ENV"] for e in envs} == {"plan"}

    def test_exception_gives_worker_error_with_traceback_and_the_executor_stays_usable(
        self, two_nodes: RayExecutor, connected: Any
    ) -> None:
        with pytest.raises(WorkerError) as info:
            two_nodes.collective_rpc("fail", args=("boom",))
        assert info.value.rank == 0
        assert info.value.exc_type == "ValueError"
        assert "ranks [1] failed too" in str(info.value)
        # The frame of fail, with its source line where the actor can read the file.
        assert re.search(r"in fail\n(    .*\n)?ValueError: boom", info.value.remote_traceback)
        two_nodes.check_health()
        big = bytes(range(256)) * 2048  # 512 KiB: put in the object store once
        assert (
            two_nodes.collective_rpc(lambda worker, data: len(data), args=(big,)) == [len(big)] * 2
        )


@pytest.mark.timeout(300)
def test_hwlaunch_run_shards_the_model_across_the_two_nodes(connected: Any, tmp_path: Path) -> None:
    """The main job on the cluster: one rank per node, each holding its shard of the model, the
    layers' collectives between the nodes inside ``generate``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    job = ["run", "--json", "-n", "2", "--nnodes", "2", "--ray-address", connected.address]
    proc = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", *job, "--max-new-tokens", "3", "--prompt", "hi"],
        cwd=tmp_path,
        env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["plan"]["executor"] == "ray"
    assert len({n["node_id"] for n in result["nodes"]}) == 2
    assert result["parallelism"] == "tensor"
    whole = result["params_single_process"]
    assert all(r["params"] <= 0.75 * whole for r in result["ranks"])
    assert result["ranks_agree"] is True and result["matches_single_process"] is True


def test_actor_killed_between_rpcs_is_noticed_by_the_monitor(connected: Any) -> None:
    """No RPC runs: the monitor alone notices the death, within 2 s, naming rank and node."""
    ex = RayExecutor(cluster_plan(world_size=2, nnodes=2)).start()
    try:
        assert ex.collective_rpc("ping") == ex.pids
        victim = ex.nodes[1]
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        while ex._group.state.died is None and time.monotonic() - killed_at < 10:
            time.sleep(0.01)
        detected = time.monotonic() - killed_at
        print(f"figure: actor killed between RPCs noticed after {detected * 1000:.0f} ms")
        assert detected < 2.0
        with pytest.raises(WorkerDiedError) as info:
            ex.check_health()
        assert info.value.rank == 1 and info.value.pid == victim.pid
        assert victim.node_ip in str(info.value) and victim.node_id[:12] in str(info.value)
        with pytest.raises(WorkerDiedError):
            ex.collective_rpc("ping")
        assert_released(ex)
    finally:
        ex.shutdown()


def test_actor_killed_between_rpcs_restarts_the_group(connected: Any) -> None:
    """max_restarts=1: the monitor notices within 2 s; a new placement group and new actors
    replay the setup call; later RPCs reach them."""
    import hwlaunch

    def load(worker: Any) -> None:
        worker.model = 40 + worker.rank

    executor = hwlaunch.launch(cluster_plan(world_size=2, nnodes=2, max_restarts=1))
    try:
        executor.collective_rpc(load, setup=True)
        victim = executor.nodes[1]
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        while not executor.plan.warnings and time.monotonic() - killed_at < 10:
            time.sleep(0.01)
        detected = time.monotonic() - killed_at
        pids = executor.pids  # waits for the restart in progress
        replaced = time.monotonic() - killed_at
        print(
            f"figure: ray actor killed: noticed {detected:.2f} s, new group after {replaced:.2f} s"
        )
        assert detected < 2.0
        note = executor.plan.warnings[0]
        assert note.startswith("restart 1 of 1: worker rank 1") and victim.node_id[:12] in note
        assert executor.restarts == 1 and victim.pid not in pids
        got = executor.collective_rpc(
            lambda worker: (worker.model, os.environ["RESTART_COUNT"], worker.all_reduce_rank())
        )
        assert got == [(40, "1", 1), (41, "1", 1)]
        assert wait_gone([victim.pid]) == []
    finally:
        executor.shutdown()
    assert set(our_placement_groups().values()) <= {"REMOVED"}


# -- node loss -------------------------------------------------------------------------------
def node_hosting(cluster: Any, node_id: str) -> Any:
    """The cluster's worker node (not the head, which the driver is attached to) by node id."""
    for node in cluster.worker_nodes:
        if node.node_id == node_id:
            return node
    raise AssertionError(f"node {node_id} is not a worker node of the test cluster")


def lose_node(cluster: Any, executor: Any) -> tuple[Any, Any]:
    """Remove the worker node that hosts one of the executor's ranks (its raylet, object store
    and every worker process on it, as when a machine goes away); return (rank's place, node)."""
    head = cluster.head_node.node_id
    victim = next(place for place in executor.nodes if place.node_id != head)
    node = node_hosting(cluster, victim.node_id)
    cluster.remove_node(node, allow_graceful=False)
    return victim, node


def restore_two_nodes(cluster: Any) -> None:
    """Bring the module's cluster back to two live nodes for the tests that follow."""
    if len(cluster.worker_nodes) < 1:
        cluster.add_node(**NODE_ARGS)
    cluster.wait_for_nodes()
    deadline = time.monotonic() + 60
    while sum(1 for n in ray.nodes() if n["Alive"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
def test_a_lost_node_fails_the_group_with_worker_died_error(connected: Any) -> None:
    """A node that goes away with a rank on it: the executor notices (monitor or the next
    call), names the rank and its node, and releases what it holds on the surviving node."""
    ex = RayExecutor(cluster_plan(world_size=2, nnodes=2)).start()
    try:
        assert len({place.node_id for place in ex.nodes}) == 2
        victim, _ = lose_node(connected, ex)
        lost_at = time.monotonic()
        while ex._group.state.died is None and time.monotonic() - lost_at < 60:
            time.sleep(0.05)
        noticed = time.monotonic() - lost_at
        print(f"figure: ray node lost: noticed after {noticed:.2f} s")
        with pytest.raises(WorkerDiedError) as info:
            ex.collective_rpc("ping", timeout=60)
        assert info.value.rank == victim.rank
        assert victim.node_id[:12] in str(info.value)
        survivors = [place.pid for place in ex.nodes if place.rank != victim.rank]
        ex.shutdown()
        assert wait_gone(survivors) == []
        assert set(our_placement_groups().values()) <= {"REMOVED"}
    finally:
        ex.shutdown()
        restore_two_nodes(connected)


@pytest.mark.slow
def test_a_lost_node_replaced_by_a_new_one_restarts_the_group(connected: Any) -> None:
    """max_restarts=1 and a node lost, then a new node joining (as an autoscaler or an
    operator would add one): the group restarts on the surviving and the new node, replays
    its setup call, and its all-reduce spans both."""
    import hwlaunch

    def load(worker: Any) -> None:
        worker.model = 40 + worker.rank

    executor = hwlaunch.launch(cluster_plan(world_size=2, nnodes=2, max_restarts=1))
    try:
        executor.collective_rpc(load, setup=True)
        victim, _ = lose_node(connected, executor)
        connected.add_node(**NODE_ARGS)  # the replacement
        deadline = time.monotonic() + 120
        while executor.restarts == 0 and time.monotonic() < deadline:
            with contextlib.suppress(WorkerDiedError):
                executor.collective_rpc("ping", timeout=60)  # a call that meets the old group
            time.sleep(0.1)
        assert executor.restarts == 1, executor.plan.warnings
        assert executor.plan.warnings[0].startswith(f"restart 1 of 1: worker rank {victim.rank}")
        nodes = {place.node_id for place in executor.nodes}
        assert len(nodes) == 2 and victim.node_id not in nodes
        got = executor.collective_rpc(lambda worker: (worker.model, worker.all_reduce_rank()))
        assert got == [(40, 1), (41, 1)]
    finally:
        executor.shutdown()
        restore_two_nodes(connected)
    assert set(our_placement_groups().values()) <= {"REMOVED"}


# -- a driver that dies ----------------------------------------------------------------------
DYING_DRIVER = """
import json, os, sys, time
from pathlib import Path
import hwlaunch

class SlowShutdown:
    where = ""  # set below: the class travels to the actors by value, with it
    seconds = 1.0

    def shutdown(self):
        time.sleep(self.seconds)
        super().shutdown()
        # Written beside the folder, then renamed into it: the marker appears whole.
        part = Path(self.where).parent / f"shutdown-{self.rank}.part"
        part.write_text(str(os.getpid()))
        os.replace(part, Path(self.where, f"shutdown-{self.rank}"))

if __name__ == "__main__":
    SlowShutdown.where, SlowShutdown.seconds = sys.argv[2], float(sys.argv[3])
    workers = hwlaunch.launch(
        backend="cpu", world_size=2, executor="ray", ray_address=sys.argv[1] or None,
        worker_extension=SlowShutdown, shutdown_timeout=20,
    )
    print(json.dumps(workers.pids), flush=True)
    time.sleep(600)
"""


def start_dying_driver(
    tmp_path: Path, address: str, seconds: float
) -> tuple[subprocess.Popen[str], list[int], Path]:
    """A driver of two actors whose shutdown() takes ``seconds`` and leaves a marker."""
    script, markers = tmp_path / "driver.py", tmp_path / "markers"
    script.write_text(DYING_DRIVER)
    markers.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "RAY_ADDRESS"))}
    proc = subprocess.Popen(
        [sys.executable, str(script), address, str(markers), str(seconds)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline()), markers


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_drivers_actors_run_their_shutdown_then_go(
    connected: Any, tmp_path: Path, how: signal.Signals
) -> None:
    """Ray would end a dead driver's actors at once; hwlaunch's are detached from it, watch
    its lifeline, run shutdown(), and leave no actor and no placement group behind."""
    before = set(our_placement_groups())
    proc, pids, markers = start_dying_driver(tmp_path, connected.address, 1.0)
    try:
        new = set(our_placement_groups()) - before
        assert len(new) == 1 and len(pids) == 2
        proc.send_signal(how)
        # SIGTERM: ray.init() installed a handler in the driver, sys.exit(15), so the driver's
        # own exit hooks shut the executor down; SIGKILL leaves it to the lifeline.
        assert proc.wait(30) == (15 if how == signal.SIGTERM else -how)
        wait_until(lambda: len(list(markers.iterdir())) >= 2, 30, "both ranks' shutdown()")
        assert sorted(p.name for p in markers.iterdir()) == ["shutdown-0", "shutdown-1"]
        assert sorted(int(p.read_text()) for p in markers.iterdir()) == sorted(pids)
        assert wait_gone(pids, 30) == []
        (name,) = new
        wait_until(lambda: our_placement_groups()[name] == "REMOVED", 30, "the group removed")
    finally:
        proc.kill()
        proc.wait()


# Ray's own agents of a node: when their raylet dies by a signal (as the raylet of a driver's
# own instance does, by the SIGKILL Ray has it get on its parent's death), each first reports
# the death to the GCS, with a timeout of 60 s that Ray fixes, before it ends itself.
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def command_line(proc: psutil.Process) -> str:
    """``proc``'s command line ("" once it is gone)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def test_a_killed_driver_of_its_own_local_ray_still_gets_each_shutdown_then_all_goes(
    tmp_path: Path,
) -> None:
    """The local instance hwlaunch starts ends a moment after its driver; its actors wait
    out a 3 s shutdown() all the same, then nothing of the instance is left but Ray's two
    agents, which end on Ray's own 60 s timeout (they are ended here, not waited for)."""
    proc, pids, markers = start_dying_driver(tmp_path, "", 3.0)
    agents: list[psutil.Process] = []
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert {p.pid for p in tree} >= set(pids)  # the instance is the driver's own
        agents = [p for p in tree if command_line(p).startswith(RAY_AGENTS)]
        assert len(agents) == len(RAY_AGENTS), [command_line(p) for p in tree]
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
        wait_until(lambda: len(list(markers.iterdir())) >= 2, 30, "both ranks' shutdown()")
        assert sorted(p.name for p in markers.iterdir()) == ["shutdown-0", "shutdown-1"]
        assert wait_gone([p.pid for p in tree if p not in agents], 30) == []
    finally:
        proc.kill()
        proc.wait()
        for agent in agents:
            with contextlib.suppress(psutil.NoSuchProcess):
                agent.kill()
