"""Every wheel a lock needs, in one directory: what is on disk first, the rest downloaded.

``bundle`` and ``pack`` share this chain, ``collect``, and which packages go through it,
``wanted``: they differ only in the ``Places`` they pass. Wheels are taken, in order, from the user's wheelhouses,
the configured find-links directories (pip's and uv's, ``config``), pip's wheel cache (wheels
pip built), pip's HTTP cache (the wheels pip downloaded, ``http-v2/**.body``), and for a package
whose lock records no file hash, uv's cache (uv keeps wheels unpacked: the wheel is rebuilt
from them, ``export/rebuild``, proven by ``record_sha256``, and not byte-equal to the index's
file, hence the condition). What is still missing is listed on the configured indexes and
downloaded in parallel (a bounded pool), each file checked against the index's sha256 while it
streams. Last, a package whose wheel exists nowhere (installed from a local directory, or its
index gone) gets one rebuilt from its installed files in the lock's own environment
(``probing/target.for_lock``). Every file is proven before it is kept: the lock's hashes where it has
them, its build (``record_sha256``) always.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from packaging.utils import canonicalize_name

from envlock._files import sha256_file
from envlock.drift.expected import TOOLING
from envlock.errors import EXIT_ENV, ArtifactsMissing, EnvlockError, HashMismatch, NotRestorable
from envlock.export.artifacts import Artifact, Sources, chain_for, lock_tags, pick
from envlock.export.config import InstallerConfig
from envlock.export.config import read as read_config
from envlock.export.index import IndexFile, Query, SimpleIndex, cache_root, names, resolve
from envlock.export.redaction import shown
from envlock.lock import Lock, Package
from envlock.restore import values, wheelhouse

if TYPE_CHECKING:
    from packaging.tags import Tag

WORKERS = 8  # downloads at once: enough to fill a link, few enough to be polite to an index
UV_TIMEOUT = 30.0


@dataclass(frozen=True)
class WheelRow:
    name: str
    version: str
    filename: str
    sha256: str
    origin: str  # "wheelhouse", "find-links", "pip cache", "pip http cache", "uv cache", "index", "rebuilt",
    # "envlock" (a wheel of the running envlock, for a lock that holds envlock)
    local_source: bool = False

    def manifest(self) -> dict[str, object]:
        row: dict[str, object] = {"name": self.name, "version": self.version,
                                  "filename": self.filename, "sha256": self.sha256,
                                  "origin": self.origin}
        if self.local_source:
            row["local_source"] = True
        return row


# -- where wheels already are ---------------------------------------------------------------------


def pip_cache_root() -> Path:
    return Path(os.environ.get("PIP_CACHE_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")


def pip_wheel_cache_dirs() -> list[Path]:
    """Directories of pip's wheel cache (wheels pip built locally, one directory per source)."""
    found = []
    for directory, _, files in os.walk(pip_cache_root() / "wheels"):
        if any(f.endswith(".whl") for f in files):
            found.append(Path(directory))
    return sorted(found)


def disk_sources(wheelhouses: Sequence[Path], config: InstallerConfig) -> list[tuple[str, Path]]:
    """(origin, directory) in the order they are searched: the user's first."""
    sources = [("wheelhouse", Path(w)) for w in wheelhouses]
    sources += [("find-links", d) for d in config.local_find_links()]
    sources += [("pip cache", d) for d in pip_wheel_cache_dirs()]
    seen: set[Path] = set()
    out = []
    for origin, directory in sources:
        real = directory.resolve()
        if real not in seen:
            seen.add(real)
            out.append((origin, directory))
    return out


def proven(pkg: Package, path: Path) -> str | None:
    """None when ``path`` is the lock's build of ``pkg``; otherwise why not."""
    try:
        allowed = wheelhouse.allowed_hashes(pkg)
        if allowed and not wheelhouse.file_matches(path, allowed):
            return f"{path.name}: not a file the lock's hashes allow"
        built = wheelhouse.wheel_record_sha256(path)
    except HashMismatch as exc:
        return exc.message
    if pkg.record_sha256 and built != pkg.record_sha256:
        return f"{path.name}: another build (record_sha256 {built[:12]}...)"
    if pkg.source == "local" and not pkg.record_sha256:
        return f"{path.name}: the lock has no record_sha256 to prove a local build against"
    return None


