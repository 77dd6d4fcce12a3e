"""What a restore changed on purpose, and the one judgement that allows for it.

A restored image differs from its lock by construction in a few known ways: the image itself is
new, packages left out with ``--skip-local`` are absent, a vcs package restored offline from a
wheel has no commit, the base's own pip may stay, a venv put onto another base has that base's
OS packages, and envlock itself comes from the envlock that restored the image. Restore's check
inside the image allows for exactly these, and so must every later verify in that image
(``envlock verify`` in ``envlock run``, ``envlock.verify()`` in training code): one image, one
verdict.

So restore writes what it changed into the image (``RESTORED_FILE``, JSON, bound to the lock's
fingerprint) and both sides call ``allow`` with the same ``Restored``: restore's check builds it
from its plan, a verify inside reads it back from the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from envlock.drift.result import RESTORED_FILE, Comparison, Difference

if TYPE_CHECKING:
    # Neither at import: ``run``'s fast path reads ``Restored`` from a kept check without the
    # models the comparator is built on.
    from envlock.lock import Lock

# pip, setuptools and wheel are the installer's tools, not the experiment's code: the restore
# installs them last from the index or the wheelhouse, and Debian's ensurepip ships its own
# rebuilds of them, so another build of them is reported but does not fail the restore.
TOOLING = ("pip", "setuptools", "wheel")
# What says where a package came from; the restored image cannot show the lock's for a vcs
# package built offline or for envlock itself.
_ORIGIN = ("source", "url", "vcs", "commit", "requested_revision", "archive_hash", "hashes")


@dataclass(frozen=True)
class Restored:
    """The differences a restore of the lock ``fingerprint`` made on purpose."""

    fingerprint: str
    image_change: bool = True
    skipped: tuple[str, ...] = ()
    from_wheel: tuple[str, ...] = ()
    base_tooling: tuple[str, ...] = ()
    os_packages_restored: bool = True
    own: str | None = None  # envlock's distribution, from a wheel of the restoring envlock

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Restored | None:
        """None for anything that is not such a document (a file of another version, edited)."""
        try:
            data: Any = json.loads(text)
            names = {k: tuple(str(x) for x in data.get(k, ())) for k in ("skipped", "from_wheel",
                                                                        "base_tooling")}
            own = data.get("own")
            return cls(fingerprint=str(data["fingerprint"]), image_change=bool(data.get("image_change", True)),
                       os_packages_restored=bool(data.get("os_packages_restored", True)),
                       own=str(own) if own else None, **names)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def restored_here(lock: Lock, path: str = RESTORED_FILE) -> Restored | None:
    """The facts of the restore that built this image, when it restored ``lock``'s environment
    (the same fingerprint); None elsewhere."""
    try:
        with open(path, encoding="utf-8") as fh:
            found = Restored.from_json(fh.read(1 << 20))
    except OSError:
        return None
    if found is None or not lock.envlock.fingerprint or found.fingerprint != lock.envlock.fingerprint:
        return None
    return found


def _package_paths(names: Iterable[str], keys: Iterable[str]) -> set[str]:
    return {f"packages.{name}.{key}" for name in names for key in keys}


def allow(cmp: Comparison, restored: Restored, lock: Lock) -> Comparison:
    """``cmp`` (the lock against the restored image) with what the restore changed on purpose
    told as info, and another build of a locked package made breaking (see ``_restore_severity``)."""
    from envlock.drift.compare import as_info, os_packages_from_base

    if restored.skipped:
        gone = {f"packages.{name}" for name in restored.skipped}
        cmp = cmp._replace(differences=tuple(d for d in cmp.differences if d.path not in gone))
    if not restored.os_packages_restored:
        # A venv restore puts the venv on another base: its OS packages are the base's, by
        # design, and reported for the reader only.
        cmp = os_packages_from_base(cmp)
    if restored.from_wheel:
        origin = _package_paths(restored.from_wheel, ("commit", "vcs", "url", "source"))
        cmp = as_info(cmp, lambda d: d.path in origin,
                      "restored from a wheel of the same version: the vcs source is out of reach offline")
    kept = {f"packages.{name}" for name in restored.base_tooling if name in TOOLING}
    if kept:
        cmp = as_info(cmp, lambda d: ".".join(d.path.split(".")[:2]) in kept,
                      "the base image's own: no wheel offline")
    cmp = cmp._replace(differences=tuple(_restore_severity(d) for d in cmp.differences))
    if restored.own:
        own = _package_paths([restored.own], _ORIGIN)
        pkg = lock.package(restored.own)
        if pkg is not None and pkg.source == "editable":
            # An editable install's RECORD names a path hook, not the module files.
            own.add(f"packages.{restored.own}.record_sha256")
        cmp = as_info(cmp, lambda d: d.path in own,
                      "envlock itself, installed from a wheel of the envlock that restored the image")
    return cmp


def _restore_severity(d: Difference) -> Difference:
    """A restore must prove the build: another build of a locked package fails it.

    An ordinary ``verify`` keeps a different ``record_sha256`` a warning (a rebuilt wheel of the
    same version on a colleague's machine is worth a look, rarely different numbers); a restore
    exists to reproduce the lock's exact artifacts, so there it is breaking.
    """
    parts = d.path.split(".")
    if len(parts) == 3 and parts[0] == "packages" and parts[2] == "record_sha256" \
            and parts[1] not in TOOLING and d.severity != "breaking":
        message = (d.message or f"{parts[1]}: different build") + " - the restored image holds another build"
        return d._replace(severity="breaking", message=message)
    return d
