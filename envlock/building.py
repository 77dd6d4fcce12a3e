"""A probe document as a lock, validated through the models.

``build_lock`` is the gate every probe value passes before it is written or compared; verify
compares what it returns with the lock it read. Apart from ``capturing`` so that turning a
document into a lock does not depend on how the probe is run.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from envlock import __version__
from envlock.errors import ProbeFailed, UsageError

if TYPE_CHECKING:
    from envlock.lock import Lock


def without_timings(doc: dict[str, Any]) -> dict[str, Any]:
    """Timings differ on every run: in a committed lock they would be churn in every diff of
    an unchanged environment, so they stay out (the model still reads older locks with them)."""
    doc = {**doc, "probe": {k: v for k, v in (doc.get("probe") or {}).items() if k != "duration_ms"}}
    if isinstance(doc.get("canary"), dict):
        doc["canary"] = {k: v for k, v in doc["canary"].items() if k != "duration_ms"}
    return doc


def build_lock(doc: dict[str, Any], *, note: str | None = None) -> Lock:
    """Validate a probe document as a lock (sealed, ready to save)."""
    from pydantic import ValidationError

    from envlock.lock import Lock, Meta, seal
    from envlock.probe.scrub import scrub_string, secret_values

    if note:
        # The note comes from the user, not the probe: the same scrub, with this process's
        # secrets (`HF_TOKEN=... envlock capture --note "run with $HF_TOKEN"`).
        note = scrub_string(note, secret_values())
    doc = without_timings(doc)
    try:
        meta = Meta(tool_version=__version__, created_at=datetime.now(timezone.utc).replace(microsecond=0),
                    note=note)
    except ValidationError as exc:
        raise UsageError(f"--note: {exc.errors()[0]['msg']}") from None
    try:
        lock = Lock.model_validate({**doc, "envlock": meta.model_dump()})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProbeFailed(f"the probe reported a value envlock cannot lock: {where}: {err['msg']}") from None
    return seal(lock)


def import_heavy_modules() -> None:
    """Import pydantic, the models, the reader and the writer: called while a probe runs."""
    import envlock.lock  # noqa: F401
