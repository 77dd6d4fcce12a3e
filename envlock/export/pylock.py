"""``export --to pylock``: PEP 751 ``pylock.toml``, built and validated by ``packaging.pylock``.

uv (``uv pip install -r pylock.toml``) and pip >= 26.1 install it without envlock. What pip and
uv cannot express (the GPU stack, the lock's identity) goes under ``[tool.envlock]``.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.markers import Marker
from packaging.pylock import (
    Package,
    PackageArchive,
    PackageDirectory,
    PackageSdist,
    PackageVcs,
    PackageWheel,
    Pylock,
    PylockValidationError,
)
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from envlock.errors import LockInvalid, UnsafeValue
from envlock.export.artifacts import Artifact, Resolved
from envlock.export.common import facts
from envlock.lock import Lock, toml_document
from envlock.probe.rules import REDACTED
from envlock.text.terminal import safe

_SYS_PLATFORM = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}


def _environments(lock: Lock) -> list[Marker] | None:
    sys_platform = _SYS_PLATFORM.get(lock.platform.os)
    if sys_platform is None:
        return None
    for what, value in (("platform.machine", lock.platform.machine), ("python.implementation", lock.python.implementation)):
        # Quoted into a PEP 508 marker: a quote would end the string and add a clause
        # ('x86_64" or "1" == "1'), a line break makes the marker unreadable.
        if not re.fullmatch(r"\w+", value):
            raise UnsafeValue(f"refusing {what} {safe(repr(value))[:80]}: not a word a marker can quote",
                              hint="the lock was edited or crafted; exports write only values that read back as written")
    return [Marker(f'sys_platform == "{sys_platform}" and platform_machine == "{lock.platform.machine}" '
                   f'and implementation_name == "{lock.python.implementation}"')]


def _file(art: Artifact, cls: type[PackageWheel] | type[PackageSdist]) -> Any:
    return cls(name=art.filename, url=art.url, path=art.path, size=art.size, hashes={"sha256": art.sha256})


def _package(r: Resolved) -> Package:
    pkg = r.package
    name = canonicalize_name(pkg.name)
    if r.kind == "vcs":
        assert pkg.vcs and pkg.commit  # _direct() guarantees both
        return Package(name=name, vcs=PackageVcs(type=pkg.vcs, url=pkg.url, commit_id=pkg.commit,
                                                 requested_revision=pkg.requested_revision))
    if r.kind == "directory":
        assert r.path
        return Package(name=name, directory=PackageDirectory(
            path=r.path, editable=True if pkg.source == "editable" else None))
    version = Version(pkg.version)
    if r.kind == "archive":
        art = r.artifacts[0]
        return Package(name=name, version=version, archive=PackageArchive(
            url=art.url, path=art.path, hashes={"sha256": art.sha256}))
    wheels = [_file(a, PackageWheel) for a in r.artifacts if a.is_wheel]
    sdists = [a for a in r.artifacts if not a.is_wheel]
    return Package(name=name, version=version, index=r.index if r.kind == "index" else None, wheels=wheels or None,
                   sdist=_file(sdists[0], PackageSdist) if sdists and not wheels else None)


def build(lock: Lock, resolved: list[Resolved]) -> Pylock:
    major, minor = lock.python.version.split(".")[:2]
    doc = Pylock(
        lock_version=Version("1.0"),
        created_by="envlock",
        requires_python=SpecifierSet(f"=={major}.{minor}.*"),
        environments=_environments(lock),
        packages=[_package(r) for r in resolved],
        tool={"envlock": facts(lock)},
    )
    try:
        doc.validate()
    except PylockValidationError as exc:
        raise LockInvalid(f"the lock does not make a valid pylock.toml: {exc}") from None
    return doc


def render(lock: Lock, resolved: list[Resolved]) -> str:
    doc = build(lock, resolved).to_dict()
    head = (f"# PEP 751 lock exported from envlock {lock.short_id} ({lock.envlock.fingerprint}).\n"
            "# Install without envlock: uv pip install -r pylock.toml   (or pip >= 26.1)\n")
    if REDACTED in str(doc.get("packages")):
        # Index and file URLs lost their credentials in artifacts.py (a path token, a presigned
        # URL's signature); say so rather than leave a URL that fails without a word.
        head += (f"# {REDACTED}: a credential of an index or file URL, never written here; "
                 "the installer needs its own\n")
    return head + toml_document(doc)
