"""A lock file's bytes to its TOML table: the first stage of the one reader.

Apart from the models (``_read``) so that ``verify`` can read a lock's tables, and choose and
start its probe from them, before pydantic is imported; the models then validate this same
table. Nothing here imports pydantic.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from envlock import _files
from envlock.errors import LockInvalid

# The schema version this envlock writes, and the one the sealed header (``_header``) reads
# without the models; ``_model`` declares its default with it, ``_read`` keys its readers by it.
SCHEMA_VERSION = 1

# One limit for every command that reads a lock, and for capture, which writes none larger.
MAX_LOCK_BYTES = 16 * 1024 * 1024

def read_text(path: str | os.PathLike[str]) -> str:
    """The text of the lock at ``path``, refused (LockInvalid) when it cannot be a lock."""
    return _files.read_text(path, limit=MAX_LOCK_BYTES, what="a lock", error=LockInvalid,
                            missing_hint="create one with `envlock capture`")


def parse_toml(text: str, name: str) -> dict[str, Any]:
    # Imported here: verify's kept check names a lock by its text and parses none on a hit.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockInvalid(f"{name} is not valid TOML: {exc}") from None
    except RecursionError:
        raise LockInvalid(f"{name} is not a lock: its arrays or tables nest too deeply") from None
    except ValueError as exc:
        # int() refuses integers of more than 4,300 digits (CVE-2020-10735 guard).
        raise LockInvalid(f"{name} is not a lock: {exc}") from None


def read_data(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML table of the lock at ``path`` (LockInvalid when it cannot be one)."""
    return parse_toml(read_text(path), os.fspath(path))
