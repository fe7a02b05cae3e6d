"""Security: the RPC channel is private, the rendezvous is loopback-only, config files are data.

- The RPC channel between the parent and its mp workers is a set of multiprocessing pipes: no
  socket listens for it, so nothing outside the parent and its workers can connect. Checked on
  the live processes: no inet socket at all, and no listening AF_UNIX socket.
- With the process group, torch.distributed's rendezvous store (MASTER_PORT) and gloo listen on
  TCP. They must listen on loopback only (no authentication protects them), and a connection to
  the store through this machine's other addresses must be refused.
- A config file is data: a value that looks like an import path or a shell command is never
  imported or executed, by resolve() nor by the workers that get it in their environment.

Plugin allow- and blocklists are tested with installed distributions in tests/plugins/test_discovery.py;
the Ray cluster's bind address in tests/integration/test_executor_ray.py.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import hwlaunch
from hwlaunch import BackendUnavailableError, ConfigError
from hwlaunch.executor.mp import MultiprocExecutor
from hwlaunch.executor.mp._forkserver import running_servers

pytestmark = pytest.mark.usefixtures("clean_env")

_SO_ACCEPTCON = 0x10000  # /proc/net/unix flag of a listening socket
EVIL = "hwlaunch_evil_probe"  # a module whose import would leave the sentinel file


def launch(method: str, init_distributed: bool) -> MultiprocExecutor:
    plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", start_method=method)
    executor = hwlaunch.launch(plan, init_distributed=init_distributed)
    assert isinstance(executor, MultiprocExecutor)
    return executor


def listening_unix_inodes() -> set[int]:
    with open("/proc/net/unix") as table:
        next(table)
        return {
            int(fields[6])
            for fields in (line.split() for line in table)
            if int(fields[3], 16) & _SO_ACCEPTCON
        }


def inet_inodes() -> set[int]:
    """Every TCP and UDP socket of this machine's network namespace, IPv4 and IPv6."""
    inodes = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/net/{table}") as rows:
            next(rows)
            inodes.update(int(row.split()[9]) for row in rows)
    return inodes


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(int(link[len("socket:[") : -1]))
    return inodes


