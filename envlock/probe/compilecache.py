"""A torch.compile cache carried from one process to another: the bytes of
``torch.compiler.save_cache_artifacts()`` (torch's "Mega-Cache": compiled graphs, AOTAutograd
entries, Triton kernels, autotuning results, dynamic-shape decisions) behind a header that says
what made them.

A run with a warm compile cache and one without can run other kernels (autotuning picks them,
and the cache replays an earlier pick), so a replay that should run the original's kernels must
start from the original's cache. torch checks that artifacts are used under the torch and Triton
versions that made them and otherwise ignores them silently: a replay would then compile cold
and nobody would know. The header makes that check envlock's, and loud.

The file::

    envlock-compile-cache 1\\n
    {"torch": "2.13.0+cpu", "triton": null, "artifacts": {"inductor": 1, ...},
     "payload_bytes": N, "payload_sha256": "...", ...}\\n
    <N bytes: what save_cache_artifacts() returned>

Stdlib only, Python >= 3.8, part of the probe package but importing none of it (as
``ospkgs.py``): envlock copies this one file beside the command it starts and runs it by path in
the command's own interpreter (a container's, a venv without envlock)::

    python compilecache.py populate FILE DIR STATUS -- CMD ...

which loads FILE into the Inductor cache directory DIR, points ``TORCHINDUCTOR_CACHE_DIR`` at it,
writes what it did to STATUS (JSON: the file's sha256, or why it refused it, which envlock
reports) and then runs CMD in its place (``exec``): the command finds a warm cache without
importing envlock or changing a line. torch is imported only to save and load.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"envlock-compile-cache 1\n"
# Where ``envlock.save_compile_cache()`` writes when given no path (``run``/``record``
# ``--save-compile-cache`` set it), and what a process that loaded a cache carries:
# ``<file sha256>:<the Inductor cache directory it was loaded into>``, read by the probe.
SAVE_ENV = "ENVLOCK_COMPILE_CACHE_OUT"
LOADED_ENV = "ENVLOCK_COMPILE_CACHE_LOADED"
# The Inductor cache directory envlock made for one run and pointed ``TORCHINDUCTOR_CACHE_DIR``
# at (``populate``): a fresh temporary path at every run, so the variable is left out of what the
# probe records while it names this directory (``set_by_envlock``).
OWN_DIR_ENV = "ENVLOCK_COMPILE_CACHE_DIR"
INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")
MAX_HEADER = 64 * 1024
# A large model's artifacts on a GPU are hundreds of MB; torch loads them from one bytes object.
MAX_BYTES = 8 << 30
_CHUNK = 1 << 20
# Exit status of ``populate`` when it refuses the file (envlock's "the input is wrong"), and when
# the command after ``--`` cannot be started (a shell's).
EXIT_REFUSED = 2
EXIT_NOT_FOUND = 127


class CacheError(Exception):
    """The file is not a compile cache envlock wrote, is damaged (``kind`` "invalid"), or was
    made by another torch or Triton (``kind`` "version")."""

    def __init__(self, kind: str, message: str) -> None:
        Exception.__init__(self, message)
        self.kind = kind


# -- the header ----------------------------------------------------------------------------------


def _text(value: Any, limit: int = 128) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def check_header(header: Any) -> Dict[str, Any]:
    """The header, if its fields have the types the reader relies on; CacheError otherwise.
    Fields it does not know are kept (a later envlock may add some)."""
    if not isinstance(header, dict):
        raise CacheError("invalid", "its header is not an object")
    triton = header.get("triton")
    artifacts = header.get("artifacts")
    size = header.get("payload_bytes")
    digest = header.get("payload_sha256")
    problems = []
    if not _text(header.get("torch")):
        problems.append("torch")
    if triton is not None and not _text(triton):
        problems.append("triton")
    if not isinstance(artifacts, dict) or not all(
            _text(k, 64) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in artifacts.items()):
        problems.append("artifacts")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_BYTES:
        problems.append("payload_bytes")
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        problems.append("payload_sha256")
    if problems:
        raise CacheError("invalid", "its header has no valid %s" % ", ".join(problems))
    return header


def parse_header(data: bytes) -> Tuple[Dict[str, Any], int]:
    """(header, offset of the payload) from the first bytes of a file (at least the magic line
    and the header line, or all of a shorter file)."""
    if not data.startswith(MAGIC):
        raise CacheError("invalid", "it is not a compile cache written by envlock")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER + 1)
    if end < 0:
        raise CacheError("invalid", "its header is cut short or longer than %d bytes" % MAX_HEADER)
    try:
        header = json.loads(data[len(MAGIC):end].decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; nesting, deep
        raise CacheError("invalid", "its header is not JSON (%s)" % (str(exc).splitlines() or ["?"])[0]) from None
    return check_header(header), end + 1


def _open(path: str) -> int:
    """A descriptor of the regular file ``path``: opened without blocking (a FIFO never answers),
    its type checked on the descriptor, so that the file read is the file checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheError("invalid", "it is not a regular file")
    return fd


