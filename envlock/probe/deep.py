"""Deep check: every installed file against the hash its distribution's RECORD gives for it.

``record_sha256`` in the lock identifies a build by its RECORD lines; it cannot see a file
edited after installation (a debugging print left in site-packages, a patched kernel, a
half-failed upgrade). This module re-hashes the files themselves, the way ``debsums`` or
``rpm -V`` do for system packages, and reports per distribution what was modified, is
missing, or was added inside the distribution's own directories.

Stdlib only and Python >= 3.8, like the probe: the probe loads it by path (``--deep``) in the
interpreter being checked, so it runs wherever the probe runs.

Files whose RECORD entry legitimately does not match, each handled by its own rule:

* bytecode (``__pycache__/*.pyc``): written by the interpreter after installation; pip lists
  what it compiled without a hash, uv lists none. Never hashed; never counted as added.
* ``RECORD`` itself: cannot contain its own hash (PEP 376, empty hash field).
* ``INSTALLER``, ``REQUESTED``, ``direct_url.json``, uv's ``uv_cache.json`` and console scripts (``../../../bin/*``):
  written by the installer, which records their hash *after* writing them (pip and uv both
  do, shebangs included), so they are checked like every other file; they are left out of
  the per-distribution digest only, because their bytes name this venv (interpreter path in a
  shebang, a local path in direct_url.json) and would differ between two identical installs.
* any other entry without a hash (a legacy installer's generated file): existence only.

A file whose stat is the one it had when last hashed is not read again (``filehashes.py``,
passed in as ``stat_cache``): a second check of an unchanged torch venv reads nothing.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import posixpath
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Set, Tuple

# Whole-file reads up to this size (one read, one hash call); larger files are streamed through
# a per-thread buffer, so memory stays at workers x CHUNK whatever the files are.
CHUNK = 1 << 20
_INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json")
Progress = Callable[[int, int, int, int], None]
# A RECORD is read whole (torch's, among the largest, is about 2 MB).
MAX_RECORD = 64 << 20
# Non-blocking: opening a FIFO then returns at once instead of waiting for a writer. Every file
# is checked to be a regular file on its open descriptor before a byte is read (a RECORD entry
# ``../../dev/zero`` or a FIFO among a package's files is a finding, never a hang), and read at
# most one chunk past the size it had when opened (a file whose size lies, as in /proc, or that
# keeps growing, is unreadable, not an endless read). Like files.py, which this module does not
# import (it runs on its own).
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) \
    | getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: str) -> "Tuple[io.FileIO, int]":
    """``path`` opened unbuffered for reading, and its size: only a regular file."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return io.FileIO(fd, "rb"), st.st_size


class StatCache(Protocol):
    """Hashes remembered by each file's stat (``filehashes.FileHashes``, passed in by the probe:
    this module imports nothing of the probe's, so it also runs on its own)."""

    def lookup(self, paths: Sequence[str]) -> List[Optional[str]]:
        """Stat every path before any is read; its remembered hash, or None to hash it."""

    def store(self, indices: Sequence[int], digests: Sequence[str]) -> None:
        """The hashes just taken of ``paths[i]`` for each of ``indices``."""


def _read_upto(fh: io.FileIO, limit: int) -> bytes:
    """The file's bytes to its end, or ``limit + 1`` of them when it holds more (one read on a
    regular file; pseudo-files answer a page at a time)."""
    parts = []
    total = 0
    while total <= limit:
        chunk = fh.read(limit + 1 - total)
        if chunk is None:  # a regular file that answers like a device (/proc/kmsg)
            raise OSError(0, "would block")
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def record_hash(path: str, buf: Optional[bytearray] = None) -> str:
    """``sha256=<urlsafe base64, no padding>`` of a file: RECORD's own format (PEP 376/627)."""
    fh, size = _open_regular(path)
    with fh:
        limit = size + CHUNK
        if size <= CHUNK:
            data = _read_upto(fh, CHUNK)
            if len(data) > CHUNK:
                raise OSError(0, "larger than its size says")
            digest = hashlib.sha256(data).digest()
        else:
            h = hashlib.sha256()
            view = memoryview(buf if buf is not None else bytearray(CHUNK))
            total = 0
            while True:
                n = fh.readinto(view)
                if n is None:
                    raise OSError(0, "would block")
                if not n:
                    break
                total += n
                if total > limit:
                    raise OSError(0, "grew while it was read")
                h.update(view[:n])
            digest = h.digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _is_bytecode(rel: str) -> bool:
    return rel.endswith((".pyc", ".pyo")) and "__pycache__/" in rel