def _keep(pkg: Package, path: Path, origin: str, rows: list[WheelRow], digest: str | None = None) -> None:
    """``digest``: the file's sha256 when it was checked on the way in (a download)."""
    rows.append(WheelRow(pkg.name, pkg.version, path.name, digest or sha256_file(path), origin,
                         pkg.source == "local"))


def take(pkgs: list[Package], directory: Path, origin: str, tags: frozenset[Tag] | None, dest: Path,
         rows: list[WheelRow], why: dict[str, list[str]]) -> list[Package]:
    """Copy into ``dest`` the proven wheel of each package ``directory`` has; the rest remain."""
    found = wheelhouse.select(directory, pkgs)
    left: list[Package] = []
    for pkg in pkgs:
        files = [f for f in found.get(pkg.name, ()) if f.name.endswith(".whl")]
        fitting = set(pick([Artifact(f.name, "") for f in files], tags))
        taken = None
        for f in files:
            if f.name not in fitting:
                continue
            reason = proven(pkg, f)
            if reason is None:
                taken = f
                break
            why.setdefault(pkg.name, []).append(f"{origin} {reason}")
        if taken is None:
            left.append(pkg)
            continue
        shutil.copy2(taken, dest / taken.name)
        _keep(pkg, dest / taken.name, origin, rows)
    return left


def _compressed(values_: Iterable[str]) -> str:
    return ".".join(dict.fromkeys(values_))


def _cached_wheel_name(body: Path) -> tuple[str, str, str] | None:
    """(project, version, wheel file name) of a wheel pip's HTTP cache holds as ``body``, from
    its own dist-info (the cache keeps no file name); None for anything else."""
    try:
        if body.stat().st_size < 22 or not zipfile.is_zipfile(body):
            return None
        with zipfile.ZipFile(body) as zf:
            infos = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
            if len(infos) != 1:
                return None
            text = zf.read(infos[0]).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        return None
    dist, _, version = infos[0].split("/")[0][: -len(".dist-info")].rpartition("-")
    tags = [t.strip().split("-") for t in HeaderParser().parsestr(text).get_all("Tag") or []]
    tags = [t for t in tags if len(t) == 3]
    if not dist or not version or not tags:
        return None
    filename = (f"{dist}-{version}-{_compressed(t[0] for t in tags)}-{_compressed(t[1] for t in tags)}-"
                f"{_compressed(t[2] for t in tags)}.whl")
    return str(canonicalize_name(dist)), version, filename


def take_pip_http_cache(pkgs: list[Package], tags: frozenset[Tag] | None, dest: Path,
                        rows: list[WheelRow], why: dict[str, list[str]]) -> list[Package]:
    """Wheels pip downloaded before, from its HTTP cache (pip >= 23.3 keeps each response body
    whole in ``http-v2/**/<key>.body``; older pips serialise it with the headers and are not
    read). The body is the index's file byte for byte, so the lock's hashes prove it."""
    if not pkgs:
        return pkgs
    wanted = {(p.name, p.version): p for p in pkgs}
    hits: dict[str, list[tuple[Path, str]]] = {}
    for directory, _, files in os.walk(pip_cache_root() / "http-v2"):
        for f in files:
            if not f.endswith(".body"):
                continue
            got = _cached_wheel_name(Path(directory) / f)
            if got and (got[0], got[1]) in wanted:
                hits.setdefault(got[0], []).append((Path(directory) / f, got[2]))
    left = []
    for pkg in pkgs:
        taken = False
        for body, filename in hits.get(pkg.name, []):
            if pick([Artifact(filename, "")], tags) != [filename]:
                continue
            target = dest / filename
            shutil.copyfile(body, target)
            reason = proven(pkg, target)
            if reason is None:
                _keep(pkg, target, "pip http cache", rows)
                taken = True
                break
            target.unlink()
            why.setdefault(pkg.name, []).append(f"pip http cache {reason}")
        if not taken:
            left.append(pkg)
    return left


