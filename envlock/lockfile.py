"""Reading ``env.lock`` through the models, and the one place callers import the lock file API.

Reading uses ``tomllib`` (fast, strict) and validates with the pydantic models; the seal is
checked on the result (see ``lockwrite`` for what the two hashes cover). Sealing and writing
live in ``lockwrite`` and are re-exported here; the read path that skips pydantic for a lock
whose seal holds is ``lockdata``. The models are imported only when a lock is validated, so
importing this module stays cheap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from envlock import __version__
from envlock.errors import LockInvalid
from envlock.lockcore import SCHEMA_VERSION
from envlock.lockdata import MAX_LOCK_BYTES, parse_toml, read_text
from envlock.lockwrite import (
    HEADER,
    STALE_TMP_SECONDS,
    TMP_SUFFIX,
    atomic_write,
    canonical_json,
    check_seal,
    dumps,
    fingerprint,
    integrity,
    looks_like_lock,
    remove_stale_temps,
    save,
    seal,
    write_target,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

    from envlock.model import Lock


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(document)"
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}{extra}"


def parse(text: str, name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    return from_dict(parse_toml(text, name), name, verify_seal=verify_seal)


def from_dict(data: dict[str, Any], name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    meta = data.get("envlock")
    if not isinstance(meta, dict):
        raise LockInvalid(f"{name} is not an env.lock: it has no [envlock] table")
    version = meta.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LockInvalid(
            f"{name} uses lock schema {version}; this envlock ({__version__}) reads up to "
            f"{SCHEMA_VERSION}",
            hint="upgrade envlock",
        )
    from pydantic import ValidationError

    from envlock._capture import import_models

    import_models()
    from envlock.model import Lock

    try:
        lock = Lock.model_validate(data)
    except ValidationError as exc:
        raise LockInvalid(f"{name} does not match the lock schema: {_first_error(exc)}") from None
    except RecursionError:
        raise LockInvalid(f"{name} does not match the lock schema: values nest too deeply") from None
    if verify_seal:
        check_seal(lock, name)
    return lock


def load(path: str | os.PathLike[str], *, verify_seal: bool = True) -> Lock:
    """Read, validate and (by default) check the seal of a lock file."""
    return parse(read_text(path), str(path), verify_seal=verify_seal)


__all__ = [
    "HEADER", "MAX_LOCK_BYTES", "STALE_TMP_SECONDS", "TMP_SUFFIX", "atomic_write", "canonical_json",
    "check_seal", "dumps", "fingerprint", "from_dict", "integrity", "load", "looks_like_lock",
    "parse", "read_text", "remove_stale_temps", "save", "seal", "write_target",
]
