"""Edits of a lock's text that the restore-speed test and benchmark share: one small package at
another version, so that a second restore differs from the first by that package alone."""

from __future__ import annotations

import re
from pathlib import Path

from envlock.restore.wheelhouse import wheel_record_sha256


def with_other_six(lock_text: str, wheelhouse: Path) -> str:
    """The lock with six 1.16.0 instead of 1.17.0 (that wheel's build); re-seal it with ``fmt``."""
    wheel = next(wheelhouse.glob("six-1.16.0-*.whl"))
    block = re.search(r'\[\[packages\]\]\nname = "six"\n.*?(?=\n\n|\Z)', lock_text, re.S)
    assert block is not None
    new = re.sub(r'version = "1\.17\.0"', 'version = "1.16.0"', block.group(0))
    new = re.sub(r'record_sha256 = "[0-9a-f]+"', f'record_sha256 = "{wheel_record_sha256(wheel)}"', new)
    new = re.sub(r'\nhashes = \[[^\]]*\]', "", new)
    return lock_text.replace(block.group(0), new)
