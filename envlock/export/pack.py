"""``envlock pack``: one self-contained artifact that restores with no network at all.

A pack is a directory (or one uncompressed tar of it)::

    env.lock                  the lock, byte for byte
    wheels/                   one wheel per locked distribution + envlock-bundle.json
    debs/                     the .deb files behind the lock's OS package pins (system-Python locks)
    image/base.docker.tar     the base image for `docker load` / `podman load` (docker-archive)
    image/base.oci.tar        the same image as an OCI archive (when skopeo is installed)
    pack.json                 what is where: base image id and origin, rebuilt wheels, missing debs
    README.md                 an artifact-evaluation appendix generated from the lock
    compile/torch-compile.cache   a torch.compile cache, with --compile-cache (`envlock run PACK` loads it)
    conda/<subdir>/<fn>       a conda lock's archives as an indexed channel, py-rattler's wheel in wheels/
    SHA256SUMS                every file above, checked by `envlock restore PACK` before use

Wheels are taken from what is already on disk first (``--wheelhouse`` directories, then
``fetch``: pip's and uv's configured find-links, pip's wheel and HTTP caches, uv's cache), then
downloaded in parallel from the configured indexes, and last, for a distribution whose wheel
exists nowhere, rebuilt from its installed files (``export/rebuild``). Every wheel is checked
against the lock before it enters the pack: its hashes where the lock has them, and its build
(``record_sha256``) always.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envlock._files import sha256_file
from envlock.errors import CompileCacheRefused, EnvlockError, NotRestorable, UsageError
from envlock.export import fetch
from envlock.export.fetch import WheelRow
from envlock.lock import Lock
from envlock.replay.compilecache import CacheFile, check_against_lock, read_cache
from envlock.restore import ociarchive, wheelhouse
from envlock.restore.image import Options
from envlock.restore.packdir import (
    COMPILE_CACHE,
    CONDA_CHANNEL,
    DEBS,
    DOCKER_ARCHIVE,
    LOCK_FILE,
    OCI_ARCHIVE,
    PACK_FORMAT,
    PACK_MANIFEST,
    README,
    SUMS,
    WHEELS,
    with_base,
)
from envlock.text.terminal import safe

if TYPE_CHECKING:
    from envlock.restore.context import BaseChoice
    from envlock.restore.engine import ContainerEngine, ImageInfo

TOOL_TIMEOUT = 3600.0


@dataclass(frozen=True)
class PackOptions:
    wheelhouses: tuple[Path, ...] = ()
    python: str | None = None  # the environment to rebuild wheels from (default: chosen as capture does)
    base: str | None = None
    download: bool = True
    index_url: str | None = None
    allow_http: bool = False
    skip_local: bool = False
    image: bool = True
    oci: bool = True
    compile_cache: Path | None = None  # a torch.compile cache to carry (envlock.save_compile_cache)


@dataclass(frozen=True)
class PackResult:
    directory: Path
    archive: Path | None
    wheels: tuple[WheelRow, ...]
    skipped: tuple[str, ...]
    debs: tuple[str, ...]
    missing_debs: tuple[str, ...]
    base: dict[str, str] = field(default_factory=dict)
    oci: bool = False
    notes: tuple[str, ...] = ()
    size: int = 0
    seconds: float = 0.0
    compile_cache: CacheFile | None = None
    conda_packages: int = 0


# -- the wheels ------------------------------------------------------------------------------------


def collect_wheels(lock: Lock, dest: Path, options: PackOptions,
                   say: Callable[[str], None]) -> tuple[list[WheelRow], list[str], list[str]]:
    """Every wanted wheel into ``dest`` (``fetch.collect``, bundle's chain with the pack's
    places): (rows, skipped names, notes); raises naming each gap."""
    wanted, skipped = fetch.wanted(lock, options.skip_local)
    places = fetch.Places(wheelhouses=options.wheelhouses, download=options.download,
                          index_url=options.index_url, allow_http=options.allow_http, python=options.python)
    got = fetch.collect(lock, wanted, dest, places, say=say)
    rows = list(got.rows)
    notes = [f"no wheel for {name}; a restore keeps the base's ensurepip copy" for name in got.missing_tooling]
    own = fetch.own_row(lock, dest)
    if own is not None:
        rows.append(own)
        notes.append(f"{own.name}: {own.filename}, a wheel of the envlock that packs (a restore installs "
                     "the restoring envlock's own)")
    return sorted(rows, key=lambda r: r.name), skipped, notes


# -- OS packages ----------------------------------------------------------------------------------


def collect_debs(lock: Lock, dest: Path, say: Callable[[str], None]) -> tuple[list[str], list[str]]:
    """(downloaded files, pins apt could not download) for a system-Python lock's dpkg pins."""
    from envlock.restore.ospackages import plan_os

    install = plan_os(lock, None, [])
    if install is None or install.manager != "apt":
        return [], []
    if shutil.which("apt-get") is None:
        return [], list(install.pins)
    dest.mkdir(exist_ok=True)
    say(f"downloading {len(install.pins)} .deb files with apt-get download")

    def fetch(pins: Sequence[str]) -> bool:
        try:
            proc = subprocess.run(["apt-get", "download", "-q", *pins], cwd=dest, capture_output=True,
                                  timeout=TOOL_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0

    missing: list[str] = []
    if not fetch(install.pins):
        missing = [pin for pin in install.pins if not fetch([pin])]
    return sorted(p.name for p in dest.iterdir() if p.name.endswith(".deb")), missing


# -- the base image -------------------------------------------------------------------------------


def find_base(engine: ContainerEngine, lock: Lock, base: str | None) -> tuple[BaseChoice, ImageInfo]:
    """The restore's base image as the engine has it (pulled when it is a tag it lacks):
    asked before any wheel is collected, so that a pack that cannot hold its base fails at
    once instead of after downloading every wheel."""
    from envlock.restore.restore import resolve_base

    choice = resolve_base(engine, lock, Options(base=base))
    info = engine.image(choice.ref)
    if info is None:
        raise NotRestorable(f"the engine has no image {choice.ref} to pack")
    return choice, info


def save_base(engine: ContainerEngine, found: tuple[BaseChoice, ImageInfo], out: Path, oci: bool,
              say: Callable[[str], None]) -> tuple[dict[str, str], bool, list[str]]:
    """Save the base image ``find_base`` found as a docker-archive (and OCI): (facts, oci
    written, notes)."""
    choice, info = found
    (out / "image").mkdir(exist_ok=True)
    say(f"saving the base image {choice.display} ({info.id[7:19]})")
    engine.save(info.id, out / DOCKER_ARCHIVE)
    notes: list[str] = []
    written = False
    skopeo = shutil.which("skopeo")
    if oci and skopeo:
        code, output = ociarchive.to_oci(skopeo, out / DOCKER_ARCHIVE, out / OCI_ARCHIVE, _run_tool)
        written = code == 0
        if not written:
            tail = output.strip().splitlines()[-1:] or ["no output"]
            notes.append(f"no OCI archive: skopeo failed ({tail[0]})")
    elif oci:
        notes.append("no OCI archive: skopeo is not installed (the docker-archive loads in Docker and Podman)")
    facts = {"id": info.id, "ref": choice.ref, "display": choice.display, "origin": choice.origin}
    return facts, written, notes


def _run_tool(argv: Sequence[str]) -> tuple[int, str]:
    """(exit status, stderr or else stdout) of a tool that runs on files of the pack."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return 1, str(exc)
    return proc.returncode, proc.stderr or proc.stdout


def needed_base(lock: Lock, base: str | None) -> str | None:
    """The base image a container restore of a pack without one starts from (as a restore
    chooses it: ``--base``, the lock's image, the table), or None when the lock names none
    that a restore could use (the restore then says why)."""
    from envlock.restore.context import choose_base

    try:
        return choose_base(lock, Options(base=base)).ref
    except EnvlockError:
        return None


# -- the pack itself ------------------------------------------------------------------------------


def sums_text(root: Path) -> str:
    """The SHA256SUMS of the pack at ``root``: one ``<sha256>  <path>`` line for every file in
    it (``sha256sum -c`` reads it), sorted. ``packdir.check_sums`` refuses a pack that holds a
    file more or less than these lines, so this must be the last file written."""
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != SUMS):
        rel = path.relative_to(root).as_posix()
        lines.append(f"{sha256_file(path)[7:]}  {rel}\n")
    return "".join(lines)


def _prepare_dir(directory: Path) -> None:
    if os.path.lexists(directory) and (directory.is_symlink() or not directory.is_dir()):
        raise UsageError(f"{directory} exists and is not a directory")
    if directory.exists() and any(directory.iterdir()):
        raise UsageError(f"refusing to write a pack into {directory}: it is not empty",
                         hint="give a new or empty directory, or a path ending in .tar")
    directory.mkdir(parents=True, exist_ok=True)


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def pack(lock: Lock, lock_path: Path, out: Path, options: PackOptions, *,
         engine: ContainerEngine | None, say: Callable[[str], None] = lambda s: None) -> PackResult:
    """Write the pack of ``lock`` to ``out`` (a directory, or a ``.tar`` file)."""
    from envlock.export.packreadme import readme

    t0 = time.monotonic()
    cache = None
    if options.compile_cache is not None:  # refused before anything is collected
        cache = read_cache(options.compile_cache)
        check_against_lock(cache, lock, str(lock_path))
    found = None
    if options.image:
        if engine is None:
            raise UsageError("packing the base image needs a container engine", hint="or pass --no-image")
        found = find_base(engine, lock, options.base)
    archive = Path(out) if str(out).endswith(".tar") else None
    if archive is not None:
        if os.path.lexists(archive):
            raise UsageError(f"refusing to replace {archive}", hint="remove it or choose another name")
        directory = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
        shutil.rmtree(directory, ignore_errors=True)
    else:
        directory = Path(out)
    _prepare_dir(directory)
    try:
        shutil.copyfile(lock_path, directory / LOCK_FILE)
        if cache is not None:
            cache = _copy_cache(cache, directory)
        (directory / WHEELS).mkdir()
        rows, skipped, notes = collect_wheels(lock, directory / WHEELS, options, say)
        wheelhouse.write_manifest(directory / WHEELS, lock, [r.manifest() for r in rows])
        conda_packages = 0
        if lock.conda and lock.conda.packages:
            from envlock.export import condapack

            conda_packages = condapack.collect(lock, directory, say)
            condapack.rattler_wheel(directory / WHEELS)
        debs, missing_debs = collect_debs(lock, directory / DEBS, say)
        if missing_debs:
            notes.append(f"{len(missing_debs)} OS package(s) could not be downloaded: "
                         + ", ".join(missing_debs))
        base: dict[str, str] = {}
        oci = False
        if engine is not None and found is not None:
            base, oci, image_notes = save_base(engine, found, directory, options.oci, say)
            notes += image_notes
        pulled_base = None if base else needed_base(lock, options.base)
        fetched = _fetched_pins(lock, directory / DEBS)
        if not base:
            start = pulled_base or "the lock's base image"
            target = "prefix" if conda_packages else "venv"
            notes.append(f"the pack holds no base image (--no-image): `envlock restore PACK --target {target} DIR` "
                         f"needs no network, but a container restore starts from {start}, which the engine "
                         "pulls unless it has it (or pass `envlock restore PACK --base REF` with an image it has)")
        apptainer = _apptainer(lock, directory, base, notes)
        manifest = {
            "envlock_pack": PACK_FORMAT,
            "lock_id": lock.short_id,
            "lock_fingerprint": lock.envlock.fingerprint,
            "base": base or None,
            "docker_archive": DOCKER_ARCHIVE if base else None,
            "oci_archive": OCI_ARCHIVE if oci else None,
            "wheels": len(rows),
            "local_wheels": sorted(r.name for r in rows if r.local_source),
            "rebuilt": sorted(r.name for r in rows if r.origin == "rebuilt"),
            "debs": debs,
            "missing_debs": missing_debs,
            "skipped": skipped,
            "apptainer": apptainer,
            "compile_cache": _cache_entry(cache),
            # A conda lock's archives, as a local channel (export/condapack).
            "conda": {"channel": CONDA_CHANNEL, "packages": conda_packages} if conda_packages else None,
        }
        (directory / PACK_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        seconds = time.monotonic() - t0
        (directory / README).write_text(
            readme(lock, len(rows), [r.name for r in rows if r.origin == "rebuilt"], base=base, oci=oci, debs=debs, missing_debs=missing_debs,
                   skipped=skipped, size=_size(directory), pack_seconds=seconds, pulled_base=pulled_base,
                   fetched=fetched),
            encoding="utf-8")
        (directory / SUMS).write_text(sums_text(directory), encoding="utf-8")
        size = _size(directory)
        if archive is not None:
            _write_tar(directory, archive)
            shutil.rmtree(directory)
    except BaseException:
        if archive is not None:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return PackResult(directory=archive or directory, archive=archive, wheels=tuple(rows),
                      skipped=tuple(skipped), debs=tuple(debs), missing_debs=tuple(missing_debs),
                      base=base, oci=oci, notes=tuple(notes), size=size,
                      seconds=time.monotonic() - t0, compile_cache=cache, conda_packages=conda_packages)


def _fetched_pins(lock: Lock, debs: Path) -> list[str]:
    """The OS package pins a container restore of the pack fetches with apt (the network on):
    those with no .deb in ``debs``, by the rule restore follows (``ospackages.local_debs``)."""
    from envlock.restore.ospackages import local_debs, plan_os

    install = plan_os(lock, None, [])
    return [] if install is None else local_debs(install, debs)[1]


def _copy_cache(cache: CacheFile, directory: Path) -> CacheFile:
    """The compile cache copied into the pack, and checked again there: the copy is what
    SHA256SUMS and the manifest vouch for, so it must be the file that was checked."""
    (directory / COMPILE_CACHE).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cache.path, directory / COMPILE_CACHE)
    copied = read_cache(directory / COMPILE_CACHE)
    if copied.sha256 != cache.sha256:
        raise CompileCacheRefused(safe(f"compile cache {cache.path} changed while it was packed"))
    return copied


def _cache_entry(cache: CacheFile | None) -> dict[str, object] | None:
    """What the manifest says of the compile cache (None: the pack holds none)."""
    if cache is None:
        return None
    return {"path": COMPILE_CACHE, "sha256": cache.sha256, "torch": cache.header["torch"],
            "triton": cache.header.get("triton"), "artifacts": cache.header["artifacts"]}


def _apptainer(lock: Lock, directory: Path, base: dict[str, str], notes: list[str]) -> str | None:
    """The pack's Apptainer definition (``export/apptainer``), rendered from the plan a restore
    of this pack would follow; its path in the pack, or None (and a note) when there is none."""
    from envlock.export import apptainer
    from envlock.restore.restore import prepare

    options = with_base(Options(wheelhouse=directory / WHEELS), base)
    try:
        plan, _ = prepare(lock, options, None)
        own = plan.wheels.get("envlock", ())
        texts = apptainer.pack_definition(plan, archive=DOCKER_ARCHIVE if base else None, wheels_dir=WHEELS,
                                          own_wheels=tuple(p.name for p in own))
    except EnvlockError as exc:
        notes.append(f"no Apptainer definition: {exc.message}")
        return None
    for rel, text in texts.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(text, encoding="utf-8")
    for wheel in own:  # envlock itself: a wheel of the envlock that packs, as a restore installs
        (directory / apptainer.PACK_DIR / "wheels").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, directory / apptainer.PACK_DIR / "wheels" / wheel.name)
    return apptainer.DEFINITION


def _write_tar(directory: Path, archive: Path) -> None:
    """An uncompressed tar (wheels and image layers are compressed already), members at its root."""
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    os.replace(tmp, archive)

