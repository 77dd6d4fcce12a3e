"""``envlock run LOCK -- CMD``: replay a command in the lock's image.

The workspace is mounted at /workspace and CMD runs as the caller's uid:gid, so every file it
writes there belongs to the caller (no root-owned leftovers). Output is streamed as it comes and
envlock exits with CMD's exit code. GPUs go through a Docker DeviceRequest or, on Podman, the
CDI device ``nvidia.com/gpu=all``; before asking for them, the host driver is checked against
the minimum for the lock's CUDA (``envlock/data/cuda.toml``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envlock.drift.result import OS_FROM_BASE_ENV
from envlock.errors import HostIncompatible, UsageError
from envlock.lock import PROTECTED_ENV, looks_like_lock
from envlock.restore.engine import ContainerEngine, RunSpec
from envlock.restore.image import (
    LABEL_CONTEXT,
    LABEL_OPTIONS,
    LABEL_SHORT_ID,
    WORKDIR,
    Options,
    image_tag,
    numerics_env,
    options_key,
)
from envlock.runtime.common import WORKERS_ENV
from envlock.text.terminal import Tail

if TYPE_CHECKING:
    from envlock.lock import Header, Lock

JUPYTER_PORT = 8888
_PORT_RE = re.compile(r"^(?:(\d{1,3}(?:\.\d{1,3}){3}):)?(\d{1,5}):(\d{1,5})(?:/(tcp|udp))?$")
_GPUS_RE = re.compile(r"^(all|none|auto|\d+(,\d+)*)$")


@dataclass(frozen=True)
class RunOptions:
    command: Sequence[str]
    gpus: str = "auto"
    workspace: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ports: Sequence[str] = ()
    jupyter: bool = False
    # (host path, container path, read-only): the replay record's journal directory.
    mounts: Sequence[tuple[str, str, bool]] = ()
    ssh: bool = False
    ssh_key: str | None = None
    lock_path: Path | None = None  # the lock being replayed, protected when in the workspace
    # Keeps the last lines of the command's stderr as they pass (a failed replay shows them).
    stderr_tail: Tail | None = None


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``K=V`` pairs; names are checked, values pass as data (no shell ever sees them)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            key, value = item, os.environ.get(item, "")
        if not re.fullmatch(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise UsageError(f"--env {item!r}: not NAME=VALUE")
        if "\0" in value:
            raise UsageError(f"--env {key}: value contains a NUL byte")
        out[key] = value
    return out


def parse_ports(items: Sequence[str]) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for item in items:
        m = _PORT_RE.fullmatch(item)
        if not m or not (0 < int(m.group(2)) < 65536 and 0 < int(m.group(3)) < 65536):
            raise UsageError(f"-p {item!r}: expected [IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp]")
        out[f"{int(m.group(3))}/{m.group(4) or 'tcp'}"] = (m.group(1) or "0.0.0.0", int(m.group(2)))
    return out


def outside_workspace(command: Sequence[str], workspace: Path) -> str | None:
    """The first word of ``command`` (or the value of a ``--opt=VALUE`` word) that is a relative
    path up out of ``workspace`` to a file that exists here: the container sees the workspace
    alone (at /workspace, its working directory), so ``python ../train.py`` from a subdirectory
    would fail inside after the image was made ready, with a "No such file" that does not say why.
    A path that does not exist here is left alone: it may be the image's own."""
    for word in command:
        for path in (word, word.partition("=")[2]):
            up = path and not os.path.isabs(path) and os.path.normpath(path).split(os.sep)[0] == ".."
            if up and (workspace / path).exists():
                return path
    return None