def uv_cache_root() -> Path | None:
    """uv's cache: ``UV_CACHE_DIR``, else what ``uv cache dir`` says, else uv's default place."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    uv = shutil.which("uv")
    if uv:
        try:
            proc = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=UV_TIMEOUT,
                                  check=False, stdin=subprocess.DEVNULL)
            if proc.returncode == 0 and proc.stdout.strip():
                return Path(proc.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv"


def take_uv_cache(pkgs: list[Package], tags: frozenset[Tag] | None, dest: Path,
                  rows: list[WheelRow], why: dict[str, list[str]]) -> list[Package]:
    """Wheels rebuilt from uv's unpacked cache (``archive-v*/<id>/<name>-<ver>.dist-info``), for
    the packages whose lock records no file hash (a rebuilt file has another sha256 than the
    index's, which such a lock would refuse)."""
    from envlock.export.rebuild import rebuild

    root = uv_cache_root()
    able = [p for p in pkgs if not wheelhouse.allowed_hashes(p) and p.record_sha256]
    if root is None or not able or not root.is_dir():
        return pkgs
    infos: dict[tuple[str, str], list[Path]] = {}
    for archive in sorted(root.glob("archive-v*/*/*.dist-info")):
        dist, _, version = archive.name[: -len(".dist-info")].rpartition("-")
        infos.setdefault((str(canonicalize_name(dist)), version), []).append(archive)
    taken: set[str] = set()
    for pkg in able:
        for dist_info in infos.get((pkg.name, pkg.version), []):
            try:
                built = rebuild(pkg, dist_info, dest)
            except (HashMismatch, EnvlockError, OSError) as exc:
                why.setdefault(pkg.name, []).append(f"uv cache {exc}")
                continue
            if pick([Artifact(built.path.name, "")], tags) != [built.path.name]:
                built.path.unlink()
                continue
            _keep(pkg, built.path, "uv cache", rows)
            taken.add(pkg.name)
            break
    return [p for p in pkgs if p.name not in taken]


# -- downloading the rest -------------------------------------------------------------------------


def _loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _check_scheme(url: str, allow_http: bool, what: str) -> None:
    if url.startswith("http://") and not allow_http and not _loopback(url):
        from envlock.errors import PlainHttp

        raise PlainHttp(f"refusing plain http {what} {shown(url)}",
                        hint="pass --allow-http to accept it (the lock's hashes and builds are still checked)")


def download(lock: Lock, pkgs: list[Package], dest: Path, *, config: InstallerConfig,
             index_url: str | None, allow_http: bool, rows: list[WheelRow], why: dict[str, list[str]],
             workers: int = WORKERS, say: Callable[[str], None] = lambda s: None) -> list[Package]:
    """Download a proven wheel of each of ``pkgs`` into ``dest``, in parallel; the rest remain.

    Index listings come from ``index.resolve`` (in parallel, cached); then each package's
    fitting files are downloaded one after another until one is the lock's build.
    """
    tags = lock_tags(lock)
    by_url = [p for p in pkgs if p.source == "url" and p.url]
    by_index = [p for p in pkgs if p not in by_url]
    plans: list[tuple[Package, SimpleIndex, list[IndexFile]]] = []
    if index_url:
        _check_scheme(index_url, allow_http, "index")
    for url in (*((config.index_url,) if config.index_url and not index_url else ()),
                *config.extra_index_urls, *config.remote_find_links()):
        _check_scheme(url, allow_http, "index")
    if by_index:
        sources = Sources(index_url=index_url, config=config)
        chains = chain_for(lock, by_index, config, sources, cache_root())
        queries = [Query(p.name, p.version, c) for p, c in zip(by_index, chains, strict=True)]
        errors: dict[str, str] = {}
        answers = resolve(queries, workers=workers, errors=errors)
        for pkg, q in zip(by_index, queries, strict=True):
            hit = answers.get(pkg.name)
            if hit is None:
                why.setdefault(pkg.name, []).append(errors.get(pkg.name) or f"not on {names(q.indexes)}")
                continue
            index, files = hit
            keep = set(pick(files, tags))
            fitting = [f for f in files if f.filename in keep and f.filename.endswith(".whl")]
            if not fitting:
                why.setdefault(pkg.name, []).append(f"no wheel on {shown(index.url)} fits the lock's platform")
                continue
            plans.append((pkg, index, fitting))
    for pkg in by_url:
        assert pkg.url
        link = values.url(pkg.url, what=f"URL of {pkg.name}", allow_http=allow_http)
        base, _, filename = link.rpartition("/")
        plans.append((pkg, SimpleIndex(base + "/"), [IndexFile(unquote(filename), link, None)]))
    if plans:
        say(f"downloading {len(plans)} wheel(s) from the index, {min(workers, len(plans))} at a time")

    def one(plan: tuple[Package, SimpleIndex, list[IndexFile]]) -> tuple[Package, IndexFile | None, list[str]]:
        pkg, index, files = plan
        reasons = []
        for f in files:
            try:
                path = index.download(f, dest)
            except EnvlockError as exc:
                reasons.append(exc.message)
                continue
            reason = proven(pkg, path)
            if reason is None:
                return pkg, f, reasons
            path.unlink()
            reasons.append(f"index {reason}")
        return pkg, None, reasons

    got: set[str] = set()
    if plans:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(plans)))) as pool:
            for pkg, f, reasons in pool.map(one, plans):
                if reasons:
                    why.setdefault(pkg.name, []).extend(reasons)
                if f is not None:  # its sha256, when listed, was checked while it streamed
                    _keep(pkg, dest / f.filename, "index", rows, f"sha256:{f.sha256}" if f.sha256 else None)
                    got.add(pkg.name)
    return [p for p in pkgs if p.name not in got]


