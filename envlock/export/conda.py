"""A conda environment's lock for conda's own tools: ``--to conda-explicit`` (an ``@EXPLICIT``
file, ``url#sha256:<hex>``, or ``url#<md5>`` with ``--md5`` for conda before sha256 lines),
``--to conda-lock`` (conda-lock.yml, version 1) and ``--to pixi`` (pixi.lock, written by
py-rattler's ``LockFile``).

Each lists the ``[[conda.packages]]`` of the lock by the archive they were installed from, so
the environment is installed again without a solver; pip packages inside the prefix are not
conda's to install and are left out (``pylock`` or ``requirements`` exports them). A lock that
lacks an archive's url or hash (captured before envlock recorded them) is refused by name
rather than written with holes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.errors import UsageError
from envlock.restore.condatarget import conda_packages as packages
from envlock.restore.condatarget import rattler_module, repodata_records

if TYPE_CHECKING:
    from envlock.lock import CondaPackage, Lock

# The conda subdir of a platform envlock records ([platform].os, .machine).
_SUBDIRS = {("Linux", "x86_64"): "linux-64", ("Linux", "aarch64"): "linux-aarch64",
            ("Linux", "ppc64le"): "linux-ppc64le", ("Darwin", "x86_64"): "osx-64",
            ("Darwin", "arm64"): "osx-arm64", ("Windows", "AMD64"): "win-64"}


def subdir(lock: Lock) -> str:
    """The environment's platform as conda names it: its packages' own subdir (noarch aside),
    else the one of the lock's platform."""
    for pkg in lock.conda.packages if lock.conda else ():
        if pkg.subdir and pkg.subdir != "noarch":
            return pkg.subdir
    found = _SUBDIRS.get((lock.platform.os, lock.platform.machine))
    if found is None:
        raise UsageError(f"no conda subdir for {lock.platform.os} {lock.platform.machine}")
    return found


def _archive_url(pkg: CondaPackage) -> str:
    assert pkg.url is not None
    return pkg.url


def explicit(lock: Lock, *, md5: bool = False) -> str:
    """An ``@EXPLICIT`` file: one archive URL a line, with its sha256 (``--md5``: its md5, the
    only hash conda read before sha256 lines)."""
    pkgs = packages(lock, need=("url", "md5") if md5 else ("url", "sha256"))
    lines = ["# conda create --name ENV --file THIS_FILE   (or: micromamba create -n ENV -f THIS_FILE)",
             f"# platform: {subdir(lock)}", "@EXPLICIT"]
    for pkg in pkgs:
        lines.append(f"{_archive_url(pkg)}#{pkg.md5}" if md5 else f"{_archive_url(pkg)}#sha256:{pkg.sha256}")
    return "\n".join(lines) + "\n"


def _dependencies(depends: list[str] | None) -> dict[str, str]:
    """conda-lock's ``dependencies``: name -> the rest of the spec (``*`` for a bare name)."""
    out: dict[str, str] = {}
    for spec in depends or ():
        name, _, rest = spec.strip().partition(" ")
        out[name] = rest.strip() or "*"
    return out


def _channel_url(channel: str | None) -> str:
    return (channel or "").rstrip("/")


def conda_lock(lock: Lock) -> str:
    """conda-lock.yml, version 1 (the version conda-lock's parser reads and ``conda-lock
    render`` renders), YAML written as JSON scalars, which YAML reads as they are."""
    platform = subdir(lock)
    pkgs = packages(lock, need=("url", "md5"))
    channels = sorted({_channel_url(p.channel) for p in pkgs if p.channel})
    q = json.dumps
    out = ["version: 1", "metadata:",
           f"  content_hash:\n    {q(platform)}: {q(lock.short_id)}",
           "  channels:"]
    out += [f"  - url: {q(c)}\n    used_env_vars: []" for c in channels] or ["  []"]
    out += ["  platforms:", f"  - {q(platform)}", "  sources:", f"  - {q('env.lock')}", "package:"]
    for pkg in pkgs:
        hashes = {"md5": pkg.md5, **({"sha256": pkg.sha256} if pkg.sha256 else {})}
        out += [f"- name: {q(pkg.name)}", f"  version: {q(pkg.version)}", "  manager: conda",
                f"  platform: {q(platform)}", f"  dependencies: {q(_dependencies(pkg.depends))}",
                f"  url: {q(_archive_url(pkg))}", f"  hash: {q(hashes)}",
                "  category: main", "  optional: false"]
        if pkg.build:
            out.append(f"  build: {q(pkg.build)}")
    return "\n".join(out) + "\n"


def pixi(lock: Lock) -> str:
    """pixi.lock, as py-rattler's ``LockFile`` writes it: one ``default`` environment on the
    lock's platform, with the virtual packages the capturing host had."""
    rattler = rattler_module()
    virtual = [f"{v.name}={v.version}={v.build}" for v in (lock.conda.virtual_packages or ())] \
        if lock.conda else []
    platform = rattler.LockPlatform(subdir(lock), virtual_packages=virtual or None)
    lockfile = rattler.LockFile([platform])
    pkgs = packages(lock)
    channels = sorted({_channel_url(p.channel) for p in pkgs if p.channel})
    lockfile.set_channels("default", [rattler.LockChannel(c) for c in channels])
    for record in repodata_records(rattler, lock):
        lockfile.add_conda_package("default", platform, record)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pixi.lock"
        lockfile.to_path(path)
        return path.read_text(encoding="utf-8")
