"""``envlock schema``: print the JSON Schema of env.lock."""

from __future__ import annotations

import argparse

from envlock.commands._output import out
from envlock.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from envlock.lock import schema_json

    out(schema_json())
    return EXIT_OK
