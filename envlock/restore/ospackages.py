"""OS packages in a restore: what the image's package manager installs, and how.

A lock of a system-Python image (NGC's PyTorch images, Debian's ``python3-torch``) holds the
image's OS packages and marks the Python distributions an OS package installed as ``source =
"system"``. Restoring it means: the OS packages at the recorded versions through the image's
own manager (apt pins ``name=version``), then the pip-installed distributions into the same
system Python. A venv lock restores only its venv: the OS is the base image's business.

Every pin goes into an exec-form ``RUN`` (no shell) after ``values.os_package`` checked it.
Before apt installs anything, ``ospkgs.py --check`` (the probe's own parser, copied into the
build) names every pinned version the image's sources no longer offer, so the build fails once
with the full list instead of apt stopping at the first.

A pack carries the ``.deb`` of every pin (``debs/``, ``apt-get download``): when it holds one
for each (``local_debs``), the build copies them in and gives apt their paths, with no
``apt-get update`` and no sources, so it runs with the network off. apt reads the files as a
repository of their own: it orders the installs by their dependencies (pre-depends and triggers
included) and refuses, before touching anything, when a dependency is in neither the files nor
the image; ``dpkg -i`` in an order computed here would repeat apt's resolver, and a local
repository made in the build needs ``dpkg-scanpackages`` (``dpkg-dev``), which slim images lack.
``offline`` is the one rule of whether the OS packages need the network, read by restore and by
the pack's README.
"""

from __future__ import annotations

import re
import urllib.parse
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.errors import NotRestorable
from envlock.lock import split_os_spec
from envlock.probing.process import OSPKGS_PATH
from envlock.restore import values
from envlock.text.terminal import first

if TYPE_CHECKING:
    from envlock.lock import Lock

SPEC_FILE = "os-packages.txt"
CHECK_SCRIPT = "ospkgs.py"
# Where the build context holds a pack's .deb files, and where the image gets them.
DEBS_IN_CONTEXT = "debs"
# ``apt-get download`` names a file name_version_arch.deb, the version's ':' as '%3a'.
_DEB_FILE = re.compile(r"([^_/]+)_([^_/]+)_([^_/]+)\.deb")


@dataclass(frozen=True)
class OsInstall:
    """The OS packages a restore installs."""

    manager: str  # "apt" or "apk"
    specs: tuple[str, ...]  # name:arch=version, as recorded
    pins: tuple[str, ...]  # as the manager's command line spells them
    # The .deb file of each pin, in the order of ``specs`` (``with_debs``): installed from
    # these with no sources and no network. Empty: apt fetches the pins from the image's sources.
    debs: tuple[Path, ...] = ()

    @property
    def offline(self) -> bool:
        """Whether installing these needs no network: every pin's .deb is at hand."""
        return bool(self.debs)


def local_debs(install: OsInstall, directory: Path | None) -> tuple[tuple[Path, ...], list[str]]:
    """(the .deb in ``directory`` of each pin of ``install``, in its order; the pins that have
    none). A file is a pin's when its name, version and architecture are the pin's
    (``name_version_arch.deb``, as ``apt-get download`` names it; ``all`` for any)."""
    if install.manager != "apt" or directory is None:
        return (), list(install.pins)
    found: dict[tuple[str, str], dict[str, Path]] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        entries = []
    for path in entries:
        m = _DEB_FILE.fullmatch(path.name)
        if m and path.is_file() and not path.is_symlink():
            name, version, arch = m.group(1), urllib.parse.unquote(m.group(2)), m.group(3)
            found.setdefault((name, version), {})[arch] = path
    files: list[Path] = []
    missing: list[str] = []
    for spec, pin in zip(install.specs, install.pins, strict=True):
        name, arch, version = split_os_spec(spec)
        by_arch = found.get((name, version), {})
        deb = by_arch.get(arch) or by_arch.get("all")
        if deb is None:
            missing.append(pin)
        else:
            files.append(deb)
    return (tuple(files), missing) if not missing else ((), missing)


def with_debs(install: OsInstall | None, directory: Path | None, notes: list[str]) -> OsInstall | None:
    """``install`` from the .deb files in ``directory`` (a pack's ``debs/``) when it holds one
    for every pin; otherwise as it was (apt fetches them), with a note naming what is missing."""
    if install is None or directory is None or install.manager != "apt":
        return install
    files, missing = local_debs(install, directory)
    if files:
        return replace(install, debs=files)
    notes.append(f"the pack has no .deb for {first(missing, 5)}: apt fetches the OS packages from the "
                 "image's sources, with the network on")
    return install


