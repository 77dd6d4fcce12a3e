"""Reading a pack that ``envlock pack`` wrote: check every file, load the base image if needed.

A pack is restored with no network at all: its files are checked against ``SHA256SUMS`` first,
before any of them is read (the pack must be exactly the files listed there, with those digests:
a truncated copy, a swapped wheel, an unlisted file or a link stops here, naming it), the base
image is loaded from its docker-archive when the engine does not have it, and the build then
takes every wheel from the pack. The layout's names live here, beside the reader; ``envlock.export.pack`` (the
writer, a layer above) imports them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.errors import HashMismatch, PackDamaged, UsageError
from envlock.restore.cachedir import touch
from envlock.text.terminal import first, safe

if TYPE_CHECKING:
    from envlock.restore.engine import ContainerEngine
    from envlock.restore.image import BaseOrigin, Options

PACK_FORMAT = 1
PACK_MANIFEST = "pack.json"
LOCK_FILE = "env.lock"
WHEELS = "wheels"
DEBS = "debs"
DOCKER_ARCHIVE = "image/base.docker.tar"
OCI_ARCHIVE = "image/base.oci.tar"
SUMS = "SHA256SUMS"
COMPILE_CACHE = "compile/torch-compile.cache"
# A conda lock's archives as a local channel: conda/<subdir>/<fn> and each subdir's repodata.json.
CONDA_CHANNEL = "conda"
README = "README.md"
MAX_MANIFEST = 16 << 20
MAX_SUMS = 16 << 20
# One line of SHA256SUMS as ``pack`` writes it (``sha256sum``'s text mode): a lowercase digest,
# two spaces, the file's path relative to the pack.
_SUMS_LINE = re.compile(r"([0-9a-f]{64})  ([^\n]+)")
# How many names one refusal lists (a venv made inside the pack has thousands of files).
_NAMED = 10
_DAMAGED_HINT = "copy the pack again from its archive"


@dataclass(frozen=True)
class Pack:
    root: Path
    manifest: dict[str, Any]
    # What SHA256SUMS lists (path relative to the pack -> sha256 hex), checked by ``open_pack``.
    sums: Mapping[str, str] = field(default_factory=dict)

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def wheels(self) -> Path:
        return self.root / WHEELS

    @property
    def debs(self) -> Path | None:
        """The .deb files of the lock's OS package pins (a system-Python lock's), if any."""
        return self.root / DEBS if any(rel.startswith(f"{DEBS}/") for rel in self.sums) else None

    @property
    def id(self) -> str:
        """The pack's identity: sha256 of its checked listing (every file's path and digest,
        in path order), the same for the directory and for a tar of it, wherever unpacked."""
        listing = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(self.sums.items()))
        return "sha256:" + hashlib.sha256(listing.encode("utf-8")).hexdigest()

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

    @property
    def conda_channel(self) -> Path | None:
        """The channel of a conda lock's archives (``export/condapack``), or None."""
        entry = self.manifest.get("conda")
        rel = entry.get("channel") if isinstance(entry, dict) else None
        return inside(self.root, str(rel), "the pack's manifest names a conda channel") if rel else None

    @property
    def checked_wheels(self) -> dict[Path, str]:
        """The files of ``wheels/`` with the sha256 SHA256SUMS gives each: the only wheels a
        restore runs anything of before proving it against the lock (uv's binary, ``uvbin``)."""
        prefix = WHEELS + "/"
        return {self.root / rel: digest for rel, digest in self.sums.items()
                if rel.startswith(prefix) and "/" not in rel[len(prefix):]}


def inside(root: Path, rel: str, what: str) -> Path:
    """``root / rel``, refused (exit 2) unless it is a path inside the pack ``root``: not
    absolute, no ``..`` step, and no link on the way that leads out. The rule for the paths a
    pack's manifest names (its archives, its compile cache): the engine loads and Charliecloud
    unpacks what they name. (SHA256SUMS's own lines are stricter: ``parse_sums``.)"""
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