class _Dist:
    def __init__(self, name: str, site: str, info_dir: str) -> None:
        self.name = name
        self.site = site
        self.info_dir = info_dir
        self.findings: Dict[str, List[str]] = {}
        # relpath -> hash as found on disk (or "missing"); feeds the per-distribution digest.
        self.disk: Dict[str, str] = {}

    def add(self, kind: str, rel: str) -> None:
        self.findings.setdefault(kind, []).append(rel)


def read_record(path: str) -> Iterator[Tuple[str, str, int]]:
    """A distribution's RECORD as (path, hash, size) rows (size 0 where RECORD gives none),
    read as a regular file of at most ``MAX_RECORD`` bytes; raises OSError,
    UnicodeDecodeError or csv.Error for one that cannot be read so."""
    fh, _ = _open_regular(path)
    with fh:
        data = _read_upto(fh, MAX_RECORD)
    if len(data) > MAX_RECORD:
        raise OSError(0, "larger than %d MiB" % (MAX_RECORD >> 20))
    with io.StringIO(data.decode("utf-8"), newline="") as text:
        for row in csv.reader(text):
            if row and row[0]:
                size = row[2] if len(row) > 2 else ""
                yield row[0], (row[1] if len(row) > 1 else ""), int(size) if size.isdigit() else 0


_Job = Tuple[str, str, str, "_Dist", int]


def _plan(dists: List[_Dist], claimed: Dict[str, Set[str]], owners: Dict[Tuple[str, str], _Dist],
          ) -> Tuple[List[_Job], Set[Tuple[str, str]]]:
    """Every hashed RECORD entry as a job (with RECORD's size, for scheduling), plus the
    package directories in which to look for added files."""
    jobs: List[_Job] = []
    tops: Set[Tuple[str, str]] = set()
    for dist in dists:
        record = os.path.join(dist.site, dist.info_dir, "RECORD")
        site_claims = claimed.setdefault(dist.site, set())
        own_record = dist.info_dir + "/RECORD"
        try:
            entries = list(read_record(record))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            dist.add("unreadable", "%s/RECORD (%s)" % (dist.info_dir, why))
            continue
        for rel, expected, size in entries:
            if "\\" in rel or "/./" in rel or "//" in rel or rel.startswith("./"):
                rel = posixpath.normpath(rel.replace("\\", "/"))
            inside = not rel.startswith("../") and not rel.startswith("/")
            if inside:
                full = dist.site + os.sep + rel
                site_claims.add(rel)
                parent, _, _ = rel.rpartition("/")
                if parent:
                    owners.setdefault((dist.site, parent), dist)
                    top = parent.partition("/")[0]
                    if top != "__pycache__":
                        tops.add((dist.site, top))
            else:
                full = os.path.normpath(os.path.join(dist.site, rel))
            if not expected:
                if not _is_bytecode(rel) and rel != own_record and not os.path.lexists(full):
                    dist.add("missing", rel)
                continue
            if not expected.startswith("sha256="):
                dist.add("unreadable", "%s (RECORD uses %s)" % (rel, expected.partition("=")[0]))
                continue
            jobs.append((full, expected, rel, dist, size))
    return jobs, tops


# conda-meta records list every file of their package (conda's, mamba's, pixi's, rattler's).
MAX_CONDA_RECORD = 64 << 20
# paths_data entries whose bytes the record's sha256 describes: files (hard-linked or copied)
# and the entry points the installer wrote (rattler records their hash).
_CONDA_HASHED = ("hardlink", "unix_python_entry_point", "windows_python_entry_point_script",
                 "windows_python_entry_point_exe")


def _hex_to_record(hexdigest: str) -> str:
    """A conda record's hex sha256 in RECORD's form, which the hashing returns."""
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode("ascii")


