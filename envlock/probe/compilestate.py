"""torch.compile's state: the Inductor and Dynamo settings that choose kernels, the Triton
version, and the compile and autotune caches a process that compiled read.

A cache directory switch alone gives non-bitwise-identical runs (triton-lang/triton #9368), and
fresh containers without a compile cache have given four different results where two with a
persisted one agreed: which kernels a compiled model runs depends on what autotuning found, and
a warm cache replays what an earlier run found. So each cache directory in use is recorded with
a bounded digest of what it holds, and the compile cache loaded into it, by a process that
compiled (``compiled_here``): the default directories are shared by every job of a user, and for
a process that never compiled, another job filling them is no fact of its run.

Settings are read only from config modules the process already imported (``rules.COMPILE_*``
says why). Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from .compilecache import INDUCTOR_DIR_ENV, TRITON_DISTRIBUTIONS, loaded_here
from .files import sha256
from .rules import COMPILE_MODULES, COMPILE_SETTINGS, quiet

# The digest lists at most this many files (the first, in sorted depth-first order): a cache
# of a long-lived user can hold hundreds of thousands, and a capture must stay cheap. Past it the
# digest says "truncated" and still changes when the first files do.
MAX_CACHE_FILES = 10000
_MAX_SETTING = 256


def collect_compile(packages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``[compile]``: triton, settings (those readable in this process) and, for a process that
    compiled (``compiled_here``), its caches and the compile cache loaded into the Inductor cache
    directory in use (``compilecache``), if any."""
    out: Dict[str, Any] = {}
    triton = _triton_version(packages)
    if triton:
        out["triton"] = triton
    settings = read_settings()
    if settings:
        out["settings"] = settings
    if compiled_here():
        out["caches"] = [describe_cache(kind, path) for kind, path in cache_dirs()]
        loaded = loaded_here(inductor_cache_dir())
        if loaded:
            out["loaded"] = loaded
    return out


def compiled_here() -> bool:
    """True when torch.compile compiled in this process: Dynamo converted at least one frame
    (its own ``counters["frames"]["ok"]``, counted once per frame it compiled, whatever the
    backend, and kept by ``torch._dynamo.reset()``).

    Only such a process read or filled an Inductor or Triton cache, or ran kernels from a loaded
    compile cache; for any other, what the user's shared cache directories hold (another job
    writes to them) cannot explain its numbers. Imported modules are no such signal:
    ``import torch._dynamo`` imports Inductor and its config without compiling anything, and
    libraries import it to ask whether they are being compiled. The counters are read from
    ``sys.modules`` (nothing is imported; a process that never imported ``torch._dynamo.utils``
    compiled nothing), so a shell probe, which never compiles, records no caches. A process
    probed before its first compiled call (a capture before the first step) has not compiled
    yet either."""
    counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    try:
        frames = counters.get("frames") if isinstance(counters, dict) else None
        return bool(frames and frames.get("ok", 0) > 0)
    except Exception:  # another torch's counters: not known to have compiled
        return False


def _triton_version(packages: List[Dict[str, Any]]) -> Optional[str]:
    module = sys.modules.get("triton")
    version = quiet(lambda: str(module.__version__)) if module is not None else None
    if version:
        return version  # type: ignore[no-any-return]
    for pkg in packages:
        if pkg.get("name") in TRITON_DISTRIBUTIONS:
            return str(pkg.get("version"))
    return None


def read_settings() -> Dict[str, Any]:
    """``{"inductor.max_autotune": False, ...}`` from the config modules already imported."""
    out: Dict[str, Any] = {}
    for config, attr in COMPILE_SETTINGS:
        module = sys.modules.get(COMPILE_MODULES[config])
        if module is None:
            continue

        value = quiet(functools.partial(_attribute, module, attr.split(".")))
        if value is None:  # unset (simdlen: chosen by the CPU), or not in this torch
            continue
        if isinstance(value, (bool, int, float, str)):
            out["%s.%s" % (config, attr)] = value
        else:  # a list of backends, an enum: its text
            out["%s.%s" % (config, attr)] = str(value)[:_MAX_SETTING]
    return out


def _attribute(obj: Any, parts: List[str]) -> Any:
    for part in parts:
        obj = getattr(obj, part)
    return obj


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled graphs, kernels and autotuning results (as torch computes
    it in torch._inductor.runtime.cache_dir_utils, without importing torch._inductor)."""
    configured = os.environ.get(INDUCTOR_DIR_ENV)
    if configured:
        return os.path.abspath(configured)
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, ImportError, OSError):
        getuid = getattr(os, "getuid", None)
        user = "uid_%d" % getuid() if callable(getuid) else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def triton_cache_dir() -> str:
    """Triton's own kernel cache (``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``)."""
    configured = os.environ.get("TRITON_CACHE_DIR")
    if configured:
        return os.path.abspath(configured)
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def cache_dirs() -> List[Tuple[str, str]]:
    return [("inductor", inductor_cache_dir()), ("triton", triton_cache_dir())]


def describe_cache(kind: str, path: str) -> Dict[str, Any]:
    """files, bytes and sha256 of (relative path, size) of every file, at most MAX_CACHE_FILES.

    Names and sizes, not contents: the entries of both caches are named by the hash of what they
    hold (a graph's, a kernel's source and options), so the names identify the contents, and
    reading gigabytes of kernels on every capture would cost more than the run they describe.
    """
    lines: List[str] = []
    total = 0
    truncated = False
    stack = [""]
    while stack and not truncated:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(path, rel) if rel else path) as it:
                entries = sorted(it, key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            name = rel + "/" + entry.name if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(name)
                elif entry.is_file(follow_symlinks=False):
                    if len(lines) >= MAX_CACHE_FILES:
                        truncated = True
                        break
                    size = entry.stat(follow_symlinks=False).st_size
                    total += size
                    lines.append("%s\0%d" % (name, size))
            except OSError:
                continue
    out: Dict[str, Any] = {"kind": kind, "path": path, "files": len(lines), "bytes": total}
    if lines:
        lines.sort()
        out["sha256"] = sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
    if truncated:
        out["truncated"] = True
    return out
