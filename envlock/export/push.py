"""``envlock restore LOCK --push REGISTRY/REPO``: the verified image, where a cluster can pull it.

Tagged ``REPO:<short id>`` and pushed; what is printed (and given to ``export --image``) is
``REPO@sha256:...``, the registry's manifest digest, so every node runs the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envlock.errors import EnvlockError, UsageError
from envlock.lock import Lock

if TYPE_CHECKING:
    from envlock.restore.engine import ContainerEngine


def push(engine: ContainerEngine, image_id: str, repo: str, lock: Lock) -> str:
    from envlock.restore import values

    try:
        name, tag, digest = values.split_ref(repo)
    except EnvlockError as exc:
        raise UsageError(f"--push: {exc.message}") from None
    if tag or digest or "/" not in name:
        raise UsageError(f"--push {repo}: give REGISTRY/REPO without a tag or digest "
                         f"(the tag is the lock's id, {lock.short_id})")
    pushed = engine.push(image_id, name, lock.short_id)
    values.digest(pushed)
    return f"{name}@{pushed}"
