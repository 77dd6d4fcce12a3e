"""Offline replay: collect every wheel a lock needs (``envlock bundle``) and find them again.

A bundle is a directory of wheels plus ``envlock-bundle.json``, a manifest with each file's
sha256. ``envlock restore --wheelhouse DIR`` installs from it with ``--no-index`` and, where the
lock has no hashes of its own, with the manifest's hashes (``--require-hashes``), so a paper's
artifact replays with no network and no silent substitution.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from envlock.errors import EnvlockError, NotRestorable, UsageError
from envlock.model import Lock, Package
from envlock.restore import values
from envlock.restore.context import TOOLING

MANIFEST = "envlock-bundle.json"
PIP_TIMEOUT = 3600.0


class HashMismatch(EnvlockError):
    """A wheel's sha256 is not one the lock (or the bundle's manifest) allows."""

    exit_code = 3


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
    """Distribution name -> (version, file) for every wheel or sdist in ``directory``."""
    out: dict[str, list[tuple[Version, Path]]] = {}
    if not Path(directory).is_dir():
        raise UsageError(f"wheelhouse {directory} is not a directory")
    for path in sorted(Path(directory).iterdir()):
        if not path.is_file():
            continue
        parsed = _parse(path)
        if parsed:
            out.setdefault(parsed[0], []).append((parsed[1], path))
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def select(directory: Path, packages: Iterable[Package]) -> dict[str, tuple[Path, ...]]:
    """Package name -> the files in ``directory`` that carry exactly its version."""
    found = scan(directory)
    out: dict[str, tuple[Path, ...]] = {}
    for pkg in packages:
        if pkg.source == "system":
            continue  # the OS package manager installs it, not pip
        want = Version(values.version(pkg.version, name=pkg.name))
        files = tuple(p for v, p in found.get(pkg.name, []) if v == want)
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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a valid bundle manifest: {exc}") from None
    return {k: tuple(v) for k, v in out.items()}


def allowed_hashes(pkg: Package) -> tuple[str, ...]:
    found = [values.package_hash(h, name=pkg.name) for h in pkg.hashes]
    if pkg.archive_hash and pkg.archive_hash.startswith("sha256"):
        found.append(values.package_hash(pkg.archive_hash, name=pkg.name))
    return tuple(found)


@dataclass(frozen=True)
class BundleResult:
    directory: Path
    files: tuple[tuple[str, str, str, str], ...]  # (name, version, filename, sha256)
    missing_tooling: tuple[str, ...]
    skipped: tuple[str, ...]


def _wanted(lock: Lock, skip_local: bool) -> tuple[list[Package], list[str]]:
    wanted: list[Package] = []
    skipped: list[str] = []
    local: list[str] = []
    for pkg in lock.packages:
        values.dist_name(pkg.name)
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


def _platform_args(lock: Lock) -> list[str]:
    """pip download options that target the lock's interpreter and platform, not this one."""
    py = lock.python
    major, minor = py.version.split(".")[:2]
    args = ["--python-version", f"{major}.{minor}"]
    if py.implementation == "cpython":
        args += ["--implementation", "cp"]
        if py.soabi and py.soabi.startswith("cpython-"):
            abi = "cp" + py.soabi.split("-")[1]
            if re.match(r"^cp[0-9]+t?$", abi):
                args += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
    machine = lock.platform.machine
    if lock.platform.os == "Linux" and re.match(r"^[A-Za-z0-9_]+$", machine):
        glibc_minor = 17
        if lock.platform.libc == "glibc" and lock.platform.libc_version:
            parts = lock.platform.libc_version.split(".")
            if len(parts) >= 2 and parts[1].isdigit():
                glibc_minor = max(17, int(parts[1]))
        tags = [f"manylinux_2_{m}_{machine}" for m in range(glibc_minor, 16, -1)]
        tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}",
                 f"linux_{machine}", "any"]
        for tag in tags:
            args += ["--platform", tag]
    return args