def _apt_pins(specs: tuple[str, ...]) -> tuple[str, ...]:
    # apt spells a native or arch-independent package `name=version` and a foreign one
    # `name:arch=version`; the native architecture is the one most packages have.
    arches = Counter(split_os_spec(s)[1] for s in specs)
    arches.pop("all", None)
    native = arches.most_common(1)[0][0] if arches else "all"
    pins = []
    for spec in specs:
        name, arch, version = split_os_spec(spec)
        pins.append(f"{name}={version}" if arch in (native, "all") else f"{name}:{arch}={version}")
    return tuple(pins)


def plan_os(lock: Lock, venv: str | None, notes: list[str]) -> OsInstall | None:
    """The OS packages to install, or None (a venv lock, or no OS packages recorded)."""
    recorded = lock.os_packages
    if venv is not None or lock.python.prefix_kind != "system" or recorded is None:
        return None
    specs = tuple(values.os_package(s) for s in recorded.packages)
    if not specs:
        return None
    if recorded.manager == "dpkg":
        return OsInstall("apt", specs, _apt_pins(specs))
    if recorded.manager == "apk":
        pins = tuple(f"{n}={v}" for n, _, v in (split_os_spec(s) for s in specs))
        return OsInstall("apk", specs, pins)
    notes.append(f"{len(specs)} {recorded.manager} packages are not reinstalled (only apt and apk "
                 "images are); the base image's are used and compared")
    return None


def system_dists(lock: Lock, install: OsInstall | None, notes: list[str]) -> list[str]:
    """Names of the distributions an OS package owns: never pip's to install.

    With the OS packages restored they come back with their owners; otherwise they are left to
    the base image and verification does not count them as missing.
    """
    owned = [p for p in lock.packages if p.source == "system"]
    if not owned:
        return []
    if install is None:
        notes.append("installed by OS packages, not restored: "
                     + ", ".join(f"{p.name} ({p.os_package or '?'})" for p in owned))
        return [p.name for p in owned]
    names = {split_os_spec(s)[0] for s in install.specs}
    orphans = [p.name for p in owned if not p.os_package or p.os_package not in names]
    if orphans:
        raise NotRestorable("installed by an OS package the lock does not list: " + ", ".join(orphans),
                            hint="capture the image again with this envlock")
    return [p.name for p in owned]


def dockerfile_lines(install: OsInstall, python: str, share: str) -> list[str]:
    """Dockerfile lines that install ``install`` (exec form; the pins never meet a shell)."""
    import json

    def run(*argv: str) -> str:
        return "RUN " + json.dumps(list(argv))

    lines = ["", f"# {len(install.pins)} OS packages at the lock's versions, with the image's {install.manager}."]
    if install.manager == "apk":
        return [*lines, run("apk", "add", "--no-cache", *install.pins)]
    if install.offline:
        inside = f"{share}/{DEBS_IN_CONTEXT}"
        return [*lines,
                "# From the pack's .deb files (no sources, no network): apt orders them by their dependencies.",
                "COPY " + json.dumps([f"{DEBS_IN_CONTEXT}/", f"{inside}/"]),
                run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
                    "--no-install-recommends", "--allow-downgrades", *(f"{inside}/{p.name}" for p in install.debs)),
                run("rm", "-rf", inside)]
    lines += [
        "COPY " + json.dumps([f"requirements/{SPEC_FILE}", f"{share}/{SPEC_FILE}"]),
        "COPY " + json.dumps([CHECK_SCRIPT, f"{share}/{CHECK_SCRIPT}"]),
        run("apt-get", "update"),
        "# Name every pinned version the sources no longer offer, all at once.",
        run(python, f"{share}/{CHECK_SCRIPT}", "--check", f"{share}/{SPEC_FILE}"),
        run("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
            "--no-install-recommends", "--allow-downgrades", *install.pins),
        "RUN apt-get clean && rm -rf /var/lib/apt/lists/*",
    ]
    return lines


def files(install: OsInstall) -> dict[str, str]:
    """Build-context files the lines above copy in (the .deb files: ``context_binaries``)."""
    if install.manager != "apt" or install.offline:
        return {}
    head = "# OS packages of the lock, name:arch=version; checked before apt installs them\n"
    return {f"requirements/{SPEC_FILE}": head + "".join(s + "\n" for s in install.specs),
            CHECK_SCRIPT: OSPKGS_PATH.read_text(encoding="utf-8")}
