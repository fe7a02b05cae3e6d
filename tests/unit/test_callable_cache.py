"""The pickled-once cache of callables: a repeated function reuses its form, and no change to
what the function would pickle with is ever missed, on the path that skips the key too.

Each case calls the function through its cached form (``cloudpickle.loads``), as a worker
does, after changing one thing the form depends on.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest

from hwlaunch.executor._callable_cache import CachedPickle, pickled_once


def _form(fn: Callable[..., Any]) -> bytes:
    return pickled_once(fn, cloudpickle.dumps)


def _run(fn: Callable[..., Any]) -> Any:
    return cloudpickle.loads(_form(fn))()


def _script(source: str) -> dict[str, Any]:
    """A ``__main__``-like namespace: cloudpickle takes its functions and globals by value."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(source, namespace)
    return namespace


def test_an_unchanged_function_reuses_one_form() -> None:
    fn = _script("def f():\n    return 1\n")["f"]
    first = _form(fn)
    assert type(first) is CachedPickle
    assert all(_form(fn) is first for _ in range(3))


def test_a_changed_cell_gives_a_new_form() -> None:
    value = 1

    def read() -> int:
        return value

    results = []
    for value in (1, 2, 2, 3):  # noqa: B007 (the cell is what changes)
        results.append(_run(read))
    assert results == [1, 2, 2, 3]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("ns['SCALE'] = 2", 20),  # a global rebound
        ("ns['SCALE'] = 1.0", 10.0),  # equal, but of another type
        ("ns['OFFSET'] = 5", 15),  # a global that was missing (a name the code uses)
        ("ns['f'].__defaults__ = (2,)", 20),
        ("ns['f'].__kwdefaults__['bias'] = 7", 17),  # changed in place
        ("ns['f'].__code__ = ns['g'].__code__", -1),
    ],
)
def test_a_changed_input_gives_a_new_form(change: str, expected: Any) -> None:
    ns = _script(
        "SCALE = 1\n"
        "def f(times=1, *, bias=0):\n"
        "    return SCALE * 10 * times + bias + (OFFSET if 'OFFSET' in globals() else 0)\n"
        "def g(times=1, *, bias=0):\n"
        "    return -1\n"
    )
    fn = ns["f"]
    assert _run(fn) == 10 and _run(fn) == 10
    exec(change, {"ns": ns})
    assert _run(fn) == expected
    assert type(_run(fn)) is type(expected)


def test_changed_attributes_docstring_and_annotations_give_a_new_form() -> None:
    fn = _script("def f():\n    return 0\n")["f"]

    def loaded() -> Any:
        return cloudpickle.loads(_form(fn))

    assert loaded().__doc__ is None and not hasattr(loaded(), "tag")
    fn.tag = "a"
    assert loaded().tag == "a"
    fn.tag = "b"
    assert loaded().tag == "b"
    fn.__doc__ = "documented"
    assert loaded().__doc__ == "documented"
    fn.__annotations__["return"] = int
    assert loaded().__annotations__ == {"return": int}


def test_a_helper_function_whose_cell_changes_is_followed() -> None:
    """A function among the globals is not taken by identity: its own content can change."""
    ns = _script(
        "def make(n):\n"
        "    def helper():\n"
        "        return n\n"
        "    return helper\n"
        "helper = make(1)\n"
        "def f():\n"
        "    return helper()\n"
    )
    fn = ns["f"]
    assert _run(fn) == 1
    ns["helper"].__closure__[0].cell_contents = 2
    assert _run(fn) == 2


def test_a_function_holding_a_mutable_value_is_pickled_anew() -> None:
    box = [1]

    def read() -> int:
        return box[0]

    assert type(_form(read)) is bytes
    box[0] = 2
    assert _run(read) == 2
