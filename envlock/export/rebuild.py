"""A wheel rebuilt from a distribution's installed files, proven to be the lock's build.

A package installed from a local sdist or directory (or whose index is gone) has a wheel
nowhere but in the pip cache of the machine that built it, if at all. Its installed files are
still there: the RECORD lists every file the wheel shipped into site-packages. Rebuilding a
wheel from those files and hashing them afresh gives a wheel whose own RECORD yields the
``record_sha256`` the probe reports (``wheelhouse.wheel_record_sha256``); it is kept only when
that equals the lock's value, so an edited file, a missing one or another version never
enters a pack.

What a wheel installs outside site-packages (scripts, headers, data; ``../`` lines in RECORD)
is left out, as ``record_sha256`` leaves it out: console scripts come back from
``entry_points.txt`` when pip installs the wheel.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from envlock.errors import EnvlockError, HashMismatch
from envlock.lock import Package
from envlock.restore.wheelhouse import wheel_record_sha256

# Written by the installer, not shipped in the wheel (the probe's _NO_HASH_IN_RECORD).
INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json")
# A zip entry's date: fixed, so the same files always make the same bytes (zip's epoch, 1980).
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
SITE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Rebuilt:
    path: Path
    left_out: tuple[str, ...]  # RECORD entries installed outside site-packages


def site_dirs(python: str) -> list[Path]:
    """The import path of ``python`` (its site-packages among it), asked of the interpreter."""
    try:
        proc = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, timeout=SITE_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
        entries = json.loads(proc.stdout) if proc.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        entries = []
    return [Path(e) for e in entries if isinstance(e, str) and e and Path(e).is_dir()]


def find_dist_info(dirs: list[Path], name: str, version: str) -> Path | None:
    """``<name>-<version>.dist-info`` of ``name`` (normalised) in the first directory that has
    one of that version, as the import system would find it."""
    want = canonicalize_name(name)
    for directory in dirs:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            dist, _, ver = entry[: -len(".dist-info")].rpartition("-")
            if canonicalize_name(dist) == want and ver == version and (directory / entry).is_dir():
                return directory / entry
    return None


def _b64_sha256(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_tag(dist_info: Path) -> str:
    """The first ``Tag`` of the installed WHEEL file (what the original wheel was built for)."""
    text = (dist_info / "WHEEL").read_text(encoding="utf-8")
    tags = HeaderParser().parsestr(text).get_all("Tag") or []
    if not tags:
        raise EnvlockError(f"{dist_info}/WHEEL names no tag")
    return str(tags[0]).strip()


def rebuild(pkg: Package, dist_info: Path, dest: Path) -> Rebuilt:
    """Write ``pkg``'s wheel into ``dest`` from its installed files; raise ``HashMismatch`` when
    the result is not the lock's build (a file edited, missing, or another build)."""
    site = dist_info.parent
    with open(dist_info / "RECORD", newline="", encoding="utf-8") as fh:
        rows = [row for row in csv.reader(fh) if row]
    members: list[tuple[str, bytes]] = []
    left_out: list[str] = []
    for row in rows:
        rel = row[0]
        if rel.startswith("../") or rel.startswith("/") or "/../" in rel:
            left_out.append(rel)
            continue
        if len(row) < 2 or not row[1]:
            continue  # bytecode pip compiled at install, RECORD itself: not the wheel's
        top, _, leaf = rel.partition("/")
        if top == dist_info.name and leaf in INSTALLER_FILES:
            continue
        try:
            members.append((rel, (site / rel).read_bytes()))
        except OSError as exc:
            raise HashMismatch(f"{pkg.name} {pkg.version}: installed file {rel} cannot be read "
                               f"({exc.strerror or exc}); no wheel can be rebuilt") from None
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, data in sorted(members):
        writer.writerow([rel, _b64_sha256(data), str(len(data))])
    writer.writerow([f"{dist_info.name}/RECORD", "", ""])
    dist = dist_info.name[: -len(".dist-info")].rpartition("-")[0]
    path = dest / f"{dist}-{pkg.version}-{_wheel_tag(dist_info)}.whl"
    tmp = dest / f".{path.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        # dist-info last, as wheels are written (installers read it from the end).
        for rel, data in sorted(members, key=lambda m: (m[0].startswith(dist_info.name + "/"), m[0])):
            zf.writestr(zipfile.ZipInfo(rel, _ZIP_DATE), data)
        zf.writestr(zipfile.ZipInfo(f"{dist_info.name}/RECORD", _ZIP_DATE), record.getvalue())
    built = wheel_record_sha256(tmp)
    if not pkg.record_sha256 or built != pkg.record_sha256:
        tmp.unlink()
        why = ("the lock records no record_sha256 to prove it against" if not pkg.record_sha256
               else f"its files give record_sha256 {built[:12]}..., the lock {pkg.record_sha256[:12]}...")
        raise HashMismatch(f"{pkg.name} {pkg.version}: the installed files are not the lock's build ({why})",
                           hint="restore the environment the lock was captured from, or provide its wheel "
                                "with --wheelhouse")
    os.replace(tmp, path)
    return Rebuilt(path, tuple(left_out))
