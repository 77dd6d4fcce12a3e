"""A conda lock's archives in a pack, laid out as a local channel (``conda/<subdir>/<fn>``,
indexed by py-rattler), with py-rattler's own wheel in ``wheels/`` so that a restore needs
nothing but the pack (``restore/condatarget``).

Each archive is taken from a package cache (``$CONDA_PKGS_DIRS``, the prefix's installation's
``pkgs/``, ``~/.conda/pkgs``) or, when none has it, from the url the lock records (``file:``
included); whichever it came from, its sha256 must be the lock's before it enters the pack.
Beside the pip path of ``export/pack``, which it does not change: the pack's SHA256SUMS lists
these files like every other.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from envlock._files import file_digest
from envlock.errors import EnvlockError
from envlock.lock import CondaPackage, Lock
from envlock.restore.condatarget import conda_packages, rattler_module
from envlock.restore.packdir import CONDA_CHANNEL
from envlock.text.terminal import first

# The distribution whose wheel a restore installs the archives with.
RATTLER_DIST = "py-rattler"


def cache_dirs(lock: Lock) -> list[Path]:
    """Where conda, mamba and pixi keep downloaded archives, most specific first."""
    dirs = [Path(d) for d in os.environ.get("CONDA_PKGS_DIRS", "").split(",") if d]
    if lock.python.prefix:
        prefix = Path(lock.python.prefix)
        dirs += [prefix / "pkgs", prefix.parent.parent / "pkgs"]  # base, or an env in envs/NAME
    dirs += [Path.home() / ".conda" / "pkgs"]
    return dirs


def _from_url(url: str, dest: Path) -> None:
    parts = urlsplit(url)
    if parts.scheme == "file":
        shutil.copyfile(unquote(parts.path), dest)
        return
    if parts.scheme not in ("https", "http"):
        raise OSError(0, f"cannot fetch a {parts.scheme}: url")
    with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as out:
        shutil.copyfileobj(resp, out)


def collect(lock: Lock, root: Path, say: Callable[[str], None]) -> int:
    """Every conda archive of ``lock`` into ``root/conda/<subdir>/<fn>``, proven by its sha256,
    then indexed; raises naming every archive found nowhere (or nowhere with the lock's hash)."""
    pkgs = conda_packages(lock, need=("sha256", "subdir", "fn"))
    channel = root / CONDA_CHANNEL
    missing: list[str] = []
    for pkg in pkgs:
        assert pkg.subdir and pkg.fn and pkg.sha256
        dest = channel / pkg.subdir / pkg.fn
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not _take(pkg, cache_dirs(lock), dest):
            missing.append(f"{pkg.fn} ({pkg.url or 'no url'})")
    if missing:
        raise EnvlockError(f"{len(missing)} conda archive(s) not found with the lock's sha256: "
                           f"{first(missing, 8)}",
                           hint="put them in a package cache ($CONDA_PKGS_DIRS) or make their urls "
                                "reachable, then pack again")
    (channel / "noarch").mkdir(exist_ok=True)  # a channel has one, even when empty
    index(channel)
    say(f"packed {len(pkgs)} conda archive(s) as a channel in {CONDA_CHANNEL}/")
    return len(pkgs)


def _take(pkg: CondaPackage, dirs: list[Path], dest: Path) -> bool:
    """``pkg``'s archive into ``dest`` from the first place that has it with the lock's sha256."""
    for d in dirs:
        candidate = d / (pkg.fn or "")
        if candidate.is_file() and file_digest(candidate).hexdigest == pkg.sha256:
            shutil.copyfile(candidate, dest)
            return True
    if pkg.url:
        try:
            _from_url(pkg.url, dest)
        except OSError:
            dest.unlink(missing_ok=True)
            return False
        if file_digest(dest).hexdigest == pkg.sha256:
            return True
        dest.unlink()
    return False


def index(channel: Path) -> None:
    """repodata.json of every subdir (``index_fs`` without a target platform: with one it
    skips noarch)."""
    import asyncio

    rattler_module()
    from rattler.index import index_fs

    asyncio.run(index_fs(channel, write_zst=False, write_shards=False))


def rattler_wheel(dest: Path) -> Path:
    """The running py-rattler as a wheel in ``dest`` (repacked from its installed files, so no
    index is asked): the restore installs the archives with it."""
    from envlock.restore import wheelfile

    rattler_module()
    dist = importlib.metadata.distribution(RATTLER_DIST)
    record = next((f for f in dist.files or () if f.as_posix().endswith(".dist-info/RECORD")), None)
    if record is None:
        raise EnvlockError(f"the installed {RATTLER_DIST} lists no RECORD to pack")
    return wheelfile.repack(Path(str(dist.locate_file(record))).parent, dest).path
