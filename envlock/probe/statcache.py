"""Files the probe would otherwise parse on every run, remembered by their stat: what each
RECORD yields, the OS package database, and which OS package owns a system distribution.

Stdlib only, Python >= 3.8. Entries live in the probe's cache directory (``cache_dir``), next
to the torch facts (``cache``).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import ospkgs
from .files import atomic_json, read_regular, sha256
from .packages import MAX_RECORD, record_libraries, record_sha256

RECORDS_FORMAT = 3  # 1: [size, mtime_ns, ino, digest] for big RECORDs only; 2: scans listed any ".so" in a name


def cache_dir() -> str:
    """``$ENVLOCK_CACHE_DIR``, else ``$XDG_CACHE_HOME/envlock``, else ``~/.cache/envlock``."""
    override = os.environ.get("ENVLOCK_CACHE_DIR")
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "envlock")


def file_cache_allowed() -> bool:
    """Whether a training process's probe may remember what it learnt of files by their stat
    (the hashes of libraries no package vouches for; never its torch facts, which are live):
    unless ``$ENVLOCK_NO_CACHE`` says to trust no cache."""
    return not os.environ.get("ENVLOCK_NO_CACHE")


# ---------------------------------------------------------------------------------------------
# Whose cache. An entry vouches for a file (its hash, its torch build, its packages), so it is
# trusted only when the caller wrote it: the cache directory, every directory between it and an
# entry, and the entry itself must be the caller's own and writable by nobody else. A shared or
# world-writable directory (``ENVLOCK_CACHE_DIR=/shared`` with mode 0777) is neither read nor
# written: another user could plant or swap entries there. Each entry also names what it
# describes (its key, its file's stat), so an entry of ours moved under another name is a miss.
# ---------------------------------------------------------------------------------------------


def private(st: os.stat_result) -> bool:
    """The caller's own and writable by no one else (POSIX only: elsewhere caches are off)."""
    return hasattr(os, "getuid") and st.st_uid == os.getuid() and not st.st_mode & 0o022


def refusal(directory: Optional[str] = None, path: Optional[str] = None) -> Optional[str]:
    """Why the cache directory (and every directory from it down to ``path``'s parent) cannot
    be trusted, or None when it can. A missing directory is no refusal: it will be ours."""
    root = os.path.abspath(directory or cache_dir())
    dirs = [root]
    if path is not None:
        parent = os.path.dirname(os.path.abspath(path))
        while parent != root and parent.startswith(root + os.sep):
            dirs.append(parent)
            parent = os.path.dirname(parent)
    for one in dirs:
        try:
            st = os.stat(one)  # a link to a directory of one's own is one's own
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            return "%s is not a directory" % one
        if not hasattr(os, "getuid"):
            return "no file ownership on this system"
        if st.st_uid != os.getuid():
            return "%s belongs to uid %d, not to this user" % (one, st.st_uid)
        if st.st_mode & 0o022:
            return "%s is writable by other users (mode %o)" % (one, stat.S_IMODE(st.st_mode))
    return None


