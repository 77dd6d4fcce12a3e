"""Offline replay: collect every wheel a lock needs (``envlock bundle``) and find them again.

A bundle is a directory of wheels plus ``envlock-bundle.json``, a manifest with each file's
sha256. ``envlock restore --wheelhouse DIR`` installs from it with ``--no-index`` and, where the
lock has no hashes of its own, with the manifest's hashes (``--require-hashes``), so a paper's
artifact replays with no network and no silent substitution.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from envlock._files import file_digest
from envlock.errors import BadWheel, HashMismatch, UsageError
from envlock.lock import Lock, Package
from envlock.probe.packages import record_digest
from envlock.restore import values

MANIFEST = "envlock-bundle.json"
PIP_TIMEOUT = 3600.0


_HEX_RE = re.compile(r"[0-9a-fA-F]+")


def _parse(path: Path) -> tuple[str, Version] | None:
    try:
        if path.name.endswith(".whl"):
            name, ver, _, _ = parse_wheel_filename(path.name)
            return str(name), ver
        if path.name.endswith((".tar.gz", ".zip")):
            name, ver = parse_sdist_filename(path.name)
            return str(name), ver
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def scan(directory: Path) -> dict[str, list[tuple[Version, Path]]]:
    """Distribution name -> (version, file) for every wheel or sdist in ``directory``.

    A symbolic link counts only when it stays inside the wheelhouse: a link named like a wheel
    that points at ``~/.ssh/id_ed25519`` must never be copied into a bundle or a build context.
    Such a link is refused when a package of the lock would take it (``select``).
    """
    out: dict[str, list[tuple[Version, Path]]] = {}
    if not Path(directory).is_dir():
        raise UsageError(f"wheelhouse {directory} is not a directory")
    for path in sorted(Path(directory).iterdir()):
        parsed = _parse(path)
        if parsed and (path.is_symlink() or path.is_file()):
            out.setdefault(parsed[0], []).append((parsed[1], path))
    return out


def _check_inside(path: Path, root: Path) -> None:
    if not path.is_symlink():
        return
    real = path.resolve()
    if not real.is_relative_to(root.resolve()) or not real.is_file():
        raise UsageError(f"wheelhouse entry {path} is a symbolic link to {real}, outside the "
                         "wheelhouse (or not a file)",
                         hint="envlock never follows links out of a wheelhouse; copy the wheel in")


def select(directory: Path, packages: Iterable[Package]) -> dict[str, tuple[Path, ...]]:
    """Package name -> the files in ``directory`` that carry exactly its version."""
    found = scan(directory)
    out: dict[str, tuple[Path, ...]] = {}
    for pkg in packages:
        if pkg.source == "system":
            continue  # the OS package manager installs it, not pip
        want = Version(values.version(pkg.version, name=pkg.name))
        files = tuple(p for v, p in found.get(pkg.name, []) if v == want)
        for f in files:
            _check_inside(f, Path(directory))
        if files:
            out[pkg.name] = files
    return out


def read_manifest(directory: Path) -> dict[str, tuple[str, ...]]:
    """Package name -> sha256 hashes recorded by ``envlock bundle`` (empty without a manifest)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["files"]
        out: dict[str, list[str]] = {}
        for row in rows:
            name = values.dist_name(str(row["name"]))
            out.setdefault(name, []).append(values.package_hash(str(row["sha256"]), name=name))
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UsageError(f"{path} is not a valid bundle manifest: {why}") from None
    return {k: tuple(v) for k, v in out.items()}


def read_local_wheels(directory: Path) -> frozenset[str]:
    """Names of the packages installed from a local sdist or directory whose wheel ``envlock
    pack`` put here (found, or rebuilt from the installed files), proven equal to the lock's
    ``record_sha256``: a restore installs them by name from it."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return frozenset()
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["files"]
        return frozenset(values.dist_name(str(r["name"])) for r in rows if r.get("local_source") is True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise UsageError(f"{path} is not a valid bundle manifest") from None


def write_manifest(out: Path, lock: Lock, rows: Iterable[Mapping[str, object]]) -> None:
    """``out/envlock-bundle.json``: each file's name, version, filename and sha256."""
    manifest = {
        "envlock_bundle": 1,
        "lock_fingerprint": lock.envlock.fingerprint,
        "lock_id": lock.short_id,
        "files": list(rows),
    }
    # Replaced, never written through: a link planted at the manifest's name stays untouched.
    tmp_manifest = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp_manifest.unlink(missing_ok=True)
    tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, out / MANIFEST)