# -- the chain: what bundle and pack collect, and from where, in one order -------------------------


def wanted(lock: Lock, skip_local: bool) -> tuple[list[Package], list[str]]:
    """The packages whose wheels a bundle or pack collects, and those it leaves out.

    Left out: what the OS package manager (or the image, for conda) brings back, and with
    ``skip_local`` what was installed from a working tree or a local file. An editable install
    is refused otherwise (its files are a working tree's, not a build's); a local one is
    wanted, its wheel rebuilt from its installed files when it exists nowhere else. envlock
    itself is neither: a wheel of the running envlock goes in (``own_row``), whatever its source.
    """
    from envlock.restore.ownwheel import OWN_DIST

    want: list[Package] = []
    skipped: list[str] = []
    editable: list[str] = []
    for pkg in lock.packages:
        values.dist_name(pkg.name)
        if pkg.name == OWN_DIST:
            continue
        brought_back = pkg.source == "system" or pkg.installer == "conda"  # by the OS or the image
        if brought_back or (skip_local and pkg.source in ("editable", "local")):
            skipped.append(pkg.name)
        elif pkg.source == "editable":
            editable.append(pkg.name)
        else:
            values.version(pkg.version, name=pkg.name)
            want.append(pkg)
    if editable:
        raise NotRestorable("cannot collect wheels of editable installs (their files live in a working "
                            "tree): " + ", ".join(editable),
                            hint="install them without -e and capture again, or pass --skip-local")
    return want, skipped


@dataclass(frozen=True)
class Places:
    """Where ``collect`` looks, in this order: the user's wheelhouses, the configured find-links,
    pip's caches, uv's cache, the indexes (unless ``download`` is off), and last the installed
    files of the lock's environment (``python``: ``--python``; see ``probing/target.for_lock``).
    ``only``: one directory and nowhere else (``bundle --find-links DIR``)."""

    wheelhouses: tuple[Path, ...] = ()
    only: Path | None = None
    download: bool = True
    index_url: str | None = None
    allow_http: bool = False
    python: str | None = None
    workers: int = WORKERS


@dataclass(frozen=True)
class Collected:
    rows: tuple[WheelRow, ...]
    missing_tooling: tuple[str, ...]  # pip/setuptools/wheel found nowhere: the base's ensurepip copy stays


