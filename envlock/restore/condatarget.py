"""``envlock restore PACK --target prefix DIR``: a conda lock's prefix on this host, installed
by py-rattler from the pack's channel with no solving, then verified in place.

The lock's records are the install: each points at its archive in the pack (or in a channel
directory given with ``--conda-channel``), and envlock checks every archive's sha256 against the
lock itself before anything is installed (py-rattler does not check ``file:`` archives). A
missing, changed or extra archive is refused by name. The install uses a fresh package cache
(rattler keeps the files of an archive that failed its check in a cache and would use them
again) and an absolute prefix (a relative one is baked into the files). A restore that fails or
is interrupted leaves no prefix behind (``venvtarget.unfinished``). py-rattler is the running
envlock's, else installed from the pack's ``wheels/`` into a temporary directory.
"""

from __future__ import annotations

import asyncio
import glob
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock._files import file_digest
from envlock.errors import BuildFailed, MissingExtra, UsageError
from envlock.text.terminal import first

if TYPE_CHECKING:
    from envlock.drift.result import Comparison
    from envlock.lock import CondaPackage, Lock


@dataclass(frozen=True)
class PrefixResult:
    directory: Path
    python: str
    packages: int
    seconds: float
    comparison: Comparison | None


def conda_packages(lock: Lock, *, need: tuple[str, ...] = ("url", "sha256")) -> list[CondaPackage]:
    """The lock's conda packages, each with the fields in ``need``; refused when there are none
    or when one lacks them (named)."""
    pkgs = list(lock.conda.packages) if lock.conda else []
    if not pkgs:
        raise UsageError("the lock has no conda packages ([conda]): it was not captured in a "
                         "conda, mamba or pixi environment")
    lacking = [p.name for p in pkgs if any(getattr(p, field) is None for field in need)]
    if lacking:
        raise UsageError(f"{first(sorted(lacking), 8)} {'has' if len(lacking) == 1 else 'have'} no "
                         f"{' or '.join(need)} in the lock",
                         hint="capture the environment again with this envlock, which records "
                              "each conda package's archive")
    return pkgs


def repodata_records(rattler: Any, lock: Lock, url_of: Any = None) -> list[Any]:
    """The lock's conda packages as py-rattler ``RepoDataRecord`` objects, each pointing at
    ``url_of(pkg)`` (default: where it was installed from) with its recorded channel."""
    out = []
    for pkg in conda_packages(lock, need=("url", "sha256", "subdir", "fn")):
        record = rattler.PackageRecord(
            pkg.name, pkg.version, rattler.BuildString(pkg.build or ""), pkg.build_number or 0, pkg.subdir,
            noarch=pkg.noarch, depends=list(pkg.depends or ()), constrains=list(pkg.constrains or ()),
            sha256=bytes.fromhex(pkg.sha256 or ""), md5=bytes.fromhex(pkg.md5) if pkg.md5 else None,
            size=pkg.size)
        out.append(rattler.RepoDataRecord(record, pkg.fn or "", url_of(pkg) if url_of else pkg.url or "",
                                          pkg.channel or ""))
    return out


# The conda subdir of a platform envlock records ([platform].os, .machine).
_SUBDIRS = {("Linux", "x86_64"): "linux-64", ("Linux", "aarch64"): "linux-aarch64",
            ("Linux", "ppc64le"): "linux-ppc64le", ("Darwin", "x86_64"): "osx-64",
            ("Darwin", "arm64"): "osx-arm64", ("Windows", "AMD64"): "win-64"}


def conda_subdir(lock: Lock) -> str:
    """The environment's platform as conda names it: its packages' own subdir (noarch aside),
    else the one of the lock's platform."""
    for pkg in lock.conda.packages if lock.conda else ():
        if pkg.subdir and pkg.subdir != "noarch":
            return pkg.subdir
    found = _SUBDIRS.get((lock.platform.os, lock.platform.machine))
    if found is None:
        raise UsageError(f"no conda subdir for {lock.platform.os} {lock.platform.machine}")
    return found


