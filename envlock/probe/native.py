"""Native code as loaded: every shared library mapped into this process, who vouches for its file,
and the BLAS and OpenMP runtimes among them.

Versions say which wheel was installed; ``/proc/self/maps`` says which file the process really
runs. A cuDNN found first on ``LD_LIBRARY_PATH`` (a cluster's module system), an OpenMP runtime
preloaded by another package, a BLAS swapped under numpy: none of these changes a version, all
of them change numbers. Each library is described by its soname and by whoever vouches for the
file: the distribution whose RECORD lists it (its version and ``record_sha256`` are in the lock
already), the OS package whose file list holds it, or nobody, and then by its sha256, remembered
by stat like ``--deep``'s hashes (``filehashes``).

Stdlib only, Python >= 3.8. ``threadpoolctl`` is used when the probed environment has it (it
calls into each runtime for its version, threading layer, thread count and CPU kernels); without
it the runtimes are named from the mapped files alone (see docs/design.md).
"""

from __future__ import annotations

import os
import re
import struct
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .files import open_regular, read_regular, sha256
from .ospkgs import merged_usr_spellings
from .rules import RUNTIME_FIELDS, numerics_runtime

MAPS = "/proc/self/maps"
# A torch process maps a few thousand regions; each line is short.
MAX_MAPS = 16 << 20
_DELETED = " (deleted)"


def is_shared_object(leaf: str) -> bool:
    """``libfoo.so``, ``libfoo.so.1.2``, ``mod.cpython-311-x86_64-linux-gnu.so``."""
    return leaf.endswith(".so") or ".so." in leaf


# The interpreter's own extension modules (``_json``, ``_random``, ``math``, ...) live in its
# lib-dynload directory on every CPython layout (Debian's, pyenv's, conda's, uv's standalone
# builds). Which of them are mapped says which standard modules the process imported - the
# probe's own bookkeeping included: a run that writes its cache imports tempfile and maps three
# more - and nothing of what computes numbers; the interpreter's build is ``[python]``.
_STDLIB_EXTENSIONS = "/lib-dynload/"


def mapped_libraries(text: str) -> List[str]:
    """The shared objects ``/proc/self/maps`` lists (one path each, sorted), but the
    interpreter's own extension modules; a file deleted or replaced since it was mapped keeps
    the kernel's `` (deleted)`` mark.

    Lines are split on ``\n`` alone: the kernel ends each line with it and writes a newline in
    a path as ``\012`` (``seq_path``), while every other character of a path - ``\r``, a form
    feed, ``\x1c``, U+2028, all line breaks to ``str.splitlines`` - is written as it is."""
    seen: Set[str] = set()
    for line in text.split("\n"):
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5]
        name = path[:-len(_DELETED)] if path.endswith(_DELETED) else path
        if is_shared_object(name.rsplit("/", 1)[-1]) and _STDLIB_EXTENSIONS not in name:
            seen.add(path)
    return sorted(seen)


def loaded_libraries(maps: Optional[str] = None) -> Optional[List[str]]:
    """The shared objects this process has mapped now, from ``maps`` (``MAPS`` by default).

    None where the system has no such file (not Linux): the libraries are not known there. A
    maps file that is there but cannot be read whole (unreadable, over ``MAX_MAPS``) raises
    ``OSError``: the libraries of part of it, or none, would read as a process that loaded
    fewer libraries, and a comparison would name every missing one."""
    try:
        data = read_regular(maps or MAPS, MAX_MAPS)
    except FileNotFoundError:
        if sys.platform.startswith("linux"):
            raise
        return None
    return mapped_libraries(data.decode("utf-8", "replace"))


# -- ELF: the soname, which is what the dynamic loader looks a library up by ----------------------

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_MAX_PHNUM = 512
_MAX_DYNAMIC = 1 << 16


def elf_soname(path: str) -> Optional[str]:
    """``DT_SONAME`` of an ELF shared object, or None (no soname, not ELF, unreadable).

    Read with a few bounded reads at the offsets the headers give (the program headers, the
    dynamic segment, one string), never the whole file: libtorch_cuda.so is a gigabyte.
    """
    try:
        fd = open_regular(path)
    except (OSError, ValueError):
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            return _soname(fh)
    except (OSError, ValueError, struct.error):
        return None


