"""A callable sent again and again is pickled once: its pickled form, cached under a key that
holds everything cloudpickle would put into it.

Why: engines send the same lambda or closure on every step, and cloudpickling a function costs
tens of microseconds, several times a no-op call. Reusing a pickled form is only correct while
pickling again would give the same bytes, so the key is made of what the pickle holds:

- the code object (by identity, kept alive by the cache entry so that its identity is not
  reused: a function defined anew each time, a lambda in a loop, shares its code object; a
  function redefined in a notebook has a new one), name, qualified name, module and
  ``__doc__``;
- the contents of the closure cells, the defaults and keyword defaults, the function's
  ``__dict__`` and ``__annotations__``;
- the values of the globals its code (and the code nested in it) names.

A value enters the key only where comparing it tells whether its pickle changed: ``None``,
booleans, numbers, strings and byte strings (with their type, so that 1 and 1.0 and True
differ), tuples and frozensets of such values, modules, builtin functions, and classes and
functions that pickle by reference (importable under their name: the worker imports them);
a function that travels by value enters as its own key, recursively. Anything else (a list,
a dict, an array, an instance, a class of ``__main__``) can change without its identity
changing, so a function that holds one is not cached: it is pickled anew on every call.

Computing the key costs a few microseconds, more than the rest of a call's overhead in the
parent. So for a function whose key holds only values that cannot change in place (atoms,
tuples and frozensets of them, modules, builtin functions: no function or class, whose own
content or importability could change), the cache also remembers what the key was computed
from, by identity: the code, the names and docstring, the defaults, each keyword default, cell
content, ``__dict__`` and annotation entry, and the value of each global name. While every one
of those is the very same object, the key is the same, and the form is reused without
computing it again.

What is cached is the pickled form alone, at most ``CAPACITY`` of them (least recently used
go first); the process-based executors' workers keep the unpickled function for a cached form
(by its digest), so a cached function is one object in the worker from call to call, as a
named method of the worker is.
"""

from __future__ import annotations

import hashlib
import operator
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hwlaunch.executor.transport._callables import CachedPickle

__all__ = ["CAPACITY", "pickled_once"]

CAPACITY = 256
_DEPTH = 8  # functions within functions followed for the key; deeper: not cached
_ATOMS = frozenset((type(None), bool, int, float, complex, str, bytes, type(Ellipsis)))
_BY_IDENTITY = (types.ModuleType, types.BuiltinFunctionType)


class _Uncacheable(Exception):
    """A value in the function whose pickle could change without the key changing."""


_lock = threading.Lock()
# key -> (the code objects the key names by id, the form)
_cache: OrderedDict[tuple[Any, ...], tuple[list[Any], CachedPickle]] = OrderedDict()