def _conda_plan(prefix: str) -> Tuple[List[_Dist], List[_Job]]:
    """Every file of every ``conda-meta/*.json`` record as a job, named ``conda:<name>``: its
    bytes against ``sha256_in_prefix`` where the installer replaced a placeholder, else the
    archive's ``sha256``. A file whose placeholder was replaced with no ``sha256_in_prefix``
    recorded (older conda), a symbolic link, or a record without ``paths_data`` (only
    ``files``) is checked for existence alone; compiled bytecode and directories not at all."""
    import json

    meta = os.path.join(prefix, "conda-meta")
    dists: List[_Dist] = []
    jobs: List[_Job] = []
    for fname in sorted(os.listdir(meta)):
        if not fname.endswith(".json"):
            continue
        try:
            fh, _ = _open_regular(os.path.join(meta, fname))
            with fh:
                data = _read_upto(fh, MAX_CONDA_RECORD)
            if len(data) > MAX_CONDA_RECORD:
                raise OSError(0, "larger than %d MiB" % (MAX_CONDA_RECORD >> 20))
            record = json.loads(data.decode("utf-8"))
            name = record["name"]
            if not isinstance(name, str):
                raise ValueError("no name")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad = _Dist("conda:" + fname[:-5], prefix, "conda-meta")
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            bad.add("unreadable", "conda-meta/%s (%s)" % (fname, why))
            dists.append(bad)
            continue
        dist = _Dist("conda:" + name, prefix, "conda-meta")
        dists.append(dist)
        paths = (record.get("paths_data") or {}).get("paths")
        if not isinstance(paths, list):
            paths = [{"_path": rel, "path_type": "hardlink"} for rel in record.get("files") or ()
                     if isinstance(rel, str)]
        for entry in paths:
            rel = entry.get("_path") if isinstance(entry, dict) else None
            if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
                continue
            full = os.path.join(prefix, rel)
            kind = entry.get("path_type", "hardlink")
            expected = entry.get("sha256_in_prefix")
            if expected is None and not entry.get("prefix_placeholder"):
                expected = entry.get("sha256")
            if kind in _CONDA_HASHED and isinstance(expected, str) and len(expected) == 64:
                try:
                    jobs.append((full, _hex_to_record(expected), rel, dist,
                                 int(entry.get("size_in_bytes") or 0)))
                    continue
                except ValueError:
                    pass
            if (kind in _CONDA_HASHED or kind == "softlink") and not os.path.lexists(full):
                dist.add("missing", rel)
    return dists, jobs


def _walk(root: str, rel: str, out: List[str]) -> None:
    try:
        it = os.scandir(root)
    except OSError:
        return
    with it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                _walk(entry.path, rel + "/" + entry.name, out)
            else:
                out.append(rel + "/" + entry.name)


def _added(tops: Set[Tuple[str, str]], claimed: Dict[str, Set[str]],
           owners: Dict[Tuple[str, str], _Dist]) -> List[Tuple[str, str, _Dist]]:
    """Files under a distribution's directories that no RECORD on that site lists.

    Namespace directories (``nvidia/``, ``google/``) hold several distributions: a file is
    attributed to the distribution owning the nearest directory above it, and only when no
    distribution at all lists it.
    """
    found: List[Tuple[str, str, _Dist]] = []
    for site, top in sorted(tops):
        claims = claimed[site]
        files: List[str] = []
        _walk(os.path.join(site, top), top, files)
        for rel in files:
            if rel in claims or _is_bytecode(rel):
                continue
            parent = rel.rpartition("/")[0]
            owner = None
            while parent:
                owner = owners.get((site, parent))
                if owner is not None:
                    break
                parent = parent.rpartition("/")[0]
            if owner is not None:
                found.append((site, rel, owner))
    return sorted(found, key=lambda f: f[1])


def _safe_hash(path: str, buf: Optional[bytearray] = None) -> str:
    try:
        return record_hash(path, buf)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return "unreadable:%s" % (exc.strerror or type(exc).__name__)
    except ValueError as exc:  # a NUL in a RECORD path: no file can have that name
        return "unreadable:%s" % exc


class _Counter:
    """Files and bytes done so far, shared by the hashing threads and the progress callback."""

    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0
        self.lock = threading.Lock()

    def add(self, files: int, nbytes: int) -> None:
        with self.lock:
            self.files += files
            self.bytes += nbytes


def _fork_shards(paths: List[str], sizes: List[int], nproc: int, counter: _Counter
                 ) -> Optional[List[Callable[[], List[str]]]]:
    """Hash small files in forked children, one shard each; returns one collector per child.

    Per small file the cost is Python's, not the hash's (open, read, close and the call
    overhead, ~15 us), and that part holds the GIL: threads only queue on it (two threads are
    slower than one). Processes have a GIL each. Children are forked before any thread of
    ours starts and only open, read, hash and write, so nothing they inherit can deadlock.
    """
    collectors: List[Callable[[], List[str]]] = []
    for shard in range(nproc):
        idx = list(range(shard, len(paths), nproc))
        try:
            rfd, wfd = os.pipe()
        except OSError:
            return None if not collectors else [*collectors, *(
                _inline(paths, sizes, list(range(k, len(paths), nproc)), counter)
                for k in range(shard, nproc))]
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            return None if not collectors else [*collectors, *(
                _inline(paths, sizes, list(range(k, len(paths), nproc)), counter)
                for k in range(shard, nproc))]
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            code = 1
            try:
                os.close(rfd)
                with os.fdopen(wfd, "wb", buffering=1 << 16) as out:
                    for i in idx:
                        out.write(_safe_hash(paths[i]).encode("utf-8", "surrogateescape") + b"\n")
                code = 0
            finally:
                # A forked child leaves without the parent's teardown: sys.exit would run the
                # parent's atexit handlers and flush its copied stdio buffers a second time.
                os._exit(code)
        os.close(wfd)
        collectors.append(_reader(pid, rfd, paths, sizes, idx, counter))
    return collectors