def _soname(fh: Any) -> Optional[str]:
    ident = fh.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return None
    wide = ident[4] == 2
    end = "<" if ident[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(end + "Q", ident, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
        ph_fmt, dyn_fmt = end + "IIQQQQQQ", end + "qQ"
    else:
        phoff, = struct.unpack_from(end + "I", ident, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
        ph_fmt, dyn_fmt = end + "IIIIIIII", end + "iI"
    if not phnum or phnum > _MAX_PHNUM or phentsize < struct.calcsize(ph_fmt):
        return None
    fh.seek(phoff)
    table = fh.read(phentsize * phnum)
    loads: List[Tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: Optional[Tuple[int, int]] = None  # (offset, filesz)
    for i in range(phnum):
        row = struct.unpack_from(ph_fmt, table, i * phentsize)
        if wide:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = row[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = row[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    fh.seek(dynamic[0])
    data = fh.read(min(dynamic[1], _MAX_DYNAMIC))
    size = struct.calcsize(dyn_fmt)
    strtab = soname = None
    for i in range(len(data) // size):
        tag, value = struct.unpack_from(dyn_fmt, data, i * size)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    for vaddr, offset, filesz in loads:  # the string table's address, as a file offset
        if vaddr <= strtab < vaddr + filesz:
            fh.seek(strtab - vaddr + offset + soname)
            raw = fh.read(256).split(b"\0", 1)[0]
            name = raw.decode("utf-8", "replace")
            return name if re.fullmatch(r"[A-Za-z0-9_.+-]{1,200}", name) else None
    return None


# -- who vouches for a file ----------------------------------------------------------------------

# Where an OS package manager installs libraries (never /usr/local, where a user's builds go): a
# library elsewhere is not looked up in its file lists, which would be read whole for nothing.
_SYSTEM_LIB_RE = r"^/(usr/(?!local/)|lib(32|64|x32)?/)"


# The fields that name who vouches for a library's file.
OWNERS = frozenset(("distribution", "conda_package", "os_package"))
def distribution_files(dists: Iterable[Tuple[str, str, str]],
                       libraries_of: Callable[[str], Optional[List[str]]]) -> Dict[str, Tuple[str, str]]:
    """{absolute path: (distribution, path inside its site directory)} of every shared library a
    RECORD of ``dists`` ((name, site directory, dist-info directory) each) lists.

    ``libraries_of(RECORD path)``: the shared objects a RECORD lists, site-relative (remembered by
    stat with the probe's cache, else read once per run with the package scan)."""
    found: Dict[str, Tuple[str, str]] = {}
    real: Dict[str, str] = {}
    for name, site, info in dists:
        libs = libraries_of(os.path.join(site, info, "RECORD"))
        if not libs:
            continue
        base = real.get(site)
        if base is None:
            base = real[site] = os.path.realpath(site)
        for rel in libs:
            found.setdefault(os.path.normpath(os.path.join(base, rel)), (name, rel))
    return found


def describe_libraries(paths: Sequence[str], dists: Dict[str, Tuple[str, str]],
                       conda: Dict[str, str],
                       os_owners: Optional[Callable[[Set[str]], Dict[str, str]]],
                       hashes: Any) -> List[Dict[str, Any]]:
    """One entry per mapped library: name (soname, else file name), path, and who vouches for it:
    ``distribution`` + ``file`` (its RECORD lists it), ``conda_package`` (a conda-meta record
    does), ``os_package`` (dpkg's or apk's file list, or rpm's database, does), or ``sha256``
    (nobody does).
    ``hashes``: a ``filehashes.FileHashes`` (lookup, store, save). A file deleted or replaced
    after it was loaded is ``deleted``: its bytes are no longer there to hash or vouch for."""
    entries: List[Dict[str, Any]] = []
    system: Dict[str, int] = {}
    for path in paths:
        deleted = path.endswith(_DELETED)
        real = path[:-len(_DELETED)] if deleted else path
        entry: Dict[str, Any] = {"name": (None if deleted else elf_soname(real))
                                 or real.rsplit("/", 1)[-1], "path": real}
        if deleted:
            entry["deleted"] = True
        elif real in dists:
            entry["distribution"], entry["file"] = dists[real]
        elif real in conda:
            entry["conda_package"] = conda[real]
        elif re.match(_SYSTEM_LIB_RE, real):
            system[real] = len(entries)
        entries.append(entry)
    if system and os_owners is not None:
        wanted = {spelling: path for path in system for spelling in merged_usr_spellings(path)}
        for spelling, owner in os_owners(set(wanted)).items():
            entries[system[wanted[spelling]]].setdefault("os_package", owner)
    unowned = [i for i, e in enumerate(entries)
               if not e.get("deleted") and not OWNERS.intersection(e)]
    if unowned:
        files = [entries[i]["path"] for i in unowned]
        known = hashes.lookup(files)
        fresh = {n: file_sha256(files[n]) for n, digest in enumerate(known) if digest is None}
        done = [n for n, digest in fresh.items() if digest]
        hashes.store(done, [fresh[n] for n in done])
        for n, i in enumerate(unowned):
            digest = known[n] or fresh.get(n)
            if digest:
                entries[i]["sha256"] = digest.split("=", 1)[1]
        hashes.save()
    return sorted(entries, key=lambda e: (e["name"], e["path"]))


class NoHashes:
    """The hash store of a run that trusts no cache: nothing is read, every file is hashed,
    nothing is written (``filehashes.FileHashes`` otherwise)."""

    def lookup(self, paths: Sequence[str]) -> List[Optional[str]]:
        return [None] * len(paths)

    def store(self, indices: Sequence[int], digests: Sequence[str]) -> None:
        pass

    def save(self) -> bool:
        return False


def file_sha256(path: str) -> Optional[str]:
    """``sha256=<hex>`` of a regular file (the form ``filehashes`` stores), None if unreadable."""
    try:
        fd = open_regular(path)
    except (OSError, ValueError):
        return None
    h = sha256()
    try:
        with os.fdopen(fd, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return "sha256=" + h.hexdigest()


# -- BLAS and OpenMP runtimes --------------------------------------------------------------------



def collect_runtimes(paths: Sequence[str]) -> Tuple[List[Dict[str, Any]], str]:
    """(the BLAS and OpenMP runtimes this process loaded, where their facts come from).

    threadpoolctl, when importable here, asks each runtime (OpenBLAS's core type, MKL's code
    path, thread counts); otherwise the runtimes among ``paths`` are named from their files
    alone (``rules.numerics_runtime``), as threadpoolctl names them, so that entries of the two
    sources compare.
    """
    threadpoolctl = _import_threadpoolctl()
    if threadpoolctl is not None:
        try:
            return _sorted([_from_threadpoolctl(i) for i in threadpoolctl.threadpool_info()]), "threadpoolctl"
        except Exception:
            pass
    out = []
    for path in paths:
        leaf = path.rsplit("/", 1)[-1]
        found = numerics_runtime(leaf)
        if found is not None and not path.endswith(_DELETED):
            out.append({"api": found[0], "implementation": found[1], "library": leaf, "path": path})
    return _sorted(out), "maps"


def _sorted(runtimes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """In one order whatever order the libraries were loaded in (threadpoolctl lists them so)."""
    return sorted(runtimes, key=lambda r: (r["api"], r["implementation"], r["library"], r["path"]))


# threadpoolctl sets this on import (os.environ.setdefault) so that a second Intel OpenMP runtime
# does not abort the process. The probe must not change the process it describes: a variable it
# did not find is taken out again (libiomp reads it when it loads, not from the probe's import).
_THREADPOOLCTL_SETS = "KMP_DUPLICATE_LIB_OK"


def _import_threadpoolctl() -> Any:
    """threadpoolctl, imported without leaving its mark on the environment; None when absent or
    broken here (then the runtimes are named from the files alone)."""
    if "threadpoolctl" in sys.modules:
        return sys.modules["threadpoolctl"]
    had = _THREADPOOLCTL_SETS in os.environ
    try:
        import threadpoolctl
    except Exception:
        return None
    finally:
        if not had:
            os.environ.pop(_THREADPOOLCTL_SETS, None)
    return threadpoolctl


def _from_threadpoolctl(info: Dict[str, Any]) -> Dict[str, Any]:
    path = str(info.get("filepath") or "")
    entry: Dict[str, Any] = {"api": str(info.get("user_api")),
                             "implementation": str(info.get("internal_api")),
                             "library": path.rsplit("/", 1)[-1], "path": path}
    for field in RUNTIME_FIELDS:
        value = info.get(field)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int) or (isinstance(value, str) and value):
            entry[field] = value
    return entry

