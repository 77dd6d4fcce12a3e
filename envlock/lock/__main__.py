"""``python -m envlock.lock``: write the JSON Schema generated from the models to ``schemas/``."""

from __future__ import annotations

from pathlib import Path

from envlock.lock import schema_json

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "env.lock.schema.json"

if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_json(), encoding="utf-8")
