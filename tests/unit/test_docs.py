"""The docs against the code they describe: the settings table, the API's signatures, the names.

The settings table in docs/configuration.md is checked row by row against
``hwlaunch.planning.settings.SETTINGS`` (a new setting without its row fails here), the
README's links against the pages they name, the
signatures that docs/api.md prints against the functions, every ``hwlaunch.<name>`` the docs
mention against the package, and the command samples of docs/cli.md against what the commands
print now.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hwlaunch
from hwlaunch.planning.settings import BACKEND_TABLE_KEYS, SETTINGS, TOP_LEVEL_KEYS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "examples" / "vendor-plugin" / "README.md"]


def section(path: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    text = path.read_text()
    level = heading.split(" ")[0]
    start = text.index(heading + "\n") + len(heading) + 1
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start:], re.M)]
    return text[start : start + ends[0]] if ends else text[start:]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text``, cells stripped."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    assert len(rows) > 2, f"no table in:\n{text[:300]}"
    return rows[2:]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def prose(path: Path) -> str:
    """A page without its fenced code blocks (samples of output, example code)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


# Pages the README links that another branch writes (the lead's vLLM guide).
PENDING_PAGES = {"docs/vllm.md"}


def test_the_readme_is_an_introduction_whose_links_lead_somewhere() -> None:
    """Under 120 lines; the reference tables live in docs/ and every link there resolves."""
    text = README.read_text()
    assert len(text.splitlines()) < 120
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert {"docs/rules.md", "docs/configuration.md", "docs/api.md"} <= set(links)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert set(missing) <= PENDING_PAGES, missing


def test_the_configuration_table_has_every_setting_with_its_default_and_allowed_values() -> None:
    rows = table_rows(section(DOCS / "configuration.md", "## Every setting"))
    documented = {code_spans(row[0])[0]: row for row in rows}
    assert list(documented) == [s.name for s in SETTINGS]
    for setting in SETTINGS:
        _, flags, env, per_backend, default, allowed, meaning = documented[setting.name]
        assert meaning == setting.help, setting.name
        assert code_spans(flags) == [f for f in (setting.short, setting.flag) if f]
        assert code_spans(env) == [setting.env_var]
        assert per_backend == ("yes" if setting.per_backend else "no"), setting.name
        if setting.default is None:
            assert default == "-", setting.name
        else:
            assert code_spans(default) == [repr(setting.default).strip("'")], setting.name
        assert code_spans(allowed) == list(setting.allowed) or (
            not setting.allowed and allowed == "-"
        ), setting.name


def test_the_configuration_page_lists_the_keys_a_config_file_may_hold() -> None:
    text = (DOCS / "configuration.md").read_text()
    top = re.search(r"Top-level keys: (.*?);", text, re.S)
    per_backend = re.search(r"per-backend keys: (.*?)\.", text, re.S)
    assert top is not None and per_backend is not None
    assert code_spans(top.group(1)) == list(TOP_LEVEL_KEYS)
    assert code_spans(per_backend.group(1)) == list(BACKEND_TABLE_KEYS)


def documented_signature(text: str, qualified: str) -> list[str]:
    """The parameter names of ``qualified(...)`` as a page prints it."""
    found = re.search(rf"`{re.escape(qualified)}\((.*?)\)( ->[^`]*)?`", text, re.S)
    assert found is not None, f"{qualified}(...) is not documented"
    names = []
    for part in found.group(1).replace("\n", " ").split(","):
        part = part.strip()
        if part and part != "*":
            names.append(part.split("=")[0].lstrip("*").strip())
    return names


@pytest.mark.parametrize(
    ("qualified", "function"),
    [
        ("hwlaunch.resolve", "hwlaunch.planning.resolver:resolve"),
        ("hwlaunch.launch", "hwlaunch.executor.launcher:launch"),
        ("Executor.collective_rpc", "hwlaunch.executor.base:Executor.collective_rpc"),
    ],
)
def test_the_api_page_prints_each_signature_as_it_is(qualified: str, function: str) -> None:
    module, _, attribute = function.partition(":")
    target: object = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    assert callable(target)
    parameters = inspect.signature(target).parameters.values()
    # resolve()'s ``**unknown: NoReturn`` only turns a misspelt keyword into a did-you-mean.
    actual = [p.name for p in parameters if p.name != "self" and p.annotation != "NoReturn"]
    assert documented_signature((DOCS / "api.md").read_text(), qualified) == actual


def test_every_setting_is_a_keyword_of_resolve() -> None:
    parameters = inspect.signature(hwlaunch.resolve).parameters
    assert {s.name for s in SETTINGS} <= set(parameters)


