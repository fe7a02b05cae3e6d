"""The wheel holds the built-in plugins and declares them as entry points, exactly as a third
party's plugins are declared, and a plain (non-editable) install of it finds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BUILTINS = ("cpu", "cuda", "hpu", "xpu")
# Build outputs and caches of the working tree that must not be copied into the build.
IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "venv", ".venv"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the repository (the working tree stays untouched)."""
    source = tmp_path_factory.mktemp("src") / "hwlaunch"
    shutil.copytree(ROOT, source, ignore=IGNORE)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(out), str(source)],
        check=True,
        timeout=300,
    )  # fmt: skip
    (built,) = out.glob("hwlaunch-*.whl")
    return built


def test_wheel_holds_the_plugins_and_their_entry_points(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    for name in BUILTINS:
        assert f"hwlaunch/plugins/{name}/__init__.py" in names
    assert "hwlaunch/__init__.py" in names
    assert "hwlaunch/py.typed" in names
    assert not [n for n in names if n.startswith(("core/", "plugins/", "tests/"))]
    section = text.split("[hwlaunch.backends]", 1)[1].split("\n[", 1)[0]
    declared = {
        line.split("=", 1)[0].strip(): line.split("=", 1)[1].strip()
        for line in section.splitlines()
        if "=" in line
    }
    assert declared == {name: f"hwlaunch.plugins.{name}" for name in BUILTINS}
    assert "hwlaunch = hwlaunch.cli:main" in text


def test_installed_wheel_finds_its_plugins(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )  # fmt: skip
    code = (
        "import json, hwlaunch, sys; from hwlaunch.cli._inspect import backend_rows; "
        "from hwlaunch.planning.registry import load_registry; "
        "rows = backend_rows(load_registry()); "
        "files = [hwlaunch.__file__] + [sys.modules['hwlaunch.plugins.' + n].__file__ "
        "for n in ('cpu', 'cuda', 'hpu', 'xpu')]; "
        "print(json.dumps({'files': files, "
        "'backends': sorted(r['name'] for r in rows if r['distribution'] == 'hwlaunch')}))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("HWLAUNCH_PLUGINS", None)
    env.pop("HWLAUNCH_DISABLE_PLUGINS", None)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    for file in found["files"]:
        assert Path(file).is_relative_to(target), file
    assert found["backends"] == sorted(BUILTINS)
