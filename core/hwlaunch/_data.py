"""Frozen dataclasses as JSON-ready data: ``to_dict()`` of the contract's records, from their
fields, so that a field added to a record is in ``--json`` without a second list to update."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def as_data(value: Any) -> Any:
    """``value`` as JSON types: a record through its ``to_dict()`` (or its fields), mappings as
    dicts, tuples and lists as lists, sets sorted."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return to_dict() if callable(to_dict) else fields_of(value)
    if isinstance(value, Mapping):
        return {key: as_data(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(as_data(item) for item in value)
    if isinstance(value, (tuple, list)):
        return [as_data(item) for item in value]
    return value


def fields_of(record: Any) -> dict[str, Any]:
    """Every field of a dataclass instance, by name, as JSON types."""
    return {f.name: as_data(getattr(record, f.name)) for f in dataclasses.fields(record)}
