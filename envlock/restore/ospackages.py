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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from envlock.errors import NotRestorable
from envlock.lock import split_os_spec
from envlock.probing.process import OSPKGS_PATH
from envlock.restore import values

if TYPE_CHECKING:
    from envlock.lock import Lock

SPEC_FILE = "os-packages.txt"
CHECK_SCRIPT = "ospkgs.py"


@dataclass(frozen=True)
class OsInstall:
    """The OS packages a restore installs."""

    manager: str  # "apt" or "apk"
    specs: tuple[str, ...]  # name:arch=version, as recorded
    pins: tuple[str, ...]  # as the manager's command line spells them


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
    """Build-context files the lines above copy in."""
    if install.manager != "apt":
        return {}
    head = "# OS packages of the lock, name:arch=version; checked before apt installs them\n"
    return {f"requirements/{SPEC_FILE}": head + "".join(s + "\n" for s in install.specs),
            CHECK_SCRIPT: OSPKGS_PATH.read_text(encoding="utf-8")}
