"""Each package of a lock with the files that install it: what pylock and requirements write.

Index packages are resolved through the simple API (``index.py``) or, offline, from an
``envlock bundle`` wheelhouse; only files that fit the lock's interpreter and platform are kept
(the lock describes one environment, so a wheel for another platform is noise and a hash the
installer must never accept). Packages whose version carries a PyTorch local label (``+cu130``)
are looked up on the PyTorch index that serves that label first.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from envlock.errors import WHEELHOUSE_HINT, ArtifactsMissing, IndexUnavailable
from envlock.export.config import InstallerConfig
from envlock.export.config import read as read_config
from envlock.export.index import (
    FlatLinks,
    IndexFile,
    Query,
    SimpleIndex,
    cache_root,
    names,
    resolve,
)
from envlock.lock import Lock, Package

# Variables a lock may carry (probe allow-list) that name the index the environment used.
INDEX_ENV = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")
ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2")


@dataclass(frozen=True)
class Artifact:
    filename: str
    sha256: str  # hex
    url: str | None = None
    path: str | None = None  # a wheelhouse file (offline export)
    size: int | None = None

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


@dataclass(frozen=True)
class Resolved:
    """One package and where it comes from; ``artifacts`` is empty for vcs and directories."""

    package: Package
    kind: str  # "index" | "links" | "wheelhouse" | "vcs" | "directory" | "archive"
    index: str | None = None  # an index's or a find-links location's public URL (or directory)
    artifacts: tuple[Artifact, ...] = ()
    path: str | None = None  # directory or local archive


@dataclass(frozen=True)
class Sources:
    """Where artifacts may come from (CLI options)."""

    index_url: str | None = None
    torch_index_url: str | None = None
    wheelhouse: Path | None = None
    use_cache: bool = True
    refresh: bool = False
    skip: frozenset[str] = field(default_factory=frozenset)  # normalised names
    config: InstallerConfig | None = None  # pip's and uv's settings; None: read them here


def main_index(lock: Lock, override: str | None) -> str | None:
    """``--index-url``, else the index the lock's environment was told to use; None when
    neither names one, and the installer's own default applies (``default_index``)."""
    if override:
        return override
    for var in INDEX_ENV:
        value = lock.env.get(var, "")
        # A redacted or credential-stripped value cannot be used; fall through to the default.
        if value.startswith(("http://", "https://")) and "<" not in value:
            return value
    return None


def default_index(config: InstallerConfig | None = None) -> str:
    """The index pip or uv would use here, to resolve hashes from when nothing else names one.

    envlock keeps no registry address of its own: pip's and uv's configuration (variables and
    files, ``config.read``), then pip's built-in default, read from pip.
    """
    config = config if config is not None else read_config()
    if config.index_url:
        return config.index_url
    try:
        models = importlib.import_module("pip._internal.models.index")
        url = getattr(getattr(models, "PyPI"), "simple_url")  # noqa: B009 - pip has no public API
    except (ImportError, AttributeError):
        url = None
    if not isinstance(url, str) or not url:
        raise IndexUnavailable("no package index is configured and pip is not installed to say its "
                               "default", hint="pass --index-url URL or set PIP_INDEX_URL")
    return url


def torch_index(pkg: Package, override: str | None) -> str | None:
    """The PyTorch index that serves ``pkg``'s local label (``cpu``, ``cu130``), if any."""
    from envlock.restore.tables import bases

    local = Version(pkg.version).local
    if not local:
        return None
    label = str(local)
    if override:
        return override.replace("{label}", label)
    return bases().torch.index_for(label, hint="or pass --torch-index-url")


