"""The README's promises: its Python example runs as printed, and its quick start is two commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quick_start_has_exactly_two_commands() -> None:
    text = README.read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.S)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("hwlaunch run")
    assert "'.[test]'" in commands[1] and commands[1].endswith("python -m pytest")


@pytest.mark.timeout(180)
def test_python_example_prints_what_the_readme_says(tmp_path: Path) -> None:
    text = README.read_text()
    code = re.search(r"```python\n(import hwlaunch\n.*?)```", text, re.S)
    assert code is not None
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=170, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    for comment in re.findall(r"print\(.*?\)\s+# (\[.*\])", code.group(1)):
        if comment != "rank order":
            assert comment in proc.stdout
    assert "[('x', 0, 'cpu'), ('x', 1, 'cpu')]" in proc.stdout
