"""``envlock bundle``: every wheel of a lock in one directory, for offline replay.

A bundle is a directory of wheels plus ``envlock-bundle.json`` (``restore/wheelhouse``: the
manifest with each file's sha256, read back by ``restore --wheelhouse DIR``). With
``--wheelhouse SRC`` the wheels are copied from there and nowhere else; with ``--find-links DIR``
they come from that directory, with no index. Otherwise they come from wherever they already
are on disk and the rest from the configured indexes, in parallel (``fetch``), each proven
against the lock before it is kept.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envlock._expected import TOOLING
from envlock._files import sha256_file
from envlock.errors import EnvlockError, NotRestorable
from envlock.export import fetch
from envlock.export.artifacts import lock_tags
from envlock.export.config import InstallerConfig
from envlock.export.config import read as read_config
from envlock.lock import Lock, Package
from envlock.restore import values
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


def _wanted(lock: Lock, skip_local: bool) -> tuple[list[Package], list[str]]:
    """The packages to find wheels for, and those left out. envlock itself is neither: as in
    ``restore``, it comes from the running envlock (``own_row``), whatever its source."""
    from envlock.restore.ownwheel import OWN_DIST

    wanted: list[Package] = []
    skipped: list[str] = []
    local: list[str] = []
    for pkg in lock.packages:
        values.dist_name(pkg.name)
        if pkg.name == OWN_DIST:
            continue
        if pkg.source == "system":
            skipped.append(pkg.name)  # its OS package brings it back, not a wheel
            continue
        values.version(pkg.version, name=pkg.name)
        if pkg.installer == "conda":
            skipped.append(pkg.name)
        elif pkg.source in ("editable", "local"):
            (skipped if skip_local else local).append(pkg.name)
        else:
            wanted.append(pkg)
    if local:
        raise NotRestorable("cannot bundle packages installed from local directories or files: "
                            + ", ".join(local), hint="pass --skip-local to leave them out")
    return wanted, skipped


def bundle(lock: Lock, out: Path, *, source: Path | None = None, index_url: str | None = None,
           pip_find_links: Path | None = None, skip_local: bool = False,
           allow_http: bool = False, config: InstallerConfig | None = None,
           workers: int = fetch.WORKERS) -> BundleResult:
    """Collect every wheel of ``lock`` into ``out`` (hash-checked) and write the manifest.

    ``source``: a local wheelhouse to copy from, and nothing else; ``pip_find_links``: a
    directory to take wheels from, with no index. Otherwise: the wheels already on disk
    (``fetch.disk_sources``, pip's and uv's caches), then ``index_url`` or the configured
    indexes (pip's and uv's, ``config``; PyTorch's, ``ENVLOCK_TORCH_INDEX_URL``, for local
    labels such as +cu121), downloaded ``workers`` at a time.
    """
    wanted, skipped = _wanted(lock, skip_local)
    out = Path(out)
    try:
        return _bundle(lock, out, wanted, skipped, source=source, index_url=index_url,
                       pip_find_links=pip_find_links, allow_http=allow_http, config=config, workers=workers)
    except OSError as exc:  # a read-only or full directory: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        raise EnvlockError(f"cannot write the bundle to {out}: {exc.strerror or exc}{where}") from None


def _gather(lock: Lock, wanted: list[Package], staging: Path, *, index_url: str | None,
            pip_find_links: Path | None, allow_http: bool, config: InstallerConfig | None,
            workers: int) -> tuple[dict[str, fetch.WheelRow], dict[str, list[str]]]:
    """Wheels from disk, then the indexes, into ``staging``: (file name -> its row, why not found)."""
    tags = lock_tags(lock)
    rows: list[fetch.WheelRow] = []
    why: dict[str, list[str]] = {}
    if pip_find_links is not None:
        left = fetch.take(wanted, pip_find_links, "find-links", tags, staging, rows, why)
    else:
        config = config if config is not None else read_config()
        left = wanted
        for origin, directory in fetch.disk_sources((), config):
            if not left:
                break
            left = fetch.take(left, directory, origin, tags, staging, rows, why)
        left = fetch.take_pip_http_cache(left, tags, staging, rows, why)
        left = fetch.take_uv_cache(left, tags, staging, rows, why)
        for pkg in left:
            if pkg.source == "vcs":
                why.setdefault(pkg.name, []).append(
                    f"it comes from {pkg.vcs}: put a wheel built from commit {pkg.commit} into a "
                    "wheelhouse and bundle with --wheelhouse")
        left = [p for p in left if p.source != "vcs"]
        if left:
            fetch.download(lock, left, staging, config=config, index_url=index_url,
                           allow_http=allow_http, rows=rows, why=why, workers=workers)
    return {r.filename: r for r in rows}, why


def _bundle(lock: Lock, out: Path, wanted: list[Package], skipped: list[str], *,
            source: Path | None, index_url: str | None, pip_find_links: Path | None,
            allow_http: bool, config: InstallerConfig | None, workers: int) -> BundleResult:
    out.mkdir(parents=True, exist_ok=True)
    kept: dict[str, fetch.WheelRow] = {}
    why: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix=".envlock-bundle-", dir=out) as tmp:
        staging = Path(tmp)
        if source is not None:
            for files in select(Path(source), wanted).values():
                for f in files:
                    shutil.copy2(f, staging / f.name)
        else:
            kept, why = _gather(lock, wanted, staging, index_url=index_url, pip_find_links=pip_find_links,
                                   allow_http=allow_http, config=config, workers=workers)
        have = select(staging, wanted)
        rows: list[tuple[str, str, str, str]] = []
        missing: list[str] = []
        missing_tooling: list[str] = []
        for pkg in wanted:
            files = have.get(pkg.name, ())
            if not files:
                if pkg.name in TOOLING:
                    missing_tooling.append(f"{pkg.name}=={pkg.version}")
                else:
                    missing.append(f"{pkg.name}=={pkg.version}"
                                   + (f" ({'; '.join(why[pkg.name])})" if pkg.name in why else ""))
                continue
            check_builds([pkg], {pkg.name: files})
            for f in files:  # the digest taken when the file was kept, else read now
                digest = kept[f.name].sha256 if f.name in kept else sha256_file(f)
                rows.append((pkg.name, pkg.version, f.name, digest))
        if missing:
            where = f"in {source}" if source else (f"in {pip_find_links}" if pip_find_links else "on disk or the index")
            raise NotRestorable(f"no wheel {where} for: " + ", ".join(missing))
        own = own_row(lock, staging)
        if own is not None:
            rows.append(own)
        for _, _, fname, _ in rows:
            shutil.move(str(staging / fname), str(out / fname))
    write_manifest(out, lock, [{"name": n, "version": v, "filename": f, "sha256": h}
                               for n, v, f, h in rows])
    return BundleResult(out, tuple(rows), tuple(missing_tooling), tuple(skipped),
                        tuple(unproven(p for p in wanted if any(r[0] == p.name for r in rows))),
                        tuple(sorted((r.name, r.origin) for r in kept.values())),
                        own=own[2] if own else None)


def own_row(lock: Lock, dest: Path) -> tuple[str, str, str, str] | None:
    """A wheel of the running envlock when the lock holds envlock (installed from a checkout,
    editable, a wheel or an index: none of them reachable where the bundle is restored), the
    wheel ``restore`` builds into the image (``ownwheel``); (name, version, filename, sha256)."""
    from envlock.restore.ownwheel import OWN_DIST, own_wheel

    if not any(p.name == OWN_DIST for p in lock.packages):
        return None
    wheel = own_wheel(dest)
    return OWN_DIST, wheel.name.split("-")[1], wheel.name, sha256_file(wheel)