def allowed_hashes(pkg: Package) -> tuple[str, ...]:
    """``algo:hex`` hashes the lock allows for ``pkg``'s file, whatever the algorithm.

    An archive hash in another algorithm than sha2 (``md5=...`` from an old index) is kept, not
    dropped: envlock checks it itself where it has the file (bundle, offline restore); pip's
    ``--hash`` only takes sha256/384/512, and restore says so (see ``context``).
    """
    found = [values.package_hash(h, name=pkg.name) for h in pkg.hashes]
    if pkg.archive_hash:
        algo, _, hexdigest = pkg.archive_hash.replace("=", ":", 1).partition(":")
        if values.pip_checks(pkg.archive_hash):
            found.append(values.package_hash(pkg.archive_hash, name=pkg.name))
        elif algo in hashlib.algorithms_guaranteed and _HEX_RE.fullmatch(hexdigest):
            found.append(f"{algo}:{hexdigest.lower()}")
        else:
            raise HashMismatch(f"{pkg.name} {pkg.version}: the lock's archive hash {pkg.archive_hash!r} "
                               "uses an algorithm envlock cannot check")
    return tuple(dict.fromkeys(found))


def file_matches(path: Path, allowed: Iterable[str]) -> bool:
    """True when ``path``'s digest in one of the algorithms of ``allowed`` is listed there."""
    by_algo: dict[str, set[str]] = {}
    for entry in allowed:
        algo, _, hexdigest = entry.partition(":")
        by_algo.setdefault(algo, set()).add(hexdigest)
    return any(file_digest(path, algo).hexdigest in digests for algo, digests in by_algo.items())


MAX_RECORD_BYTES = 64 << 20
_DATA_SCHEMES_IN_SITE = (b"purelib/", b"platlib/")


def wheel_record_sha256(path: Path) -> str:
    """The ``record_sha256`` the probe will report once this wheel is installed.

    A wheel's RECORD lists every file it ships with its hash; installing moves
    ``*.data/purelib|platlib/`` into site-packages and everything else under ``*.data/`` out of
    it (scripts, headers, data: ``../`` lines, which the probe leaves out), and adds the
    installer's own files (left out too). Mapping the lines that way gives the probe's value
    without installing anything.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            records = [i for i in zf.infolist()
                       if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise BadWheel(f"{path.name} is not a wheel: it has no single *.dist-info/RECORD")
            if records[0].file_size > MAX_RECORD_BYTES:
                raise BadWheel(f"{path.name}: its RECORD is implausibly large")
            data = zf.read(records[0])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise BadWheel(f"{path.name} is not a wheel (not a zip archive: {exc})") from None
    except OSError as exc:
        raise BadWheel(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    lines = []
    for raw in data.splitlines():
        quoted = raw.startswith(b'"')
        body = raw[1:] if quoted else raw
        top, slash, rest = body.partition(b"/")
        if slash and top.endswith(b".data"):
            scheme = next((s for s in _DATA_SCHEMES_IN_SITE if rest.startswith(s)), None)
            if scheme is None:
                continue  # installed outside site-packages: the probe drops those lines
            body = rest[len(scheme):]
        lines.append(b'"' + body if quoted else body)
    return record_digest(b"\n".join(lines))


def check_builds(packages: Iterable[Package], files_for: Mapping[str, tuple[Path, ...]]) -> None:
    """Every wheel that would be installed for a package is the build the lock records.

    Raises ``BadWheel`` for a file that is no wheel and ``HashMismatch`` (naming the package) for
    another build (its RECORD) or an archive whose hash the lock does not allow.
    """
    for pkg in packages:
        allowed = allowed_hashes(pkg)
        for f in files_for.get(pkg.name, ()):
            if allowed and not file_matches(f, allowed):
                raise HashMismatch(f"{pkg.name} {pkg.version}: {f.name} is not the file the lock "
                                   f"allows (its hash is none of {', '.join(a[:19] + '...' for a in allowed)})")
            if not f.name.endswith(".whl"):
                continue  # an sdist: the build is checked inside the restored image
            built = wheel_record_sha256(f)
            if pkg.record_sha256 and built != pkg.record_sha256:
                raise HashMismatch(
                    f"{pkg.name} {pkg.version}: {f.name} is another build than the lock's (its RECORD "
                    f"gives record_sha256 {built[:12]}..., the lock {pkg.record_sha256[:12]}...)",
                    hint="use the wheel the locked environment was installed from")


_MAX_METADATA = 1 << 20
_EXTRA = re.compile(r"\bextra\s*==")


def wheel_requires(wheel: Path) -> set[str]:
    """The normalized names a wheel's METADATA requires (``Requires-Dist``; a requirement of an
    extra left out, one for a platform kept), read with packaging's own METADATA parser; empty
    when it cannot be read (a missing or broken wheel is ``check_builds``'s to report, and
    planning must not fail first with a worse message)."""
    from packaging.metadata import parse_email
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        with zipfile.ZipFile(wheel) as zf:
            meta = [i for i in zf.infolist()
                    if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/METADATA")]
            if len(meta) != 1 or meta[0].file_size > _MAX_METADATA:
                return set()
            raw, _ = parse_email(zf.read(meta[0]))
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return set()
    out: set[str] = set()
    for spec in raw.get("requires_dist", ()):
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        if req.marker is None or not _EXTRA.search(str(req.marker)):
            out.add(canonicalize_name(req.name))
    return out
