"""SIGTERM to a real envlock with a real engine: during ``run`` (its container) and during a
build, once and twice. Before, ``kill -TERM`` of ``envlock run`` ended envlock at once: the
container stayed ``Up`` (holding its GPU) and ``run --record`` wrote no record. Now nothing is
left: no container of that envlock process, no image of the interrupted build, no temporary
directory; a record is written, marked interrupted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from envlock.commands import main

from helpers import REPO, reap, stop_with  # isort: skip
from test_restore_integration import _cmdline_has, _no_image, capture, small_source  # noqa: F401  # isort: skip

pytestmark = pytest.mark.integration


class Ready(NamedTuple):
    lock: Path
    options: list[str]
    env: dict[str, str]


@pytest.fixture(scope="module")
def ready(request: pytest.FixtureRequest, base_image: str, wheelhouse: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ready]:
    """The suite's small lock, restored and checked once (a cache hit when another test of the
    session restored it), so that each ``run`` below starts its container at once."""
    root = tmp_path_factory.mktemp("signals")
    cache = root / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
        capture(request.getfixturevalue("small_source"), root / "env.lock")
        options = ["--base", base_image, "--wheelhouse", str(wheelhouse), "--name", "it-small"]
        assert main(["restore", str(root / "env.lock"), *options]) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1", "XDG_CACHE_HOME": str(cache),
           "ENVLOCK_PLAIN_PROGRESS": "1", "ENVLOCK_STOP_SECONDS": "2"}
    yield Ready(root / "env.lock", options, env)


def _owned(client: Any, pid: int) -> list[Any]:
    """Every container (running or not) an envlock process with this pid created here. Sparse:
    the list's own entries, not one inspect each, which fails when envlock removes a short-lived
    container between the list and the inspect."""
    found: list[Any] = client.containers.list(all=True, sparse=True,
                                              filters={"label": f"org.envlock.owner={socket.gethostname()}/{pid}"})
    return found


def _remove(containers: list[Any]) -> None:
    import docker.errors

    for container in containers:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # gone since the list


def _until_running(client: Any, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not [c for c in _owned(client, proc.pid) if c.status == "running"]:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the container never started"
        time.sleep(0.1)
    time.sleep(0.5)  # its command runs


@pytest.mark.parametrize("record, signals", [(False, 1), (True, 2)], ids=["run-once", "record-twice"])
def test_sigterm_during_run_leaves_no_container_and_no_temporary_directory(
        docker_client: Any, ready: Ready, tmp_path: Path, record: bool, signals: int) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = [sys.executable, "-m", "envlock", "run", str(ready.lock), *ready.options, "--gpus", "none",
            "--workspace", str(ws), *(["--record", str(tmp_path / "run.record")] if record else []),
            "--", "sleep", "600"]
    proc = subprocess.Popen(argv, env={**ready.env, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _until_running(docker_client, proc)
        for _ in range(signals - 1):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        _, err = stop_with(proc, signal.SIGTERM, "envlock run")
    finally:
        reap(proc)
        _remove(_owned(docker_client, proc.pid))  # never left for the next test
    assert proc.returncode == 143, err
    assert "envlock: stopping the container (SIGTERM sent; killed after 2 s)" in err
    assert _owned(docker_client, proc.pid) == []
    assert list(tmp.iterdir()) == []
    if record:
        from envlock.replay.record import load

        rec = load(tmp_path / "run.record")
        assert rec.record.interrupted == "SIGTERM" and rec.record.where == "container"
        assert "(marked interrupted)" in err and "cleaning up first" in err


# A real build, stopped as every command is (``commands.main``).
BUILD_UNTIL_STOPPED = """
import sys
from pathlib import Path
from envlock._signals import on_the_way_out, stops_as_interrupt
from envlock.errors import interrupted_exit
from envlock.restore.endpoint import connect
from envlock.restore.progress import PlainProgress

try:
    with stops_as_interrupt(), connect() as engine:
        engine.build(Path(sys.argv[1]), tag=sys.argv[3], labels={}, log_path=Path(sys.argv[2]),
                     progress=PlainProgress(sys.stderr), network=False)
