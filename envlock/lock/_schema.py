"""The JSON Schema of env.lock, generated from the models (``schemas/`` holds a copy).

Regenerate the copy with ``python -m envlock.lock``; a test fails when it is stale. Field
policies are metadata pydantic does not know, so they stay out of the schema.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from envlock.lock._lock import Lock
from envlock.lock._model import SCHEMA_VERSION, LockData
from envlock.lock._policy import nested_model


def json_schema() -> dict[str, Any]:
    doc = Lock.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["$id"] = f"https://envlock.dev/schemas/env.lock.v{SCHEMA_VERSION}.json"
    doc["title"] = "env.lock"
    return doc


def schema_json() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def empty_defaults(model: type[BaseModel] = LockData) -> dict[str, Any]:
    """Where ``model`` defaults to an empty list or table: what the writer leaves out of the TOML
    (``hashes = []`` on every row is noise) and the models put back, so the sealed header puts
    it back too before it hashes the table (``_derived.EMPTY_DEFAULTS``). A field maps to its
    empty value, or to a dict that recurses into its model (``"__all__"``: into every row of a
    list of them), with the empty value under ``"__default__"`` when the field has one."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
        else:
            default = None if field.is_required() else field.default  # no default at all
        empty = isinstance(default, (list, dict)) and not default
        inner = nested_model(field.annotation)
        sub = empty_defaults(inner[0]) if inner is not None else {}
        if sub:
            spec = {"__all__": sub} if inner is not None and inner[1] else dict(sub)
            out[name] = {**spec, "__default__": type(default)()} if empty else spec
        elif empty:
            out[name] = type(default)()
    return out
