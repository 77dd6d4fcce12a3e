"""Writing ``env.lock``: the TOML text of a lock, and the atomic write of it.

The text comes from ``_toml``, linear in the size of the lock (tomlkit, used before, is
quadratic in a table's size: 20,000 ``[env]`` keys took over 100 s). Every write is atomic: a
temp file in the same directory, fsync, ``os.replace``; temp files of interrupted writes are
removed by the next write.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import envlock.lock._text as _text
import envlock.lock._toml as _toml
from envlock._version import __version__
from envlock.errors import EnvlockError, LockTooLarge, UsageError
from envlock.lock._seal import seal
from envlock.lock._text import SCHEMA_VERSION
from envlock.probe.procs import pid_alive
from envlock.text.terminal import plural

if TYPE_CHECKING:
    # The models only where a lock is written: ``PROTECTED_ENV`` and ``looks_like_lock`` are
    # read on ``run``'s fast path, which builds no model.
    from envlock.lock._model import LockData

# No file name in here: the same environment written to two names must give the same text.
HEADER = """\
env.lock - a replayable environment, written by envlock {version}.
  envlock verify LOCK     does the environment in front of you match it?
  envlock show LOCK       summary (--format markdown for a paper or pull request)
  envlock restore LOCK    rebuild it as a container
Hand edits break the seal (verify exits 2); after a deliberate edit run `envlock fmt LOCK`."""


@functools.cache
def _section_comments() -> dict[str, str]:
    """The comment under each top-level table's header, as the model declares it."""
    from envlock.lock._model import LockData
    from envlock.lock._policy import policies

    return {name: p.comment for name, p in policies(LockData).items() if p.comment is not None}





def _os_packages_table(out: list[str], table: dict[str, Any]) -> None:
    # One pin per line: hundreds of them on a single line would make a diff of two locks show
    # one giant changed line instead of one line per changed OS package.
    specs = table.get("packages", [])
    out.append(f"\n# {plural(len(specs), 'OS package')} installed by {_toml.string(table['manager'])[1:-1]}, "
               "as name:arch=version.\n")
    out += ["[os_packages]\n", f"manager = {_toml.string(table['manager'])}\n", "packages = ["]
    out.extend(f"\n    {_toml.string(s)}," for s in specs)
    out.append("\n]\n" if specs else "]\n")


def dumps(lock: LockData, name: str = "env.lock") -> str:
    """Render a lock as TOML: stable order (model field order, packages by name), linear time."""
    data = lock.model_dump(mode="json", exclude_none=True)
    data["envlock"]["created_at"] = lock.envlock.created_at  # a native TOML datetime
    # A comment cannot hold control characters: the version and file name go in escaped.
    header = HEADER.format(version=_toml.string(lock.envlock.tool_version)[1:-1],
                           name=_toml.string(name)[1:-1])
    out = [f"# {line}\n" for line in header.splitlines()]
    tail = []
    for key, value in data.items():
        if key in ("os_packages", "packages", "duplicates", "unreadable"):
            if value:
                tail.append((key, value))
            continue
        if value in ({}, []) and key not in ("determinism", "seeds"):
            continue
        _toml.table(out, key, value, _section_comments().get(key))
    for key, rows in tail:
        if key == "os_packages":
            _os_packages_table(out, rows)
            continue
        if key == "packages":
            out.append(f"\n# {plural(len(rows), 'distribution')}, sorted by name. record_sha256 names the exact build.\n")
        elif key == "unreadable":
            out.append(f"\n# {_section_comments()['unreadable']}\n")
        else:
            out.append("\n# Distributions shadowed by another of the same name earlier on sys.path.\n")
        # An empty list is the model's default: `hashes = []` on every row is only noise in a
        # pull request's diff.
        _toml.array_of_tables(out, key, [{k: v for k, v in r.items() if v != []} for r in rows])
    text = "".join(out)
    check_size(text)
    return text


def check_size(text: str) -> None:
    """Refuse a lock text larger than every reader accepts (``_text.MAX_LOCK_BYTES``): the one limit,
    checked where a lock is written, so capture never writes what verify, show and diff refuse."""
    limit = _text.MAX_LOCK_BYTES  # the reader's, read where it is defined
    size = len(text.encode("utf-8"))
    if size > limit:
        raise LockTooLarge(
            f"the lock would be {size / (1 << 20):.1f} MiB; no command reads a lock over "
            f"{limit / (1 << 20):g} MiB, so none was written",
            hint="lock a smaller environment: its distributions (and their shadowed copies on "
                 "sys.path) make up most of a lock")


def file_head(path: Path) -> bytes:
    """The first 64 KiB of ``path`` (empty when it cannot be read): enough to tell what a file
    is (a lock, a replay record) before replacing it, without parsing it."""
    try:
        with open(path, "rb") as fh:
            return fh.read(65536)
    except OSError:
        return b""


def looks_like_lock(path: Path) -> bool:
    return b"[envlock]" in file_head(path)


def _schema_of(path: Path) -> int | None:
    """The schema_version an existing lock declares (read cheaply from its head), if any."""
    m = re.search(rb"^schema_version\s*=\s*([0-9]{1,9})\s*$", file_head(path), re.M)
    return int(m.group(1)) if m else None


