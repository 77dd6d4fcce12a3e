"""A probe document as a lock: validated through the models, or as a view beside a light lock.

``build_lock`` is the gate every probe value passes before it is written. ``current_lock`` is
what verify compares: a ``lockdata`` view when the expected lock was read without the models
(nothing is written, so nothing needs the gate, and pydantic is never imported), else the
validated lock. Apart from ``capturing`` so that ``lockfile`` can import the models the way
capture does without depending on how the probe is run.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from envlock import __version__
from envlock.errors import ProbeFailed, UsageError

if TYPE_CHECKING:
    from envlock.model import Lock


def without_timings(doc: dict[str, Any]) -> dict[str, Any]:
    """Timings differ on every run: in a committed lock they would be churn in every diff of
    an unchanged environment, so they stay out (the model still reads older locks with them)."""
    doc = {**doc, "probe": {k: v for k, v in (doc.get("probe") or {}).items() if k != "duration_ms"}}
    if isinstance(doc.get("canary"), dict):
        doc["canary"] = {k: v for k, v in doc["canary"].items() if k != "duration_ms"}
    return doc


def current_lock(doc: dict[str, Any], *, light: bool) -> Lock:
    """The lock of what the probe found now, to compare with an expected lock read ``light``ly
    (``lockdata``) or through the models."""
    if light:
        from envlock.lockdata import light_current

        view = light_current(without_timings(doc))
        if view is not None:
            return view
    import_models()
    return build_lock(doc)


def build_lock(doc: dict[str, Any], *, note: str | None = None) -> Lock:
    """Validate a probe document as a lock (sealed, ready to save)."""
    from pydantic import ValidationError

    from envlock.lockwrite import seal
    from envlock.model import Lock, Meta
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
    """Import pydantic, the models and the lock writer: called while a probe subprocess runs."""
    import_models()
    import envlock.lockwrite  # noqa: F401


def import_models() -> None:
    """Import envlock's models without pydantic's plugin scan.

    Pydantic looks for plugins through the entry points of every installed distribution when
    the first model class is built (~46 us each); envlock's own models need none, so the scan
    is skipped for them. get_plugins() caches nothing while disabled, so models a training
    script defines later still get their plugins.
    """
    if "envlock.model" not in sys.modules:
        previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        try:
            import envlock.model  # noqa: F401
        finally:
            if previous is None:
                del os.environ["PYDANTIC_DISABLE_PLUGINS"]
            else:
                os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous
