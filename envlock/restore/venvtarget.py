"""``envlock restore PACK --target venv DIR``: the lock's environment as a plain venv on this host.

For a cluster's login node or a shared filesystem, where there is no container engine. The
plan is the container restore's (``context.plan``: the same layers, requirement files, hash
checks and refusals), installed with this host's interpreter of the lock's Python version into
a new venv with ``--no-index --find-links`` from the pack or wheelhouse and none of the host
installers' configuration (``installer_env``), then verified in place with the same judgement
as the check inside a restored image. The host's OS packages, kernel
and CPU are the host's: the comparison reports them, as any ``verify`` on another machine does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.errors import BuildFailed, HostIncompatible, InterpreterNotFound, UsageError
from envlock.lock import Lock
from envlock.restore import context as ctx
from envlock.restore import dockerfile
from envlock.restore.image import Options

if TYPE_CHECKING:
    from envlock.drift.result import Comparison

INSTALL_TIMEOUT = 3600.0
# In DIR from before ``python -m venv`` until the last install is done (``unfinished``).
UNFINISHED = ".envlock-unfinished"
# In a finished venv: the fingerprint of the lock it was restored from (``restored_from``).
RESTORED = ".envlock-restored"
# Stands for "no image": the plan validates a base it never builds FROM here.
_NO_IMAGE = ctx.BaseChoice("sha256:" + "0" * 64, "--base", True, "sha256:" + "0" * 64)


@dataclass(frozen=True)
class VenvResult:
    directory: Path
    python: str
    installer: str
    seconds: float
    comparison: Comparison | None


def _version_of(python: str) -> tuple[str, str] | None:
    """(major.minor.micro, implementation) of ``python``, or None when it does not run."""
    try:
        proc = subprocess.run([python, "-c", "import sys, platform; print(platform.python_version(), "
                               "sys.implementation.name)"], capture_output=True, text=True, timeout=60,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = proc.stdout.split()
    return (parts[0], parts[1]) if proc.returncode == 0 and len(parts) == 2 else None


def host_python(lock: Lock, python: str | None) -> str:
    """``--python``, else ``pythonX.Y`` of the lock's version on PATH; refuses another minor."""
    major_minor = ".".join(lock.python.version.split(".")[:2])
    candidates = [python] if python else [f"python{major_minor}", "python3"]
    seen = []
    for cand in candidates:
        exe = cand if os.sep in cand else shutil.which(cand)
        if exe is None:
            continue
        found = _version_of(exe)
        if found is None:
            continue
        version, impl = found
        if ".".join(version.split(".")[:2]) == major_minor and impl == lock.python.implementation:
            return exe
        seen.append(f"{exe} is {impl} {version}")
    if not seen:
        raise InterpreterNotFound(f"no python{major_minor} on this host (the lock needs "
                                  f"{lock.python.implementation} {major_minor})",
                                  hint=f"install python{major_minor} or pass --python /path/to/python{major_minor}")
    raise HostIncompatible(f"the lock needs {lock.python.implementation} {major_minor}, but "
                           + "; ".join(seen),
                           hint=f"pass --python with a python{major_minor} interpreter, or restore a container")


def _installer(python: str) -> tuple[list[str], str]:
    """uv when it is on PATH (much faster at unpacking large wheels), pip otherwise; uv with
    ``--no-config`` as in an image build (its files), ``installer_env`` for the rest."""
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--no-config", "--python", python, "--no-deps", "--no-index"], "uv"
    return [python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir",
            "--disable-pip-version-check", "--no-input"], "pip"


# Where uv keeps its cache says nothing about what it installs; a login node whose home is
# read-only needs it kept.
_KEPT = ("UV_CACHE_DIR",)


