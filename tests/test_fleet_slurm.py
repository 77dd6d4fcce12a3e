"""verify --fleet and the Slurm --venv job on a real Slurm cluster of four nodes (n1..n4).

scripts/test.sh starts the cluster (munged, slurmctld, four slurmd; scripts/slurm.sh) and exports
ENVLOCK_TEST_SLURM_CONF; without it these tests skip, unless ENVLOCK_REQUIRE_SLURM=1 (set by
test.sh) makes that a failure. A node gets its own environment through the cluster's TaskProlog:
the file ENVLOCK_TEST_NODE_ENV_DIR/NODENAME (``export VIRTUAL_ENV=...``), so n3 can run a venv
with another version of six, and n2 one whose interpreter hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, NoReturn

import pytest
from helpers import REPO, unavailable

pytestmark = pytest.mark.integration


def _unavailable(reason: str) -> NoReturn:
    unavailable(reason, required_env="ENVLOCK_REQUIRE_SLURM")


class Cluster(NamedTuple):
    root: Path
    lock: Path
    same: Path      # venv the lock was captured from (six 1.17.0)
    other: Path     # six 1.16.0
    hang: Path      # a venv whose interpreter never answers
    hang_token: str
    env: dict[str, str]


def _venv(path: Path, six: str, wheelhouse: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install",
                    "-q", "--no-index", "--find-links", str(wheelhouse), f"six=={six}"],
                   check=True, capture_output=True, text=True)
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    conf = os.environ.get("ENVLOCK_TEST_SLURM_CONF")
    if not conf or not Path(conf).is_file():
        _unavailable("ENVLOCK_TEST_SLURM_CONF is not set; run scripts/test.sh (it starts a Slurm cluster)")
    raw = os.environ.get("ENVLOCK_TEST_WHEELHOUSE")
    if not raw or not any(Path(raw).glob("six-1.16.0-*.whl")) or not any(Path(raw).glob("six-1.17.0-*.whl")):
        _unavailable("ENVLOCK_TEST_WHEELHOUSE with six 1.16.0 and 1.17.0 is missing; run scripts/test.sh")
    assert conf is not None and raw is not None
    root = tmp_path_factory.mktemp("fleet")
    same = _venv(root / "venv-same", "1.17.0", Path(raw))
    other = _venv(root / "venv-other", "1.16.0", Path(raw))
    token = f"envlock-test-hang-{uuid.uuid4().hex[:12]}"
    hang = root / "venv-hang"
    (hang / "bin").mkdir(parents=True)
    (hang / "bin" / "python").write_text(f"#!/bin/bash\nexec -a {token} sleep 3600\n")
    (hang / "bin" / "python").chmod(0o755)
    bin_dir = root / "bin"  # `envlock` on PATH for the batch script, as on a login node
    bin_dir.mkdir()
    (bin_dir / "envlock").write_text(f"#!/bin/sh\nexec {sys.executable} -m envlock \"$@\"\n")
    (bin_dir / "envlock").chmod(0o755)
    env = {**os.environ, "SLURM_CONF": conf, "PYTHONPATH": str(REPO), "VIRTUAL_ENV": str(same),
           "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    for name in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        del env[name]
    lock = root / "env.lock"
    subprocess.run([sys.executable, "-m", "envlock", "capture", "--python", str(same), "--no-torch",
                    "-o", str(lock)], check=True, cwd=root, env=env, capture_output=True, text=True)
    yield Cluster(root, lock, same, other, hang, token, env)
    _kill_leftovers(token)


def _leftovers(token: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().startswith(token.encode()):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _kill_leftovers(token: str) -> None:
    for pid in _leftovers(token):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def _node_env(cluster: Cluster, tmp_path: Path, **nodes: str) -> dict[str, str]:
    """The cluster's environment with NODE=TEXT given to each node's TaskProlog."""
    d = tmp_path / "node-env"
    d.mkdir()
    for node, text in nodes.items():
        (d / node).write_text(text)
    return {**cluster.env, "ENVLOCK_TEST_NODE_ENV_DIR": str(d)}


def _fleet(cluster: Cluster, env: dict[str, str], *args: str, cwd: Path,
           launcher: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([*launcher, sys.executable, "-m", "envlock", "verify", str(cluster.lock),
                        "--fleet", *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=300, check=False)
    return r, time.monotonic() - t0


def test_preflight_passes_on_identical_nodes(cluster: Cluster, tmp_path: Path) -> None:
    r, _ = _fleet(cluster, _node_env(cluster, tmp_path), "--nodes", "4", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    assert [(n["node"], n["status"]) for n in doc["nodes"]] == [(f"n{i}", "ok") for i in range(1, 5)]
    (tmp_path / "text").mkdir()
    r, _ = _fleet(cluster, _node_env(cluster, tmp_path / "text"), "--nodes", "4", cwd=tmp_path)
    assert r.returncode == 0 and "all match" in r.stdout and "n[1-4]" in r.stdout


def test_drifted_node_is_named_with_its_difference(cluster: Cluster, tmp_path: Path) -> None:
    env = _node_env(cluster, tmp_path, n3=f"export VIRTUAL_ENV={cluster.other}\n")
    r, _ = _fleet(cluster, env, "--nodes", "4", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[2:]}
    assert "drift" in rows["n3"] and "packages.six.version" in rows["n3"] and "1.17.0 -> 1.16.0" in rows["n3"]
    assert rows["n[1-2,4]"].split()[1] == "ok"


def test_job_exits_1_before_training_when_a_node_drifts(cluster: Cluster, tmp_path: Path) -> None:
    env = _node_env(cluster, tmp_path, n3=f"export VIRTUAL_ENV={cluster.other}\n")
    job = tmp_path / "job.sbatch"
    subprocess.run([sys.executable, "-m", "envlock", "export", str(cluster.lock), "--to", "slurm",
                    "--venv", str(cluster.same), "--nodes", "4", "--command", "touch trained",
                    "-o", str(job)], check=True, env=env, capture_output=True, text=True)
    r = subprocess.run(["sbatch", "--wait", str(job)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    (output,) = tmp_path.glob("envlock-*.out")
    text = output.read_text()
    assert "n3" in text and "six 1.17.0 -> 1.16.0" in text
    assert not (tmp_path / "trained").exists()
    assert not list(tmp_path.glob("envlock-status-*"))


def test_hung_node_is_named_after_the_timeout(cluster: Cluster, tmp_path: Path) -> None:
    env = _node_env(cluster, tmp_path, n2=f"export VIRTUAL_ENV={cluster.hang}\n")
    # Long enough for the healthy nodes' verifies on a loaded machine, where all four share it.
    r, took = _fleet(cluster, env, "--nodes", "4", "--timeout", "12", "--json", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes["n2"]["status"] == "timeout" and "12s" in nodes["n2"]["message"]
    assert all(nodes[n]["status"] == "ok" for n in ("n1", "n3", "n4"))
    assert took < 12 + 10 + 30  # the node's deadline, the grace, and srun's start
    deadline = time.monotonic() + 30
    while _leftovers(cluster.hang_token) and time.monotonic() < deadline:
        time.sleep(0.2)  # slurmstepd reaps the step's processes
    assert not _leftovers(cluster.hang_token)


def test_node_hung_before_envlock_starts_is_named_from_the_allocation(cluster: Cluster, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\ntime.sleep(3600)\n")
    env = _node_env(cluster, tmp_path, n2=f"export PYTHONPATH={site}:{REPO}\n")
    r, took = _fleet(cluster, env, "--timeout", "12", "--json", cwd=tmp_path,
                     launcher=("salloc", "--nodes=4", "--quiet"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert took < 12 + 10 + 30 + 30  # deadline, grace, srun's cancel wait, allocation
    nodes = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes["n2"]["status"] == "timeout"
    assert nodes["n2"]["message"].startswith("did not start envlock within 12 s")
    assert [nodes[n]["status"] for n in ("n1", "n3", "n4")] == ["ok"] * 3


def test_exported_job_runs_on_every_node_and_records_each_outcome(cluster: Cluster, tmp_path: Path) -> None:
    env = _node_env(cluster, tmp_path)
    job = tmp_path / "job.sbatch"
    command = "python -c 'import os, six; print(\"ran\", os.environ[\"SLURMD_NODENAME\"], six.__version__)'"
    subprocess.run([sys.executable, "-m", "envlock", "export", str(cluster.lock), "--to", "slurm",
                    "--venv", str(cluster.same), "--nodes", "4", "--command", command, "-o", str(job)],
                   check=True, env=env, capture_output=True, text=True)
    r = subprocess.run(["sbatch", "--wait", str(job)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, check=False)
    (output,) = tmp_path.glob("envlock-*.out")
    text = output.read_text()
    assert r.returncode == 0, r.stdout + r.stderr + text
    assert "all match" in text
    (status,) = tmp_path.glob("envlock-status-*")
    assert sorted(p.name for p in status.iterdir()) == [f"n{i}.rc" for i in range(1, 5)]
    assert all(p.read_text() == "0\n" for p in status.iterdir())
    for i in range(1, 5):
        assert f"ran n{i} 1.17.0" in text and f"envlock: node n{i}: exit 0" in text
