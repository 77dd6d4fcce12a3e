"""The lock model's string-holding places, walked from its fields: one walk for the tests that
edit each place (test_lockfile_bounds) and the adversarial output corpus that fills each one
(benchmarks/adversarial_outputs.py)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

Slot = tuple[tuple[Any, ...], str, str | None]


def _pattern(meta: list[Any], annotation: Any) -> str | None:
    for m in [*meta, *getattr(annotation, "__metadata__", ())]:
        pattern = getattr(m, "pattern", None)
        if pattern:
            return str(pattern)
    return None


def string_slots(model: type[BaseModel], prefix: tuple[Any, ...] = ()) -> list[Slot]:
    """(path, kind, pattern) of every string-holding place in ``model``: kind "value" (a str
    field), "item" (a list[str] element), "key"/"dictvalue" (a dict[str, ...]); ``pattern`` is
    the field's regular expression, where it has one. A list of models is walked at index 0."""
    out: list[Slot] = []
    for name, fld in model.model_fields.items():
        ann = fld.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)] \
            if typing.get_origin(ann) in (typing.Union, types.UnionType) else [ann]
        for arg in args:
            origin = typing.get_origin(arg)
            base = typing.get_args(arg)[0] if origin is typing.Annotated else arg
            if isinstance(base, type) and issubclass(base, BaseModel):
                out += string_slots(base, (*prefix, name))
            elif base is str:
                out.append(((*prefix, name), "value", _pattern(fld.metadata, arg)))
            elif origin is list:
                (item,) = typing.get_args(arg)
                inner = typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    out += string_slots(inner, (*prefix, name, 0))
                elif inner is str:
                    out.append(((*prefix, name), "item", _pattern([], item)))
            elif origin is dict:
                out.append(((*prefix, name), "key", None))
                out.append(((*prefix, name), "dictvalue", None))
    return out
