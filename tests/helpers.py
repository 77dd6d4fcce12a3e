"""Small builders shared by the core tests: fake distributions, minimal locks, CLI runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import pytest

if TYPE_CHECKING:
    from envlock.lock import Lock

REPO = Path(__file__).resolve().parent.parent


def unavailable(reason: str, *, required_env: str = "ENVLOCK_REQUIRE_ENGINE") -> NoReturn:
    """What a test needs is missing: a failure where ``required_env`` is 1, a skip otherwise.

    ``scripts/test.sh`` exports ENVLOCK_REQUIRE_ENGINE=1 before it sets anything up (engines,
    images, wheelhouse, tools, caches), and ENVLOCK_REQUIRE_PODMAN, ENVLOCK_REQUIRE_PODMAN_ROOTLESS
    and ENVLOCK_REQUIRE_SLURM once it has set those up: under it a missing piece is a broken
    setup, never a test quietly left out. A plain ``pytest`` without that setup skips.
    """
    if os.environ.get(required_env) == "1":
        pytest.fail(f"{reason} ({required_env}=1)", pytrace=False)
    pytest.skip(reason)


def needs_tool(name: str) -> str:
    """The path of the program ``name``, which ``scripts/test.sh`` installs (``unavailable``
    without it)."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (scripts/test.sh installs it)")
    return path


