"""vLLM's OpenAI-compatible server on hwlaunch's executor, started as docs/vllm.md shows.

``hwlaunch serve-vllm MODEL --tensor-parallel-size 2`` answers an ``openai`` client's completion
with the tokens of the offline engine on hwlaunch's executor (same prompt, greedy, same
max_tokens), and SIGINT or SIGTERM ends it with no process of its tree left (the API server,
vLLM's engine core, the fork server and hwlaunch's workers) and none of the shared memory
they had mapped. One server per signal (a server's start is the cost here, some 40-90 s on 2
shared cores); the offline engine is the session's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from vllm_engines import ENGINE, MAX_TOKENS, token_ids

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = "hello world the model is"
# The offline engine's settings (vllm_engines.ENGINE) as the server's flags.
ENGINE_ARGS = [
    arg
    for key, value in ENGINE.items()
    for arg in (
        [f"--{key.replace('_', '-')}"]
        if value is True
        else [f"--{key.replace('_', '-')}", str(value)]
    )
]
READY_WITHIN_S = 300
GONE_WITHIN_S = 30
HWLAUNCH = str(Path(sys.executable).with_name("hwlaunch"))  # the console script, as users run it


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def offline_tokens(engine_tp2: Any) -> list[int]:
    """The offline engine on hwlaunch's executor at TP=2 (the session's), same prompt."""
    tokens = token_ids(engine_tp2, [PROMPT])[0]
    assert len(tokens) == MAX_TOKENS
    return tokens


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int
    log: Path
    model: str
    shared: set[str] = dataclasses.field(default_factory=set)  # /dev/shm files the tree mapped
    signalled: bool = False

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_ready(server: Server) -> None:
    import httpx

    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"server exited {server.proc.returncode}:\n{server.output()[-4000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{server.port}/v1/models", timeout=2).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    pytest.fail(f"server not ready in {READY_WITHIN_S} s:\n{server.output()[-4000:]}")


# The signal, and for one server vLLM's own --shutdown-timeout 0: its API server then kills the
# engine core and its workers at once, and serve-vllm removes what they could not.
@pytest.fixture(scope="module", params=["SIGINT", "SIGTERM", "SIGTERM/shutdown-timeout=0"])
def server(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    at_once = ["--shutdown-timeout", "0"] if request.param.endswith("=0") else []
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *(HWLAUNCH, "serve-vllm", str(tiny_model), "--tensor-parallel-size", "2"),
                *("--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS, *at_once),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=engine_env(),
        )
    running = Server(proc, port, log, str(tiny_model))
    try:
        wait_ready(running)
        yield running
    finally:  # whatever a failed test left: the server first, then its tree
        left = _tree(proc.pid)
        proc.kill()
        proc.wait(timeout=30)
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def test_the_help_of_hwlaunch_does_not_import_vllm() -> None:
    probe = (
        "import sys\n"
        "from hwlaunch.cli import main\n"
        "assert main(['--help']) == 0\n"
        "print('VLLM IMPORTED' if 'vllm' in sys.modules else 'NO VLLM')\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "serve-vllm" in proc.stdout and proc.stdout.strip().endswith("NO VLLM")


@pytest.mark.parametrize(
    "flag", ["--distributed-executor-backend=mp", "--distributed-executor-backend ray"]
)
def test_another_executor_is_a_user_error(flag: str, tiny_model: Path) -> None:
    proc = subprocess.run(
        [HWLAUNCH, "serve-vllm", str(tiny_model), *flag.split()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "--distributed-executor-backend" in proc.stderr and "Fix: leave the flag out" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def _shared_memory(processes: list[psutil.Process]) -> set[str]:
    """The /dev/shm files the processes have mapped."""
    return {
        m.path
        for process in processes
        for m in process.memory_maps(grouped=True)
        if m.path.startswith("/dev/shm/")
    }


def test_a_completion_has_the_offline_tokens(server: Server, offline_tokens: list[int]) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused")
    reply = client.completions.create(
        model=server.model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = reply.choices[0]
    assert choice.model_extra is not None
    assert choice.model_extra["token_ids"] == offline_tokens
    assert "hwlaunch plan for vLLM's workers" in server.output()  # hwlaunch's executor ran


def test_the_signal_ends_the_server_and_its_tree(
    server: Server, request: pytest.FixtureRequest
) -> None:
    name = request.node.callspec.params["server"].partition("/")[0]
    tree = _tree(server.proc.pid)
    names = [" ".join(p.cmdline()).strip() for p in tree]  # the titles hwlaunch and vLLM set
    workers = [n for n in names if n.startswith("hwlaunch cpu rank")]
    assert sorted(workers) == ["hwlaunch cpu rank0", "hwlaunch cpu rank1"], names
    assert "VLLM::EngineCore" in names, names
    server.shared = _shared_memory(tree)
    assert any("cpushm" in path for path in server.shared), server.shared  # vLLM's all-reduce
    server.proc.send_signal(getattr(signal, name))
    code = server.proc.wait(timeout=GONE_WITHIN_S)
    _, alive = psutil.wait_procs(tree, timeout=GONE_WITHIN_S)
    assert not alive, f"left after {name}: {[(p.pid, p.name()) for p in alive]}"
    assert code in (0, -getattr(signal, name), 128 + getattr(signal, name)), server.output()[-3000:]
    # vLLM's API server may log its output handler's EngineDeadError as the engine core exits
    # in a graceful shutdown (a race of vLLM's own): no other traceback.
    own = [line for line in server.output().splitlines() if "[async_llm.py:" not in line]
    assert not [line for line in own if "Traceback" in line], server.output()[-3000:]
    server.signalled = True


def test_no_shared_memory_of_the_tree_is_left(server: Server) -> None:
    """serve-vllm's --shutdown-timeout default (a grace, not vLLM's 0) lets the engine core stop
    its workers, which unlink vLLM's CPU all-reduce segments; at vLLM's 0 the tree is killed
    at once and serve-vllm removes the segments no process maps any more."""
    assert server.signalled, "the signal test ran first"
    left = sorted(path for path in server.shared if os.path.exists(path))
    assert not left, left