def parse_sums(data: bytes, where: str) -> dict[str, str]:
    """The listing of a SHA256SUMS file's bytes: path relative to the pack -> sha256 hex.

    Only what ``pack`` writes is read: UTF-8, every line ``<64 lowercase hex>  <path>`` ending
    in a newline, each path once, relative and plain (no ``..``, ``.`` or empty step, no
    control character, not SHA256SUMS itself). Anything else raises ``PackDamaged`` naming the
    line; order means nothing. ``where`` names the file in the message."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackDamaged(f"{where} is not UTF-8 text (byte {exc.start})", hint=_DAMAGED_HINT) from None
    if not text:
        raise PackDamaged(f"{where} is empty: it lists no file", hint=_DAMAGED_HINT)
    if not text.endswith("\n"):
        raise PackDamaged(f"{where} is cut short: its last line has no end", hint=_DAMAGED_HINT)
    listing: dict[str, str] = {}
    for number, line in enumerate(text[:-1].split("\n"), 1):
        match = _SUMS_LINE.fullmatch(line)
        if match is None:
            raise PackDamaged(f"{where}, line {number}: not a checksum line: {safe(line[:80])}",
                              hint=_DAMAGED_HINT)
        digest, rel = match.groups()
        steps = rel.split("/")
        if (safe(rel) != rel or rel == SUMS or not all(steps)
                or any(step in (".", "..") for step in steps)):
            raise PackDamaged(f"{where}, line {number}: not a path inside the pack: {safe(rel[:80])}",
                              hint=_DAMAGED_HINT)
        if rel in listing:
            raise PackDamaged(f"{where}, line {number}: {safe(rel)} is listed twice", hint=_DAMAGED_HINT)
        listing[rel] = digest
    return listing


def _files(root: Path) -> set[str]:
    """Every file under ``root`` (relative paths, ``/``-separated), SHA256SUMS left out; a link
    or anything else that is not a plain file or directory is refused, naming it. ``pack``
    writes no link, and a link would let a listed path read a file outside the pack."""
    found: set[str] = set()
    pending = [(str(root), "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_symlink():
                    raise PackDamaged(f"the pack {root} holds a link, {safe(rel)}: a pack holds plain files only",
                                      hint=_DAMAGED_HINT)
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, rel + "/"))
                elif entry.is_file(follow_symlinks=False):
                    found.add(rel)
                else:
                    raise PackDamaged(f"the pack {root} holds {safe(rel)}, which is not a plain file",
                                      hint=_DAMAGED_HINT)
    found.discard(SUMS)
    return found


def _named(kind: str, names: list[str]) -> str:
    """``names`` for a refusal: the first few, then how many more."""
    return f"{kind}: {first([safe(n) for n in names], _NAMED)}"


def check_sums(root: Path) -> dict[str, str]:
    """The pack at ``root`` is exactly the files SHA256SUMS lists, each with its digest: the
    listing (path -> sha256 hex), or ``PackDamaged`` naming every file that is unlisted,
    missing or changed. Nothing of the pack but SHA256SUMS is read before this passes: an
    unlisted file (a second uv wheel, another ``pack.json``) would otherwise be used unchecked,
    and a shortened SHA256SUMS would vouch for less than the pack holds."""
    from envlock._files import sha256_file

    sums = root / SUMS
    try:
        st = os.lstat(sums)
    except FileNotFoundError:
        raise UsageError(f"{root} is not a pack: it has no {SUMS}") from None
    except OSError as exc:
        raise PackDamaged(f"{sums} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PackDamaged(f"{sums} is not a plain file", hint=_DAMAGED_HINT)
    if st.st_size > MAX_SUMS:
        raise PackDamaged(f"{sums} is larger than any pack's ({st.st_size} bytes)", hint=_DAMAGED_HINT)
    try:
        listing = parse_sums(sums.read_bytes(), str(sums))
        found = _files(root)
    except OSError as exc:
        raise PackDamaged(f"the pack {root} cannot be read: {exc.strerror or exc}") from None
    unlisted = sorted(found - listing.keys())
    missing = sorted(listing.keys() - found)
    if unlisted or missing:
        parts = ([_named("files SHA256SUMS does not list", unlisted)] if unlisted else []) + (
            [_named("files it lists that are not there", missing)] if missing else [])
        raise PackDamaged(f"the pack {root} is not the files its {SUMS} lists; " + "; ".join(parts),
                          hint="a pack holds only the files it was made with: move the others out of it "
                               "(a venv or image belongs beside the pack), or copy the pack again")
    changed = [rel for rel in sorted(listing) if sha256_file(root / rel)[7:] != listing[rel]]
    if changed:
        raise PackDamaged(f"the pack {root} is damaged: " + ", ".join(f"{safe(r)} (changed)" for r in changed),
                          hint=_DAMAGED_HINT)
    return listing


def open_pack(path: Path, workdir: Path) -> Pack:
    """The checked pack at ``path`` (a directory, or a tar unpacked under ``workdir``). Its
    manifest is read only after the check, and only as the bytes SHA256SUMS vouches for."""
    root = _extract(path, workdir) if path.is_file() else path
    listing = check_sums(root)
    manifest_path = root / PACK_MANIFEST
    try:
        if PACK_MANIFEST not in listing:
            raise ValueError("the pack has none")
        if manifest_path.stat().st_size > MAX_MANIFEST:
            raise ValueError("too large")
        raw = manifest_path.read_bytes()
        if hashlib.sha256(raw).hexdigest() != listing[PACK_MANIFEST]:
            raise PackDamaged(f"the pack {root} is damaged: {PACK_MANIFEST} (changed while it was read)",
                              hint=_DAMAGED_HINT)
        manifest = json.loads(raw.decode("utf-8"))
        if not isinstance(manifest, dict) or manifest.get("envlock_pack") != PACK_FORMAT:
            raise ValueError("not a pack of format 1")
    except (OSError, ValueError) as exc:
        raise UsageError(f"{manifest_path} is not a valid pack manifest: {exc}") from None
    return Pack(root, manifest, listing)


BASE_REPO = "envlock-pack/base"


def base_tag(short_id: str) -> str:
    """``envlock-pack/base:<id>``: the name a pack's base image is given once loaded, whether
    ``restore`` or ``run`` loads it (``ensure_base``)."""
    return f"{BASE_REPO}:{short_id}"


def with_base(options: Options, base: Mapping[str, str]) -> Options:
    """``options`` building FROM the base image a pack recorded (``pack.json``'s ``base``: its
    id, how it was shown, where the pack's restore took it from), unchanged when it recorded
    none. The origin is a restore's own (``lock``, ``--base``, ``table``); any other value reads
    as ``--base``, the one that promises least. ``restore`` of a pack and the Apptainer
    definition ``pack`` writes both come here, so they follow the same plan."""
    import dataclasses

    if not base.get("id"):
        return options
    recorded = base.get("origin")
    origin: BaseOrigin = "lock" if recorded == "lock" else "table" if recorded == "table" else "--base"
    return dataclasses.replace(options, base=base["id"], base_display=base.get("display") or None,
                               base_origin=origin)


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
