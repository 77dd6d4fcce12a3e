"""The package sections of a comparison: distributions, shadowed copies, conda, OS packages.

The largest sections of a lock and the ones with their own wording rules (one line per breaking
OS package, one summary line for the rest), apart from the environment-wide rules in ``compare``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from envlock.drift.result import Collector, Severity, dump
from envlock.text.terminal import agree, first, plural

if TYPE_CHECKING:
    from envlock.lock import Lock

_PACKAGE: dict[str, Severity] = {
    "version": "breaking", "source": "warning", "url": "warning", "vcs": "breaking",
    "commit": "breaking", "archive_hash": "warning", "record_sha256": "warning",
    "requested_revision": "info", "installer": "info", "requested": "info",
    "os_package": "warning", "os_package_version": "warning",
    # Only compared when both locks were captured with --deep (drift/deep.align).
    "files_sha256": "breaking", "files_changed": "breaking",
}

def packages(c: Collector, old: Lock, new: Lock) -> None:
    """The ``[[packages]]`` sections compared by name: versions and where each came from, one
    difference per package, so a report names what to reinstall."""
    a = {p.name: p for p in old.packages}
    b = {p.name: p for p in new.packages}
    for name in sorted(set(a) | set(b)):
        pa, pb = a.get(name), b.get(name)
        if pa is None and pb is not None:
            c.add("packages", f"packages.{name}", None, pb.version, "breaking",
                  c.words.only_new(f"{name} {pb.version}"))
        elif pb is None and pa is not None:
            c.add("packages", f"packages.{name}", pa.version, None, "breaking",
                  c.words.only_old(f"{name} {pa.version}"))
        elif pa is not None and pb is not None and pa != pb:
            da, db = dump(pa), dump(pb)
            if da.get("version") != db.get("version"):
                c.add("packages", f"packages.{name}.version", pa.version, pb.version, "breaking",
                      f"{name} {pa.version} -> {pb.version}")
                continue  # a new version explains every other field of the same package
            for key in sorted(set(da) | set(db)):
                if key == "name" or da.get(key) == db.get(key):
                    continue
                severity = _PACKAGE.get(key, "info")
                message = ""
                if key == "record_sha256":
                    message = f"{name} {pa.version}: same version, different build (RECORD differs)"
                c.add("packages", f"packages.{name}.{key}", da.get(key), db.get(key), severity, message)
    dup_a = {(d.name, d.version) for d in old.duplicates}
    dup_b = {(d.name, d.version) for d in new.duplicates}
    for name, version in sorted(dup_a ^ dup_b):
        gone = (name, version) in dup_a
        c.add("packages", f"duplicates.{name}", version if gone else None, None if gone else version,
              "warning", f"shadowed copy of {name} {version} " + ("gone" if gone else "appeared"))


# OS packages whose change alone can change results or stop the code from running: the C
# library, the CUDA stack (toolkit, cuDNN, NCCL, cuBLAS, the driver's user-space libraries) and
# the Python interpreter itself. Every other OS package change is a warning.
OS_BREAKING_RE = re.compile(
    r"^(libc6(-.+)?|glibc(-.+)?|musl"
    r"|cuda-.+|libcuda.*|libcudnn.*|cudnn.*|libnccl.*|libcublas.*|libcusparse.*|libcufft.*"
    r"|libcurand.*|libcusolver.*|libnvjitlink.*|libnvidia-.+|nvidia-.+"
    r"|(lib)?python3(\.[0-9]+)?(-minimal|-stdlib|-libs|-dev)?)$")
OS_NAMES_SHOWN = 8


def os_package_severity(name: str) -> Severity:
    """``breaking`` for libc, CUDA-stack and Python packages, else ``warning``."""
    return "breaking" if OS_BREAKING_RE.match(name.split(":", 1)[0]) else "warning"


def os_packages(c: Collector, old: Lock, new: Lock) -> None:
    """One line per breaking change, and one summary line for all the others.

    An image update easily changes a hundred OS packages; listing each would bury the few that
    matter, so the rest are counted and named on one line (the full maps stay in --json).
    """
    a, b = old.os_packages, new.os_packages
    if a is None and b is None:
        return
    if a is None or b is None:
        c.add("os_packages", "os_packages", a and len(a.packages), b and len(b.packages), "warning",
              "OS packages not recorded here" if b is None else "OS packages recorded here, none in the lock")
        return
    if a.manager != b.manager:
        c.add("os_packages", "os_packages.manager", a.manager, b.manager, "breaking",
              f"OS packages managed by {a.manager} in the lock, by {b.manager} here")
        return
    va, vb = a.versions(), b.versions()
    soft: dict[str, list[str]] = {"changed": [], "added": [], "removed": []}
    old_soft: dict[str, str] = {}
    new_soft: dict[str, str] = {}
    for key in sorted(set(va) | set(vb)):
        x, y = va.get(key), vb.get(key)
        if x == y:
            continue
        name = key.split(":", 1)[0]
        kind = "added" if x is None else "removed" if y is None else "changed"
        if os_package_severity(name) == "breaking":
            message = {"added": f"OS package {name} {y} is installed but not in the lock",
                       "removed": f"OS package {name} {x} is in the lock but not installed",
                       "changed": f"OS package {name} {x} -> {y}"}[kind]
            c.add("os_packages", f"os_packages.{key}", x, y, "breaking", message)
            continue
        soft[kind].append(name)
        if x is not None:
            old_soft[key] = x
        if y is not None:
            new_soft[key] = y
    total = sum(len(v) for v in soft.values())
    if not total:
        return
    parts = []
    for kind in ("changed", "added", "removed"):
        names = soft[kind]
        if names:
            names = sorted(names)
            parts.append(f"{len(names)} {kind} ({first(names, OS_NAMES_SHOWN)})")
    c.add("os_packages", "os_packages", _os_side(old_soft), _os_side(new_soft), "warning",
          f"{plural(total, 'other OS package')} {agree(total, 'differs', 'differ')}: " + "; ".join(parts))


def _os_side(versions: dict[str, str]) -> str | None:
    """One side of the summary line, short enough for a table cell: a few ``name version``."""
    if not versions:
        return None
    items = sorted((key.split(":", 1)[0], v) for key, v in versions.items())
    return first([f"{n} {v}" for n, v in items], OS_NAMES_SHOWN)


def conda(c: Collector, old: Lock, new: Lock) -> None:
    """The conda packages compared by name. Another build string, or the same name, version and
    build from another archive (its sha256: a rebuild, a patched mirror), is another binary:
    breaking. A channel that differs for the same archive only says where it came from (info);
    without a sha256 on both sides (a lock written before envlock recorded them) the channel
    is what tells two builds apart, a warning. The virtual packages are facts of the host
    (info)."""
    a = {p.name: p for p in (old.conda.packages if old.conda else [])}
    b = {p.name: p for p in (new.conda.packages if new.conda else [])}
    for name in sorted(set(a) | set(b)):
        pa, pb = a.get(name), b.get(name)
        if pa is None or pb is None:
            c.add("conda", f"conda.{name}", pa and pa.version, pb and pb.version, "breaking",
                  c.words.only_old(f"{name} {pa.version}") if pa else
                  c.words.only_new(f"{name} {pb.version}") if pb else "")
        elif pa.version != pb.version:
            c.add("conda", f"conda.{name}.version", pa.version, pb.version, "breaking",
                  f"conda package {name} {pa.version} -> {pb.version}")
        elif pa.build != pb.build:
            c.add("conda", f"conda.{name}.build", pa.build, pb.build, "breaking",
                  f"conda package {name} {pa.version}: build {pa.build} -> {pb.build}")
        elif pa.sha256 and pb.sha256 and pa.sha256 != pb.sha256:
            c.add("conda", f"conda.{name}.sha256", pa.sha256, pb.sha256, "breaking",
                  f"conda package {name} {pa.version} {pa.build}: same version and build, "
                  f"another archive (sha256 {pa.sha256[:12]} -> {pb.sha256[:12]})")
        elif pa.channel != pb.channel:
            same = bool(pa.sha256 and pa.sha256 == pb.sha256)
            c.add("conda", f"conda.{name}.channel", pa.channel, pb.channel, "info" if same else "warning",
                  f"conda package {name} {pa.version} {pa.build}: channel {pa.channel} -> {pb.channel}"
                  + (" (the same archive)" if same else ""))
    if old.conda and new.conda and old.conda.virtual_packages is not None \
            and new.conda.virtual_packages is not None:
        va = {v.name: v for v in old.conda.virtual_packages}
        vb = {v.name: v for v in new.conda.virtual_packages}
        for name in sorted(set(va) | set(vb)):
            sa = f"{va[name].version}={va[name].build}" if name in va else None
            sb = f"{vb[name].version}={vb[name].build}" if name in vb else None
            if sa != sb:
                c.add("conda", f"conda.virtual_packages.{name}", sa, sb, "info")
