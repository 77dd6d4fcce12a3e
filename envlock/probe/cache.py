"""Caches of the probe: the torch facts, and the digests of big RECORD files.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from . import ospkgs, source
from .files import atomic_json, read_text, sha256
from .packages import path_entries, record_sha256
from .rules import canonicalize_name

TYPE_CHECKING = False  # typing is imported by the type checker only, see rules.py
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

# ---------------------------------------------------------------------------------------------
# Torch facts cache: what ``import torch`` would tell, reused while nothing it depends on moved.
#
# Importing torch is most of a capture (seconds on a GPU box) and its answers - version, CUDA,
# cuDNN, NCCL, build flags, and the flags a *fresh* interpreter starts with - change only when
# torch's or its CUDA libraries' files change, or a variable, the CPU or the driver does. Those
# inputs are hashed into a key; a hit skips the import. Used only by the probe run as a program
# (CLI capture/verify), whose torch state is a fresh interpreter's by construction; a training
# process (``envlock.capture()``) reads its own live flags and never uses it. Seeds are never
# cached: a seed set through envlock makes the run live.
# ---------------------------------------------------------------------------------------------

CACHE_FORMAT = 1
RECORDS_FORMAT = 2  # 1: [size, mtime_ns, ino, digest] for big RECORDs only
CACHE_MAX_ENTRIES = 64
# Everything torch, its BLAS/OpenMP runtimes, CUDA or the dynamic loader read at import.
_KEY_ENV_PREFIXES = (
    "CUDA_", "TORCH_", "PYTORCH_", "ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "CUBLAS", "CUDNN_",
    "NCCL_", "NVIDIA_", "ONEDNN_", "DNNL_", "OPENBLAS_", "TRITON_", "LD_", "HIP_", "ROCM_",
    "ROCR_", "HSA_", "XLA_", "USE_", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONUSERBASE",
)
# Strings compiled by ``re`` on first use: only a run that reads torch's facts needs them.
_KEY_LIB_RE = (
    r"^lib(cuda|cudart|cudnn|cublas|nccl|nvrtc|nvrtc-builtins|nvJitLink|cufft|curand|cusolver|"
    r"cusparse|cupti|nvToolsExt|amdhip64|MIOpen|rccl|rocblas|hipblas|gomp|iomp5|mkl)[^/]*\.so")
_KEY_DIST_RE = r"(?i)^(torch|triton|pytorch_triton[^-]*|nvidia_[^-]+)-[^-]+\.dist-info$"


def cache_dir() -> str:
    """``$ENVLOCK_CACHE_DIR``, else ``$XDG_CACHE_HOME/envlock``, else ``~/.cache/envlock``."""
    override = os.environ.get("ENVLOCK_CACHE_DIR")
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "envlock")


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "%s:absent" % path
    return "%s:%d:%d:%d" % (path, st.st_size, st.st_mtime_ns, st.st_ino)


def _torch_dists() -> List[Tuple[str, str]]:
    """``(path entry, dist-info dir)`` of torch, triton and every nvidia-* distribution."""
    seen = set()
    found = []
    for entry in path_entries(None):
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for fname in names:
            if re.match(_KEY_DIST_RE, fname):
                cname = canonicalize_name(fname.split("-", 1)[0])
                if cname not in seen:
                    seen.add(cname)
                    found.append((entry, fname))
    return found


def scan_record(path: str) -> Optional[Tuple[str, List[str]]]:
    """(sha256 of a RECORD, the shared libraries it lists inside site-packages), or None."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    libs = []
    for line in data.splitlines():
        rel = line.split(b",", 1)[0].decode("utf-8", "surrogateescape")
        leaf = rel.rsplit("/", 1)[-1]
        if ".so" in leaf and not rel.startswith("../"):
            libs.append(rel)
    return sha256(data).hexdigest(), libs