def _inline(paths: List[str], sizes: List[int], idx: List[int], counter: _Counter
            ) -> Callable[[], List[str]]:
    def run() -> List[str]:
        out = [_safe_hash(paths[i]) for i in idx]
        counter.add(len(idx), sum(sizes[i] for i in idx))
        return out
    return run


def _reader(pid: int, rfd: int, paths: List[str], sizes: List[int], idx: List[int],
            counter: _Counter) -> Callable[[], List[str]]:
    def run() -> List[str]:
        got: List[str] = []
        with os.fdopen(rfd, "rb") as fh:
            for line in fh:
                got.append(line.rstrip(b"\n").decode("utf-8", "surrogateescape"))
                if len(got) % 256 == 0:
                    counter.add(256, sum(sizes[i] for i in idx[len(got) - 256:len(got)]))
        os.waitpid(pid, 0)
        counter.add(len(got) % 256, sum(sizes[i] for i in idx[len(got) - len(got) % 256:len(got)]))
        # A child that died early (killed, out of memory) leaves the rest to this thread.
        for i in idx[len(got):]:
            got.append(_safe_hash(paths[i]))
            counter.add(1, sizes[i])
        return got
    return run


def _hash_all(paths: List[str], sizes: List[int], workers: int, processes: bool,
              counter: _Counter, progress: Optional[Callable[[], None]],
              meanwhile: Callable[[], Any]) -> List[str]:
    """Hash every path in one pass; the result is in the order of ``paths``.

    ``meanwhile`` (the directory walk for added files) runs in this thread while the hashing
    runs elsewhere: it is syscalls and set lookups, which the hashing threads leave room for.
    """
    result: List[str] = [""] * len(paths)
    small = [i for i, n in enumerate(sizes) if n <= CHUNK]
    big = sorted((i for i, n in enumerate(sizes) if n > CHUNK), key=lambda i: -sizes[i])
    tasks: List[Tuple[List[int], Callable[[], List[str]]]] = []
    collectors = None
    if processes and workers > 1 and len(small) > 2000 and hasattr(os, "fork"):
        sub_paths = [paths[i] for i in small]
        collectors = _fork_shards(sub_paths, [sizes[i] for i in small], workers, counter)
        if collectors is not None:
            tasks += [(small[k::workers], c) for k, c in enumerate(collectors)]
    if collectors is None:
        # Threads still pay off for small files spread over a few chunks: the reads overlap.
        n = max(1, min(len(small), workers))
        tasks += [(small[k::n], _inline(paths, sizes, small[k::n], counter)) for k in range(n)]
    # Big files: one thread per core, biggest first; hashlib drops the GIL while it hashes.
    local = threading.local()

    def one(i: int) -> Tuple[int, str]:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(CHUNK)
        digest = _safe_hash(paths[i], buf)
        counter.add(1, sizes[i])
        return i, digest

    with ThreadPoolExecutor(max_workers=workers + len(tasks),
                            thread_name_prefix="envlock-hash") as pool:
        fut_small = [(ids, pool.submit(fn)) for ids, fn in tasks]
        fut_big = [pool.submit(one, i) for i in big]
        pending = [f for _, f in fut_small] + fut_big
        meanwhile()
        while progress is not None and not all(f.done() for f in pending):
            progress()
            time.sleep(0.1)
        for ids, fut in fut_small:
            for i, digest in zip(ids, fut.result()):  # noqa: B905 (3.8)
                result[i] = digest
        for big_fut in fut_big:
            index, digest = big_fut.result()
            result[index] = digest
    return result