def read_cache(path: str, limit: int, directory: Optional[str] = None) -> Optional[bytes]:
    """The bytes of the cache entry ``path`` when the caller owns it and its directories (see
    above), it is a regular file (not a link, not a FIFO) and at most ``limit`` bytes; else
    None. The one check every cache reader goes through."""
    if refusal(directory, path) is not None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not private(st) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(limit + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return data if len(data) <= limit else None


def write_cache(path: str, data: Any, directory: Optional[str] = None) -> bool:
    """``atomic_json`` into a cache directory that passes the check above (created private when
    missing); False, writing nothing, when it does not."""
    missing = []
    parent = os.path.dirname(os.path.abspath(path))
    while parent != os.path.dirname(parent) and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    try:
        for one in reversed(missing):  # each level private (makedirs gives only the last one)
            try:
                os.mkdir(one, 0o700)
            except FileExistsError:
                pass
    except OSError:
        return False
    if refusal(directory, path) is not None:
        return False
    return atomic_json(path, data)


def prune(prefix: str, keep: int, directory: Optional[str] = None) -> None:
    """Remove the oldest files named ``prefix*`` in ``directory`` (default: the cache
    directory) beyond the newest ``keep``. Never raises."""
    directory = directory or cache_dir()
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
        if len(names) <= keep:
            return
        stamped = []
        for name in names:
            path = os.path.join(directory, name)
            try:
                stamped.append((os.stat(path).st_mtime_ns, path))
            except OSError:
                continue  # pruned by another run meanwhile
        for _, old in sorted(stamped)[:len(stamped) - keep]:
            os.unlink(old)
    except OSError:
        pass  # another run pruned the same entry first


def scan_record(path: str) -> Optional[Tuple[str, List[str]]]:
    """(sha256 of a RECORD, the shared libraries it lists inside site-packages), or None."""
    try:
        data = read_regular(path, MAX_RECORD)  # a regular file, bounded (files.py)
    except OSError:
        return None
    return sha256(data).hexdigest(), record_libraries(data)


# ---------------------------------------------------------------------------------------------
# Stat-keyed entries: a file's parsed form, reused while the file is provably the same file.
#
# The key is (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns). Any write, truncation, chmod
# or rename moves the ctime to the current time, which user space cannot set (``touch`` sets
# mtime and atime, not ctime), and a file replaced by a rename (dpkg writes ``status-new`` and
# renames it over ``status``; installers rewrite RECORD) has a new inode or a new ctime even when
# its inode number is reused. What is left is the timestamp granularity: two changes within one
# clock tick leave the same stat. So, as git does with racily clean index entries, a file is
# remembered only when it last changed more than SETTLE_NS before it was read; a change after
# the read gets a later ctime, so an entry never outlives its file. Such a file is simply read
# again on the next run.
# ---------------------------------------------------------------------------------------------

SETTLE_NS = 3 * 10**9  # above the coarsest timestamp granularity in use (FAT: 2 s)

# "Now" in nanoseconds since the epoch, the scale of st_mtime_ns and st_ctime_ns. Each stat-keyed
# cache takes its clock as a parameter, so a test can run the racy rule at any instant.
Clock = Callable[[], int]


def stat_key(st: os.stat_result) -> List[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(st: os.stat_result, now_ns: Clock = time.time_ns) -> bool:
    """True when the file last changed long enough ago that its stat identifies its content."""
    return now_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_NS


def _valid_key(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 5 and all(type(v) is int for v in value)


def read_entry(path: str, limit: int, directory: Optional[str] = None,
               **expected: Any) -> Optional[Dict[str, Any]]:
    """The JSON object of the cache entry at ``path`` when each of ``expected`` holds its value
    there (the entry's format, the key it was written under); None when it is missing,
    unreadable, corrupt, too big, not the caller's own (``read_cache``) or another entry. The
    one reader of a JSON cache entry: each caller checks only its own fields."""
    data = read_cache(path, limit, directory)
    if data is None:
        return None
    try:
        entry = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
        return None
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in expected.items()):
        return None
    return entry


class RecordDigests:
    """What the probe derives from RECORD files, remembered by their stat (see above).

    ``record_sha256`` of every distribution (torch's RECORD alone is ~15,000 lines, read and
    sorted on every run otherwise; reading a stat is far less than reading the file), and for the
    torch-facts key the raw sha256 and the shared libraries a RECORD lists (``scan``).
    One file per interpreter. ``now_ns``: the clock of the racy rule (see above).
    """

    MAX_BYTES = 1 << 24

    def __init__(self, now_ns: Clock = time.time_ns) -> None:
        self.now_ns = now_ns
        h = sha256(("%s\0%s" % (sys.prefix, sys.executable)).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(cache_dir(), "records-%s.json" % h.hexdigest()[:32])
        self.entries: Dict[str, List[Any]] = {}
        self.scans: Dict[str, List[Any]] = {}
        self.used: Set[str] = set()
        self.dirty = False
        data = read_entry(self.path, self.MAX_BYTES)
        if isinstance(data, dict) and data.get("format") == RECORDS_FORMAT:
            for name, store in (("entries", self.entries), ("scans", self.scans)):
                found = data.get(name)
                if isinstance(found, dict):
                    store.update(found)

    def _lookup(self, store: Dict[str, List[Any]], path: str, size: int
                ) -> "Tuple[Optional[os.stat_result], Optional[List[Any]]]":
        self.used.add(path)
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        entry = store.get(path)
        if isinstance(entry, list) and len(entry) == size + 1 and _valid_key(entry[0]) \
                and entry[0] == stat_key(st):
            return st, entry[1:]
        return st, None

    def __call__(self, path: str) -> Optional[str]:
        st, hit = self._lookup(self.entries, path, 1)
        if st is None:
            return None
        if hit is not None and isinstance(hit[0], str):
            return hit[0]
        digest = record_sha256(path)
        if digest is not None and settled(st, self.now_ns):
            self.entries[path] = [stat_key(st), digest]
            self.dirty = True
        return digest

    def scan(self, path: str) -> Optional[Tuple[str, List[str]]]:
        """``scan_record(path)``, remembered."""
        st, hit = self._lookup(self.scans, path, 2)
        if st is None:
            return None
        if hit is not None and isinstance(hit[0], str) and isinstance(hit[1], list) \
                and all(isinstance(x, str) for x in hit[1]):
            return hit[0], hit[1]
        found = scan_record(path)
        if found is not None and settled(st, self.now_ns):
            self.scans[path] = [stat_key(st), found[0], found[1]]
            self.dirty = True
        return found

    def save(self) -> None:
        """Write the entries when one was added; those of RECORDs that are gone (a distribution
        upgraded or removed) are dropped then, so the file does not grow with every upgrade."""
        if not self.dirty:
            return
        for store in (self.entries, self.scans):
            for path in [p for p in store if p not in self.used and not os.path.exists(p)]:
                del store[path]
        write_cache(self.path, {"format": RECORDS_FORMAT, "entries": self.entries,
                                "scans": self.scans})
        self.dirty = False


# ---------------------------------------------------------------------------------------------
# OS package database: dpkg's status file (one stanza per package, hundreds of them) or apk's
# installed file, remembered by its stat (see above). rpm has no such file (a BerkeleyDB or
# SQLite database with a journal, read through ``rpm -qa``) and is always asked.
# ---------------------------------------------------------------------------------------------

OSPKGS_FORMAT = 1
OWNERS_MAX_ENTRIES = 16
_PKG_FIELDS = ("name", "version", "arch", "source")


def _parser_digest() -> str:
    """The parser is part of the key: a newer ospkgs.py may read the same file differently."""
    try:
        with open(ospkgs.__file__, "rb") as fh:
            return sha256(fh.read()).hexdigest()
    except (OSError, TypeError):
        return "unknown:%s" % time.time()  # unreadable: never reuse


def _spec_list_re() -> "re.Pattern[str]":
    # The entry's pins, one per line, are checked as one string: what ospkgs.spec() returns.
    return re.compile("(?:%s\n)*%s" % (ospkgs.SPEC_PATTERN, ospkgs.SPEC_PATTERN))


def database_from_entry(entry: Any, key: List[Any], root: str) -> Optional[ospkgs.Database]:
    """The database an entry holds; None unless it is exactly the shape written for ``key``."""
    if not isinstance(entry, dict) or entry.get("format") != OSPKGS_FORMAT \
            or entry.get("key") != key:
        return None
    manager, packages, dirs = entry.get("manager"), entry.get("packages"), entry.get("apk_dirs")
    specs = entry.get("specs")
    if manager not in ("dpkg", "apk") or type(packages) is not list or type(specs) is not list:
        return None
    fields, required = set(_PKG_FIELDS), set(_PKG_FIELDS[:3])
    for pkg in packages:
        if type(pkg) is not dict or not fields.issuperset(pkg) or not required <= pkg.keys():
            return None
        for value in pkg.values():
            if type(value) is not str:
                return None
    if specs and not (all(type(x) is str for x in specs)
                      and _spec_list_re().fullmatch("\n".join(specs))):
        return None
    if manager == "apk":
        if not isinstance(dirs, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in dirs.items()):
            return None
    elif dirs is not None:
        return None
    return ospkgs.Database(manager, packages, root, dirs, specs)


def load_os_packages(root: str = "/", run: Optional[ospkgs.Runner] = None,
                     now_ns: Clock = time.time_ns) -> Optional[ospkgs.Database]:
    """``ospkgs.load(root, run)``, remembered by the stat of the file it reads; ``now_ns`` is
    the clock of the racy rule, for this file and for the owners (``dpkg_owners``).

    Both database files are keyed (present or absent): ``load`` reads dpkg's when there is one,
    else apk's, so the pair decides what it reads.
    """
    stats: List[Optional[os.stat_result]] = []
    for rel in (ospkgs.DPKG_STATUS, ospkgs.APK_INSTALLED):
        try:
            stats.append(os.stat(os.path.join(root, rel)))
        except OSError:
            stats.append(None)
    if all(st is None for st in stats):
        return ospkgs.load(root, run)
    key: List[Any] = [root, _parser_digest(), [stat_key(st) if st else None for st in stats]]
    digest = sha256(root.encode("utf-8", "surrogateescape")).hexdigest()
    path = os.path.join(cache_dir(), "ospkgs-%s.json" % digest[:32])
    db = database_from_entry(read_entry(path, 1 << 26), key, root)
    if db is None:
        db = ospkgs.load(root, run)
        if db is not None and db.manager in ("dpkg", "apk") \
                and all(settled(st, now_ns) for st in stats if st is not None):
            write_cache(path, {"format": OSPKGS_FORMAT, "key": key, "manager": db.manager,
                               "packages": db.packages, "apk_dirs": db.apk_dirs,
                               "specs": db.specs()})
    if db is not None:
        db.dpkg_owners = lambda info_dir, wanted, kind: dpkg_owners(info_dir, wanted, now_ns, kind)
    return db


def _owners_key(info_dir: str, wanted: Set[str], kind: Tuple[bytes, str] = ospkgs.DISTRIBUTIONS
                ) -> Tuple[str, List[Any]]:
    names = sorted(wanted)
    how = [kind[0].decode("ascii"), kind[1]]  # the scan's order decides which lists it reads
    digest = sha256(json.dumps([info_dir, names, how]).encode("utf-8")).hexdigest()
    return (os.path.join(cache_dir(), "ospkgs-owners-%s.json" % digest[:32]),
            [info_dir, _parser_digest(), names, how])


def owners_from_entry(entry: Any, key: List[Any], info_dir: str) -> Optional[Dict[str, str]]:
    """The answer an entry holds when it is for ``key`` and the directory and every list it
    read have the stat they had; else None."""
    if not isinstance(entry, dict) or entry.get("format") != OSPKGS_FORMAT or entry.get("key") != key:
        return None
    listing, reads, found = entry.get("dir"), entry.get("reads"), entry.get("found")
    if not _valid_key(listing) or not isinstance(reads, list) or not isinstance(found, dict):
        return None
    wanted = set(key[2])
    if not all(isinstance(v, str) and k in wanted for k, v in found.items()):
        return None
    try:
        if stat_key(os.stat(info_dir)) != listing:
            return None
        for item in reads:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and "/" not in item[0] and _valid_key(item[1])):
                return None
            if stat_key(os.stat(os.path.join(info_dir, item[0]))) != item[1]:
                return None
    except OSError:
        return None
    return found


def dpkg_owners(info_dir: str, wanted: Set[str], now_ns: Clock = time.time_ns,
                kind: Tuple[bytes, str] = ospkgs.DISTRIBUTIONS) -> Dict[str, str]:
    """``ospkgs.dpkg_owners``, remembered by the stat of dpkg's info directory (a list added or
    removed changes it) and of every list the scan read (the scan stops at the last one it
    needs, so the lists after it cannot change the answer). A system Python's capture on a
    desktop-sized Debian would otherwise read a few hundred lists on every run."""
    path, key = _owners_key(info_dir, wanted, kind)
    found = owners_from_entry(read_entry(path, 1 << 24), key, info_dir)
    if found is not None:
        return found
    try:
        listing = os.stat(info_dir)
    except OSError:
        return ospkgs.dpkg_owners(info_dir, wanted, kind=kind)
    reads: List[Tuple[str, Optional[os.stat_result]]] = []
    found = ospkgs.dpkg_owners(info_dir, wanted, reads, kind)
    done = [(name, st) for name, st in reads if st is not None]
    if len(done) == len(reads) and settled(listing, now_ns) \
            and all(settled(st, now_ns) for _, st in done) \
            and write_cache(path, {"format": OSPKGS_FORMAT, "key": key, "dir": stat_key(listing),
                                   "reads": [[name, stat_key(st)] for name, st in done],
                                   "found": found}):
        # One per set of system distributions, and one per process's set of system libraries.
        prune("ospkgs-owners-", OWNERS_MAX_ENTRIES)
    return found
