"""Test plugin distributions, pip-installed for real into a ``--target`` directory: the one
install helper of the tests that need plugins a user would install (tests/plugins/, and the bad
input cases of tests/e2e/). A site is put on ``PYTHONPATH`` of the programs a test runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parent / "plugins"
PLUGIN_DISTS = PLUGINS / "plugin_dists"  # discovery: good, broken and clashing backends
CONTRACT_DISTS = PLUGINS / "contract_dists"  # contract versions, site policies
EXECUTOR_DISTS = PLUGINS / "executor_plugin_dists"  # executors from plugins
# setuptools writes build/ and *.egg-info next to the sources: install from copies.
BUILD_OUTPUTS = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")


def distributions(folder: Path) -> list[Path]:
    """Every distribution (a directory with a pyproject.toml) in ``folder``, in name order."""
    return [d for d in sorted(folder.iterdir()) if (d / "pyproject.toml").is_file()]


def install(sources: Iterable[Path], site: Path) -> Path:
    """Copy ``sources`` beside ``site`` and pip-install the copies into ``site`` (no index, no
    build isolation, no dependencies: everything they need is installed already)."""
    copies = site.parent / f"{site.name}-src"
    paths = [str(shutil.copytree(s, copies / s.name, ignore=BUILD_OUTPUTS)) for s in sources]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "--no-index", "--target", str(site)),
            *paths,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode != 0:
        pytest.fail(f"pip install of {', '.join(paths)} failed:\n{done.stdout}\n{done.stderr}")
    return site


def install_from_index(names: Iterable[str], prefix: Path) -> Path:
    """pip-install the distributions ``names`` (no dependencies) from the package index into
    ``prefix``, and return it: shared libraries shipped as data files land in ``<prefix>/lib``,
    packages in ``<prefix>/lib/pythonX.Y/site-packages``. ``--prefix``, not ``--target``:
    wheels such as intel-openmp and mkl ship their shared libraries as data files, which
    ``--target`` leaves out."""
    names = list(names)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--prefix", str(prefix), *names),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(f"pip install of {', '.join(names)} failed:\n{done.stdout}\n{done.stderr}")
    return prefix


def site_environ(
    site: Path | None, drop: tuple[str, ...] = ("HWLAUNCH_",), **env: str
) -> dict[str, str]:
    """This process's environment with ``site`` (if any) first on PYTHONPATH, without the
    variables starting with ``drop`` (so only ``env``'s HWLAUNCH_* settings apply), plus ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    if site is not None:
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH")) if p
        )
    environ.update(env)
    return environ


def hwlaunch_cli(
    site: Path | None, *args: str, cwd: Path | None = None, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m hwlaunch.cli ARGS`` with the plugins of ``site`` (None: none) and only the
    given HWLAUNCH_* variables, in ``cwd`` (an empty directory: no hwlaunch.toml to pick up;
    None: this process's working directory)."""
    return subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", *args],
        env=site_environ(site, **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