def lockfile_text(rattler: Any, lock: Lock, url_of: Any = None) -> str:
    """The lock's conda packages as py-rattler's ``LockFile`` (pixi.lock) writes them: one
    ``default`` environment, the capturing host's virtual packages, each record pointing at
    ``url_of(pkg)`` (default: where it was installed from)."""
    virtual = [f"{v.name}={v.version}={v.build}" for v in (lock.conda.virtual_packages or ())] \
        if lock.conda else []
    platform = rattler.LockPlatform(conda_subdir(lock), virtual_packages=virtual or None)
    lockfile = rattler.LockFile([platform])
    channels = sorted({(p.channel or "").rstrip("/") for p in conda_packages(lock) if p.channel})
    lockfile.set_channels("default", [rattler.LockChannel(c) for c in channels])
    for record in repodata_records(rattler, lock, url_of):
        lockfile.add_conda_package("default", platform, record)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pixi.lock"
        lockfile.to_path(path)
        return path.read_text(encoding="utf-8")


def check_channel(lock: Lock, channel: Path) -> dict[str, Path]:
    """{name: archive} of every conda package of ``lock`` in ``channel/<subdir>/<fn>``, each
    with the lock's sha256; refused naming every archive missing, changed or not in the lock."""
    pkgs = conda_packages(lock, need=("sha256", "subdir", "fn"))
    wanted = {f"{p.subdir}/{p.fn}": p for p in pkgs}
    found = {Path(f).relative_to(channel).as_posix()
             for pattern in ("*/*.conda", "*/*.tar.bz2") for f in glob.glob(str(channel / pattern))}
    missing = sorted(set(wanted) - found)
    extra = sorted(found - set(wanted))
    changed = sorted(rel for rel in set(wanted) & found if file_digest(channel / rel).hexdigest != wanted[rel].sha256)
    problems = ([f"missing: {first(missing, 8)}"] if missing else []) + (
        [f"not the lock's (sha256 differs): {first(changed, 8)}"] if changed else []) + (
        [f"not in the lock: {first(extra, 8)}"] if extra else [])
    if problems:
        raise UsageError(f"refusing to restore from {channel}: its conda archives are not the lock's; "
                         + "; ".join(problems), hint="pack the environment again, or give the channel "
                                                     "its archives were packed from")
    return {p.name: channel / rel for rel, p in wanted.items()}


def rattler_module() -> Any:
    """py-rattler, which exports to pixi, packs and restores a conda lock: the one place that
    says how to install it."""
    try:
        import rattler
    except ModuleNotFoundError:
        raise MissingExtra("a conda lock's pixi export, pack and restore need py-rattler",
                           hint="pip install 'envlock-ml[conda]'") from None
    return rattler


def _rattler(pack_wheels: Path | None, tmp: Path) -> Any:
    """py-rattler: the running envlock's, else the pack's wheel installed into ``tmp``."""
    wheels = sorted(pack_wheels.glob("py_rattler-*.whl")) if pack_wheels else []
    try:
        return rattler_module()
    except MissingExtra:
        if not wheels:
            raise
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--disable-pip-version-check", "--target", str(tmp), str(wheels[-1])],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise BuildFailed(f"installing the pack's {wheels[-1].name} failed (exit {proc.returncode})",
                          log_tail=(proc.stderr or proc.stdout).strip().splitlines()[-8:])
    sys.path.insert(0, str(tmp))
    import rattler
    return rattler


def pip_requirements(lock: Lock, wheels: Path | None) -> list[str]:
    """``name==version --hash=...`` of the lock's packages a pack holds wheels of: those pip
    installed on top of conda's (``export/fetch.wanted`` chose them when the pack was made; the
    ones conda installed are conda's records), each with the hashes the pack proved."""
    from envlock.restore import values, wheelhouse

    hashes = wheelhouse.read_manifest(wheels) if wheels is not None else {}
    out = []
    for pkg in lock.packages:
        if pkg.name in hashes:
            out.append(f"{values.dist_name(pkg.name)}=={values.version(pkg.version, name=pkg.name)} "
                       + " ".join(f"--hash={h}" for h in hashes[pkg.name]))
    return out


