"""A compile cache on the host: checked before a run or a pack uses it, loaded before a command
starts, collected after it saved one.

The file is ``probe/compilecache``'s (``envlock.save_compile_cache()`` writes it). Loading needs
torch, and the command's process is the one that must find the cache, so envlock does not load
it itself: the command runs as ``python compilecache.py populate FILE DIR STATUS -- CMD ...`` in
its own interpreter (a container's, or a venv on this host), which loads FILE into a fresh
Inductor cache directory DIR, points ``TORCHINDUCTOR_CACHE_DIR`` at it and becomes CMD. So a
script that never imports envlock compiles warm, every rank ``torchrun`` starts shares the
directory, and the run starts from exactly the artifacts of the file, not from whatever an
earlier job left in the default cache directory. The loader writes STATUS before it becomes the
command: envlock reads it afterwards to tell a refused cache from the command's own exit code.

Saving is the process's: only it holds what it compiled. ``--save-compile-cache FILE`` names a
private path in ``ENVLOCK_COMPILE_CACHE_OUT``; the first ``envlock.record()`` arranges the save
at exit (or the script calls ``envlock.save_compile_cache()``), and envlock checks what was
written and moves it to FILE whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.errors import CompileCacheRefused, UsageError
from envlock.probe import compilecache
from envlock.text.terminal import plural, safe

if TYPE_CHECKING:
    from envlock.lock import Lock

# Where the private directory is mounted in a container, and the names inside it.
INSIDE = "/envlock-compile"
_LOADER = "compilecache.py"
_CACHE = "cache.bin"       # the file to load (a mount point in a container, the file's path here)
_INDUCTOR = "inductor"     # the command's TORCHINDUCTOR_CACHE_DIR
_STATUS = "status.json"
_SAVED = "saved.bin"       # where the process saves (ENVLOCK_COMPILE_CACHE_OUT)
_MAX_STATUS = 64 * 1024


@dataclass(frozen=True)
class CacheFile:
    """A compile cache whose header and digest were checked."""

    path: Path
    header: dict[str, Any]
    sha256: str

    @property
    def artifacts(self) -> int:
        return sum(self.header["artifacts"].values())

    def describe(self) -> str:
        made = f"torch {self.header['torch']}" + (f", Triton {self.header['triton']}" if self.header.get("triton") else "")
        size = self.header["payload_bytes"] / 1e6
        return f"{self.sha256[:12]} ({plural(self.artifacts, 'artifact')}, {size:.1f} MB, made by {made})"


def read_cache(path: str | os.PathLike[str]) -> CacheFile:
    """The checked header and sha256 of a compile cache; ``CompileCacheRefused`` (exit 2) for a
    file that is not one, is damaged, or cannot be read."""
    p = Path(path)
    try:
        header, _, digest = compilecache.read(str(p), payload=False)
    except compilecache.CacheError as exc:
        raise CompileCacheRefused(safe(f"compile cache {p}: {exc}")) from None
    except OSError as exc:
        raise CompileCacheRefused(safe(f"compile cache {p}: {(exc.strerror or str(exc)).lower()}")) from None
    return CacheFile(p, header, digest)


def lock_triton(lock: Lock) -> str | None:
    """The Triton of a lock's environment: its package (any of Triton's distributions)."""
    for name in compilecache.TRITON_DISTRIBUTIONS:
        pkg = lock.package(name)
        if pkg is not None:
            return pkg.version
    return None


def check_against_lock(cache: CacheFile, lock: Lock, lock_name: str) -> None:
    """Refuse a cache the lock's environment would not use: made by another torch or Triton
    (torch ignores such artifacts and compiles cold, silently), or a lock without torch."""
    if lock.torch is None:
        raise CompileCacheRefused(safe(f"compile cache {cache.path}: {lock_name} has no torch to use it"))
    try:
        compilecache.check_versions(cache.header, lock.torch.version, lock_triton(lock))
    except compilecache.CacheError as exc:
        raise CompileCacheRefused(safe(f"compile cache {cache.path}: {exc} ({lock_name})")) from None


def check_save_target(path: str | os.PathLike[str]) -> Path:
    """Where ``--save-compile-cache`` will write, checked before the command runs: its directory
    exists, and the path is not a directory."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(safe(f"--save-compile-cache {p}: is a directory"))
    if not p.absolute().parent.is_dir():
        raise UsageError(safe(f"--save-compile-cache {p}: no directory {p.absolute().parent}"))
    return p


