"""The wheel holds the built-in plugins and declares them as entry points, exactly as a third
party's plugins are declared, and a plain (non-editable) install of it finds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = ("cpu", "cuda", "hpu", "xpu")
BUILTIN_PLUGINS = (*BUILTINS, "executors")  # the built-in executors are a plugin too
# Build outputs and caches of the working tree that must not be copied into the build, and
# the venvs (.ci/other-pythons may be installing into .venv-3.13 while this copies).
IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "*venv*"
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
    for name in BUILTIN_PLUGINS:
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
    assert declared == {name: f"hwlaunch.plugins.{name}" for name in BUILTIN_PLUGINS}
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


def test_sdist_carries_the_plugins_as_files(tmp_path: Path) -> None:
    """core/hwlaunch/plugins is a symlink in the repository; the sdist must hold real files, so
    that a wheel built from it (on any platform) has the plugins."""
    source = tmp_path / "hwlaunch"
    shutil.copytree(ROOT, source, ignore=IGNORE, symlinks=True)
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist"),
         str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (sdist,) = (tmp_path / "dist").glob("hwlaunch-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
    for name in BUILTIN_PLUGINS:
        member = members[f"core/hwlaunch/plugins/{name}/__init__.py"]
        assert member.isfile(), f"{member.name} is not a regular file in the sdist"
    assert not [m.name for m in members.values() if m.issym()]


def test_the_editable_install_is_a_plain_path_entry() -> None:
    """The import package is a real directory (core/hwlaunch), so an editable install adds one
    path (core/) and needs no import hook that tools (mypy, import-linter) cannot see."""
    import hwlaunch

    if not Path(hwlaunch.__file__).is_relative_to(ROOT):
        pytest.skip("hwlaunch is not installed from this checkout")
    pth = [
        p for p in map(Path, sys.path) if p.is_dir() for p in p.glob("__editable__*hwlaunch*.pth")
    ]
    assert pth, "no editable .pth file for hwlaunch on sys.path"
    lines = pth[0].read_text(encoding="utf-8").split()
    assert lines == [str(ROOT / "core")]


@pytest.mark.parametrize("how", ["script", "-c", "-m"])
def test_a_clone_named_hwlaunch_beside_the_program_does_not_shadow_the_package(
    tmp_path: Path, how: str
) -> None:
    """A directory named hwlaunch/ without __init__.py (a clone of the repository) next to the
    program is at most a namespace portion; the installed regular package wins over it."""
    clone = tmp_path / "hwlaunch"
    shutil.copytree(ROOT, clone, ignore=IGNORE, symlinks=True)
    code = (
        "import hwlaunch; print(hwlaunch.__file__); print(hwlaunch.resolve(backend='cpu').backend)"
    )
    (tmp_path / "prog.py").write_text(code + "\n", encoding="utf-8")
    argv = {"script": ["prog.py"], "-c": ["-c", code], "-m": ["-m", "prog"]}[how]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    file, backend = result.stdout.split()
    assert not Path(file).is_relative_to(clone)
    assert backend == "cpu"
