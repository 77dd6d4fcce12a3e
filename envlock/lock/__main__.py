"""``python -m envlock.lock``: write what is generated from the models: the JSON Schema in
``schemas/`` and what the seal needs of the models (``_derived.py``: what the fingerprint leaves out, and where
the models default to an empty list or table), which the seal and the sealed header read
without importing pydantic."""

from __future__ import annotations

from pathlib import Path

from envlock.lock import schema_json

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "env.lock.schema.json"
DERIVED_FILE = Path(__file__).resolve().parent / "_derived.py"


def derived_source() -> str:
    """The text of ``_derived.py``: ``_policy.fingerprint_exclude`` and ``_schema.empty_defaults``
    of the models, as literals."""
    import pprint

    from envlock.lock._model import LockData
    from envlock.lock._policy import fingerprint_exclude
    from envlock.lock._schema import empty_defaults

    def literal(value: object) -> str:
        return pprint.pformat(value, indent=4, width=100, sort_dicts=True)

    return ('"""What the seal needs of the models, generated from them by ``python -m envlock.lock``\n'
            "(a test fails when it is stale). Literals, so that the seal and the sealed header\n"
            '(``_header``) hash a lock without importing pydantic."""\n\n'
            "from __future__ import annotations\n\nfrom typing import Any\n\n"
            "# What the fingerprint leaves out, in the shape pydantic's ``exclude`` takes (True drops a\n"
            '# key, a dict recurses, ``"__all__"`` applies to every item of an array), from each\n'
            "# field's policy (``_policy.fingerprint_exclude``).\n"
            f"FINGERPRINT_EXCLUDE: dict[str, Any] = {literal(fingerprint_exclude(LockData))}\n\n"
            "# Where the models default to an empty list or table, which the writer leaves out of the\n"
            "# TOML (``_schema.empty_defaults``), in the same shape.\n"
            f"EMPTY_DEFAULTS: dict[str, Any] = {literal(empty_defaults(LockData))}\n")


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_json(), encoding="utf-8")
    DERIVED_FILE.write_text(derived_source(), encoding="utf-8")
