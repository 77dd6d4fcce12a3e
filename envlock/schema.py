"""The JSON Schema of env.lock, generated from the models (``schemas/`` holds a copy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envlock.model import SCHEMA_VERSION, Lock

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "env.lock.schema.json"


def schema() -> dict[str, Any]:
    doc = Lock.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["$id"] = f"https://envlock.dev/schemas/env.lock.v{SCHEMA_VERSION}.json"
    doc["title"] = "env.lock"
    return doc


def schema_json() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_json(), encoding="utf-8")