def torch_cache_key(records: Optional["RecordDigests"] = None) -> Optional[str]:
    """sha256 of every input the torch facts depend on, or None when they cannot be pinned
    down (no torch distribution with a RECORD: a source checkout, an egg).

    ``records`` remembers what each RECORD yields by its stat (torch's is ~15,000 lines)."""
    import importlib.util

    dists = _torch_dists()
    if not any(d[1].lower().startswith("torch-") for d in dists):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    h = sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape") + b"\0")

    put("format", str(CACHE_FORMAT), str(source.PROBE_VERSION), sys.version, sys.prefix,
        os.path.realpath(sys.executable or ""), _stat_line(os.path.realpath(sys.executable or "")),
        _stat_line(spec.origin), source.digest())
    for entry, info in dists:
        record = os.path.join(entry, info, "RECORD")
        scanned = records.scan(record) if records is not None else scan_record(record)
        if scanned is None:
            return None
        put(info, scanned[0])
        for rel in scanned[1]:
            put(_stat_line(os.path.join(entry, rel)))
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if not directory:
            continue
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            put("%s:unreadable" % directory)
            continue
        for name in names:
            if re.match(_KEY_LIB_RE, name):
                put(_stat_line(os.path.join(directory, name)))
    for lib in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")):
        if lib:
            put(_stat_line(lib))
    put(_stat_line("/etc/ld.so.cache"))
    for name in sorted(os.environ):
        if name.startswith(_KEY_ENV_PREFIXES):
            put(name, os.environ[name])
    cpuinfo = read_text("/proc/cpuinfo", 1 << 16) or ""
    flags = [line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))][:1]
    put("cpu", *flags)
    try:
        put("affinity", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        put("cpus", str(os.cpu_count()))
    put("driver", read_text("/proc/driver/nvidia/version", 4096) or "none")
    return h.hexdigest()


def _cache_path(key: str) -> str:
    return os.path.join(cache_dir(), "torch-facts-%s.json" % key[:32])


def cache_read(key: str) -> Optional[Dict[str, Any]]:
    """The facts stored under ``key``; None for a miss, a corrupt or a foreign entry."""
    try:
        with open(_cache_path(key), "rb") as fh:
            entry = json.loads(fh.read(1 << 22).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT
            or entry.get("key") != key or not isinstance(entry.get("facts"), dict)):
        return None
    facts: Dict[str, Any] = entry["facts"]
    if not isinstance(facts.get("torch"), dict) or not isinstance(facts.get("determinism"), dict):
        return None
    return facts


def cache_write(key: str, facts: Dict[str, Any]) -> None:
    """Concurrent writers of one key write the same bytes, so whichever rename lands last is
    right. The oldest entries beyond CACHE_MAX_ENTRIES go. Never raises."""
    if atomic_json(_cache_path(key), {"format": CACHE_FORMAT, "key": key, "facts": facts}):
        _prune("torch-facts-", CACHE_MAX_ENTRIES)


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


def stat_key(st: os.stat_result) -> List[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(st: os.stat_result) -> bool:
    """True when the file last changed long enough ago that its stat identifies its content."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_NS


def _valid_key(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 5 and all(type(v) is int for v in value)


def _read_entry(path: str, limit: int) -> Any:
    """The JSON at ``path``; None when missing, unreadable, corrupt or too big."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None


class RecordDigests:
    """What the probe derives from RECORD files, remembered by their stat (see above).

    ``record_sha256`` of every distribution (torch's RECORD alone is ~15,000 lines, ~60 ms to
    digest; the digests of a small venv together cost more than the lookups), and for the
    torch-facts key the raw sha256 and the shared libraries a RECORD lists (``scan``).
    One file per interpreter.
    """

    MAX_BYTES = 1 << 24

    def __init__(self) -> None:
        h = sha256(("%s\0%s" % (sys.prefix, sys.executable)).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(cache_dir(), "records-%s.json" % h.hexdigest()[:32])
        self.entries: Dict[str, List[Any]] = {}
        self.scans: Dict[str, List[Any]] = {}
        self.used: Set[str] = set()
        self.dirty = False
        data = _read_entry(self.path, self.MAX_BYTES)
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
        if digest is not None and settled(st):
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
        if found is not None and settled(st):
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
        atomic_json(self.path, {"format": RECORDS_FORMAT, "entries": self.entries,
                                "scans": self.scans})
        self.dirty = False


# ---------------------------------------------------------------------------------------------
# OS package database: dpkg's status file (~12 ms to parse with 800 packages) or apk's
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


def load_os_packages(root: str = "/", run: Optional[ospkgs.Runner] = None) -> Optional[ospkgs.Database]:
    """``ospkgs.load(root, run)``, remembered by the stat of the file it reads.

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
    db = database_from_entry(_read_entry(path, 1 << 26), key, root)
    if db is None:
        db = ospkgs.load(root, run)
        if db is not None and db.manager in ("dpkg", "apk") \
                and all(settled(st) for st in stats if st is not None):
            atomic_json(path, {"format": OSPKGS_FORMAT, "key": key, "manager": db.manager,
                               "packages": db.packages, "apk_dirs": db.apk_dirs,
                               "specs": db.specs()})
    if db is not None:
        db.dpkg_owners = dpkg_owners
    return db


def _owners_key(info_dir: str, wanted: Set[str]) -> Tuple[str, List[Any]]:
    names = sorted(wanted)
    digest = sha256(json.dumps([info_dir, names]).encode("utf-8")).hexdigest()
    return os.path.join(cache_dir(), "ospkgs-owners-%s.json" % digest[:32]), [info_dir, _parser_digest(), names]


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


def dpkg_owners(info_dir: str, wanted: Set[str]) -> Dict[str, str]:
    """``ospkgs.dpkg_owners``, remembered by the stat of dpkg's info directory (a list added or
    removed changes it) and of every list the scan read (the scan stops at the last one it
    needs, so the lists after it cannot change the answer). A system Python's capture on a
    desktop-sized Debian reads a few hundred lists, ~20 ms."""
    path, key = _owners_key(info_dir, wanted)
    found = owners_from_entry(_read_entry(path, 1 << 24), key, info_dir)
    if found is not None:
        return found
    try:
        listing = os.stat(info_dir)
    except OSError:
        return ospkgs.dpkg_owners(info_dir, wanted)
    reads: List[Tuple[str, Optional[os.stat_result]]] = []
    found = ospkgs.dpkg_owners(info_dir, wanted, reads)
    done = [(name, st) for name, st in reads if st is not None]
    if len(done) == len(reads) and settled(listing) and all(settled(st) for _, st in done) \
            and atomic_json(path, {"format": OSPKGS_FORMAT, "key": key, "dir": stat_key(listing),
                                   "reads": [[name, stat_key(st)] for name, st in done],
                                   "found": found}):
        _prune("ospkgs-owners-", OWNERS_MAX_ENTRIES)  # one per set of system distributions
    return found


def _prune(prefix: str, keep: int) -> None:
    """Remove the oldest entries named ``prefix*`` beyond ``keep``. Never raises."""
    directory = cache_dir()
    try:
        entries = [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(prefix)]
        if len(entries) > keep:
            entries.sort(key=lambda p: os.stat(p).st_mtime)
            for old in entries[:len(entries) - keep]:
                os.unlink(old)
    except OSError:
        pass  # another run pruned the same entry first
