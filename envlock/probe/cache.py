"""The torch facts cache: what ``import torch`` would tell, reused while nothing it depends on
changed. (Files parsed once and remembered by stat are ``statcache``.)

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import source
from .files import read_text, sha256
from .native import is_shared_object
from .packages import collect_packages, path_entries, record_sha256
from .rules import canonicalize_name, numerics_library, numerics_variable
from .statcache import RecordDigests, cache_dir, prune, read_entry, scan_record, write_cache

# ---------------------------------------------------------------------------------------------
# Torch facts cache: what ``import torch`` would tell, reused while nothing it depends on moved.
#
# Importing torch is most of a capture (seconds on a GPU box) and its answers - version, CUDA,
# cuDNN, NCCL, build flags, the flags a *fresh* interpreter starts with, and the libraries it
# maps - change only when torch's or its CUDA libraries' files change, a distribution torch
# imports or maps a library of changes (numpy and its bundled OpenBLAS, a device backend found
# through an entry point), or a variable, the CPU or the driver does. Those inputs are hashed
# into a key; a hit skips the import. Every installed distribution counts by its name, version
# and RECORD digest, which the package scan has read anyway: which ones ``import torch`` pulls
# in is only known after it ran, and an entry kept across ``pip install numpy==...`` served the
# old numpy's runtime and a library path that no longer existed. An entry also holds the stat of
# each library the import mapped, so one replaced in place is a miss too. Used only by the
# probe run as a program (CLI capture/verify), whose torch state is a fresh interpreter's by
# construction; a training process (``envlock.capture()``) reads its own live flags and never
# uses it. Seeds are never cached: a seed set through envlock makes the run live.
# ---------------------------------------------------------------------------------------------

CACHE_FORMAT = 3  # 2: the libraries and runtimes import torch loads; 3: their stat, every dist
CACHE_MAX_ENTRIES = 64
# Beyond the variables that change numerics (``rules.numerics_variable``, keyed on too): the
# families torch, its BLAS/OpenMP runtimes, CUDA, ROCm, the dynamic loader and the interpreter
# read at import, settings and diagnostics alike (a whole family: a fact may follow from any).
_IMPORT_ENV_PREFIXES = (
    "CUDA_", "TORCH_", "PYTORCH_", "ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "CUBLAS", "CUDNN_",
    "NCCL_", "NVIDIA_", "ONEDNN_", "DNNL_", "OPENBLAS_", "TRITON_", "LD_", "HIP_", "ROCM_",
    "ROCR_", "HSA_", "XLA_", "USE_", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONUSERBASE",
)
# Strings compiled by ``re`` on first use: only a run that reads torch's facts needs them.
# Of the files in LD_LIBRARY_PATH's directories, those `import torch` may load in place of its
# own: the libraries that decide numerics (``rules.numerics_library``) and those that do not
# but that torch's facts come from (the CUDA driver's, the profiler's, NVTX).
_KEY_LIB_ALSO_RE = r"^lib(cuda|cupti|nvToolsExt)(?![a-z])"
_KEY_DIST_RE = r"(?i)^(torch|triton|pytorch_triton[^-]*|nvidia_[^-]+)-[^-]+\.dist-info$"


def _key_library(name: str) -> bool:
    """Whether a file of a directory on LD_LIBRARY_PATH goes into the key."""
    return is_shared_object(name) and (numerics_library(name) or re.match(_KEY_LIB_ALSO_RE, name) is not None)


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "%s:absent" % path
    return "%s:%d:%d:%d" % (path, st.st_size, st.st_mtime_ns, st.st_ino)


def key_variable(name: str) -> bool:
    """True for a variable the torch-facts key holds: one that changes numerics, or one read
    while ``import torch`` runs."""
    return numerics_variable(name) or name.startswith(_IMPORT_ENV_PREFIXES)


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


def library_stats(paths: Sequence[str]) -> List[str]:
    """The stat of each library ``import torch`` mapped, as an entry holds it: a library
    replaced, upgraded or removed since (a wheel's bundled OpenBLAS) makes the entry stale."""
    return [_stat_line(path) for path in paths]


def _distributions(packages: Sequence[Mapping[str, Any]]) -> List[str]:
    """Each active distribution as the key holds it: name, version and RECORD digest."""
    return sorted("%s %s %s" % (p.get("name"), p.get("version"), p.get("record_sha256") or "-")
                  for p in packages)


def torch_cache_key(records: Optional[RecordDigests] = None,
                    packages: Optional[Sequence[Mapping[str, Any]]] = None) -> Optional[str]:
    """sha256 of every input the torch facts depend on, or None when they cannot be pinned
    down (no torch distribution with a RECORD: a source checkout, an egg).

    ``records`` remembers what each RECORD yields by its stat (torch's is ~15,000 lines).
    ``packages``: the package scan of this run (``collect_packages``), scanned here without it."""
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
    if packages is None:
        packages = collect_packages(errors=[], record_digest=records or record_sha256)[0]
    put("distributions", *_distributions(packages))
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
            if _key_library(name):
                put(_stat_line(os.path.join(directory, name)))
    for lib in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")):
        if lib:
            put(_stat_line(lib))
    put(_stat_line("/etc/ld.so.cache"))
    for name in sorted(os.environ):
        if key_variable(name):
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
    """The facts stored under ``key``; None for a miss, a corrupt entry, one of another key or
    one the caller does not own (``statcache.read_cache``)."""
    entry = read_entry(_cache_path(key), 1 << 22, format=CACHE_FORMAT, key=key)
    if entry is None or not isinstance(entry.get("facts"), dict):
        return None
    facts: Dict[str, Any] = entry["facts"]
    if not isinstance(facts.get("torch"), dict) or not isinstance(facts.get("determinism"), dict):
        return None
    libraries = facts.get("libraries")
    if not isinstance(libraries, list) or not all(isinstance(p, str) for p in libraries) \
            or facts.get("library_stats") != library_stats(libraries):
        return None  # a library the import mapped is gone or another file now
    return facts


def cache_write(key: str, facts: Dict[str, Any]) -> None:
    """Concurrent writers of one key write the same bytes, so whichever rename lands last is
    right. The oldest entries beyond CACHE_MAX_ENTRIES go. Never raises."""
    if write_cache(_cache_path(key), {"format": CACHE_FORMAT, "key": key, "facts": facts}):
        prune("torch-facts-", CACHE_MAX_ENTRIES)