def read(path: str, payload: bool = True) -> Tuple[Dict[str, Any], Optional[bytes], str]:
    """(header, payload or None, sha256 of the whole file) of a compile cache, its payload
    checked against the header's size and digest (read even when ``payload`` is False, to check
    it). CacheError names what is wrong; OSError as ``open`` raises it."""
    fd = _open(path)
    whole = hashlib.sha256()
    inner = hashlib.sha256()
    kept: List[bytes] = []
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > MAX_BYTES + MAX_HEADER + len(MAGIC) + 1:
            raise CacheError("invalid", "it is larger than %d GiB" % (MAX_BYTES >> 30))
        first = fh.read(len(MAGIC) + MAX_HEADER + 1)
        header, offset = parse_header(first)
        whole.update(first)
        rest = first[offset:]
        got = 0
        while rest:
            got += len(rest)
            if got > header["payload_bytes"]:
                break
            inner.update(rest)
            if payload:
                kept.append(rest)
            rest = fh.read(_CHUNK)
            whole.update(rest)
    if got != header["payload_bytes"] or inner.hexdigest() != header["payload_sha256"]:
        raise CacheError("invalid", "it is damaged: its artifacts are not the %d bytes its header "
                                    "names (%d read, or another digest)" % (header["payload_bytes"], got))
    return header, (b"".join(kept) if payload else None), whole.hexdigest()


def check_versions(header: Dict[str, Any], torch_version: str, triton_version: Optional[str]) -> None:
    """CacheError ("version") unless the cache was made by this torch and this Triton: torch
    would not use it, and the run would compile cold without a word."""
    made = (header["torch"], header.get("triton"))
    if made != (torch_version, triton_version):
        raise CacheError("version", "it was made by %s; this environment has %s: torch would not use it "
                                    "and would compile cold" % (_stack(*made), _stack(torch_version, triton_version)))


def _stack(torch_version: str, triton_version: Optional[str]) -> str:
    return "torch %s (%s)" % (torch_version, "Triton %s" % triton_version if triton_version else "no Triton")


# -- this process's torch ------------------------------------------------------------------------


def triton_version() -> Optional[str]:
    """The installed Triton's version, without importing it (what Inductor would use)."""
    module = sys.modules.get("triton")
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str):
        return version
    from importlib import metadata

    for name in TRITON_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _devices(torch: Any) -> List[str]:
    """The GPUs of a process that initialised CUDA (never initialised here): Inductor's entries
    for one GPU are not used on another."""
    try:
        if not torch.cuda.is_initialized():
            return []
        return ["%s (%d.%d)" % (torch.cuda.get_device_name(i), *torch.cuda.get_device_capability(i))
                for i in range(torch.cuda.device_count())]
    except Exception:  # a torch without CUDA, a wedged driver: say nothing rather than fail a save
        return []


def write(path: str, header: Dict[str, Any], payload: bytes) -> None:
    """Write a compile cache whole or not at all: a temporary file beside ``path``, flushed to
    disk, then renamed over it (a link at ``path`` is replaced, not followed)."""
    full = dict(header, payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())
    line = json.dumps(check_header(full), sort_keys=True).encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    import tempfile  # only where a cache is written: a probe that reads one does not pay it

    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + line + b"\n")
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _needs_mega_cache(torch: Any, name: str) -> None:
    """A torch from before torch.compiler's portable caches cannot take part: say so, rather
    than fail with an AttributeError."""
    if not callable(getattr(getattr(torch, "compiler", None), name, None)):
        raise CacheError("version", "torch %s has no torch.compiler.%s: it cannot save or load "
                                    "compile caches" % (torch.__version__, name))


