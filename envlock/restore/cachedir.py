"""What restore keeps in envlock's cache, who is using it, and pruning it (``envlock cache``).

Restore's part of the cache (``restore.cache_dir()``) holds five kinds of entry, each a copy or
a by-product that the next restore makes again when it is gone:

* ``packs/pack-<key>/``: a pack's ``.tar`` unpacked (the tar itself stays where it is);
* ``<name>-<id>/``: a build context with its logs (an offline one holds every wheel);
* ``envlock-wheel/*.whl``: wheels of the running envlock (``ownwheel``);
* ``uv/<sha256 of the wheel>/``: uv binaries taken from packs (``uvbin``);
* ``inside/``: the checks inside restored images, kept per image id (``inside``), one entry for
  all of them; without it the next restore or run of each image checks it again.

``options/`` (``commands._recording.REMEMBERED``) is state, not an entry: the options of the last
``envlock restore`` of each lock, which ``run`` reuses; a few bytes each, kept by ``prune``.
``charliecloud/`` is left out: its directory images are restored environments, not a cache,
and its storage is ch-image's (``ch-image reset`` empties it).

Who is using it is said with ``flock`` on the directories themselves: no lock file to clean up,
and a lock dies with its process, however the process ends.

* A command that restores, and ``run`` of a pack (its unpacked files and the compile cache
  mounted from them are the running job's), holds the whole cache shared for as long as it runs (``in_use``);
  ``prune`` needs it exclusive and refuses while a restore runs, so it never removes a pack or
  a build context from under one.
* A restore holds its build context exclusive while it looks for its image, writes the context
  and builds (``hold``): a second restore of the same lock at the same time waits, then finds
  the first one's image instead of rewriting the context under its build.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from envlock.errors import EnvlockError

PACKS = "packs"
OWN_WHEELS = "envlock-wheel"
UV = "uv"
CHECKS = "inside"  # ``inside.DIRECTORY``
# <name>-<short id>: image_name's characters, then the lock's 12 hex digits.
_CONTEXT = re.compile(r"[a-z0-9-]+-(?:[0-9a-f]{12}|unsealed)")
_PACK = re.compile(r"pack-[0-9a-f]{16}")
# An unpack that was interrupted (``packdir``): a private temporary directory.
_PARTIAL = re.compile(r"\.pack-[0-9a-f]{16}\..*\.tmp")


@dataclass(frozen=True)
class Entry:
    kind: str  # "pack", "context", "envlock wheel", "uv", "partial unpack", "kept checks"
    path: Path
    size: int  # bytes of its files, each hard-linked file counted once
    mtime: float  # last use: a restore touches what it reuses


def _size(path: Path, seen: set[tuple[int, int]]) -> int:
    """Bytes of the files under ``path`` (not following links), each inode counted once: a build
    context hard-links its wheels from an unpacked pack."""
    total = 0
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            st = top.lstat()
        except OSError:
            continue
        if top.is_dir() and not top.is_symlink():
            with contextlib.suppress(OSError):
                stack.extend(top.iterdir())
        elif (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def entries(root: Path) -> list[Entry]:
    """Every entry of restore's cache at ``root``, largest first."""
    found: list[tuple[str, Path]] = []

    def children(directory: Path) -> list[Path]:
        try:
            return sorted(directory.iterdir())
        except OSError:
            return []

    for path in children(root / PACKS):
        if path.is_dir() and not path.is_symlink():
            if _PACK.fullmatch(path.name):
                found.append(("pack", path))
            elif _PARTIAL.fullmatch(path.name):
                found.append(("partial unpack", path))
    for path in children(root / OWN_WHEELS):
        if path.name.endswith(".whl") and path.is_file() and not path.is_symlink():
            found.append(("envlock wheel", path))
    for path in children(root / UV):
        if path.is_dir() and not path.is_symlink():
            found.append(("uv", path))
    for path in children(root):
        if _CONTEXT.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
            found.append(("context", path))
        elif path.name == CHECKS and path.is_dir() and not path.is_symlink():
            found.append(("kept checks", path))
    seen: set[tuple[int, int]] = set()
    out = []
    for kind, path in found:
        with contextlib.suppress(OSError):
            out.append(Entry(kind, path, _size(path, seen), path.lstat().st_mtime))
    return sorted(out, key=lambda e: (-e.size, str(e.path)))


def touch(path: Path) -> None:
    """Mark the entry ``path`` used now (``prune --older-than`` counts from the last use)."""
    with contextlib.suppress(OSError):
        os.utime(path)


@contextlib.contextmanager
def hold(path: Path, *, exclusive: bool = False,
         waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Lock the directory ``path`` for as long as the block runs: shared (others may hold it
    shared too) or exclusive. When another holder keeps it, ``waiting`` is called once and the
    lock is waited for (Ctrl-C interrupts the wait)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def in_use(root: Path, say: Callable[[str], None]) -> Iterator[None]:
    """The cache at ``root`` is used by a restore for as long as the block runs (see above).
    A cache that cannot be made (a read-only home) is not locked: nothing can be pruned there,
    and a restore that needs it says so where it writes."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            root.mkdir(parents=True, exist_ok=True)
            stack.enter_context(hold(root, waiting=lambda: say("waiting for `envlock cache prune` to finish")))
        yield


def prune(root: Path, *, older_than: float | None = None, now: float | None = None,
          dry_run: bool = False) -> list[Entry]:
    """Remove the entries not used for ``older_than`` seconds (all of them when None); the
    entries removed (with ``dry_run``: that would be). Refuses while a restore uses the cache."""
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvlockError(f"an envlock restore or a run of a pack is using the cache {root} right now; "
                               "nothing was removed",
                               hint="prune again when it has finished") from None
        old = [e for e in entries(root) if older_than is None or now - e.mtime >= older_than]
        if not dry_run:
            for entry in old:
                if entry.path.is_dir():
                    shutil.rmtree(entry.path)
                else:
                    entry.path.unlink()
        return old
    finally:
        os.close(fd)