def make_dist(
    site: Path,
    name: str,
    version: str,
    *,
    installer: str | None = "pip",
    requested: bool = True,
    direct_url: dict[str, Any] | None = None,
    files: int = 3,
    script: str | None = None,
) -> Path:
    """Write a ``*.dist-info`` directory the way pip leaves one."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test\n\nLong text.\n"
    )
    record = [f"{name.replace('-', '_')}/f{i}.py,sha256=abc{i},{10 + i}" for i in range(files)]
    record.append(f"{dist.name}/METADATA,sha256=def,42")
    if installer:
        (dist / "INSTALLER").write_text(installer + "\n")
        record.append(f"{dist.name}/INSTALLER,sha256=xyz,4")
    if requested:
        (dist / "REQUESTED").write_text("")
        record.append(f"{dist.name}/REQUESTED,,")
    if direct_url is not None:
        (dist / "direct_url.json").write_text(json.dumps(direct_url))
        record.append(f"{dist.name}/direct_url.json,sha256=q,9")
    if script:
        record.append(f"../../../bin/{name},sha256={script},100")
    record.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(record) + "\n")
    return dist


def probe_doc(**sections: Any) -> dict[str, Any]:
    """A minimal probe document; keyword arguments replace whole sections."""
    doc: dict[str, Any] = {
        "image": {"source": "none"},
        "platform": {"os": "Linux", "machine": "x86_64", "libc": "glibc", "libc_version": "2.36",
                     "os_id": "debian", "os_version_id": "12"},
        "python": {"version": "3.11.7", "implementation": "cpython", "prefix_kind": "venv",
                   "soabi": "cpython-311-x86_64-linux-gnu"},
        "determinism": {"torch_loaded": False},
        "seeds": {"hash_randomization": True},
        "env": {},
        "packages": [
            {"name": "numpy", "version": "2.1.0", "installer": "pip", "requested": True},
            {"name": "six", "version": "1.16.0", "installer": "pip", "requested": False},
        ],
        "probe": {"version": 1, "errors": {}},
    }
    doc.update(sections)
    return doc


PackageSpec = tuple[str, str] | dict[str, Any]


def make_lock(*, packages: Sequence[PackageSpec] | None = None, envlock: dict[str, Any] | None = None,
              construct: bool = False, **sections: Any) -> Lock:
    """A sealed Lock as capture builds it (``build_lock``) from ``probe_doc(**sections)``.

    The one lock factory of the tests. Keyword arguments replace whole sections. ``packages``:
    rows as dicts or ``(name, version)`` pairs. ``envlock``: fields of ``[envlock]`` to set
    (``tool_version``, ``note``, ``created_at``; the time is fixed otherwise, so two calls give
    the same lock). ``construct=True`` skips model validation of the package rows
    (``model_construct``), to hand restore values the model itself would have refused.
    """
    from envlock.lock import Meta, Package, seal
    from envlock.probing.capture import build_lock

    if packages is not None:
        rows = [{"name": p[0], "version": p[1]} if isinstance(p, tuple) else dict(p) for p in packages]
        sections["packages"] = [] if construct else rows
    lock = build_lock(probe_doc(**sections))
    meta = Meta.model_validate({**lock.envlock.model_dump(),
                                "created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
                                **(envlock or {})})
    lock = lock.model_copy(update={"envlock": meta})
    if construct and packages is not None:
        lock = lock.model_copy(update={"packages": [Package.model_construct(**row) for row in rows]})
    return seal(lock)


class LockFactory(Protocol):
    """``make_lock`` with some defaults bound (the ``restore_lock`` fixture)."""

    def __call__(self, *, packages: Sequence[PackageSpec] | None = ..., envlock: dict[str, Any] | None = ...,
                 construct: bool = ..., **sections: Any) -> Lock: ...


def full_lock() -> Lock:
    """A sealed Lock with every section filled: loaders and writers see most of the schema."""
    return make_lock(
        git={"commit": "a" * 40, "branch": "main", "remote": "https://example.org/r.git"},
        env={"NCCL_DEBUG": "INFO"},
        torch={"version": "2.13.0", "git_version": "g", "arch_list": ["sm_90"], "cpu_capability": "AVX2",
               "build": {"compiler": "GCC 11.2", "blas": "MKL", "cuda_arch_flags": ["sm_90"],
                         "options": {"USE_CUDA": "ON"}},
               "cuda_libraries": {"cudnn": {"built": "9.20.0", "loaded": "9.20.0"}}},
        os_packages={"manager": "dpkg", "packages": ["libc6:amd64=2.36-9"]},
        gpu={"source": "nvml", "driver": "550", "devices": [
            {"index": 0, "name": "H100", "compute_capability": "9.0", "torch_kernels": "native"}]},
        requires={"cuda_driver": "12.6", "glibc": "2.28", "gpu_archs": ["sm_90"], "cpu_features": ["avx2"]},
        native={"libraries": [
            {"name": "libgomp.so.1", "path": "/v/site/torch/lib/libgomp.so.1", "distribution": "torch",
             "file": "torch/lib/libgomp.so.1"},
            {"name": "libc.so.6", "path": "/usr/lib/x86_64-linux-gnu/libc.so.6", "os_package": "libc6"},
            {"name": "libmkl_rt.so.2", "path": "/opt/conda/lib/libmkl_rt.so.2", "conda_package": "mkl"},
            {"name": "libcudnn.so.9", "path": "/opt/cudnn/libcudnn.so.9", "sha256": "0" * 64},
            {"name": "libold.so", "path": "/opt/libold.so", "deleted": True}],
            "runtimes": [{"api": "blas", "implementation": "mkl", "library": "libmkl_rt.so.2",
                          "path": "/opt/conda/lib/libmkl_rt.so.2", "version": "2024.2", "threading_layer": "intel",
                          "architecture": "Haswell", "num_threads": 8}],
            "runtimes_source": "threadpoolctl"},
        compile={"triton": "3.7.1", "settings": {"inductor.max_autotune": True, "inductor.cpp.simdlen": 512,
                                                 "inductor.max_autotune_gemm_backends": "ATEN,TRITON"},
                 "caches": [{"kind": "inductor", "path": "/tmp/torchinductor_u", "files": 2, "bytes": 10,
                             "sha256": "1" * 64, "truncated": True}]},
        determinism={"torch_loaded": True, "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                     "float32_matmul_precision": "highest"},
        canary={"settings": {"k": "v"}, "errors": {"a": "b"},
                "results": [{"name": "mm", "device": "cpu", "dtype": "float32", "sha256": "0" * 64}]},
        conda={"packages": [{"name": "x", "version": "1", "build": "b", "channel": "c"}],
               "virtual_packages": [{"name": "__glibc", "version": "2.36"}]},
        probe={"version": 1, "errors": {"gpu": "none"}},
        packages=[{"name": "numpy", "version": "2.1.0", "installer": "pip", "requested_revision": "r",
                   "source": "vcs", "vcs": "git", "commit": "c" * 40, "url": "https://h/x.git",
                   "archive_hash": "sha256=ab", "record_sha256": "0" * 64},
                  {"name": "six", "version": "1.16.0", "source": "system", "os_package": "python3-six",
                   "os_package_version": "1.16.0-4"}],
        duplicates=[{"name": "numpy", "version": "1.0", "active_version": "2.1.0", "path_index": 1}],
    )


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m envlock ARGS`` as a user would, capturing text output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [python or sys.executable, "-m", "envlock", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def fake_engine_run(monkeypatch: pytest.MonkeyPatch, lock: Lock, run_in_image: Any, *, cached: bool = True,
                    builds: list[Any] | None = None) -> None:
    """``envlock run`` without an engine: the restore returns at once (``cached``), each build's
    (args, options, keyword arguments) goes to ``builds``, the check inside finds ``lock``, and
    ``run_in_image`` stands for the command in the image."""
    import contextlib
    from collections.abc import Iterator

    from envlock.drift.compare import compare
    from envlock.restore import endpoint
    from envlock.restore import restore as restore_mod
    from envlock.restore import run as run_mod
    from envlock.restore.context import plan
    from envlock.restore.image import Options

    the_plan = plan(lock, Options(base="python@sha256:" + "a" * 64))

    class NoImages:  # an engine that has no image of the lock yet: run restores
        name = "docker"

        def image(self, ref: str) -> None:
            return None

    @contextlib.contextmanager
    def connect(_: Any) -> Iterator[object]:
        yield NoImages()

    def restore_image(args: Any, _lock: Any, options: Any, *_: Any, **kw: Any) -> Any:
        if builds is not None:
            builds.append((args, options, kw))
        return restore_mod.RestoreResult(plan=the_plan, image_id="sha256:" + "c" * 64, tag="envlock/x:1",
                                         cached=cached, seconds=1.0, comparison=None, size=None)

    monkeypatch.setattr(endpoint, "connect", connect)
    monkeypatch.setattr("envlock.commands.run.restore_image", restore_image)
    monkeypatch.setattr(restore_mod, "verify_image_for", lambda *a: (lock, compare(lock, lock)))
    monkeypatch.setattr(run_mod, "run_in_image", run_in_image)


def container_output(client: Any, image: str, command: list[str], **create: Any) -> str:
    """What a container of ``image`` prints on stdout, run to its end and removed; an exit that
    is not 0 fails the test with its stderr.

    Attached before it starts, as ``docker run`` and envlock's own engine do: Podman's logs of a
    container that has just exited may lack their last line (a listing came back without its
    last name), so reading the logs after ``wait``, as docker-py's ``containers.run`` does, races
    with the engine writing them."""
    from docker.utils.socket import STDERR, frames_iter

    from envlock.restore.dockerengine import _close_socket

    container = client.containers.create(image, command, **create)
    out, err = bytearray(), bytearray()
    try:
        sock = client.api.attach_socket(container.id, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 1})
        try:
            container.start()
            for stream, data in frames_iter(sock, False):
                (err if stream == STDERR else out).extend(data)
        finally:
            _close_socket(sock)
        code = int(container.wait().get("StatusCode", 1))
    finally:
        container.remove(force=True)
    if code != 0:
        pytest.fail(f"{' '.join(command)} in {image} exited {code}: {err.decode(errors='replace')}")
    return out.decode()


def remove_image(client: Any, image: Any) -> None:
    """Remove an image by each of its tags, then by id. Removing by id fails while another
    image was built on top of it (the engine refuses even with force), and leaves its tags in
    place; a tag can always be removed, so a test that purges a cache really finds it gone."""
    for tag in list(image.tags):
        try:
            client.images.remove(tag)
        except Exception:
            pass
    try:
        client.images.remove(image.id, force=True)
    except Exception:
        pass


def reap(proc: subprocess.Popen[str]) -> None:
    """A test's clean-up of a process it started: killed if it still runs, then reaped with its
    pipes closed, whatever the test asserted."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def stop_with(proc: subprocess.Popen[str], signum: int, what: str) -> tuple[str, str]:
    """Send ``signum`` to an envlock process and return its (stdout, stderr) once it has exited.
    One that has not exited 120 s later is sent SIGABRT: started with ``PYTHONFAULTHANDLER=1``,
    it prints where each of its threads stood, and the test fails with that, not a bare timeout."""
    import signal

    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"{what} did not stop within 120 s of signal {signum}; where it stood:\n{err}")
    return out or "", err or ""


def resealed(table: dict[str, Any]) -> str:
    """The TOML text of a lock's ``table`` with both hashes recomputed over the table itself, as
    the sealed header (``lock.header``) recomputes them: a hand edit by someone who knows the
    seal. ``created_at`` stays a TOML date-time."""
    from envlock.lock import toml_document
    from envlock.lock._header import _dumped
    from envlock.lock._seal import _fingerprint_of, _integrity_of, sealed_form

    form = sealed_form(_dumped(table))
    meta = {**table["envlock"], "fingerprint": _fingerprint_of(form), "integrity": _integrity_of(form)}
    return toml_document({**table, "envlock": meta})