def installer_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment pip and uv install the checked wheels in: none of the installers' own
    configuration. Every ``PIP_*`` and ``UV_*`` variable is left out (find-links, indexes,
    constraints, binary or source preferences: each could bring a file envlock did not check),
    and pip reads no configuration file (``PIP_CONFIG_FILE`` set to the null device skips them
    all; uv gets ``--no-config``). The wheels come from the pack or ``--wheelhouse`` alone, as in
    an image built from the same plan."""
    env = {k: v for k, v in environ.items() if not k.startswith(("PIP_", "UV_")) or k in _KEPT}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_WARN_SCRIPT_LOCATION="1")
    return env


def _run(argv: list[str], what: str) -> None:
    env = installer_env(os.environ)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildFailed(f"{what} could not run: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise BuildFailed(f"{what} failed (exit {proc.returncode})", log_tail=tail)


def refuse_unless_free(dest: Path) -> None:
    """``dest`` must not exist, or be an empty directory; a directory an interrupted restore left
    (it still holds the marker) is named as such, with how to remove it."""
    if not os.path.lexists(dest):
        return
    if dest.is_dir() and not dest.is_symlink():
        if os.path.lexists(dest / UNFINISHED):
            raise UsageError(f"refusing to create a venv at {dest}: it is an unfinished venv that an "
                             "envlock restore left when it was killed",
                             hint=f"remove it (rm -rf {shlex.quote(str(dest))}) and restore again")
        if not any(dest.iterdir()):
            return
    raise UsageError(f"refusing to create a venv at {dest}: it exists and is not an empty directory")


@contextlib.contextmanager
def unfinished(dest: Path) -> Iterator[None]:
    """``dest`` while the venv is made in it: marked unfinished, and taken away again when the
    restore stops before the end (a failed install, Ctrl-C, SIGTERM), so the next try finds
    nothing in its way; an empty directory that was there is left empty. Only a restore killed
    outright (SIGKILL) leaves it behind, with the marker that names it envlock's."""
    existed = dest.is_dir()
    dest.mkdir(parents=True, exist_ok=True)
    marker = dest / UNFINISHED
    marker.write_text("a venv an envlock restore is still making, or was killed while making\n",
                      encoding="utf-8")
    try:
        yield
    except BaseException:
        # The marker goes last: a second Ctrl-C during the removal still leaves it there.
        for child in dest.iterdir():
            if child.name != UNFINISHED:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
        if not existed:
            with contextlib.suppress(OSError):
                dest.rmdir()
        raise
    marker.unlink()


def restore_venv(lock: Lock, wheels: Path, dest: Path, options: Options, *, verify: bool = True,
                 say: Callable[[str], None] = lambda s: None) -> VenvResult:
    """Create the venv ``dest`` with the lock's packages from ``wheels``, then verify it."""
    from envlock.restore.restore import wheel_inputs

    dest = Path(dest).absolute()
    refuse_unless_free(dest)
    python = host_python(lock, options.python)
    t0 = time.monotonic()
    options = replace(options, wheelhouse=wheels, venv=str(dest), python=None, base=None)
    # The plan of the image target: the wheelhouse's wheels proven, envlock's own wheel for envlock.
    options, files_for, own = wheel_inputs(lock, options)
    plan = ctx.plan(lock, options, _NO_IMAGE, files_for, own)
    for note in plan.notes:
        say(note if note.startswith("warning: ") else f"note: {note}")
    rendered = dockerfile.render(plan)
    venv_python = str(dest / "bin" / "python")
    install, installer = _installer(venv_python)
    with unfinished(dest):
        say(f"creating {dest} with {python}")
        _run([python, "-m", "venv", str(dest)], "python -m venv")
        with tempfile.TemporaryDirectory(prefix="envlock-venv-") as tmp:
            for layer in plan.layers:
                # Each layer finds only its own wheels, as in an image: envlock's layer its own
                # wheel, never another build of it that the wheelhouse may hold under that name.
                links = [arg for d in sorted({str(w.parent) for w in plan.wheels.get(layer.name, ())})
                         for arg in ("--find-links", d)]
                for fname in layer.files():
                    req = Path(tmp) / fname
                    req.write_text(rendered[f"requirements/{fname}"], encoding="utf-8")
                    hashed = ("--require-hashes",) if fname.endswith("-hashed.txt") else ()
                    say(f"installing the {layer.name} layer with {installer}")
                    _run([*install, *hashed, *links, "-r", str(req)], f"{installer} install ({layer.name})")
        if plan.remove:
            _run([venv_python, "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", *plan.remove],
                 "pip uninstall (ensurepip's tools the lock does not have)")
        (dest / RESTORED).write_text(f"{lock.envlock.fingerprint}\n", encoding="utf-8")
    seconds = time.monotonic() - t0
    comparison = None
    if verify:
        say("verifying the venv in place")
        comparison = verify_venv(lock, plan, venv_python)
    return VenvResult(dest, venv_python, installer, seconds, comparison)


def restored_from(program: str) -> str | None:
    """The fingerprint of the lock whose venv ``program`` (``DIR/bin/python``) runs in, when
    ``restore_venv`` made that venv; else None. A replay of a record made under that lock runs
    the recorded ``python`` there as the same program (another path, the same environment)."""
    marker = Path(program).parent.parent / RESTORED
    try:
        with open(marker, "rb") as f:
            text = f.read(200).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith("sha256:") and len(text) == 71 else None


def verify_venv(lock: Lock, plan: ctx.Plan, python: str) -> Comparison:
    from envlock.check.local import judge, probe_wanted_for
    from envlock.probing.capture import capture

    want_torch, want_canary = probe_wanted_for(lock)
    here = capture(python=python, torch=want_torch, canary=want_canary)
    # The restore's own verdict (``check/local.judge``, as in an image), with what it changed on
    # purpose allowed for; a venv sits on the host, so its OS packages are the host's.
    restored = replace(plan.restored, os_packages_restored=False)
    return judge(lock, here, None, strict=False, process_state="report", limit=None,
                 restored=restored)
