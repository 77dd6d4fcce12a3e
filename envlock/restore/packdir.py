"""Reading a pack that ``envlock pack`` wrote: check every file, load the base image if needed.

A pack is restored with no network at all: its files are checked against ``SHA256SUMS`` first
(a truncated copy or a swapped wheel stops here, naming the file), the base image is loaded
from its docker-archive when the engine does not have it, and the build then takes every wheel
from the pack. The layout's names live here, beside the reader; ``envlock.export.pack`` (the
writer, a layer above) imports them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.errors import HashMismatch, UsageError
from envlock.restore.cachedir import touch
from envlock.text.terminal import safe

if TYPE_CHECKING:
    from envlock.restore.engine import ContainerEngine

PACK_FORMAT = 1
PACK_MANIFEST = "pack.json"
LOCK_FILE = "env.lock"
WHEELS = "wheels"
DEBS = "debs"
DOCKER_ARCHIVE = "image/base.docker.tar"
OCI_ARCHIVE = "image/base.oci.tar"
SUMS = "SHA256SUMS"
COMPILE_CACHE = "compile/torch-compile.cache"
README = "README.md"
MAX_MANIFEST = 16 << 20


@dataclass(frozen=True)
class Pack:
    root: Path
    manifest: dict[str, Any]

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def wheels(self) -> Path:
        return self.root / WHEELS

    @property
    def base_id(self) -> str | None:
        base = self.manifest.get("base") or {}
        return str(base["id"]) if isinstance(base, dict) and base.get("id") else None

    @property
    def base(self) -> dict[str, str]:
        base = self.manifest.get("base") or {}
        return {str(k): str(v) for k, v in base.items()} if isinstance(base, dict) else {}

    @property
    def oci_archive(self) -> Path | None:
        rel = self.manifest.get("oci_archive")
        return inside(self.root, str(rel), "the pack's manifest names an OCI archive") if rel else None

    @property
    def docker_archive(self) -> Path | None:
        rel = self.manifest.get("docker_archive")
        return inside(self.root, str(rel), "the pack's manifest names a docker-archive") if rel else None

    @property
    def compile_cache(self) -> Path | None:
        """The compile cache ``pack --compile-cache`` put in (``run PACK`` loads it)."""
        entry = self.manifest.get("compile_cache")
        if not entry:
            return None
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(rel, str):
            raise UsageError("the pack's manifest names a compile cache without a path")
        return inside(self.root, rel, "the pack's manifest names a compile cache")


def inside(root: Path, rel: str, what: str) -> Path:
    """``root / rel``, refused (exit 2) unless it is a path inside the pack ``root``: not
    absolute, no ``..`` step, and no link on the way that leads out. The one rule for every path
    a pack's own files name (its manifest's archives, the lines of SHA256SUMS): the engine loads
    and Charliecloud unpacks what they name."""
    path = root / rel
    top = os.path.realpath(root)
    if (not rel or "\0" in rel or rel.startswith("/") or ".." in Path(rel).parts
            or not os.path.realpath(path).startswith(top.rstrip("/") + "/")):
        raise UsageError(f"{what} outside the pack: {rel[:80]!r}")
    return path


def is_pack(path: Path) -> bool:
    """A directory with ``pack.json``, or a ``.tar`` file (checked when opened)."""
    return (path.is_dir() and (path / PACK_MANIFEST).is_file()) or (
        path.is_file() and path.name.endswith(".tar"))


def _extract(archive: Path, into: Path) -> Path:
    """Unpack a pack's tar once (keyed by its path, size and mtime) into ``into``.

    Into a private temporary directory first, renamed into place whole: two restores of one
    pack at once each unpack their own copy, the first rename wins and the second uses it (a
    rename never replaces a directory that holds files), and an unpack cut short by Ctrl-C
    leaves no half pack that a later restore would take for the whole one."""
    st = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = into / f"pack-{key}"
    if (dest / PACK_MANIFEST).is_file():
        touch(dest)
        return dest
    into.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".pack-{key}.", suffix=".tmp", dir=into))
    try:
        extract_data(archive, tmp, not_what=f"{archive} is not a pack")
        if not (tmp / PACK_MANIFEST).is_file():
            raise UsageError(f"{archive} is not a pack: it has no {PACK_MANIFEST}")
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / PACK_MANIFEST).is_file():
                raise
            # Another restore unpacked the same pack meanwhile: the same files, already checked
            # against SHA256SUMS or about to be.
    except (tarfile.TarError, OSError) as exc:
        raise UsageError(f"{archive} is not a readable pack: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def check_sums(root: Path) -> None:
    """Every file listed in SHA256SUMS is there with that digest; raises naming each bad one."""
    from envlock._files import sha256_file

    sums = root / SUMS
    if not sums.is_file():
        raise UsageError(f"{root} is not a pack: it has no {SUMS}")
    bad = []
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, sep, rel = line.partition("  ")
        if not sep:
            raise UsageError(f"{sums}: not a checksum line: {line[:80]!r}")
        # A name is the pack's text, shown as such: a control character in it is escaped.
        path = inside(root, rel, f"{sums} names a file")
        if not path.is_file() or path.is_symlink():
            bad.append(f"{safe(rel)} (missing)")
        elif sha256_file(path)[7:] != digest:
            bad.append(f"{safe(rel)} (changed)")
    if bad:
        raise HashMismatch(f"the pack {root} is damaged: " + ", ".join(bad),
                           hint="copy the pack again from its archive")


def open_pack(path: Path, workdir: Path) -> Pack:
    """The checked pack at ``path`` (a directory, or a tar unpacked under ``workdir``)."""
    root = _extract(path, workdir) if path.is_file() else path
    check_sums(root)
    manifest_path = root / PACK_MANIFEST
    try:
        if manifest_path.stat().st_size > MAX_MANIFEST:
            raise ValueError("too large")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or manifest.get("envlock_pack") != PACK_FORMAT:
            raise ValueError("not a pack of format 1")
    except (OSError, ValueError) as exc:
        raise UsageError(f"{manifest_path} is not a valid pack manifest: {exc}") from None
    return Pack(root, manifest)


def ensure_base(engine: ContainerEngine, pack: Pack, tag: str) -> bool:
    """Load the pack's base image unless the engine has it; True when it was loaded."""
    image_id = pack.base_id
    if image_id is None or engine.image(image_id) is not None:
        return False
    archive = pack.docker_archive
    if archive is None or not archive.is_file():
        raise UsageError(f"the pack has no archive of its base image {image_id[:19]}")
    engine.load(archive)
    if engine.image(image_id) is None:
        raise HashMismatch(f"loading {archive.name} did not give the image {image_id[:19]} the pack names")
    # A name, so that pruning dangling images does not take it.
    engine.tag(image_id, tag)
    return True


def extract_data(archive: Path, dest: Path, *, not_what: str) -> None:
    """Extract an uncompressed tar that must be data (a pack, an OCI layout): only plain files
    and directories, inside ``dest``; anything else is refused as ``not_what``, naming it.
    Tar and OS errors are the caller's to word."""
    with tarfile.open(archive, "r:") as tar:
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or member.name.startswith("/") \
                    or ".." in Path(member.name).parts:
                raise UsageError(f"{not_what}: it holds {member.name!r}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python 3.10 before 3.10.12: the members were checked above
            tar.extractall(dest)