def test_the_api_page_names_every_public_member_of_executor_and_every_plan_field() -> None:
    text = prose(DOCS / "api.md")
    spans = {span.split("(")[0].split(".")[-1] for span in re.findall(r"`([^`]+)`", text)}
    members = {name for name in vars(hwlaunch.Executor) if not name.startswith("_")}
    members |= {"restarts", "pids"}  # restarting executors and the process-based ones
    assert members - spans == set()
    fields = {f.name for f in dataclasses.fields(hwlaunch.Plan)}
    assert fields - spans == set()


def mentioned_names() -> list[tuple[str, str]]:
    """Every ``hwlaunch.<dotted name>`` in a code span of the docs, with its page."""
    found = []
    for page in PAGES:
        for span in code_spans(prose(page)):
            for name in re.findall(r"(?<![\w./-])hwlaunch(?:\.[A-Za-z_]\w*)+", span):
                if name.endswith(".toml") or name == "hwlaunch.backends":  # a file, the group
                    continue
                found.append((page.name, name))
    return sorted(set(found))


@pytest.mark.parametrize(("page", "name"), mentioned_names())
def test_every_hwlaunch_name_in_the_docs_exists(page: str, name: str) -> None:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            try:
                present = hasattr(target, attribute)
            except ModuleNotFoundError as exc:  # an integration whose engine is not installed
                pytest.skip(f"{name} needs {exc.name}, which is not installed here")
            assert present, f"{page} names {name}, which does not exist"
            target = getattr(target, attribute)
        return
    pytest.fail(f"{page} names {name}, which does not exist")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env["COLUMNS"] = "200"
    return env


def sample(heading_command: str) -> str:
    """The output printed after ``$ <command>`` in docs/cli.md, up to the next ``$`` line."""
    text = (DOCS / "cli.md").read_text()
    start = text.index(f"$ {heading_command}\n") + len(heading_command) + 3
    end = min(i for i in (text.find("\n$ ", start), text.find("\n```", start)) if i >= 0)
    return text[start:end]


def first_cells(table: str) -> list[str]:
    """The first column of a rich table's rows (continuation lines left out)."""
    cells = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    return [cell for cell in cells if cell]


def header(table: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def hwlaunch_cli(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,  # no config file
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_samples_show_the_rows_and_columns_the_commands_print(tmp_path: Path) -> None:
    backends = "hwlaunch backends"
    assert header(sample(backends)) == header(hwlaunch_cli(tmp_path, "backends"))
    resolve = "hwlaunch resolve --assume cuda.initialized=true --assume cuda.device_count=2 -n 2"
    printed = hwlaunch_cli(tmp_path, *resolve.split()[1:])
    assert header(sample(resolve)) == header(printed)
    assert first_cells(sample(resolve)) == first_cells(printed)


# Pass marks of a check run, and "here" as in "on the machine this was written on".
BUILD_HISTORY = re.compile(
    r"\*\*(PASS|FAIL|N/A)\*\*|\bPASSED\b|\b(works|minutes|CPU|seconds|s) here\b|\bhere[;)]"
    r"|\(this machine|\bwas fixed\b|\bwe found\b"
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_describe_the_software_not_how_it_was_built(page: Path) -> None:
    hits = [line for line in page.read_text().splitlines() if BUILD_HISTORY.search(line)]
    assert hits == []


def test_the_plugin_guide_lists_every_backendspec_field_and_which_are_required() -> None:
    guide = DOCS / "writing-a-backend-plugin.md"
    part = section(guide, "## 4. Fill in the BackendSpec")
    fields = dataclasses.fields(hwlaunch.BackendSpec)
    table = [code_spans(row[0])[0] for row in table_rows(part)]
    assert table == [f.name for f in fields]
    required = re.search(r"Required fields: (.*?);", part, re.S)
    assert required is not None
    assert code_spans(required.group(1)) == [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def test_the_plugin_guide_lists_every_executorspec_field() -> None:
    part = section(DOCS / "writing-a-backend-plugin.md", "## 10. An executor of your own")
    documented = [name for row in table_rows(part) for name in code_spans(row[0])]
    assert documented == [f.name for f in dataclasses.fields(hwlaunch.ExecutorSpec)]


def test_the_contract_version_the_readme_and_plugin_guide_give_is_the_codes() -> None:
    readme = re.findall(r"contract `(\d+\.\d+)`", README.read_text())
    guide = re.findall(
        r"Plugin contract \*\*(\d+\.\d+)\*\*", (DOCS / "writing-a-backend-plugin.md").read_text()
    )
    assert readme == [hwlaunch.CONTRACT_VERSION]
    assert guide == [hwlaunch.CONTRACT_VERSION]
