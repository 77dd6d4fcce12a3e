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
from typing import TYPE_CHECKING

from envlock.restore.condatarget import conda_packages as packages
from envlock.restore.condatarget import conda_subdir as subdir
from envlock.restore.condatarget import lockfile_text, rattler_module

if TYPE_CHECKING:
    from envlock.lock import CondaPackage, Lock

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
    return lockfile_text(rattler_module(), lock)