def _install_pip(python: str, wheels: Path, requirements: list[str], tmp: Path) -> None:
    """The pip packages into the prefix's interpreter, by this host's pip (``--python``: a conda
    prefix need not hold pip), from the pack's wheels alone, every file's hash required."""
    from envlock.restore.venvtarget import _run

    req = tmp / "requirements.txt"
    req.write_text("".join(line + "\n" for line in requirements), encoding="utf-8")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--require-hashes",
          "--find-links", str(wheels), "-r", str(req)], "pip install (the packages pip installed into the prefix)")


def restore_prefix(lock: Lock, channel: Path, dest: Path, *, pack_wheels: Path | None = None,
                   verify: bool = True, say: Callable[[str], None] = lambda s: None) -> PrefixResult:
    """Install the conda prefix ``dest`` from the archives in ``channel``, and the packages pip
    installed on top of them from ``pack_wheels``, then verify it."""
    from envlock.restore.venvtarget import refuse_unless_free, unfinished

    dest = Path(dest).absolute()
    refuse_unless_free(dest)
    archives = check_channel(lock, Path(channel).resolve())  # file: urls need absolute paths
    requirements = pip_requirements(lock, pack_wheels)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="envlock-conda-") as tmp:
        rattler = _rattler(pack_wheels, Path(tmp) / "rattler")
        records = repodata_records(rattler, lock, url_of=lambda pkg: archives[pkg.name].as_uri())
        with unfinished(dest):
            say(f"installing {len(records)} conda package(s) into {dest} with py-rattler (no solving)")
            try:
                asyncio.run(rattler.install(records, target_prefix=str(dest), cache_dir=Path(tmp) / "pkgs",
                                            show_progress=False))
            except Exception as exc:  # py-rattler's own errors; a PanicException is a BaseException
                raise BuildFailed(f"py-rattler could not install the prefix: {exc}") from None
            if requirements and pack_wheels is not None:
                say(f"installing {len(requirements)} package(s) pip installed into the prefix, from the pack's wheels")
                _install_pip(str(dest / "bin" / "python"), pack_wheels, requirements, Path(tmp))
    seconds = time.monotonic() - t0
    python = str(dest / "bin" / "python")
    comparison = None
    if verify:
        say("verifying the prefix in place")
        comparison = verify_prefix(lock, python)
    return PrefixResult(dest, python, len(records), seconds, comparison)


def verify_prefix(lock: Lock, python: str) -> Comparison:
    """The restore's verdict (``check/local.judge``) on the prefix's interpreter, as for a venv."""
    from envlock.check.local import judge, probe_wanted_for
    from envlock.probing.capture import capture

    want_torch, want_canary = probe_wanted_for(lock)
    here = capture(python=python, torch=want_torch, canary=want_canary)
    return judge(lock, here, None, strict=False, process_state="report", limit=None)


# -- a container image -----------------------------------------------------------------------------

