"""Edits of a lock's text that the restore-speed test and benchmark share: one small package at
another version, so that a second restore differs from the first by that package alone."""

from __future__ import annotations

import re
from pathlib import Path

from envlock.restore.wheelhouse import wheel_record_sha256


def with_other_six(lock_text: str, wheelhouse: Path, old: str = "1.17.0", new_version: str = "1.16.0") -> str:
    """The lock with six ``new_version`` instead of ``old`` (that wheel's build); re-seal it with
    ``fmt``."""
    wheel = next(wheelhouse.glob(f"six-{new_version}-*.whl"))
    block = re.search(r'\[\[packages\]\]\nname = "six"\n.*?(?=\n\n|\Z)', lock_text, re.S)
    assert block is not None
    new = re.sub(rf'version = "{re.escape(old)}"', f'version = "{new_version}"', block.group(0))
    new = re.sub(r'record_sha256 = "[0-9a-f]+"', f'record_sha256 = "{wheel_record_sha256(wheel)}"', new)
    new = re.sub(r'\nhashes = \[[^\]]*\]', "", new)
    return lock_text.replace(block.group(0), new)
