"""The JSON Schema of env.lock, generated from the models (``schemas/`` holds a copy).

Regenerate the copy with ``python -m envlock.lock``; a test fails when it is stale. Field
policies are metadata pydantic does not know, so they stay out of the schema.
"""

from __future__ import annotations

import json
from typing import Any

from envlock.lock._lock import Lock
from envlock.lock._model import SCHEMA_VERSION


def json_schema() -> dict[str, Any]:
    doc = Lock.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["$id"] = f"https://envlock.dev/schemas/env.lock.v{SCHEMA_VERSION}.json"
    doc["title"] = "env.lock"
    return doc


def schema_json() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