# Where the build stage keeps the pack's channel, wheels and the locked records.
_IMAGE_DIR = "/envlock-conda"
# Run by the build stage's python3 (any >= 3.10) with the pack's py-rattler: the locked records
# (pixi.lock, pointing at the channel copied in), every archive's sha256 checked against them,
# installed with no solving; then what pip installed on top, from the pack's wheels.
_IMAGE_SCRIPT = '''\
import asyncio, hashlib, os, subprocess, sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import rattler

prefix, here = sys.argv[1], Path(sys.argv[2])
env = rattler.LockFile.from_path(here / "pixi.lock").default_environment()
[platform] = env.platforms()
records = env.conda_repodata_records_for_platform(platform)
bad = []
for r in records:
    data = Path(unquote(urlsplit(r.url).path)).read_bytes()
    if hashlib.sha256(data).digest() != r.sha256:
        bad.append(r.file_name)
if bad:
    sys.exit("envlock: archives not the lock's (sha256 differs): " + ", ".join(bad))
asyncio.run(rattler.install(records, target_prefix=prefix, cache_dir=here / "pkgs", show_progress=False))
if (here / "pip.txt").stat().st_size:
    subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(prefix, "bin", "python"),
                    "install", "--no-deps", "--no-index", "--no-cache-dir", "--require-hashes",
                    "--disable-pip-version-check", "--find-links", str(here / "wheels"),
                    "-r", str(here / "pip.txt")], check=True)
# Done: leave without the interpreter's teardown, where an extension's runtime threads can still
# be running (a crash there would fail an install that has finished; the check inside judges it).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def image_context(lock: Lock, pack_channel: Path, pack_wheels: Path, base: str, prefix: str,
                  context: Path) -> None:
    """The build context of a conda lock's image: a build stage ``FROM base`` installs the
    records into ``prefix`` with the pack's py-rattler, the final stage copies the prefix alone."""
    import shutil

    from envlock.restore import values

    archives = check_channel(lock, pack_channel.resolve())
    rattler = _rattler(None, context / "unused")
    shutil.copytree(pack_channel, context / "conda")
    shutil.copytree(pack_wheels, context / "wheels")
    (context / "pixi.lock").write_text(lockfile_text(
        rattler, lock, lambda pkg: f"file://{_IMAGE_DIR}/conda/" + archives[pkg.name].relative_to(
            pack_channel.resolve()).as_posix()), encoding="utf-8")
    (context / "pip.txt").write_text("".join(r + "\n" for r in pip_requirements(lock, pack_wheels)),
                                     encoding="utf-8")
    (context / "install.py").write_text(_IMAGE_SCRIPT, encoding="utf-8")
    base = values.image_ref(base, what="--base")
    prefix = values.abs_path(prefix, what="the lock's conda prefix")
    (context / "Dockerfile").write_text(
        f"# A conda lock's prefix, installed by py-rattler from the pack's channel (no solving).\n"
        f"FROM {base} AS build\n"
        f"COPY conda {_IMAGE_DIR}/conda\n"
        f"COPY wheels {_IMAGE_DIR}/wheels\n"
        f"COPY pixi.lock pip.txt install.py {_IMAGE_DIR}/\n"
        f"RUN python3 -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check "
        f"--target {_IMAGE_DIR}/rattler {_IMAGE_DIR}/wheels/py_rattler-*.whl"
        f" && PYTHONPATH={_IMAGE_DIR}/rattler python3 -X faulthandler {_IMAGE_DIR}/install.py {prefix} {_IMAGE_DIR}\n"
        f"FROM {base}\n"
        f"COPY --from=build {prefix} {prefix}\n"
        f"ENV PATH={prefix}/bin:$PATH\n", encoding="utf-8")


def restore_conda_image(engine: Any, lock: Lock, pack_channel: Path, pack_wheels: Path, *, base: str,
                        tag: str, workdir: Path, verify: bool = True, quiet: bool = False,
                        say: Callable[[str], None] = lambda s: None) -> tuple[str, Comparison | None]:
    """(image id, the check inside): the conda lock's prefix at the lock's own path, built with
    the network off from the pack, then probed in a fresh container of it."""
    from envlock.drift.expected import Restored
    from envlock.restore.progress import make_progress
    from envlock.restore.verify import verify_image

    prefix = lock.python.prefix
    if not prefix:
        raise UsageError("the lock records no prefix to restore the conda environment at")
    # The build log outlives the context (a temporary directory in ``workdir``): a failed
    # build's hint names it.
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "build.log"
    with tempfile.TemporaryDirectory(prefix="envlock-conda-image-", dir=workdir) as tmp:
        context = Path(tmp)
        image_context(lock, pack_channel, pack_wheels, base, prefix, context)
        say(f"building {tag} from {base}: {len(conda_packages(lock))} conda package(s) into {prefix}, no network")
        image_id = engine.build(context, tag=tag, labels={"org.envlock.lock": lock.short_id},
                                log_path=log_path, progress=make_progress(quiet=quiet, log=log_path),
                                network=False)
    comparison = None
    if verify:
        say("verifying inside the image")
        _, comparison = verify_image(engine, lock, image_id, python=f"{prefix}/bin/python",
                                     restored=Restored(lock.envlock.fingerprint or "", os_packages_restored=False))
    return image_id, comparison
