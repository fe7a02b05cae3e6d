"""resolve()'s keywords are the settings table's rows: one place to add a setting.

The signature spells the keywords out for type checkers and readers; these checks hold it to
``hwlaunch.planning.settings.SETTINGS`` (docs/configuration.md's table is held to the same rows
by tests/unit/test_docs.py), show that each keyword reaches its row's parser under its own
source label, and that a misspelt keyword is a TypeError with a did-you-mean.
"""

from __future__ import annotations

import inspect

import pytest

import hwlaunch
from hwlaunch.errors import ConfigError
from hwlaunch.planning.settings import SETTINGS

NOT_SETTINGS = {"config", "assume"}  # where the settings come from, not settings


def test_the_keywords_of_resolve_are_the_rows_of_the_settings_table() -> None:
    parameters = inspect.signature(hwlaunch.resolve).parameters.values()
    named = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    assert {p.name for p in named} == {s.name for s in SETTINGS} | NOT_SETTINGS
    assert all(p.default is None for p in named)
    rest = [p for p in parameters if p.kind is not p.KEYWORD_ONLY]
    assert [(p.kind, p.annotation) for p in rest] == [(inspect.Parameter.VAR_KEYWORD, "NoReturn")]


@pytest.mark.parametrize("name", [s.name for s in SETTINGS])
def test_each_keyword_is_read_by_its_row_under_its_own_source(name: str) -> None:
    """A value no row accepts fails in that row's parser, named as the keyword it came by."""
    with pytest.raises(ConfigError, match=rf"invalid {name} .* from resolve\({name}=\)"):
        hwlaunch.resolve(**{name: object()})


def test_a_misspelt_keyword_is_a_type_error_with_a_did_you_mean() -> None:
    with pytest.raises(TypeError) as info:
        hwlaunch.resolve(world_sise=2)  # type: ignore[arg-type]
    message = str(info.value)
    assert "unexpected keyword argument 'world_sise'; did you mean 'world_size'?" in message
    assert "docs/configuration.md#every-setting" in message


def test_launch_passes_a_misspelt_keyword_on_to_the_same_error() -> None:
    with pytest.raises(TypeError, match="'exector'; did you mean 'executor'"):
        hwlaunch.launch(exector="uni")
