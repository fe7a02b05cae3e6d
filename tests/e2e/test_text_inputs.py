"""Settings written as text, and what ``launch()`` is given: a bad one is named, never read as
something else or lost in silence.

The CLI runs as a user runs it, in a subprocess in an empty directory, with only the
``HWLAUNCH_*`` variables a test gives; ``launch()`` runs real workers.

- numbers from text are ASCII digits: ``2_0`` is not 20, a full-width two is not 2;
- an environment value with a NUL character is refused when the plan is made, naming its key;
- a config file that is not valid TOML is named with its line and column, and a pyproject.toml
  that is not ours to judge (no ``[tool.hwlaunch]`` in it) is skipped with a warning that says so;
- ``launch("plan.json")`` names the argument and what it takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import plugin_sites
import pytest

import hwlaunch
from hwlaunch.errors import ConfigError

pytestmark = pytest.mark.usefixtures("clean_env")


def hwlaunch_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return plugin_sites.hwlaunch_cli(None, *args, cwd=cwd, timeout=120, **env)


def user_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one message of a user error (exit 2, no traceback)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("hwlaunch: error: "), done.stderr
    return done.stderr


def plan_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


# -- numbers from text ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HWLAUNCH_WORLD_SIZE", "2_0"),
        ("HWLAUNCH_WORLD_SIZE", "\uff12"),  # FULLWIDTH DIGIT TWO
        ("HWLAUNCH_WORLD_SIZE", "\u0663"),  # ARABIC-INDIC DIGIT THREE
        ("HWLAUNCH_MAX_RESTARTS", "1_0"),
        ("HWLAUNCH_STARTUP_TIMEOUT", "6_0"),
        ("HWLAUNCH_RPC_WARN_AFTER", "\uff16\uff10"),
        ("HWLAUNCH_CPU_THREADS", "\uff14"),
    ],
)
def test_numbers_from_variables_are_ascii_digits(tmp_path: Path, variable: str, value: str) -> None:
    message = user_error(
        hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path, **{variable: value})
    )
    assert f"{value!r} from env {variable}" in message
    assert "ASCII digits 0-9" in message


def test_numbers_from_flags_and_config_files_are_ascii_digits(tmp_path: Path) -> None:
    message = user_error(hwlaunch_cli("resolve", "--world-size", "1_6", cwd=tmp_path))
    assert "'1_6' from --world-size" in message and "ASCII digits 0-9" in message
    (tmp_path / "hwlaunch.toml").write_text('world_size = 4\nshutdown_timeout = "1_0"\n')
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path))
    assert "'1_0' from hwlaunch.toml:2" in message


def test_launcher_variables_are_ascii_digits_too(tmp_path: Path) -> None:
    """What torchrun sets is read with the same rule (a rank of ``1_0`` is no rank 10)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1_0", "LOCAL_WORLD_SIZE": "1"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="x")
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path, **env))
    assert "'1_0' of WORLD_SIZE" in message and "ASCII digits 0-9" in message


def test_plain_numbers_still_read(tmp_path: Path) -> None:
    env = {"HWLAUNCH_WORLD_SIZE": " 3 ", "HWLAUNCH_RPC_WARN_AFTER": "2.5e1"}
    plan = plan_of(hwlaunch_cli("resolve", "--backend", "cpu", "--json", cwd=tmp_path, **env))
    assert plan["world_size"] == 3 and plan["rpc_warn_after"] == 25.0


# -- environment values --------------------------------------------------------------------------
def test_nul_in_a_config_env_value_is_refused_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "hwlaunch.toml").write_text(
        'world_size = 2\n[env]\nGOOD = "1"\nBROKEN = "a\\u0000b"\n'
    )
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path))
    assert "BROKEN" in message and "hwlaunch.toml:2" in message
    assert "NUL character" in message


def test_nul_in_a_backend_env_table_is_refused_before_any_worker(clean_env: Path) -> None:
    (clean_env / "hwlaunch.toml").write_text('[backends.cpu.env]\nX = "\\u0000"\n')
    with pytest.raises(ConfigError, match=r"X = '\\x00' holds a NUL character"):
        hwlaunch.launch(backend="cpu", world_size=2, start_method="fork")


# -- config files that are not valid TOML --------------------------------------------------------
BROKEN_PYPROJECT = """\
[project]
name = "demo"

[tool.hwlaunch]
world_size = 4
version = 1.0.0
"""


def test_our_pyproject_table_in_invalid_toml_is_an_error_with_line_and_column(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path))
    assert "pyproject.toml:6:14: not valid TOML" in message
    assert "[tool.hwlaunch]" in message


def test_invalid_hwlaunch_toml_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "hwlaunch.toml").write_text("world_size = 2\nexecutor = mp\n")
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path))
    assert "hwlaunch.toml:2:12: not valid TOML" in message


def test_undecodable_config_file_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "hwlaunch.toml").write_bytes(b"world_size = 2\n# caf\xe9\n")
    message = user_error(hwlaunch_cli("resolve", "--backend", "cpu", cwd=tmp_path))
    assert "hwlaunch.toml:2:" in message and "UTF-8" in message


def test_someone_elses_invalid_pyproject_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """No ``[tool.hwlaunch]`` table anywhere in it: the settings lost are none of ours, so every
    command still runs, and the plan says which file was skipped and where it breaks."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = 1.0.0\n')
    plan = plan_of(hwlaunch_cli("resolve", "--backend", "cpu", "--json", cwd=tmp_path))
    found = [w for w in plan["warnings"] if "pyproject.toml" in w]
    assert len(found) == 1, plan["warnings"]
    assert "pyproject.toml:3:" in found[0] and "no [tool.hwlaunch] table" in found[0]


# -- what launch() is given ----------------------------------------------------------------------
@pytest.mark.parametrize("given", ["plan.json", Path("plan.json"), {"world_size": 2}])
def test_launch_names_its_argument_when_it_is_no_plan(given: object) -> None:
    with pytest.raises(TypeError) as caught:
        hwlaunch.launch(given)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "launch()" in message and type(given).__name__ in message
    assert "hwlaunch.resolve()" in message and "keywords" in message


def test_launch_with_a_string_in_a_script_says_so(tmp_path: Path) -> None:
    script = tmp_path / "launch_text.py"
    script.write_text(
        textwrap.dedent(
            """\
            import hwlaunch

            if __name__ == "__main__":
                hwlaunch.launch("plan.json")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 1
    assert "TypeError: launch() takes a Plan" in done.stderr, done.stderr
    assert "AttributeError" not in done.stderr