def save(path: str, settings: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """Save what this process compiled to ``path``; its header, or None (nothing written) when
    the process compiled nothing. ``settings``: the torch.compile settings it ran under."""
    import torch

    _needs_mega_cache(torch, "save_cache_artifacts")
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    payload, info = saved
    import datetime

    header = {
        "torch": str(torch.__version__), "triton": triton_version(),
        "python": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
        "created_at": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "artifacts": {str(k): len(v) for k, v in sorted(info.artifacts.items()) if v},
        "settings": dict(settings or {}), "devices": _devices(torch),
    }
    write(path, header, payload)
    return header


def load(path: str, cache_dir: Optional[str] = None) -> Dict[str, Any]:
    """Load a compile cache into the Inductor cache directory (``cache_dir``, which
    ``TORCHINDUCTOR_CACHE_DIR`` then names, else the one in use), where every later compile of
    this process and of the processes it starts finds it; refused (CacheError) unless this torch
    and Triton made it. Returns its header with ``sha256`` (the file's) and ``loaded`` (the
    artifacts torch wrote, by kind)."""
    header, payload, digest = read(path)
    import torch

    check_versions(header, str(torch.__version__), triton_version())
    _needs_mega_cache(torch, "load_cache_artifacts")
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
        os.environ[INDUCTOR_DIR_ENV] = os.environ[OWN_DIR_ENV] = os.path.abspath(cache_dir)
    info = torch.compiler.load_cache_artifacts(payload or b"")
    if info is None:
        raise CacheError("invalid", "torch could not read its artifacts")
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    os.environ[LOADED_ENV] = "%s:%s" % (digest, inductor_cache_dir())
    return dict(header, sha256=digest, loaded={str(k): len(v) for k, v in sorted(info.artifacts.items()) if v})


def loaded_here(inductor_cache_dir: str) -> Optional[str]:
    """The sha256 of the compile cache loaded into ``inductor_cache_dir`` (the one this process
    uses) by this process or the one that started it, else None: a process that moved to another
    cache directory does not run from what was loaded into the first."""
    digest, sep, directory = os.environ.get(LOADED_ENV, "").partition(":")
    if sep and len(digest) == 64 and not digest.strip("0123456789abcdef") and directory == inductor_cache_dir:
        return digest
    return None


def set_by_envlock(name: str, value: str) -> bool:
    """True for ``TORCHINDUCTOR_CACHE_DIR`` while it names the directory envlock loaded a compile
    cache into for this run: envlock's temporary path, another at every run, which no process
    chose; what the directory held when the process started is ``[compile].loaded``. A value the
    process or its user set (another cache) is theirs, and recorded."""
    return name == INDUCTOR_DIR_ENV and bool(value) and value == os.environ.get(OWN_DIR_ENV)


# -- populate: load, then become the command -----------------------------------------------------


def _status(path: str, doc: Dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh)


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 6 or args[0] != "populate" or args[4] != "--":
        sys.stderr.write("usage: compilecache.py populate FILE DIR STATUS -- CMD ...\n")
        return EXIT_REFUSED
    path, directory, status, command = args[1], args[2], args[3], args[5:]
    try:
        found = load(path, directory)
    except Exception as exc:  # whatever torch raises, the command must not start
        kind = exc.kind if isinstance(exc, CacheError) else "invalid"
        message = (str(exc) if isinstance(exc, CacheError) else exc.strerror or str(exc)
                   if isinstance(exc, OSError) else "torch could not load it: %s: %s" % (type(exc).__name__, exc))
        _status(status, {"refused": kind, "message": message})  # envlock reports it
        return EXIT_REFUSED
    _status(status, {"loaded": found["sha256"], "artifacts": found["loaded"]})
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        _status(status, {"loaded": found["sha256"], "artifacts": found["loaded"],
                         "not_started": "%s: %s" % (command[0], exc.strerror or exc)})
    return EXIT_NOT_FOUND


if __name__ == "__main__":
    # Run by path, this file's directory is sys.path[0]; whatever else lies there must not
    # shadow what torch imports.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    raise SystemExit(main())
