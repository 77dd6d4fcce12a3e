"""A wheel rebuilt from a distribution's installed files, proven to be the lock's build.

A package installed from a local sdist or directory (or whose index is gone) has a wheel
nowhere but in the pip cache of the machine that built it, if at all. Its installed files are
still there: the RECORD lists every file the wheel shipped into site-packages. Rebuilding a
wheel from those files and hashing them afresh gives a wheel whose own RECORD yields the
``record_sha256`` the probe reports (``wheelhouse.wheel_record_sha256``); it is kept only when
that equals the lock's value, so an edited file, a missing one or another version never
enters a pack.

The wheel is written by ``restore/wheelfile`` (the one writer: deterministic, deflated, each
file's executable bit kept). ``record_sha256`` proves the contents; the modes are proven by
reading the wheel back against the installed files (``wheelfile.mode_differences``). What a
wheel installs outside site-packages (scripts, headers, data; ``../`` lines in RECORD) is left
out, as ``record_sha256`` leaves it out: console scripts come back from ``entry_points.txt``
when pip installs the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from packaging.utils import canonicalize_name

from envlock.errors import HashMismatch
from envlock.lock import Package
from envlock.restore.wheelfile import Repacked, mode_differences, repack
from envlock.restore.wheelhouse import wheel_record_sha256

SITE_TIMEOUT = 60.0


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


def rebuild(pkg: Package, dist_info: Path, dest: Path) -> Repacked:
    """Write ``pkg``'s wheel into ``dest`` from its installed files; raise ``HashMismatch`` when
    the result is not the lock's build (a file edited, missing, or another build) or does not
    carry the installed files' modes."""
    try:
        built = repack(dist_info, dest)
    except HashMismatch as exc:
        raise HashMismatch(f"{pkg.name} {pkg.version}: {exc.message}") from None
    digest = wheel_record_sha256(built.path)
    modes = mode_differences(built.path, dist_info.parent)
    if pkg.record_sha256 and digest == pkg.record_sha256 and not modes:
        return built
    built.path.unlink()
    if modes:
        raise HashMismatch(f"{pkg.name} {pkg.version}: the rebuilt wheel's file modes are not the installed "
                           f"files' ({', '.join(modes[:3])}{', ...' if len(modes) > 3 else ''})",
                           hint="an installed file changed while it was read; pack again")
    why = ("the lock records no record_sha256 to prove it against" if not pkg.record_sha256
           else f"its files give record_sha256 {digest[:12]}..., the lock {pkg.record_sha256[:12]}...")
    raise HashMismatch(f"{pkg.name} {pkg.version}: the installed files are not the lock's build ({why})",
                       hint="restore the environment the lock was captured from, or provide its wheel "
                            "with --wheelhouse")
