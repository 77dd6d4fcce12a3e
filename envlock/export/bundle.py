"""``envlock bundle``: every wheel of a lock in one directory, for offline replay.

A bundle is a directory of wheels plus ``envlock-bundle.json`` (``restore/wheelhouse``: the
manifest with each file's sha256, read back by ``restore --wheelhouse DIR``). With
``--wheelhouse SRC`` the wheels are copied from there and nowhere else; with ``--find-links DIR``
they come from that directory, with no index. Otherwise they are collected as ``pack`` collects
them (``fetch.collect``): from wherever they already are on disk, the rest from the configured
indexes in parallel, and last rebuilt from the installed files of the lock's environment; each
proven against the lock before it is kept.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envlock._files import sha256_file
from envlock.drift.expected import TOOLING
from envlock.errors import EnvlockError, NotRestorable
from envlock.export import fetch
from envlock.export.config import InstallerConfig
from envlock.lock import Lock, Package
from envlock.restore.context import unproven
from envlock.restore.wheelhouse import check_builds, select, write_manifest


@dataclass(frozen=True)
class BundleResult:
    directory: Path
    files: tuple[tuple[str, str, str, str], ...]  # (name, version, filename, sha256)
    missing_tooling: tuple[str, ...]
    skipped: tuple[str, ...]
    unproven: tuple[str, ...] = ()  # bundled, but nothing in the lock checks their files
    origins: tuple[tuple[str, str], ...] = ()  # (name, where its wheel was found)
    own: str | None = None  # the file of envlock's own wheel, when the lock holds envlock


def bundle(lock: Lock, out: Path, *, source: Path | None = None, index_url: str | None = None,
           pip_find_links: Path | None = None, skip_local: bool = False, python: str | None = None,
           allow_http: bool = False, config: InstallerConfig | None = None,
           workers: int = fetch.WORKERS, say: Callable[[str], None] = lambda s: None) -> BundleResult:
    """Collect every wheel of ``lock`` into ``out`` (hash-checked) and write the manifest.

    ``source``: a local wheelhouse to copy from, and nothing else; ``pip_find_links``: a
    directory to take wheels from, with no index. Otherwise ``fetch.collect``, the chain pack
    follows too: the wheels already on disk (pip's and uv's find-links and caches), then
    ``index_url`` or the configured indexes (pip's and uv's, ``config``; PyTorch's,
    ``ENVLOCK_TORCH_INDEX_URL``, for local labels such as +cu121), downloaded ``workers`` at a
    time, then a wheel rebuilt from the installed files of the lock's environment (``python``:
    ``--python``, else the lock's own when it is on this machine).
    """
    wanted, skipped = fetch.wanted(lock, skip_local)
    out = Path(out)
    places = fetch.Places(only=pip_find_links, index_url=index_url, allow_http=allow_http, python=python,
                          workers=workers)
    try:
        return _bundle(lock, out, wanted, skipped, source=source, places=places, config=config, say=say)
    except OSError as exc:  # a read-only or full directory: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        raise EnvlockError(f"cannot write the bundle to {out}: {exc.strerror or exc}{where}") from None


def _copy(source: Path, wanted: list[Package], staging: Path) -> tuple[list[fetch.WheelRow], list[str]]:
    """``--wheelhouse SRC``: every file of SRC for a wanted package, each checked against the
    lock (a mismatch stops the bundle); (rows, tooling found nowhere)."""
    have = select(Path(source), wanted)
    rows: list[fetch.WheelRow] = []
    missing: list[str] = []
    missing_tooling: list[str] = []
    for pkg in wanted:
        files = have.get(pkg.name, ())
        if not files:
            (missing_tooling if pkg.name in TOOLING else missing).append(f"{pkg.name}=={pkg.version}")
            continue
        check_builds([pkg], {pkg.name: files})
        for f in files:
            shutil.copy2(f, staging / f.name)
            rows.append(fetch.WheelRow(pkg.name, pkg.version, f.name, sha256_file(staging / f.name),
                                       "wheelhouse", pkg.source == "local"))
    if missing:
        raise NotRestorable(f"no wheel in {source} for: " + ", ".join(missing),
                            hint=f"put their wheels into {source}, or pass --skip-local to leave out "
                                 "what was installed from a local directory")
    return rows, missing_tooling


def _bundle(lock: Lock, out: Path, wanted: list[Package], skipped: list[str], *, source: Path | None,
            places: fetch.Places, config: InstallerConfig | None, say: Callable[[str], None]) -> BundleResult:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".envlock-bundle-", dir=out) as tmp:
        staging = Path(tmp)
        if source is not None:
            rows, missing_tooling = _copy(source, wanted, staging)
        else:
            got = fetch.collect(lock, wanted, staging, places, config=config, say=say)
            rows, missing_tooling = list(got.rows), list(got.missing_tooling)
        found = tuple(sorted((r.name, r.origin) for r in rows)) if source is None else ()
        own = fetch.own_row(lock, staging)
        if own is not None:
            rows.append(own)
        for row in rows:
            shutil.move(str(staging / row.filename), str(out / row.filename))
    write_manifest(out, lock, [r.manifest() for r in rows])
    return BundleResult(out, tuple((r.name, r.version, r.filename, r.sha256) for r in rows),
                        tuple(missing_tooling), tuple(skipped),
                        tuple(unproven(p for p in wanted if any(r.name == p.name for r in rows))),
                        found, own=own.filename if own else None)
