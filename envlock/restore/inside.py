"""The check inside a restored image, kept per image: the probe runs in an image once, not on
every ``restore`` that finds it in the cache nor before every ``run``.

What the probe prints inside a container depends on the image, the probe, the lock it answers
for and the host the container runs on; the entry keeping it is keyed by all of them:

* the engine's image id. Docker and Podman name an image by the digest of its configuration,
  which names every layer by the digest of its content: one id is one set of files and
  settings, and whatever changes them (a rebuild, ``docker commit`` over the tag, a layer
  pulled again with other content) makes another id, so another key. Charliecloud's directory
  images can be edited in place under the same name: nothing is kept for them;
* the lock's integrity (every field of it: an edited and re-sealed lock is another key) and
  envlock's version, whose comparator gave the verdict ``run`` reads back;
* the probe's digest (its files): a probe that reads more must look again;
* the engine's kind and this host's ``uname`` (name, kernel release and build, machine): a
  container sees the host's kernel and CPU, which the probe records. An engine on another
  machine (``DOCKER_HOST=tcp://...``) is taken to stay as it was; ``ENVLOCK_NO_CACHE=1`` makes
  the check run again (its result is kept).

An entry holds the probe's document, when it ran, what the restore changed on purpose
(``Restored``), the image's interpreter and the verdict. ``restore`` judges the document again
(the report is today's comparator's); ``run`` reads the verdict. Entries are read and written
through the probe's cache rules (``probe.statcache``: the caller's own private directory,
regular files only, atomic writes, bounded reads); an entry that is missing, unreadable,
corrupt, not the caller's own, or keyed otherwise is a miss, and an entry that cannot be
written is no entry: the check simply runs the next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock._version import __version__
from envlock.drift.expected import Restored

if TYPE_CHECKING:
    from envlock.lock import Header, Lock

FORMAT = 1
DIRECTORY = "inside"  # under restore's part of the cache (``restore.cache_dir``); ``cachedir.CHECKS``
PREFIX = "check-"
KEEP = 256  # entries kept; the oldest beyond are removed when one is written
MAX_BYTES = 16 * 1024 * 1024  # a lock's own bound (``lock.MAX_LOCK_BYTES``)
# Engines whose image ids are content digests (see above).
CONTENT_ADDRESSED = ("docker", "podman")


@dataclass(frozen=True)
class Kept:
    """What an earlier check inside the image found."""

    checked_at: str  # when the probe ran, UTC, ISO 8601
    python: str  # the interpreter the probe ran with: the image's
    restored: Restored
    document: dict[str, Any]  # what the probe printed inside the image
    ok: bool  # the verdict of envlock ``__version__``'s comparator


def _directory() -> Path:
    from envlock.probe.statcache import cache_dir

    return Path(cache_dir()) / "restore" / DIRECTORY


def key(engine: str, lock: Lock | Header, image_id: str) -> str | None:
    """The entry's key (see the module's docstring); None where nothing is kept: an engine
    whose ids name no content, a lock without its integrity hash."""
    from envlock.probe.source import digest

    integrity = lock.envlock.integrity
    if engine not in CONTENT_ADDRESSED or not integrity or not image_id.startswith("sha256:"):
        return None
    material = {"format": FORMAT, "image": image_id, "lock": integrity, "probe": digest(),
                "engine": engine, "host": list(os.uname()), "envlock": __version__}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _path(entry_key: str) -> Path:
    return _directory() / f"{PREFIX}{entry_key[:40]}.json"


def find(engine: str, lock: Lock | Header, image_id: str) -> Kept | None:
    """The earlier check inside ``image_id`` for ``lock``, or None (never raises). ``run``'s fast
    path asks with the sealed header: an entry was kept by a restore that read the lock through
    the models, so one found for the header's integrity is a lock ``load()`` accepted."""
    from envlock.probe.statcache import file_cache_allowed, read_entry

    entry_key = key(engine, lock, image_id)
    if entry_key is None or not file_cache_allowed():
        return None
    entry = read_entry(str(_path(entry_key)), MAX_BYTES, format=FORMAT, key=entry_key)
    if entry is None:
        return None
    checked_at, python, doc, ok = (entry.get(k) for k in ("checked_at", "python", "document", "ok"))
    restored = Restored.from_json(entry["restored"]) if isinstance(entry.get("restored"), str) else None
    if (not isinstance(checked_at, str) or not isinstance(python, str) or not isinstance(doc, dict)
            or not isinstance(ok, bool) or restored is None
            or restored.fingerprint != lock.envlock.fingerprint):
        return None
    with contextlib.suppress(OSError):
        os.utime(_directory())  # used now: `envlock cache prune --older-than` counts from here
    return Kept(checked_at=checked_at, python=python, restored=restored, document=doc, ok=ok)


def keep(engine: str, lock: Lock, image_id: str, *, python: str, restored: Restored,
         document: dict[str, Any], ok: bool) -> bool:
    """Keep what the check inside ``image_id`` found; False when nothing was written (an
    engine or lock whose checks are not kept, a cache directory that cannot be written)."""
    from envlock.probe.statcache import prune, write_cache

    entry_key = key(engine, lock, image_id)
    if entry_key is None:
        return False
    entry = {"format": FORMAT, "key": entry_key, "image": image_id,
             "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": python,
             "restored": restored.to_json(), "document": document, "ok": ok}
    written = write_cache(str(_path(entry_key)), entry)
    if written:
        prune(PREFIX, KEEP, str(_directory()))
    return written