except KeyboardInterrupt as exc:
    on_the_way_out()  # as ``commands.main`` does
    sys.exit(interrupted_exit(exc))
"""


def test_sigterm_twice_during_a_build_leaves_no_image_process_or_temporary_directory(
        docker_client: Any, base_image: str, tmp_path: Path) -> None:
    """BuildKit (the engine's own client, ``auto``'s choice here) building a step that sleeps:
    two SIGTERMs; the client is stopped, the build cancelled, its context directory gone."""
    context = tmp_path / "build" / "context"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text(f"FROM {base_image}\nRUN [\"sh\", \"-c\", \"echo {uuid.uuid4().hex}; "
                                        "sleep 600\"]\n")
    tag = f"envlock-test/stopped:{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1", "ENVLOCK_BUILDER": "cli"}
    proc = subprocess.Popen([sys.executable, "-c", BUILD_UNTIL_STOPPED, str(context), str(tmp_path / "build.log"),
                             tag], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "sleep" in line:
                break
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        _, err = stop_with(proc, signal.SIGTERM, "the stopped build")
    finally:
        reap(proc)
    assert proc.returncode == 143, err
    assert _no_image(docker_client, tag)
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == ["context"]  # no .envlock-build-*
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline_has(pid, tag)]



def _envlock_pid(token: str) -> int | None:
    """The envlock process (``python -m envlock``) whose command line holds ``token``."""
    for pid in os.listdir("/proc"):
        if pid.isdigit() and _cmdline_has(pid, token) and _cmdline_has(pid, "envlock"):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith("python"):
                    return int(pid)
            except OSError:
                continue
    return None


def test_scancel_of_a_run_under_srun_leaves_no_container_and_no_temporary_directory(
        docker_client: Any, ready: Ready, tmp_path: Path) -> None:
    """The acceptance case: ``srun envlock run LOCK -- sleep 600``, then ``scancel``. Slurm sends
    the step's processes SIGTERM (SIGKILL after KillWait); envlock stops and removes its
    container and its temporary directories before that. Before, the container stayed ``Up``
    and the compile cache's directory stayed in TMPDIR."""
    from helpers import unavailable

    conf = os.environ.get("ENVLOCK_TEST_SLURM_CONF")
    if not conf or not Path(conf).is_file():
        unavailable("ENVLOCK_TEST_SLURM_CONF is not set; run scripts/test.sh (it starts a Slurm cluster)",
                    required_env="ENVLOCK_REQUIRE_SLURM")
    assert conf is not None
    tmp, ws = tmp_path / "tmp", tmp_path / "ws"
    tmp.mkdir()
    ws.mkdir()
    job = f"envlock-scancel-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in ready.env.items() if not k.startswith("SLURM_")}
    env.update(SLURM_CONF=conf, TMPDIR=str(tmp))
    srun = subprocess.Popen(["srun", "-N1", "-n1", f"--job-name={job}", sys.executable, "-m", "envlock", "run",
                             str(ready.lock), *ready.options, "--gpus", "none", "--workspace", str(ws), "--",
                             "sleep", "600"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        deadline = time.monotonic() + 120
        while pid is None or not [c for c in _owned(docker_client, pid) if c.status == "running"]:
            assert srun.poll() is None, srun.communicate()
            assert time.monotonic() < deadline, "the job's container never started"
            time.sleep(0.2)
            pid = pid or _envlock_pid(str(ws))
        subprocess.run(["scancel", f"--name={job}"], env=env, check=True, timeout=60)
        _, err = srun.communicate(timeout=60)
        deadline = time.monotonic() + 60
        while _envlock_pid(str(ws)) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if srun.poll() is None:
            subprocess.run(["scancel", f"--name={job}"], env=env, check=False, timeout=60)
            srun.kill()
            srun.communicate()
        left = _owned(docker_client, pid) if pid is not None else []
        _remove(left)
    assert "envlock: stopping the container (SIGTERM sent; killed after 2 s)" in err, err
    assert "Exited with exit code 143" in err, err
    assert left == []
    assert list(tmp.iterdir()) == []