def lock_tags(lock: Lock) -> frozenset[Tag] | None:
    """Wheel tags the lock's interpreter accepts; None when they cannot be known (not Linux)."""
    py, plat = lock.python, lock.platform
    if py.implementation != "cpython" or plat.os != "Linux" or not re.fullmatch(r"\w+", plat.machine):
        return None
    major, minor = (int(x) for x in py.version.split(".")[:2])
    glibc = 17
    minor_glibc = re.match(r"^2\.(\d+)", plat.libc_version or "")
    if plat.libc == "glibc" and minor_glibc:  # the digits only: "2.36*a" once raised ValueError (exit 3)
        glibc = max(17, int(minor_glibc.group(1)))
    arch = plat.machine
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(glibc, 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    if plat.libc == "musl":
        platforms = [f"musllinux_1_{m}_{arch}" for m in range(9, -1, -1)] + [f"linux_{arch}"]
    abis = []
    if py.soabi and py.soabi.startswith("cpython-"):
        abis.append("cp" + py.soabi.split("-")[1])
    tags = [*cpython_tags((major, minor), abis=abis or None, platforms=platforms),
            *compatible_tags((major, minor), interpreter=f"cp{major}{minor}", platforms=platforms)]
    return frozenset(tags)


def _fits(filename: str, tags: frozenset[Tag] | None) -> bool:
    if not filename.endswith(".whl"):
        return False
    return tags is None or bool(set(parse_wheel_filename(filename)[3]) & tags)


def pick(files: Sequence[IndexFile | Artifact], tags: frozenset[Tag] | None) -> list[str]:
    """File names to offer the installer: the fitting wheels, else the sdist(s)."""
    wheels = [f.filename for f in files if _fits(f.filename, tags)]
    return wheels or [f.filename for f in files if not f.filename.endswith(".whl")]


def _allowed(pkg: Package, arts: list[Artifact]) -> list[Artifact]:
    """When the lock recorded hashes, only files with those hashes may be offered."""
    known = {h.split(":", 1)[1] for h in pkg.hashes}
    return [a for a in arts if a.sha256 in known] if known else arts


def _local_path(url: str) -> str:
    return unquote(urlsplit(url).path)


def _direct(pkg: Package) -> Resolved | str:
    """vcs, directory and archive packages; a string says why one cannot be exported."""
    if pkg.source == "vcs":
        if not (pkg.url and pkg.vcs and pkg.commit):
            return "vcs package without url or commit"
        return Resolved(pkg, "vcs")
    if not pkg.url:
        return f"{pkg.source} package without a URL"
    sha = None
    if pkg.archive_hash and re.fullmatch(r"sha256[=:][0-9a-fA-F]{64}", pkg.archive_hash):
        sha = pkg.archive_hash[7:].lower()
    if pkg.url.startswith("file:"):
        path = _local_path(pkg.url)
        if pkg.source == "editable" or not path.endswith(ARCHIVE_SUFFIXES):
            return Resolved(pkg, "directory", path=path)
        if sha is None:
            return "local archive without a sha256 in the lock"
        name = path.rsplit("/", 1)[-1]
        return Resolved(pkg, "archive", artifacts=(Artifact(name, sha, path=path),), path=path)
    if sha is None:
        return "URL archive without a sha256 in the lock"
    name = pkg.url.rsplit("/", 1)[-1]
    return Resolved(pkg, "archive", artifacts=(Artifact(name, sha, url=pkg.url),))


def _from_wheelhouse(lock: Lock, pkgs: list[Package], directory: Path, tags: frozenset[Tag] | None,
                     relative_to: Path | None) -> tuple[list[Resolved], list[str]]:
    from envlock._files import sha256_file
    from envlock.restore.wheelhouse import read_manifest, select

    manifest = read_manifest(directory)
    found = select(directory, pkgs)
    out: list[Resolved] = []
    missing: list[str] = []
    for pkg in pkgs:
        files = found.get(pkg.name, ())
        keep = set(pick([Artifact(f.name, "") for f in files], tags))
        arts = []
        for f in files:
            if f.name not in keep:
                continue
            digest = sha256_file(f)[7:]
            recorded = {h.split(":", 1)[1] for h in manifest.get(pkg.name, ())}
            if recorded and digest not in recorded:
                missing.append(f"{pkg.name}=={pkg.version} ({f.name} does not match the bundle manifest)")
                break
            shown = os.path.relpath(f.resolve(), relative_to) if relative_to else str(f.resolve())
            arts.append(Artifact(f.name, digest, path=shown, size=f.stat().st_size))
        else:
            arts = _allowed(pkg, arts)
            if arts:
                out.append(Resolved(pkg, "wheelhouse", artifacts=tuple(arts)))
            else:
                missing.append(f"{pkg.name}=={pkg.version} (no fitting file in {directory})")
    return out, missing


def _artifact(index: SimpleIndex, f: IndexFile, relative_to: Path | None) -> Artifact:
    if isinstance(index, FlatLinks) and index.directory is not None:
        path = Path(_local_path(f.url))
        shown = os.path.relpath(path, relative_to) if relative_to else str(path)
        return Artifact(f.filename, f.sha256 or "", path=shown, size=f.size)
    return Artifact(f.filename, f.sha256 or "", url=index.public_file(f.url), size=f.size)


def chain_for(lock: Lock, pkgs: Sequence[Package], config: InstallerConfig, sources: Sources,
              cache: Path | None) -> list[tuple[SimpleIndex, ...]]:
    """For each package, where to look in turn: the configured find-links (files the user put
    there on purpose, and what works when an index does not answer), PyTorch's index for a
    local label, the main index, the configured index, then the extra indexes."""
    pool: dict[str, SimpleIndex] = {}

    def ix(url: str, flat: bool = False) -> SimpleIndex:
        if url not in pool:
            pool[url] = (FlatLinks if flat else SimpleIndex)(url, cache=cache, refresh=sources.refresh)
        return pool[url]

    links = [ix(str(d), True) for d in config.local_find_links()]
    links += [ix(u, True) for u in config.remote_find_links()]
    main = main_index(lock, sources.index_url) or default_index(config)
    out = []
    for pkg in pkgs:
        t = torch_index(pkg, sources.torch_index_url)
        # The configured index after the main one: the lock's own index (its environment's
        # PIP_INDEX_URL) may be gone, and the user's is then the next place to look.
        urls = dict.fromkeys(x for x in (t, main, config.index_url, *config.extra_index_urls) if x)
        out.append(tuple(links) + tuple(ix(u) for u in urls))
    return out


def resolve_lock(lock: Lock, sources: Sources, *, relative_to: Path | None = None) -> list[Resolved]:
    """Every package of ``lock`` with its source; raises ArtifactsMissing naming each gap."""
    tags = lock_tags(lock)
    by_index: list[Package] = []
    out: list[Resolved] = []
    missing: list[str] = []
    for pkg in lock.packages:
        if pkg.name in sources.skip:
            continue
        if pkg.source in ("vcs", "url", "local", "editable"):
            got = _direct(pkg)
            if isinstance(got, str):
                missing.append(f"{pkg.name}=={pkg.version} ({got})")
            else:
                out.append(got)
        else:
            by_index.append(pkg)
    if sources.wheelhouse is not None:
        found, gaps = _from_wheelhouse(lock, by_index, sources.wheelhouse, tags, relative_to)
        out += found
        missing += gaps
    else:
        config = sources.config if sources.config is not None else read_config()
        cache = (cache_root() if sources.use_cache else None)
        chains = chain_for(lock, by_index, config, sources, cache)
        queries = [Query(pkg.name, pkg.version, chain) for pkg, chain in zip(by_index, chains, strict=True)]
        answers = resolve(queries)
        for pkg, q in zip(by_index, queries, strict=True):
            hit = answers.get(pkg.name)
            if hit is None:
                missing.append(f"{pkg.name}=={pkg.version} (not on {names(q.indexes)})")
                continue
            index, files = hit
            keep = set(pick(files, tags))
            # URLs lose their credentials (user:password, the index's path token, a presigned
            # URL's signature): an export is a file people commit and attach, and the
            # installer brings its own credentials (keyring, netrc, UV_INDEX_* variables).
            arts = _allowed(pkg, [_artifact(index, f, relative_to) for f in files if f.filename in keep])
            if not arts:
                missing.append(f"{pkg.name}=={pkg.version} (no file on {index.public} fits "
                               f"{lock.python.version} {lock.platform.machine} or the lock's hashes)")
                continue
            kind = "links" if isinstance(index, FlatLinks) else "index"
            out.append(Resolved(pkg, kind, index=index.public.rstrip("/") if kind == "index" else index.public,
                                artifacts=tuple(arts)))
    if missing:
        raise ArtifactsMissing(
            f"no installable file found for {len(missing)} package(s): " + "; ".join(missing),
            hint="pass --index-url (and --torch-index-url for +cpu/+cuXXX builds), "
                 f"{WHEELHOUSE_HINT}, or --skip NAME")
    return sorted(out, key=lambda r: r.package.name)