_names: dict[int, tuple[types.CodeType, tuple[str, ...]]] = {}  # by id(code): no code hashing


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Every name the code (and code nested in it) may look up: a superset of its globals."""
    known = _names.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    found = tuple(sorted(names))
    if len(_names) > 4 * CAPACITY:
        _names.clear()
    _names[id(code)] = (code, found)
    return found


def _by_reference(obj: Any) -> bool:
    """Pickled by name (the worker imports it): importable where it says it lives."""
    module_name = getattr(obj, "__module__", None)
    if module_name in (None, "__main__"):
        return False
    module = sys.modules.get(module_name)
    target: Any = module
    for part in getattr(obj, "__qualname__", "<").split("."):
        target = getattr(target, part, None)
    return target is obj


def _value_key(value: Any, depth: int, seen: dict[int, Any]) -> Any:
    cls = type(value)
    if cls in _ATOMS:
        return (cls, value)
    if cls is tuple or cls is frozenset:
        items = [_value_key(item, depth, seen) for item in value]
        return (cls, frozenset(items) if cls is frozenset else tuple(items))
    if isinstance(value, _BY_IDENTITY):
        return value
    if cls is types.FunctionType:
        return value if _by_reference(value) else _function_key(value, depth + 1, seen)
    if isinstance(value, type) and _by_reference(value):
        return value
    raise _Uncacheable


def _mapping_key(mapping: dict[str, Any] | None, depth: int, seen: dict[int, Any]) -> Any:
    if not mapping:
        return None
    return tuple((name, _value_key(v, depth, seen)) for name, v in sorted(mapping.items()))


def _function_key(fn: types.FunctionType, depth: int, seen: dict[int, Any]) -> tuple[Any, ...]:
    """``seen``: the functions met so far (by id), and their code objects: the key names code
    by ``id``, and the cache entry keeps them, so that no id is reused while the key lives."""
    if depth > _DEPTH:
        raise _Uncacheable
    code = fn.__code__
    if id(fn) in seen:  # a function that names itself (recursion)
        return ("self", id(code))
    seen[id(fn)] = code
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_value_key(cell.cell_contents, depth, seen))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    names = fn.__globals__
    used = {name: names[name] for name in _global_names(code) if name in names}
    return (
        id(code),
        fn.__name__,
        fn.__qualname__,
        fn.__module__,
        fn.__doc__,
        tuple(_value_key(v, depth, seen) for v in fn.__defaults__ or ()),
        _mapping_key(fn.__kwdefaults__, depth, seen),
        tuple(cells),
        _mapping_key(used, depth, seen),
        _mapping_key(fn.__dict__, depth, seen),
        _mapping_key(fn.__annotations__, depth, seen),
    )


def callable_key(fn: Callable[..., Any]) -> tuple[tuple[Any, ...], list[Any]] | None:
    """The key of a function's pickled form, and the code objects it names by id; None where
    it cannot be cached (see the module docstring: not a plain function, or a value in it that
    may change in place)."""
    if type(fn) is not types.FunctionType:
        return None
    seen: dict[int, Any] = {}
    try:
        return _function_key(fn, 0, seen), list(seen.values())
    except (_Uncacheable, TypeError):  # TypeError: an unhashable value inside a tuple
        return None


# id(function) -> (the function, kept so that its id is not reused; its inputs; its form, or
# None where an input could change in place)
_unchanged: OrderedDict[int, tuple[Any, tuple[Any, ...], CachedPickle | None]] = OrderedDict()
_SECTION = object()  # between the parts of the inputs, so that no entry can move unseen
_MISSING = object()  # a global name the function's globals do not hold
_is = operator.is_


def _inputs(fn: types.FunctionType) -> tuple[Any, ...] | None:
    """Every object a function's key is computed from, flat, in a fixed order; None where a
    cell is empty."""
    code = fn.__code__
    flat = [code, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__, fn.__defaults__]
    for mapping in (fn.__kwdefaults__, fn.__dict__, fn.__annotations__):
        flat.append(_SECTION)
        if mapping:
            for item in mapping.items():
                flat += item
    flat.append(_SECTION)
    try:
        for cell in fn.__closure__ or ():
            flat.append(cell.cell_contents)
    except ValueError:  # an empty cell
        return None
    flat.append(_SECTION)
    names = fn.__globals__
    for name in _global_names(code):
        flat.append(names.get(name, _MISSING))
    return tuple(flat)


def _immutable(value: Any) -> bool:
    """A value whose identity tells its pickle: it cannot change in place."""
    cls = type(value)
    if cls in _ATOMS or isinstance(value, _BY_IDENTITY):
        return True
    if cls is tuple or cls is frozenset:
        return all(_immutable(item) for item in value)
    return False


def _remembered(fn: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The entry of this very function, where its inputs are the same objects as then."""
    entry = _unchanged.get(id(fn))
    if entry is None or entry[0] is not fn:  # (the entry keeps its function: ids stay unique)
        return None
    known = entry[1]
    if len(inputs) != len(known) or not all(map(_is, inputs, known)):
        return None
    return entry


def _remember(fn: Any, inputs: tuple[Any, ...], form: CachedPickle) -> None:
    """Remember the inputs and the form; the form None where an input could change in place
    (the function is then keyed on every call, and these inputs are not looked at again)."""
    immutable = all(_immutable(v) for v in inputs[1:] if v is not _SECTION and v is not _MISSING)
    with _lock:
        _unchanged[id(fn)] = (fn, inputs, form if immutable else None)
        _unchanged.move_to_end(id(fn))
        while len(_unchanged) > CAPACITY:
            _unchanged.popitem(last=False)


def pickled_once(fn: Callable[..., Any], pickle: Callable[[Any], bytes]) -> bytes:
    """``pickle(fn)``, or the form pickled earlier under the same key (a CachedPickle)."""
    inputs = _inputs(fn) if type(fn) is types.FunctionType else None
    entry = None if inputs is None else _remembered(fn, inputs)
    if entry is not None and entry[2] is not None:
        return entry[2]  # type: ignore[no-any-return]
    keyed = callable_key(fn)
    if keyed is None:
        return pickle(fn)
    key, codes = keyed
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            form = hit[1]
    if hit is None:
        form = CachedPickle(pickle(fn))
        form.digest = hashlib.blake2b(form, digest_size=16).digest()
        with _lock:
            _cache[key] = (codes, form)  # the entry keeps the code objects its key names by id
            while len(_cache) > CAPACITY:
                _cache.popitem(last=False)
    if inputs is not None and entry is None:  # not judged yet with these very inputs
        _remember(fn, inputs, form)
    return form
