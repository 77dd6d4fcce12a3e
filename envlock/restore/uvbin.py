"""The uv binary an offline restore installs with inside its build stages.

Builds have no network, so uv must come from disk: the uv wheel of the wheelhouse (a pack
carries one when it was made with uv at hand), else the running host's own ``uv`` (on PATH,
or next to this interpreter, where ``pip install uv`` puts it). Only a Linux executable of this
machine's architecture is taken; whether it runs in the base (glibc or musl, an emulated
architecture) is decided inside the build, which falls back to pip with one log line
(``dockerfile``), so a uv that does not fit never fails a restore.

uv installs the same files as pip: the same requirement files, ``--no-deps --no-index
--find-links`` to the context's wheels, ``--require-hashes`` for hashed rows, and byte code
compiled as pip compiles it; verification inside the image is the same either way.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
import zipfile
from pathlib import Path

# ELF e_machine values of the architectures uv is published for.
_MACHINES = {"x86_64": 0x3E, "amd64": 0x3E, "aarch64": 0xB7, "arm64": 0xB7, "ppc64le": 0x15,
             "s390x": 0x16, "i686": 0x03, "armv7l": 0x28}
_WHEEL = re.compile(r"uv-[0-9][^-]*-py3-none-(?:many|musl)linux[^/]*\.whl")
_MAX_BINARY = 256 << 20


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


def from_wheelhouse(house: Path, dest: Path) -> Path | None:
    """The binary of a uv wheel in ``house``, unpacked once into ``dest`` (a cache directory)."""
    wheels = sorted(p for p in house.iterdir() if _WHEEL.fullmatch(p.name) and p.is_file()
                    and not p.is_symlink()) if house.is_dir() else []
    for wheel in reversed(wheels):  # the newest version first
        out = dest / wheel.name[:-4] / "uv"
        if out.is_file() and runs_here(out):
            return out
        try:
            with zipfile.ZipFile(wheel) as zf:
                member = next((i for i in zf.infolist()
                               if re.fullmatch(r"uv-[^/]+\.data/scripts/uv", i.filename)), None)
                if member is None or member.file_size > _MAX_BINARY:
                    continue
                data = zf.read(member)
        except (OSError, zipfile.BadZipFile, EOFError):
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".uv.{os.getpid()}")
        tmp.write_bytes(data)
        tmp.chmod(0o755)
        os.replace(tmp, out)
        if runs_here(out):
            return out
    return None


def find(house: Path | None, cache: Path) -> Path | None:
    """The uv to install with: the wheelhouse's, else the host's; None when there is none."""
    if os.environ.get("ENVLOCK_RESTORE_INSTALLER", "").strip().lower() == "pip":
        return None
    return (from_wheelhouse(house, cache) if house is not None else None) or from_host()