def _download(lock: Lock, pkgs: list[Package], dest: Path, *, index_url: str | None,
              find_links: Path | None, torch_index: str | None) -> None:
    lines = []
    for pkg in pkgs:
        if pkg.source == "url" and pkg.url and not find_links:
            lines.append(f"{pkg.name} @ {values.url(pkg.url, what=f'URL of {pkg.name}')}")
        elif pkg.source == "vcs":
            raise NotRestorable(f"{pkg.name} comes from {pkg.vcs}; put a wheel built from commit "
                                f"{pkg.commit} into a wheelhouse and bundle with --wheelhouse")
        else:
            lines.append(f"{pkg.name}=={pkg.version}")
    req = dest / "requirements.txt"
    req.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
            "-d", str(dest), *_platform_args(lock), "-r", str(req)]
    if find_links:
        argv += ["--no-index", "--find-links", str(find_links)]
    else:
        if index_url:
            argv += ["--index-url", values.url(index_url, what="--index-url")]
        if torch_index:
            argv += ["--extra-index-url", torch_index]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=PIP_TIMEOUT, check=False)
    req.unlink()
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise NotRestorable("pip download failed: " + " | ".join(tail) if tail else "pip download failed")


def bundle(lock: Lock, out: Path, *, source: Path | None = None, index_url: str | None = None,
           pip_find_links: Path | None = None, skip_local: bool = False) -> BundleResult:
    """Collect every wheel of ``lock`` into ``out`` (hash-checked) and write the manifest.

    ``source``: a local wheelhouse to copy from; otherwise ``pip download`` fetches the exact
    pins for the lock's platform from ``index_url`` (PyPI by default, plus the PyPI-compatible
    PyTorch index for local labels such as +cu121), or from ``pip_find_links`` with no index.
    """
    from envlock.restore.context import _torch_label
    from envlock.restore.tables import bases

    wanted, skipped = _wanted(lock, skip_local)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".envlock-bundle-", dir=out) as tmp:
        staging = Path(tmp)
        if source is not None:
            for files in select(Path(source), wanted).values():
                for f in files:
                    shutil.copy2(f, staging / f.name)
        else:
            torch_index = bases().torch.index_for(_torch_label(lock))
            _download(lock, wanted, staging, index_url=index_url, find_links=pip_find_links,
                      torch_index=torch_index)
        have = select(staging, wanted)
        rows: list[tuple[str, str, str, str]] = []
        missing: list[str] = []
        missing_tooling: list[str] = []
        for pkg in wanted:
            files = have.get(pkg.name, ())
            if not files:
                (missing_tooling if pkg.name in TOOLING else missing).append(f"{pkg.name}=={pkg.version}")
                continue
            allowed = allowed_hashes(pkg)
            for f in files:
                digest = sha256_file(f)
                if allowed and digest not in allowed:
                    raise HashMismatch(f"{f.name}: sha256 {digest[7:19]}... is not one the lock "
                                       f"allows for {pkg.name} {pkg.version}")
                rows.append((pkg.name, pkg.version, f.name, digest))
        if missing:
            where = f"in {source}" if source else "on the index"
            raise NotRestorable(f"no wheel {where} for: " + ", ".join(missing))
        for _, _, fname, _ in rows:
            shutil.move(str(staging / fname), str(out / fname))
    manifest = {
        "envlock_bundle": 1,
        "lock_fingerprint": lock.envlock.fingerprint,
        "lock_id": lock.short_id,
        "files": [{"name": n, "version": v, "filename": f, "sha256": h} for n, v, f, h in rows],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return BundleResult(out, tuple(rows), tuple(missing_tooling), tuple(skipped))


def manifest_names(hashes: Mapping[str, tuple[str, ...]]) -> list[str]:
    return sorted(canonicalize_name(n) for n in hashes)
