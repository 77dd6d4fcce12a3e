"""``export --to intoto``: an in-toto Statement v1 whose predicate is the lock.

The subject is the lock file itself (its sha256), plus the image the lock was restored into
when its digest is known. The statement is unsigned: sign it with cosign, sigstore or GitHub's
attest action (README, "Attach and share"). A lock's own fingerprint seals nothing against
someone who edits it and recomputes sha256; only a signature binds it to a signer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envlock.lock import Lock

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# The project's predicate type: the lock, as `envlock show --format json` prints it.
PREDICATE_TYPE = "https://envlock.dev/attestation/lock/v1"


def statement(lock: Lock, lock_path: Path, *, image: str | None = None) -> dict[str, Any]:
    data = Path(lock_path).read_bytes()
    subjects: list[dict[str, Any]] = [
        {"name": Path(lock_path).name, "digest": {"sha256": hashlib.sha256(data).hexdigest()}}]
    ref = image
    if ref is None and lock.image.reference and lock.image.digest:
        from envlock.errors import UsageError
        from envlock.export.common import pinned_image

        try:
            ref = pinned_image(lock, None)
        except UsageError:
            ref = None
    if ref and "@sha256:" in ref:
        name, _, digest = ref.partition("@sha256:")
        subjects.append({"name": name, "digest": {"sha256": digest}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": lock.model_dump(mode="json", exclude_none=True),
    }


def render(lock: Lock, lock_path: Path, *, image: str | None = None) -> str:
    return json.dumps(statement(lock, lock_path, image=image), indent=2, sort_keys=False) + "\n"
