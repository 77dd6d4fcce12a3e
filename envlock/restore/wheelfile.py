"""The one wheel writer: a wheel of files envlock holds, the same bytes for the same files.

envlock writes wheels in two places: a pack's or bundle's wheel rebuilt from a distribution's
installed files (``export/rebuild``, also from uv's unpacked cache) and the wheel of the
running envlock that restore puts into an image (``ownwheel``). Both go through ``write``:

* the RECORD is written for the files given (sha256 and size of each, itself last, unhashed);
* the order is fixed: sorted, the ``.dist-info`` last (installers read it from the end);
* every entry carries 1980-01-01, the earliest time a zip can hold;
* every entry is deflated (the same zlib gives the same bytes; an installed torch packed
  uncompressed is twice the size);
* every entry keeps the one part of a file's mode an installer reads: pip and uv set a file's
  executable bits when its entry's mode has one (a script in a package, a bundled binary), and
  ignore the rest. It is written as ``0o755`` or ``0o644``, whatever the umask of the machine
  that installed the files, so the bytes do not depend on it.

``record_sha256`` proves a rebuilt wheel's contents (the lock records no mode), so
``mode_differences`` proves the modes: it reads the wheel back and compares each entry's
executable bit with the installed file's.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from envlock.errors import EnvlockError, HashMismatch

# Written by the installer, not shipped in the wheel (the probe's _NO_HASH_IN_RECORD).
INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json"})
# 1980-01-01, the earliest time a zip can hold: the same bytes for the same files, always.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_EXECUTABLE, _PLAIN = 0o755, 0o644


@dataclass(frozen=True)
class Member:
    """One file of a wheel: its path in the archive, its bytes, whether it is executable."""

    name: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Repacked:
    path: Path
    left_out: tuple[str, ...]  # RECORD entries installed outside site-packages


def record_hash(data: bytes) -> str:
    """A RECORD line's hash: ``sha256=`` and the urlsafe base64 digest without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def is_executable(info: zipfile.ZipInfo) -> bool:
    """Whether an installer makes this entry's file executable (pip's rule: a regular file's
    mode in the upper half of ``external_attr`` with an executable bit)."""
    mode = info.external_attr >> 16
    return bool(mode and stat.S_ISREG(mode) and mode & 0o111)


def write(out: Path, members: Sequence[Member], dist_info: str) -> Path:
    """The wheel ``out`` of ``members`` with a RECORD written for them (``dist_info``: the
    ``name-version.dist-info`` directory), deterministic; replaced whole, so a reader sees the
    old file, the new one or none."""
    ordered = sorted(members, key=lambda m: (m.name.startswith(dist_info + "/"), m.name))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for m in ordered:
        writer.writerow([m.name, record_hash(m.data), str(len(m.data))])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries = [*ordered, Member(f"{dist_info}/RECORD", record.getvalue().encode("utf-8"))]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            for m in entries:
                info = zipfile.ZipInfo(m.name, date_time=ZIP_TIME)
                info.create_system = 3  # Unix: the mode below is read from external_attr's upper half
                info.external_attr = (stat.S_IFREG | (_EXECUTABLE if m.executable else _PLAIN)) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, m.data)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def wheel_tag(dist_info: Path) -> str:
    """The first ``Tag`` of the installed ``WHEEL`` file (what the original wheel was built for)."""
    text = (dist_info / "WHEEL").read_text(encoding="utf-8")
    tags = HeaderParser().parsestr(text).get_all("Tag") or []
    if not tags:
        raise EnvlockError(f"{dist_info}/WHEEL names no tag")
    return str(tags[0]).strip()


def _shipped(dist_info: Path) -> tuple[list[str], list[str]]:
    """(files the wheel shipped into site-packages, RECORD entries installed outside it)."""
    with open(dist_info / "RECORD", newline="", encoding="utf-8") as fh:
        rows = [row for row in csv.reader(fh) if row]
    inside: list[str] = []
    outside: list[str] = []
    for row in rows:
        rel = row[0]
        if rel.startswith("../") or rel.startswith("/") or "/../" in rel:
            outside.append(rel)
        elif len(row) < 2 or not row[1]:
            continue  # bytecode compiled at install, RECORD itself: not the wheel's
        elif rel.partition("/")[0] == dist_info.name and rel.partition("/")[2] in INSTALLER_FILES:
            continue
        else:
            inside.append(rel)
    return inside, outside


def repack(dist_info: Path, dest: Path) -> Repacked:
    """A wheel in ``dest`` of what the installed distribution ``dist_info`` shipped into
    site-packages, as its RECORD lists it: contents and executable bits read from the files.
    What the installer wrote is left out, and so is what went outside site-packages (scripts
    come back from ``entry_points.txt`` when the wheel is installed)."""
    site = dist_info.parent
    inside, outside = _shipped(dist_info)
    members = []
    for rel in inside:
        try:
            with open(site / rel, "rb") as fh:
                executable = bool(os.fstat(fh.fileno()).st_mode & 0o111)
                members.append(Member(rel, fh.read(), executable))
        except OSError as exc:
            raise HashMismatch(f"{dist_info.name}: installed file {rel} cannot be read "
                               f"({exc.strerror or exc}); no wheel can be rebuilt") from None
    dist, _, version = dist_info.name[: -len(".dist-info")].rpartition("-")
    path = write(dest / f"{dist}-{version}-{wheel_tag(dist_info)}.whl", members, dist_info.name)
    return Repacked(path, tuple(outside))


def mode_differences(wheel: Path, site: Path) -> list[str]:
    """The wheel's files whose executable bit is not the one of the same file under ``site``
    (missing files count), read back from the archive as an installer would read it."""
    differ = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                continue
            try:
                installed = bool(os.stat(site / info.filename).st_mode & 0o111)
            except OSError:
                installed = not is_executable(info)  # no such file: never the same
            if installed != is_executable(info):
                differ.append(info.filename)
    return differ