def inet_listeners(pid: int) -> list[tuple[str, int]]:
    return [
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def outside_addresses() -> Iterator[str]:
    """This machine's addresses that are neither loopback nor link-local."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(address.address.split("%")[0])
            if not (ip.is_loopback or ip.is_link_local):
                yield str(ip)


# -- the RPC channel ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_rpc_channel_listens_on_no_socket(method: str) -> None:
    """No inet socket and no listening AF_UNIX socket in the workers or this process, but for
    what this process held before the launch (a finished Ray session's client, which a forked
    worker inherits too: not the channel's)."""
    before = socket_inodes(os.getpid())
    executor = launch(method, init_distributed=False)
    with executor:
        assert executor.collective_rpc("ping", timeout=120) == executor.pids
        listening, inet = listening_unix_inodes(), inet_inodes()
        for pid in (os.getpid(), *executor.pids):
            assert pid is not None
            new = socket_inodes(pid) - before
            assert not new & inet, f"pid {pid} has an inet socket"
            assert not new & listening, f"pid {pid} has a listening unix socket"


def test_fork_server_socket_is_private() -> None:
    """The fork server (hwlaunch's, one per worker environment) listens on an AF_UNIX socket:
    it must sit in a directory only this user can enter."""
    executor = launch("forkserver", init_distributed=False)
    with executor:
        executor.collective_rpc("ping", timeout=120)
        parent = psutil.Process(executor.pids[0]).ppid()
        servers = [s for s in running_servers() if s._forkserver_pid == parent]  # type: ignore[attr-defined]
        assert servers, "the workers' fork server is not one of hwlaunch's"
        address = getattr(servers[0], "_forkserver_address", None)
        assert isinstance(address, str), "the fork server is not running"
        folder = os.stat(os.path.dirname(address))
        assert folder.st_uid == os.getuid()
        assert stat.S_IMODE(folder.st_mode) & 0o077 == 0, oct(folder.st_mode)


# -- the process group's sockets ---------------------------------------------------------------
def _master_port(worker: hwlaunch.Worker) -> int:
    return worker.master_port


def test_process_group_listens_on_loopback_only() -> None:
    """The rendezvous store (MASTER_PORT) and gloo's listeners are bound to loopback.

    Why it needs a test: with ``init_method="tcp://127.0.0.1:PORT"`` torch's TCPStore server
    binds the wildcard ``::`` (dual-stack: every IPv4 address too) whatever the host in the URL,
    and gloo binds the address the host name resolves to, often an external one. Rank 0 must
    bind the store's socket itself (``master_listen_fd``) and gloo must be kept on ``lo``.
    """
    executor = launch("fork", init_distributed=True)
    with executor:
        assert executor.collective_rpc("all_reduce_rank", timeout=120) == [1, 1]
        (port,) = set(executor.collective_rpc(_master_port, timeout=60))
        listeners = {
            pid: inet_listeners(pid) for pid in (os.getpid(), *executor.pids) if pid is not None
        }
        store = [ip for found in listeners.values() for ip, p in found if p == port]
        assert store, f"nothing listens on MASTER_PORT {port}: {listeners}"
        exposed = {
            pid: [(ip, p) for ip, p in found if not is_loopback(ip)]
            for pid, found in listeners.items()
        }
        assert not any(exposed.values()), f"listening beyond loopback: {exposed}"


def test_store_refuses_connections_through_other_addresses() -> None:
    """A client elsewhere on the network reaches this machine through its other addresses: a
    connection to the rendezvous port through them must be refused, and the job go on."""
    addresses = list(outside_addresses())
    if not addresses:
        pytest.skip("this machine has no address besides loopback")
    executor = launch("fork", init_distributed=True)
    with executor:
        (port,) = set(executor.collective_rpc(_master_port, timeout=60))
        accepted = []
        for ip in addresses:
            try:
                with socket.create_connection((ip, port), timeout=2):
                    accepted.append(ip)
            except OSError:
                pass
        assert executor.collective_rpc("all_reduce_rank", timeout=120) == [1, 1]
        assert not accepted, f"the store on port {port} accepted connections through {accepted}"


# -- config files are data ---------------------------------------------------------------------
@pytest.fixture
def sentinel(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module (first on sys.path) whose import, or any shell that ran one of the
    commands below, would create the returned file."""
    where = tmp_path_factory.mktemp("evil")
    mark = where / "EXECUTED"
    (where / f"{EVIL}.py").write_text(
        f"from pathlib import Path\nPath({str(mark)!r}).touch()\n"
        f"def run(*args): Path({str(mark)!r}).touch()\nclass Worker: pass\nExecutor = Worker\n"
    )
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.delitem(sys.modules, EVIL, raising=False)
    return mark


def assert_untouched(mark: Path) -> None:
    assert not mark.exists(), "something from the config file was executed"
    assert EVIL not in sys.modules, "a module named by the config file was imported"


@pytest.mark.parametrize(
    ("document", "error", "fragment"),
    [
        (f'backend = "{EVIL}:run"', BackendUnavailableError, "hwlaunch.toml:1"),
        (f'backend = "{EVIL}"', BackendUnavailableError, "hwlaunch.toml:1"),
        (f'executor = "{EVIL}:Executor"', ConfigError, "hwlaunch.toml:1"),
        (f'start_method = "{EVIL}"', ConfigError, "hwlaunch.toml:1"),
        (f"world_size = \"__import__('{EVIL}')\"", ConfigError, "hwlaunch.toml:1"),
        (f'worker = "{EVIL}:Worker"', ConfigError, "unknown key 'worker'"),
        (f'worker_extension = "{EVIL}:Worker"', ConfigError, "unknown key 'worker_extension'"),
        (f'plugins = ["{EVIL}"]', ConfigError, "unknown key 'plugins'"),
        (f'[backends.cpu]\nworker = "{EVIL}:Worker"', ConfigError, "unknown key 'worker'"),
        (f"ray_address = \"$(python -c 'import {EVIL}')\"", None, ""),
        (f'[backends."{EVIL}:run"]\nworld_size = 2', None, ""),
    ],
)
def test_config_values_are_never_imported(
    clean_env: Path,
    sentinel: Path,
    document: str,
    error: type[Exception] | None,
    fragment: str,
) -> None:
    (clean_env / "hwlaunch.toml").write_text(document + "\n")
    if error is None:
        hwlaunch.resolve(assume={"cuda.available": False, "main_guard": "guarded"})
    else:
        with pytest.raises(error) as info:
            hwlaunch.resolve(assume={"cuda.available": False, "main_guard": "guarded"})
        assert fragment in str(info.value)
    assert_untouched(sentinel)


def test_pyproject_build_backend_and_python_config_are_not_run(
    clean_env: Path, sentinel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["{EVIL}"]
            build-backend = "{EVIL}"

            [tool.hwlaunch]
            world_size = 1
            """
        )
    )
    assert hwlaunch.resolve().world_size == 1
    (clean_env / "evil_config.py").write_text(f"import {EVIL}\n")
    monkeypatch.setenv("HWLAUNCH_CONFIG", str(clean_env / "evil_config.py"))
    with pytest.raises(ConfigError, match=r"evil_config\.py:1:8: not valid TOML"):
        hwlaunch.resolve()
    assert_untouched(sentinel)


def _environment(worker: hwlaunch.Worker, names: list[str]) -> list[str | None]:
    return [os.environ.get(name) for name in names]


def test_env_table_values_reach_workers_as_literal_text(clean_env: Path, sentinel: Path) -> None:
    """Shell-looking values travel as text: no shell ever expands them, here or in a worker."""
    values = {
        "HWPROBE_SUBST": f"$(touch {sentinel})",
        "HWPROBE_TICKS": f"`touch {sentinel}`",
        "HWPROBE_CHAIN": f"x; touch {sentinel} && python -c 'import {EVIL}'",
    }
    table = ", ".join(f'{k} = """{v}"""' for k, v in values.items())
    (clean_env / "hwlaunch.toml").write_text(
        f'world_size = 2\nexecutor = "mp"\nstart_method = "fork"\nenv = {{ {table} }}\n'
    )
    plan = hwlaunch.resolve(backend="cpu")
    assert {k: v for k, v in plan.env.items() if k.startswith("HWPROBE_")} == values
    with hwlaunch.launch(plan, init_distributed=False) as executor:
        seen = executor.collective_rpc(_environment, args=(list(values),), timeout=120)
    assert seen == [list(values.values())] * 2
    assert not any(name in os.environ for name in values), "the parent's environment changed"
    assert_untouched(sentinel)