def host_python(program: str | None, base: Path) -> str:
    """The interpreter that loads a cache before a command on this host: the command's own when
    it is a Python (``python train.py``), else the Python of the environment the program lies in
    (``.venv/bin/torchrun``), else the environment chosen as capture chooses it."""
    if program and re.fullmatch(r"python(\d+(\.\d+)*)?", os.path.basename(program)):
        return program
    from envlock.probing.target import choose, prefix_interpreter

    prefix = Path(program).parent.parent if program else None
    if prefix is not None and ((prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir()):
        found = prefix_interpreter(prefix)
        if found:
            return found
    return choose(None, cwd=base).python


@dataclass
class CompileRun:
    """What one command does with compile caches: ``load`` before it starts, a file it saves
    collected to ``save``. ``directory`` is private to this run (removed afterwards); ``root``
    is where the command sees it (the directory on this host, ``INSIDE`` in a container)."""

    directory: Path
    root: str
    load: CacheFile | None = None
    save: Path | None = None
    notes: list[str] = field(default_factory=list)

    def command(self, python: str, command: Sequence[str]) -> list[str]:
        """The command as it runs: behind the loader when a cache is to be loaded."""
        if self.load is None:
            return list(command)
        cache = f"{self.root}/{_CACHE}" if self.root == INSIDE else str(self.load.path.absolute())
        return [python, f"{self.root}/{_LOADER}", "populate", cache, f"{self.root}/{_INDUCTOR}",
                f"{self.root}/{_STATUS}", "--", *command]

    def env(self) -> dict[str, str]:
        return {compilecache.SAVE_ENV: f"{self.root}/{_SAVED}"} if self.save is not None else {}

    def mounts(self) -> list[tuple[str, str, bool]]:
        """(host path, container path, read-only) for a container run."""
        if self.load is None and self.save is None:
            return []
        out = [(str(self.directory), INSIDE, False)]
        if self.load is not None:
            out.append((str(self.load.path.resolve()), f"{INSIDE}/{_CACHE}", True))
        return out

    def loaded(self) -> str | None:
        """After the command: the sha256 the loader loaded (None when none was to be); raises
        when it refused the cache or could not start the command, which then never ran."""
        if self.load is None:
            return None
        status = self.directory / _STATUS
        try:
            with open(status, "rb") as fh:
                doc = json.loads(fh.read(_MAX_STATUS))
        except (OSError, ValueError, RecursionError):
            raise CompileCacheRefused(safe(f"compile cache {self.load.path}: the interpreter that loads it "
                                           "did not run (the command did not start)")) from None
        if not isinstance(doc, dict):
            raise CompileCacheRefused(safe(f"compile cache {self.load.path}: its loader wrote no status"))
        if doc.get("refused"):
            raise CompileCacheRefused(safe(f"compile cache {self.load.path}: {doc.get('message')}: "
                                           "nothing was run"))
        if doc.get("not_started"):
            raise UsageError(safe(f"the command could not be started after the compile cache was loaded: "
                                  f"{doc['not_started']}"))
        digest = doc.get("loaded")
        return digest if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) else None

    def collect(self) -> CacheFile | None:
        """After the command: the compile cache it saved, checked and moved to ``save`` whole
        (None, with a note, when it saved none)."""
        if self.save is None:
            return None
        saved = self.directory / _SAVED
        if not saved.is_file():
            self.notes.append(f"no compile cache was saved to {self.save}: the command compiled nothing, or "
                              "never called envlock.record() or envlock.save_compile_cache()")
            return None
        checked = read_cache(saved)
        target = self.save.absolute()
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(saved, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return CacheFile(self.save, checked.header, checked.sha256)


@contextmanager
def compile_run(load: CacheFile | None, save: Path | None, *, container: bool) -> Iterator[CompileRun]:
    """A ``CompileRun`` with its private directory (the loader copied in, the mount point of the
    file to load made), removed when the block ends, whatever the command did."""
    directory = Path(tempfile.mkdtemp(prefix="envlock-compile-"))
    try:
        if load is not None:
            shutil.copyfile(compilecache.__file__, directory / _LOADER)
            if container:
                (directory / _CACHE).touch()
        yield CompileRun(directory, INSIDE if container else str(directory), load, save)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def pack_cache(path: Path, sha256: Any) -> CacheFile:
    """The compile cache of a pack (``path``: the file its manifest names, already checked to
    lie inside the pack), checked against the digest the manifest gives for it."""
    if path.is_symlink() or not path.is_file():
        raise CompileCacheRefused(safe(f"the pack's compile cache {path} is not a file in the pack"))
    found = read_cache(path)
    if found.sha256 != sha256:
        raise CompileCacheRefused(safe(f"the pack's compile cache {path} is not the one its manifest names"),
                                  hint="copy the pack again from its archive")
    return found