# Temp files of a write are named ``.<name>.<pid>.<random>.envlock-tmp`` so that the next write
# can tell an interrupted one (its process is gone) from one in progress, and remove it.
TMP_SUFFIX = ".envlock-tmp"
_TMP_RE = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)\.[A-Za-z0-9_]+" + re.escape(TMP_SUFFIX))
STALE_TMP_SECONDS = 600.0


def remove_stale_temps(directory: Path, name: str) -> list[Path]:
    """Remove temp files of interrupted writes of ``name`` in ``directory``; returns them."""
    removed: list[Path] = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = _TMP_RE.fullmatch(entry)
        if not m or m.group("name") != name:
            continue
        path = directory / entry
        try:
            st = os.lstat(path)
            if pid_alive(int(m.group("pid"))) and now - st.st_mtime < STALE_TMP_SECONDS:
                continue  # a write in progress (or a pid reused: removed once it is old)
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the only portable way, and put it back
    os.umask(mask)
    return mask


def write_target(path: Path) -> Path:
    """The file a write to ``path`` replaces: the link's final target when ``path`` is a link.

    Replacing a symbolic link by a regular file would silently cut it from where it pointed
    (a lock kept in a shared directory); the target is updated instead, and callers say so.
    A dangling link is refused (UsageError): its target may be anywhere (``/etc/cron.d/x``,
    another user's directory), and creating it is not what ``-o`` asked for.
    """
    path = Path(path)
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.exists():
        raise UsageError(f"refusing to write {path}: it is a symbolic link to {target}, which does "
                         "not exist (envlock never creates a link's target)",
                         hint="remove the link or give another file name")
    return target


def atomic_write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the file written (a link's target).

    New files get the mode the umask allows (as ``open()`` would); an existing file keeps its
    mode. Temp files of earlier interrupted writes are removed first.
    """
    target = write_target(path)
    directory = target.parent if str(target.parent) else Path(".")
    remove_stale_temps(directory, target.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return target


# `envlock run` mounts the locks of the workspace read-only over themselves and names them here
# (paths in the container, os.pathsep-separated): a replay changes nothing it was not asked to.
PROTECTED_ENV = "ENVLOCK_PROTECTED_LOCKS"
# Where a save onto a protected lock goes instead, beside it.
REPLAY_DIR = ".envlock-replay"


def replay_target(path: Path) -> Path | None:
    """Where a save to ``path`` goes in an `envlock run` that protects it; None elsewhere.

    Training code ends with ``envlock.capture().save("env.lock")``; replayed as written, that
    line must neither fail the replay nor replace the lock being replayed.
    """
    raw = os.environ.get(PROTECTED_ENV)
    if not raw:
        return None
    target = os.path.realpath(path)
    if target not in {os.path.realpath(x) for x in raw.split(os.pathsep) if x}:
        return None
    return Path(target).parent / REPLAY_DIR / Path(target).name


def save(lock: LockData, path: str | os.PathLike[str], *, force: bool = False, reseal: bool = True) -> Path:
    """Seal and write ``lock`` atomically; returns the path written.

    An existing file that is not an env.lock is never overwritten without ``force``: one typo
    in ``-o`` must not cost a researcher their training script. Nor is a lock of a newer
    schema: this envlock cannot read it, so it cannot know what the overwrite would lose.
    In `envlock run`, a lock it protects is not replaced: the new one goes to ``REPLAY_DIR``
    beside it, and stderr says so.
    """
    p = Path(path)
    moved = replay_target(p)
    if moved is not None:
        try:
            moved.parent.mkdir(exist_ok=True)
        except OSError as exc:
            raise EnvlockError(f"cannot write {moved.parent}: {exc.strerror or exc}") from None
        sys.stderr.write(f"envlock: {p} is the lock `envlock run` replays and stays as it is; "
                         f"this one goes to {moved}\n")
        p = moved
    if p.is_dir():
        raise UsageError(f"{p} is a directory; give a file name such as {p / 'env.lock'}")
    if p.exists() and not force:
        if not looks_like_lock(p):
            raise UsageError(
                f"refusing to overwrite {p}: it is not an env.lock", hint="pass --force to replace it"
            )
        theirs = _schema_of(p)
        if theirs is not None and theirs > SCHEMA_VERSION:
            raise UsageError(
                f"refusing to overwrite {p}: it is a lock of schema {theirs}, written by a newer "
                f"envlock (this one, {__version__}, writes schema {SCHEMA_VERSION})",
                hint="upgrade envlock, write elsewhere with -o, or pass --force to replace it")
    target = write_target(p)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {p}: directory {parent} does not exist")
    # reseal=False is for a lock sealed a moment ago (capture): the seal hashes the whole
    # canonical form, which grows with the environment, and would only be computed again.
    sealed = seal(lock) if reseal or lock.envlock.fingerprint is None else lock
    try:
        text = dumps(sealed, p.name)
    except ValueError as exc:
        raise EnvlockError(f"cannot write {p}: {exc}") from None
    try:
        atomic_write(p, text)
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.EROFS):
            # A rename onto a read-only bind mount fails with EBUSY, a write into one with EROFS.
            raise EnvlockError(f"cannot write {p}: it is read-only here (mounted read-only, as "
                               "`envlock run` mounts the locks of its workspace)",
                               hint="save the new lock under another name") from None
        raise EnvlockError(f"cannot write {p}: {exc.strerror or exc}") from None
    return p
