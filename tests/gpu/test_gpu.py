"""Runs tests/gpu/check_cuda.py where an NVIDIA GPU is present; skipped everywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwlaunch.probes import nvml_device_count

CHECK = Path(__file__).with_name("check_cuda.py")


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(nvml_device_count() == 0, reason="no NVIDIA GPU (NVML reports none)")
def test_cuda_check_script(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.run(
        [sys.executable, str(CHECK)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"], json.dumps(report, indent=2) + "\n" + proc.stderr[-4000:]
    assert proc.returncode == 0
    assert "Cannot re-initialize CUDA in forked subprocess" not in proc.stderr