def collect(lock: Lock, pkgs: list[Package], dest: Path, places: Places, *,
            config: InstallerConfig | None = None, say: Callable[[str], None] = lambda s: None) -> Collected:
    """A proven wheel of each of ``pkgs`` in ``dest``, from the first of ``places`` that has
    one; ``ArtifactsMissing`` names every package found nowhere, with why each place failed."""
    tags = lock_tags(lock)
    rows: list[WheelRow] = []
    why: dict[str, list[str]] = {}
    if places.only is not None:
        left = take(pkgs, places.only, "find-links", tags, dest, rows, why)
    else:
        config = config if config is not None else read_config()
        left = pkgs
        for origin, directory in disk_sources(places.wheelhouses, config):
            if not left:
                break
            left = take(left, directory, origin, tags, dest, rows, why)
        left = take_pip_http_cache(left, tags, dest, rows, why)
        left = take_uv_cache(left, tags, dest, rows, why)
        for pkg in left:
            if pkg.source == "vcs":
                why.setdefault(pkg.name, []).append(
                    f"it comes from {pkg.vcs}: put a wheel built from commit {pkg.commit} into a "
                    "wheelhouse and pass it with --wheelhouse")
        indexed = [p for p in left if p.source not in ("vcs", "local")]
        if indexed and places.download:
            try:
                download(lock, indexed, dest, config=config, index_url=places.index_url,
                         allow_http=places.allow_http, rows=rows, why=why, workers=places.workers, say=say)
            except EnvlockError as exc:
                if exc.exit_code != EXIT_ENV:
                    raise  # the user's input (a plain http index): no later place makes it right
                for pkg in indexed:  # an index that cannot answer: the installed files may still
                    why.setdefault(pkg.name, []).append(exc.message)
            got = {r.name for r in rows}
            left = [p for p in left if p.name not in got]
        if left:
            left = _rebuild(lock, left, dest, places.python, rows, why, say)
    missing = [p for p in left if p.name not in TOOLING]
    if missing:
        where = f"in {places.only}" if places.only is not None else "anywhere"
        gaps = [f"{p.name}=={p.version}" + (f" ({'; '.join(why[p.name])})" if p.name in why else "")
                for p in missing]
        raise ArtifactsMissing(f"no wheel {where} for {len(missing)} package(s): " + ", ".join(gaps),
                               hint="pass --wheelhouse DIR with them, or run where the locked environment "
                                    "is installed (--python), to rebuild them from its files")
    return Collected(tuple(sorted(rows, key=lambda r: r.name)),
                     tuple(f"{p.name}=={p.version}" for p in left if p.name in TOOLING))


def _rebuild(lock: Lock, pkgs: list[Package], dest: Path, python: str | None, rows: list[WheelRow],
             why: dict[str, list[str]], say: Callable[[str], None]) -> list[Package]:
    """Wheels rebuilt from the installed files of the lock's environment (``rebuild``), each
    proven by ``record_sha256`` and its modes; the packages still without one remain."""
    from envlock.export.rebuild import find_dist_info, rebuild, site_dirs
    from envlock.probing.target import for_lock

    target = for_lock(python, lock.python.prefix)
    dirs = site_dirs(target.python)
    found = [(pkg, find_dist_info(dirs, pkg.name, pkg.version)) for pkg in pkgs]
    if any(dist_info is not None for _, dist_info in found):
        say(f"rebuilding wheels from the installed files of {target.describe()}"
            + (f" ({target.warning})" if target.warning else ""))
    left = []
    for pkg, dist_info in found:
        if dist_info is None:
            why.setdefault(pkg.name, []).append(f"not installed in the environment {target.describe()}"
                                                + (f"; {target.warning}" if target.warning else ""))
            left.append(pkg)
            continue
        try:
            built = rebuild(pkg, dist_info, dest)
        except (EnvlockError, OSError) as exc:
            why.setdefault(pkg.name, []).append(str(exc))
            left.append(pkg)
            continue
        say(f"rebuilt {built.path.name} from the installed files (record_sha256 and modes proven)")
        _keep(pkg, built.path, "rebuilt", rows)
    return left


def own_row(lock: Lock, dest: Path) -> WheelRow | None:
    """A wheel of the running envlock when the lock holds envlock (installed from a checkout,
    editable, a wheel or an index: none of them reachable where the wheels are restored), the
    wheel ``restore`` builds into the image (``ownwheel``)."""
    from envlock.restore.ownwheel import OWN_DIST, own_wheel

    if not any(p.name == OWN_DIST for p in lock.packages):
        return None
    wheel = own_wheel(dest)
    return WheelRow(OWN_DIST, wheel.name.split("-")[1], wheel.name, sha256_file(wheel), "envlock")
