"""The ``--deep`` file-hash cache: a file is re-hashed only when its stat says it may have changed.

Re-hashing a CPU torch venv (~17,600 files, ~0.9 GB) keeps every core busy for most of a
second; stat-ing the same files takes a tenth of that. Like git's index and rsync's quick check,
a file whose ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` is still the one recorded
when it was last hashed is taken to hold the bytes it held then.

What the stat check trusts. mtime alone proves nothing: ``touch -d`` or ``os.utime`` sets it to
any value, so an edit followed by a restored mtime would pass. ctime cannot be chosen: every
write, rename, chmod or utime sets it to the kernel's *now*. An edited file therefore keeps its
recorded ctime only if the clock was turned back to that instant (root), the disk was written
behind the kernel's back (``debugfs``, an image edited offline), or a disk image holding both the
files and this cache was restored. Device and inode catch a file replaced by another one (an
editor's save-by-rename, a reinstall) with the same size and times. ``--no-cache`` reads none
of it and re-hashes every file. POSIX only: elsewhere ``st_ctime`` is the creation time, which a
write leaves alone, so there the cache is off.

Racy entries, as git's "racy clean" index entries. A file written in the same timestamp tick as
its stat can be written again within that tick with the same size: same stat, other bytes. Every
file is stat-ed before any is read, and an entry is stored only when the file's mtime and ctime
are older than the moment the check started by ``RACY_NS``: the window of the probe's other
stat-keyed caches (``statcache.SETTLE_NS``, 3 s), above the coarsest granularity in common use
(FAT/exFAT mtimes: 2 s; 1 s on ext3, HFS+ and some NFS servers; one kernel tick on ext4, xfs,
btrfs). Anything written later gets a ctime at least that much newer than the stored one. A
racy file is simply hashed again next time, and stored then.

One JSON file per environment (``sys.prefix`` and its site directories, hashed into the name),
beside the torch facts: json because its C parser reads a torch venv's 17,600 entries (3.5 MB)
faster than a line format split in Python, and a file someone else wrote cannot run code (pickle and marshal are out). Written through a temp file and a rename (last
writer wins, never a torn file); a file that is unreadable, truncated, of another format or
shape is ignored and rewritten; one another user owns or could write, or in a directory that
is not the caller's own, is neither read nor written (``statcache.read_cache``). Stdlib only, Python >= 3.8; never
raises.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .statcache import SETTLE_NS, Clock, cache_dir, prune, read_entry, stat_key, write_cache

FORMAT = 1
KIND = "envlock-file-hashes"
RACY_NS = SETTLE_NS
# A CUDA torch venv lists ~25,000 files; beyond this many the biggest (dearest to re-hash) stay.
MAX_ENTRIES = 200000
MAX_BYTES = 64 << 20
MAX_ENVIRONMENTS = 32  # files of other environments (older venvs, test runs): the newest stay
_PREFIX = "filehashes-"
_SHA = "sha256="


def cache_path(sites: Sequence[str], directory: Optional[str] = None) -> str:
    key = "\0".join([sys.prefix, *sorted(set(sites))])
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(directory or cache_dir(), "%s%s.json" % (_PREFIX, name))


def load(path: str, prefix: str, sites: List[str]) -> Dict[str, Any]:
    """The entries of ``path``; empty for a missing, unreadable, oversized or foreign file, or
    one another user owns.

    Entries are checked one by one where they are used (``FileHashes.lookup``), not here:
    one pass over 25,000 of them would cost as much as the parse."""
    # Someone else's file (planted in a shared $ENVLOCK_CACHE_DIR) could vouch for any edited
    # file: only the caller's own, in a directory of its own, is read (``read_cache``).
    data = read_entry(path, MAX_BYTES, os.path.dirname(path), kind=KIND, format=FORMAT, prefix=prefix,
                      sites=sites)
    if data is None:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


class FileHashes:
    """The stat cache of one ``--deep`` check: ``lookup`` all paths, ``store`` what was hashed,
    then ``save``.

    ``read=False`` (``--no-cache``): nothing is taken from the file, every path is hashed, and
    the file is rewritten with the fresh hashes. ``state`` says which it was for the report.
    ``now_ns`` is the clock that decides which entries are racy (the start of the check).
    """

    def __init__(self, sites: Sequence[str], read: bool = True, directory: Optional[str] = None,
                 racy_ns: int = RACY_NS, now_ns: Clock = time.time_ns) -> None:
        self.sites = sorted(set(sites))
        self.now_ns = now_ns
        self.path = cache_path(self.sites, directory)
        self.racy_ns = racy_ns
        self.enabled = os.name == "posix"
        self.read = read and self.enabled
        self.state = "off" if not self.enabled else "used" if read else "ignored"
        self.loaded: Dict[str, Any] = {}  # read by lookup, inside the check's timing
        # What the next save writes: entries confirmed by this check, then fresh ones.
        self.keep: Dict[str, List[Any]] = {}
        self.fresh = 0
        self.paths: Sequence[str] = ()
        self.sigs: List[Optional[List[int]]] = []
        self.start_ns = 0

    def lookup(self, paths: Sequence[str]) -> List[Optional[str]]:
        """Stat every path, before any is read; each one's stored hash when its stat is the
        stored one, else None (hash it)."""
        if self.read:
            self.loaded = load(self.path, sys.prefix, self.sites)
        self.start_ns = self.now_ns()
        self.paths = paths
        found: List[Optional[str]] = [None] * len(paths)
        if not self.enabled:
            self.sigs = [None] * len(paths)
            return found
        sigs: List[Optional[List[int]]] = []
        get, keep, stat = self.loaded.get, self.keep, os.stat
        for i, path in enumerate(paths):
            try:
                st = stat(path)
            except (OSError, ValueError):  # ValueError: a NUL in a RECORD path
                sigs.append(None)
                continue
            sig = stat_key(st)
            sigs.append(sig)
            entry = get(path)
            if (type(entry) is list and len(entry) == 6 and entry[:5] == sig
                    and type(entry[5]) is str):
                found[i] = _SHA + entry[5]
                keep[path] = entry
        self.sigs = sigs
        return found

    def store(self, indices: Sequence[int], digests: Sequence[str]) -> None:
        """Remember the hashes just taken of ``paths[i]``, except racy ones and failures."""
        if not self.enabled:
            return
        safe = self.start_ns - self.racy_ns
        for i, digest in zip(indices, digests):  # noqa: B905 (3.8)
            sig = self.sigs[i]
            if sig is None or not digest.startswith(_SHA) or max(sig[3], sig[4]) >= safe:
                continue
            self.keep[self.paths[i]] = [*sig, digest[len(_SHA):]]
            self.fresh += 1

    def save(self) -> bool:
        """Write the file when it would change: new hashes, or entries of files that are gone,
        changed or no longer listed (dropped here). True when written."""
        if not self.enabled or (self.read and not self.fresh and len(self.keep) == len(self.loaded)):
            return False
        entries = _bounded(self.keep)
        doc = {"kind": KIND, "format": FORMAT, "prefix": sys.prefix, "sites": self.sites,
               "entries": entries}
        if not write_cache(self.path, doc, os.path.dirname(self.path)):
            return False
        prune(_PREFIX, MAX_ENVIRONMENTS, os.path.dirname(self.path))
        return True


def _bounded(entries: Dict[str, List[Any]]) -> Dict[str, List[Any]]:
    """At most MAX_ENTRIES, and few enough that ``load`` reads the file back (MAX_BYTES, paths
    estimated at their longest JSON escaping); the biggest files, dearest to re-hash, stay."""
    def cost(path: str) -> int:
        return 160 + len(path) * (1 if path.isascii() else 12)

    if len(entries) <= MAX_ENTRIES and sum(map(cost, entries)) <= MAX_BYTES:
        return entries
    out: Dict[str, List[Any]] = {}
    total = 0
    for path in sorted(entries, key=lambda p: -entries[p][2])[:MAX_ENTRIES]:
        total += cost(path)
        if total > MAX_BYTES:
            break
        out[path] = entries[path]
    return out
