"""One locked package as a pip requirement line: exact pin, URL or VCS commit, and its hashes.

Every value passes through ``values`` first; what cannot be expressed safely raises. Editable and
local sources have no line (``requirement`` returns None): the planner decides whether they
refuse the restore or are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from envlock.errors import NotRestorable
from envlock.restore import values

if TYPE_CHECKING:
    from envlock.lock import Package


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    line: str  # the requirement-file line, without hashes
    hashes: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.hashes:
            return self.line
        return " \\\n    ".join([self.line, *(f"--hash={h}" for h in self.hashes)])


def _hashes(pkg: Package, extra: Sequence[str]) -> tuple[str, ...]:
    """The hashes pip checks: the lock's, a URL source's sha2 archive hash, else ``extra`` (a
    bundle manifest's)."""
    found = [values.package_hash(h, name=pkg.name) for h in pkg.hashes]
    if pkg.source == "url" and pkg.archive_hash and values.pip_checks(pkg.archive_hash):
        found.append(values.package_hash(pkg.archive_hash, name=pkg.name))
    if not found:
        found = [values.package_hash(h, name=pkg.name) for h in extra]
    return tuple(dict.fromkeys(found))


def _weak_hash_note(pkg: Package, offline: bool) -> str | None:
    """Say what happens to an archive hash pip cannot check (md5 from old indexes)."""
    if not pkg.archive_hash or values.pip_checks(pkg.archive_hash):
        return None
    algo = values.hash_algorithm(pkg.archive_hash)
    checked = ("checked by envlock against the wheelhouse file" if offline
               else "not checked at install; the build is checked inside the image (record_sha256)")
    return f"{pkg.name}: the lock's archive hash is {algo}, which pip cannot check: {checked}"


def _vcs(pkg: Package, name: str, ver: str, *, offline: bool, allow_http: bool
         ) -> tuple[Requirement, str | None]:
    vcs = pkg.vcs or ""
    if vcs not in values.VCS_SCHEMES:
        raise NotRestorable(f"{name} {ver} comes from {vcs or 'an unknown VCS'}; only git and hg "
                            "sources can be restored")
    if not pkg.url or not pkg.commit:
        raise NotRestorable(f"{name} {ver} comes from {vcs} without a recorded URL and commit")
    commit = values.vcs_commit(pkg.commit, vcs=vcs)
    if offline:
        return (Requirement(name, ver, f"{name}=={ver}", ()),
                f"{name}: vcs source replaced by a wheel of {ver} from the wheelhouse")
    link = values.url(pkg.url, schemes=values.VCS_SCHEMES[vcs], what=f"{vcs} URL of {name}",
                      allow_http=allow_http)
    # pip cannot hash a checkout; the full commit id is the pin.
    return Requirement(name, ver, f"{name} @ {vcs}+{link}@{commit}", ()), None


def requirement(pkg: Package, *, offline: bool, allow_http: bool = False,
                extra_hashes: Sequence[str] = ()) -> tuple[Requirement | None, str | None]:
    """(requirement, note) for one package; raises when it cannot be expressed safely.

    Offline, URL and VCS sources install by name and version from the wheelhouse.
    """
    name = values.dist_name(pkg.name)
    ver = values.version(pkg.version, name=name)
    if pkg.source == "vcs":
        return _vcs(pkg, name, ver, offline=offline, allow_http=allow_http)
    if pkg.source not in ("index", "unknown", "url"):
        return None, None  # editable / local
    line = f"{name}=={ver}"
    if pkg.source == "url" and not offline:
        if not pkg.url:
            raise NotRestorable(f"{name} {ver} was installed from a URL the lock does not record")
        line = f"{name} @ {values.url(pkg.url, what=f'URL of {name}', allow_http=allow_http)}"
    return Requirement(name, ver, line, _hashes(pkg, extra_hashes)), _weak_hash_note(pkg, offline)
