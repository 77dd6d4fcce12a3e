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
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock._textsafe import safe
from envlock.errors import HashMismatch, UsageError

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
        if not rel:
            return None
        if str(rel).startswith("/") or ".." in Path(str(rel)).parts:
            raise UsageError(f"the pack's manifest names an OCI archive outside the pack: {str(rel)[:80]!r}")
        return self.root / str(rel)

    @property
    def docker_archive(self) -> Path | None:
        rel = self.manifest.get("docker_archive")
        return self.root / str(rel) if rel else None


def is_pack(path: Path) -> bool:
    """A directory with ``pack.json``, or a ``.tar`` file (checked when opened)."""
    return (path.is_dir() and (path / PACK_MANIFEST).is_file()) or (
        path.is_file() and path.name.endswith(".tar"))


def _extract(archive: Path, into: Path) -> Path:
    """Unpack a pack's tar once (keyed by its size and mtime) into ``into``."""
    st = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = into / f"pack-{key}"
    if (dest / PACK_MANIFEST).is_file():
        return dest
    tmp = into / f".pack-{key}.{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=False)
    try:
        extract_data(archive, tmp, not_what=f"{archive} is not a pack")
        os.replace(tmp, dest)
    except (tarfile.TarError, OSError) as exc:
        raise UsageError(f"{archive} is not a readable pack: {exc}") from None
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def check_sums(root: Path) -> None:
    """Every file listed in SHA256SUMS is there with that digest; raises naming each bad one."""
    from envlock.restore.wheelhouse import sha256_file

    sums = root / SUMS
    if not sums.is_file():
        raise UsageError(f"{root} is not a pack: it has no {SUMS}")
    bad = []
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, sep, rel = line.partition("  ")
        path = root / rel
        if not sep or rel.startswith("/") or ".." in Path(rel).parts:
            raise UsageError(f"{sums}: not a checksum line: {line[:80]!r}")
        # A name is the pack's text, shown as such: a control character in it is escaped.
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