def check(dists: List[Tuple[str, str, str]], workers: Optional[int] = None,
          progress: Optional[Progress] = None, processes: bool = False,
          stat_cache: Optional[StatCache] = None, conda_prefix: Optional[str] = None
          ) -> Dict[str, Any]:
    """Check distributions given as ``(name, site_dir, dist_info_dirname)``, and with
    ``conda_prefix`` the files of every conda package of that prefix against its
    ``conda-meta`` record (``_conda_plan``; named ``conda:<name>``).

    Returns ``{"files", "bytes", "hashed_files", "hashed_bytes", "cached_files",
    "cached_bytes", "seconds", "workers", "dists": {name: {kind: [relpath]}},
    "digests": {name: hex}}``; kinds are ``modified``, ``missing``, ``added``, ``unreadable``.
    A bad file becomes a finding, never an exception. ``processes`` lets small files be
    hashed in forked children: only for a process that owns no GPU context and no threads of
    its own (the probe run as a script), never inside a training process. ``stat_cache``:
    files it vouches for are not read (``cached_*``); the rest are hashed and handed back to it.
    """
    start = time.perf_counter()
    if workers is None:
        try:
            workers = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            workers = os.cpu_count() or 1
    workers = max(1, min(32, workers))
    objs = [_Dist(name, site, info) for name, site, info in dists]
    claimed: Dict[str, Set[str]] = {}
    owners: Dict[Tuple[str, str], _Dist] = {}
    jobs, tops = _plan(objs, claimed, owners)
    if conda_prefix is not None:
        conda_dists, conda_jobs = _conda_plan(conda_prefix)
        objs.extend(conda_dists)
        jobs.extend(conda_jobs)
    # RECORD's sizes: they only schedule work and scale the progress bar.
    sizes = [job[4] for job in jobs]
    total_files, total_bytes = len(jobs), sum(sizes)
    counter = _Counter()
    tick = None
    if progress is not None:
        cb = progress

        def tick() -> None:
            cb(counter.files, total_files, counter.bytes, total_bytes)

    paths = [j[0] for j in jobs]
    known = stat_cache.lookup(paths) if stat_cache is not None else [None] * len(paths)
    todo = [i for i, digest in enumerate(known) if digest is None]
    todo_sizes = [sizes[i] for i in todo]
    counter.add(total_files - len(todo), total_bytes - sum(todo_sizes))
    added: List[Tuple[str, str, _Dist]] = []
    fresh = _hash_all([paths[i] for i in todo], todo_sizes, workers, processes, counter, tick,
                      lambda: added.extend(_added(tops, claimed, owners)))
    if tick is not None:
        tick()
    if stat_cache is not None:
        stat_cache.store(todo, fresh)
    hashes = [digest or "" for digest in known]
    for i, digest in zip(todo, fresh):  # noqa: B905 (3.8)
        hashes[i] = digest
    for (_full, expected, rel, dist, _), actual in zip(jobs, hashes):  # noqa: B905 (3.8)
        leaf = rel.rsplit("/", 1)[-1]
        digestable = not rel.startswith("../") and not (
            leaf in _INSTALLER_FILES and rel.startswith(dist.info_dir + "/"))
        if digestable:
            dist.disk[rel] = actual
        if actual == "missing":
            dist.add("missing", rel)
        elif actual.startswith("unreadable:"):
            dist.add("unreadable", "%s (%s)" % (rel, actual.split(":", 1)[1]))
        elif actual != expected:
            dist.add("modified", rel)
    for site, rel, owner in added:
        owner.add("added", rel)
        owner.disk[rel] = _safe_hash(os.path.join(site, rel))
    report: Dict[str, Any] = {
        "files": total_files, "bytes": total_bytes, "workers": workers,
        "hashed_files": len(todo), "hashed_bytes": sum(todo_sizes),
        "cached_files": total_files - len(todo), "cached_bytes": total_bytes - sum(todo_sizes),
        "processes": bool(processes and workers > 1),
        "seconds": round(time.perf_counter() - start, 3), "dists": {}, "digests": {},
    }
    for dist in objs:
        if dist.findings:
            report["dists"][dist.name] = {k: sorted(v) for k, v in sorted(dist.findings.items())}
        report["digests"][dist.name] = files_digest(dist.disk)
    return report


def files_digest(disk: Dict[str, str]) -> str:
    """sha256 over ``path NUL hash`` lines, sorted: the distribution's files as they are on
    disk. Installer-written files and scripts outside site-packages are not in ``disk``, so
    two clean installs of one wheel share it on every machine."""
    lines = sorted("%s\0%s" % (rel, h) for rel, h in disk.items())
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def changes(findings: Dict[str, List[str]]) -> List[str]:
    """Findings as ``kind path`` strings, for the lock's ``files_changed``."""
    return sorted("%s %s" % (kind, rel) for kind, rels in findings.items() for rel in rels)
