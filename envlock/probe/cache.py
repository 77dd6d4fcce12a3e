"""Caches of the probe: the torch facts, and the digests of big RECORD files.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import source
from .files import atomic_json, read_text
from .packages import path_entries, record_sha256
from .rules import canonicalize_name

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
CACHE_MAX_ENTRIES = 64
# Everything torch, its BLAS/OpenMP runtimes, CUDA or the dynamic loader read at import.
_KEY_ENV_PREFIXES = (
    "CUDA_", "TORCH_", "PYTORCH_", "ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "CUBLAS", "CUDNN_",
    "NCCL_", "NVIDIA_", "ONEDNN_", "DNNL_", "OPENBLAS_", "TRITON_", "LD_", "HIP_", "ROCM_",
    "ROCR_", "HSA_", "XLA_", "USE_", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONUSERBASE",
)
_KEY_LIB_RE = re.compile(
    r"^lib(cuda|cudart|cudnn|cublas|nccl|nvrtc|nvrtc-builtins|nvJitLink|cufft|curand|cusolver|"
    r"cusparse|cupti|nvToolsExt|amdhip64|MIOpen|rccl|rocblas|hipblas|gomp|iomp5|mkl)[^/]*\.so")
_KEY_DIST_RE = re.compile(r"^(torch|triton|pytorch_triton[^-]*|nvidia_[^-]+)-[^-]+\.dist-info$",
                          re.IGNORECASE)


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
            if _KEY_DIST_RE.match(fname):
                cname = canonicalize_name(fname.split("-", 1)[0])
                if cname not in seen:
                    seen.add(cname)
                    found.append((entry, fname))
    return found


def torch_cache_key() -> Optional[str]:
    """sha256 of every input the torch facts depend on, or None when they cannot be pinned
    down (no torch distribution with a RECORD: a source checkout, an egg)."""
    import importlib.util

    dists = _torch_dists()
    if not any(d[1].lower().startswith("torch-") for d in dists):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape") + b"\0")

    put("format", str(CACHE_FORMAT), str(source.PROBE_VERSION), sys.version, sys.prefix,
        os.path.realpath(sys.executable or ""), _stat_line(os.path.realpath(sys.executable or "")),
        _stat_line(spec.origin), source.digest())
    for entry, info in dists:
        record = os.path.join(entry, info, "RECORD")
        try:
            with open(record, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        put(info, hashlib.sha256(data).hexdigest())
        for line in data.splitlines():
            rel = line.split(b",", 1)[0].decode("utf-8", "surrogateescape")
            leaf = rel.rsplit("/", 1)[-1]
            if ".so" in leaf and not rel.startswith("../"):
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
            if _KEY_LIB_RE.match(name):
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
    if not atomic_json(_cache_path(key), {"format": CACHE_FORMAT, "key": key, "facts": facts}):
        return
    directory = cache_dir()
    try:
        entries = [n for n in os.listdir(directory) if n.startswith("torch-facts-")]
        if len(entries) > CACHE_MAX_ENTRIES:
            paths = sorted((os.path.join(directory, n) for n in entries),
                           key=lambda p: os.stat(p).st_mtime)
            for old in paths[:len(entries) - CACHE_MAX_ENTRIES]:
                os.unlink(old)
    except OSError:
        pass  # another run pruned the same entry first


class RecordDigests:
    """``record_sha256`` of big RECORD files, remembered by their stat.

    torch's RECORD alone is ~15,000 lines (~60 ms to digest); an installer rewrites RECORD
    whenever it touches a distribution, which changes its inode, size or mtime. Small RECORDs
    are cheaper to digest than to look up and are not kept.
    """

    MIN_SIZE = 32 << 10

    def __init__(self) -> None:
        h = hashlib.sha256(("%s\0%s" % (sys.prefix, sys.executable)).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(cache_dir(), "records-%s.json" % h.hexdigest()[:32])
        self.entries: Dict[str, List[Any]] = {}
        self.dirty = False
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read(1 << 24).decode("utf-8"))
            if isinstance(data, dict) and data.get("format") == CACHE_FORMAT \
                    and isinstance(data.get("entries"), dict):
                self.entries = data["entries"]
        except (OSError, ValueError):
            pass

    def __call__(self, path: str) -> Optional[str]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if st.st_size < self.MIN_SIZE:
            return record_sha256(path)
        sig = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = self.entries.get(path)
        if isinstance(entry, list) and len(entry) == 4 and entry[:3] == sig \
                and isinstance(entry[3], str):
            return entry[3]
        digest = record_sha256(path)
        if digest is not None:
            self.entries[path] = [*sig, digest]
            self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            atomic_json(self.path, {"format": CACHE_FORMAT, "entries": self.entries})