def host_driver() -> str | None:
    """The NVIDIA driver version of this host: kernel module, then NVML, then nvidia-smi.

    NVML comes before nvidia-smi because it is what the probe records as ``[gpu].driver`` and
    it is present wherever the driver's user-space library is (also in containers that lack
    /proc/driver/nvidia); the probe's watchdog bounds a wedged driver.
    """
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
        m = re.search(r"\b(\d{3,4}\.\d+(?:\.\d+)?)\b", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    from envlock.probe.gpu import collect_gpu, nvml_timeout_from_env

    info, _ = collect_gpu(None, nvml_timeout_from_env())
    if info and info.get("driver"):
        return str(info["driver"])
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None


def needs_driver(lock: Lock | Header, gpus: str) -> bool:
    """Whether ``resolve_gpus`` judges the host's driver for ``gpus``: every request but
    ``none``, and ``auto`` only for a lock whose torch uses CUDA (else it runs on CPU)."""
    return gpus != "none" and (gpus != "auto" or bool(lock.torch and lock.torch.cuda))


def resolve_gpus(lock: Lock | Header, gpus: str, driver: str | None) -> tuple[str | None, list[str]]:
    """(the GPU request for the engine or None, warnings); refuses what cannot work."""
    if not _GPUS_RE.fullmatch(gpus):
        raise UsageError(f"--gpus {gpus!r}: expected all, none, auto or a list like 0,1")
    cuda = lock.torch.cuda if lock.torch else None
    if gpus == "none" or (gpus == "auto" and (not cuda or driver is None)):
        return None, []
    warnings: list[str] = []
    if driver is None:
        raise HostIncompatible("--gpus asks for GPUs, but this host has no NVIDIA driver "
                               "(/proc/driver/nvidia/version and nvidia-smi not found)")
    if cuda:
        from envlock.restore.tables import driver_older, driver_requirement  # a GPU run's alone

        need = driver_requirement(cuda)
        if need is None:
            warnings.append(f"no driver minimum known for CUDA {cuda}; not checked")
        elif driver_older(driver, need.min_driver):
            raise HostIncompatible(
                f"the host's NVIDIA driver {driver} cannot run CUDA {cuda} (torch "
                f"{lock.torch.version if lock.torch else '?'}): it needs at least {need.min_driver}",
                hint="upgrade the driver, or run on CPU with --gpus none")
        elif need.toolkit_driver and driver_older(driver, need.toolkit_driver):
            warnings.append(f"driver {driver} runs CUDA {cuda} under minor version compatibility "
                            f"only (toolkit driver {need.toolkit_driver}); PTX JIT may fail")
    return ("all" if gpus in ("all", "auto") else gpus), warnings


def _jupyter(lock: Lock, python: str, ports: dict[str, tuple[str, int]], env: dict[str, str]
             ) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """JupyterLab's command line and ports (127.0.0.1:8888 unless given); its token goes into
    ``env`` and its URL to stderr."""
    if lock.package("jupyterlab") is None:
        raise UsageError("--jupyter: the lock has no jupyterlab", hint="add jupyterlab to the "
                         "environment and capture again")
    token = secrets.token_hex(24)
    env["JUPYTER_TOKEN"] = token  # an env var, not an argument: it does not show in `ps`
    if not ports:
        ports = {f"{JUPYTER_PORT}/tcp": ("127.0.0.1", JUPYTER_PORT)}
    inner = int(next(iter(ports)).split("/")[0])
    command = [python, "-m", "jupyterlab", "--ip=0.0.0.0", f"--port={inner}", "--no-browser",
               f"--ServerApp.root_dir={WORKDIR}"]
    if os.getuid() == 0:
        # The lab runs as the caller; as root (CI, many cluster containers) Jupyter refuses
        # to start without this.
        command.append("--ServerApp.allow_root=True")
    host_ip, host_port = next(iter(ports.values()))
    shown = "127.0.0.1" if host_ip == "0.0.0.0" else host_ip
    sys.stderr.write(f"JupyterLab: http://{shown}:{host_port}/lab?token={token}\n")
    return command, ports


def process_variables(lock: Lock | Header) -> dict[str, str]:
    """What the recorded process set itself and ``run`` sets again: its numerics variables
    (``numerics_env``) and whether seed_everything() seeded DataLoader workers
    (``ENVLOCK_SEED_WORKERS``, recorded in ``[env]``), as one of its two meanings."""
    env = numerics_env(lock, process=True)
    workers = lock.env.get(WORKERS_ENV)
    if workers is not None and WORKERS_ENV in lock.determinism.process_env:
        env[WORKERS_ENV] = "0" if workers == "0" else "1"
    return env


def protected_locks(workspace: Path, lock_path: Path | None) -> list[tuple[str, str]]:
    """(host path, container path) of every lock envlock owns in the workspace: the one being
    replayed and the ``*.lock`` files beside it at the top. Each is mounted read-only over
    itself, so nothing the command runs can replace it (``Lock.save`` writes to
    ``.envlock-replay/`` instead)."""
    candidates = sorted(workspace.glob("*.lock"))
    if lock_path is not None:
        candidates.append(Path(lock_path))
    out: dict[str, str] = {}
    for path in candidates:
        real = path.resolve()
        try:
            rel = real.relative_to(workspace)
        except ValueError:
            continue  # outside the workspace: the command cannot reach it
        if real.is_file() and not path.is_symlink() and looks_like_lock(real):
            out[str(real)] = f"{WORKDIR}/{rel.as_posix()}"
    return sorted(out.items())


def run_in_image(engine: ContainerEngine, lock: Lock | Header, image_id: str, tag: str, opts: RunOptions,
                 *, python: str, os_packages_restored: bool = True) -> int:
    """Run the command (or JupyterLab) and return its exit code.

    ``os_packages_restored=False`` (a venv put onto another base) is passed on to the process,
    so that ``envlock.verify()`` inside judges the OS packages as the restore's check did.
    """
    command = list(opts.command)
    # The process state the lock recorded as variables (CUBLAS_WORKSPACE_CONFIG set by
    # deterministic(), ENVLOCK_SEED by seed_everything(), which seed_everything() with no
    # argument reads back); the image itself carries only what was set before start.
    env = process_variables(lock)
    env.update({"ENVLOCK_IMAGE": tag, "ENVLOCK_IMAGE_ID": image_id, "HOME": "/tmp"})
    if not os_packages_restored:
        env[OS_FROM_BASE_ENV] = "base"
    env.update(opts.env or {})
    ports = parse_ports(opts.ports)
    if opts.jupyter and opts.ssh:
        raise UsageError("--jupyter and --ssh: give one")
    if opts.ssh and command:
        raise UsageError("--ssh starts the image's sshd; run commands over ssh, not after --")
    if opts.jupyter:
        from envlock.lock import Header

        full = lock.lock if isinstance(lock, Header) else lock
        if full is None:  # the fast path (``commands/run``) leaves --jupyter to the models
            raise AssertionError("--jupyter reads the lock's packages: load() the lock")
        command, ports = _jupyter(full, python, ports, env)
    if opts.ssh:
        from envlock.restore.ssh import prepare, private_directory

        directory = private_directory()
        try:
            server = prepare(directory, env, opts.ssh_key)
            return _run(engine, lock, image_id, server.command, env, opts, ports={**ports, **server.ports},
                        user=server.user, extra_mounts=server.mounts,
                        banner=f"SSH (Ctrl-C stops the server): {server.login}\n")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if not command:
        raise UsageError("nothing to run: give a command after --, e.g. envlock run env.lock -- python train.py")
    return _run(engine, lock, image_id, command, env, opts, ports=ports, user=f"{os.getuid()}:{os.getgid()}")


def _run(engine: ContainerEngine, lock: Lock | Header, image_id: str, command: Sequence[str],
         env: Mapping[str, str], opts: RunOptions, *, ports: Mapping[str, tuple[str, int]], user: str,
         extra_mounts: Sequence[tuple[str, str, bool]] = (), banner: str = "") -> int:
    workspace = (opts.workspace or Path.cwd()).resolve()
    if not workspace.is_dir():
        raise UsageError(f"--workspace {workspace} is not a directory")
    # --gpus none needs no driver, nor does auto for a lock without CUDA: NVML may take up to
    # its timeout on a wedged driver, and every run would wait for a driver it does not use.
    gpus, warnings = resolve_gpus(lock, opts.gpus, host_driver() if needs_driver(lock, opts.gpus) else None)
    for w in warnings:
        sys.stderr.write(f"envlock: warning: {w}\n")
    locks = protected_locks(workspace, opts.lock_path)
    if locks:
        env = {**env, PROTECTED_ENV: os.pathsep.join(inside for _, inside in locks)}
    # The protected locks are mounted read-only over the workspace's read-write mount, so last.
    spec = RunSpec(image=image_id, command=command, env=env, user=user, workdir=WORKDIR,
                   mounts=[(str(workspace), WORKDIR, False), *opts.mounts, *extra_mounts,
                           *((host, inside, True) for host, inside in locks)],
                   gpus=gpus, ports=ports)
    if banner:
        sys.stderr.write(banner)

    def out(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def err(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()
        if opts.stderr_tail is not None:
            opts.stderr_tail.feed(data)

    result = engine.run(spec, on_stdout=out, on_stderr=err)
    return result.exit_code


@dataclass(frozen=True)
class Ready:
    """An image ``run`` can start without restoring: the lock's, proven by a kept check."""

    image_id: str
    tag: str
    python: str
    os_packages_restored: bool


def ready_image(engine: ContainerEngine, lock: Lock | Header, options: Options, name: str) -> Ready | None:
    """The lock's image when it was restored with these options and the check inside it
    passed (kept per image id, ``inside``); None sends ``run`` through the whole restore.

    ``run`` needs an image proven to match the lock, not a build context: the image the tag
    names, with the options the restore recorded in its labels, and a kept check that passed
    for this lock. Rendering the context and hashing its wheels again (``context_key``, what
    ``restore`` compares), and listing images by label, are left to ``restore``. ``lock`` may be
    the sealed header (``lock.header``): the tag, the short id and the kept check's key are all
    this needs of it."""
    from envlock.restore import inside

    tag = image_tag(name, lock.short_id)
    info = engine.image(tag)
    if info is None or info.labels.get(LABEL_OPTIONS) != options_key(options) \
            or info.labels.get(LABEL_SHORT_ID) != lock.short_id \
            or LABEL_CONTEXT not in info.labels:
        return None
    kept = inside.find(engine.name, lock, info.id)
    if kept is None or not kept.ok:
        return None
    return Ready(image_id=info.id, tag=tag, python=kept.python,
                 os_packages_restored=kept.restored.os_packages_restored)
