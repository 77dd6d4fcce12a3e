"""A training run recorded in the lock's restored image, then replayed there, with a real engine
and real torch (CPU).

The example trains with ``envlock.record(step, loss=loss)`` and saves its weights; ``envlock run
--record`` keeps every loss, the weights' sha256, a data directory's digest and a Hugging Face
cache revision. A replay as recorded is bit-identical (exit 0); one with another thread count
diverges (exit 1) and names the first step and the thread settings beside it; an edited data file
and a moved revision are named as drift. envlock reaches the container through the workspace
(a copy of the package beside the script), since the image holds only the lock's packages.
Then two gloo ranks under ``torchrun`` in the same image: each rank's context is kept, and a
variable set on rank 1 only is named with its rank.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from test_replay_record import REV1, REV2, hf_repo
from test_restore_integration import TORCH, build_source_image, capture, no_leftover_containers

from envlock.commands import main
from envlock.replay.record import load

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def torch_image(docker_client: Any, base_image: str, wheelhouse: Path) -> str:
    return build_source_image(docker_client, base_image, wheelhouse, TORCH,
                              {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "envlock-test/src-torch")


@pytest.fixture
def untag(docker_client: Any) -> Any:
    """The restored image's tag of this test is removed afterwards (the image stays while
    another tag, such as another test's, still names it)."""
    yield
    try:
        for image in docker_client.images.list(name="envlock/it-replay-record"):
            for tag in image.tags:
                if tag.startswith("envlock/it-replay-record:"):
                    docker_client.images.remove(tag, noprune=True)
    except Exception as exc:  # best effort: a busy engine may time out; the tag is harmless
        print(f"could not untag envlock/it-replay-record: {exc}")


def numerics_change(context: dict[str, Any]) -> tuple[str, str]:
    """A variable that changes a CPU run's numbers on this machine, and the line of the lock
    differences that its effect must show in: with several threads, one thread; on one core,
    where the thread count cannot change, torch's scalar kernels instead of its vector ones."""
    threads = int(context.get("determinism.num_threads", 1))
    if threads > 1:
        return "OMP_NUM_THREADS=1", f"determinism.num_threads: {threads} -> 1"
    return "ATEN_CPU_CAPABILITY=default", f"torch.cpu_capability: {context['torch.cpu_capability']} -> DEFAULT"


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    shutil.copy(REPO / "examples" / "train_mnist_like.py", ws / "train.py")
    shutil.copytree(REPO / "envlock", ws / "envlock", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "data").mkdir()
    (ws / "data" / "labels.csv").write_text("0,1,2\n")
    hf_repo(ws / "hf" / "hub", "org/tiny", REV1, {"config.json": "c" * 40, "model.safetensors": "d" * 64})
    return ws


def test_record_then_replay_in_the_image(docker_client: Any, base_image: str, wheelhouse: Path,
                                         torch_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capfd: pytest.CaptureFixture[str], untag: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    ws = _workspace(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(ws / "hf" / "hub"))
    capture(torch_image, ws / "env.lock")
    lock_bytes = (ws / "env.lock").read_bytes()
    common = [str(ws / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-replay-record", "--context-dir", str(tmp_path / "work"), "--workspace", str(ws)]
    rec = str(ws / "run.record")
    train = ["python", "train.py", "--save", "model.pt", "--workers", "0"]
    # A first run builds (or reuses) the image, so the timings below are the runs alone.
    assert main(["run", *common, "--", "python", "-c", "import torch"]) == 0
    capfd.readouterr()

    started = time.perf_counter()
    assert main(["run", *common, "--record", rec, "--output", "model.pt", "--input", "data",
                 "--input", "hf:org/tiny", "--", *train]) == 0
    recorded_s = time.perf_counter() - started
    record = load(rec)
    assert record.record.where == "container" and record.record.command == train
    assert [s.step for s in record.steps] == list(range(16))
    assert all(isinstance(s.metrics["loss"], float) for s in record.steps)
    assert record.outputs[0].path == "model.pt" and record.outputs[0].sha256
    assert {i.name for i in record.inputs} == {"data", "hf:models/org/tiny@main"}
    assert record.context["process.world_size"] == 1 and record.context["determinism.deterministic_algorithms"]
    assert record.record.lock == "env.lock"
    capfd.readouterr()

    # The replay reuses the record's --base, --wheelhouse and --name: the same image, no rebuild.
    started = time.perf_counter()
    assert main(["run", str(ws / "env.lock"), "--context-dir", str(tmp_path / "work"), "--workspace", str(ws),
                 "--replay", rec]) == 0
    replayed_s = time.perf_counter() - started
    out, err = capfd.readouterr()
    assert "OK: the replay reproduced" in out and "bit-identical; 16 steps compared" in out, out + err
    assert (f"reusing the restore options {rec} was recorded with: --base {base_image} --wheelhouse "
            f"{os.path.abspath(wheelhouse)} --name it-replay-record\n") in err, err
    assert (ws / "env.lock").read_bytes() == lock_bytes

    # One numerics change: another thread count (or, on one core, the scalar CPU kernels).
    change, effect = numerics_change(record.context)
    assert main(["run", *common, "--replay", rec, "-e", change]) == 1
    out, err = capfd.readouterr()
    assert "DIVERGED" in out and "first divergence: step " in out, out + err
    explained = out.split("lock differences that can explain it", 1)[1]
    assert change.split("=")[0] in explained and effect in explained, explained

    # Inputs: an edited data file and a moved Hugging Face revision are drift.
    (ws / "data" / "labels.csv").write_text("0,1,3\n")
    hf_repo(ws / "hf" / "hub", "org/tiny", REV2, {"config.json": "c" * 40, "model.safetensors": "e" * 64})
    assert main(["run", *common, "--replay", rec]) == 1
    out, err = capfd.readouterr()
    assert "input drift: data content changed" in out, out + err
    assert f"input drift: hf:models/org/tiny@main revision changed: {REV1} -> {REV2}" in out
    assert "first divergence" not in out  # the run itself reproduced
    _two_ranks(ws, common, capfd)
    _traced_from_the_start(ws, common, capfd)
    no_leftover_containers(docker_client)
    timings = {"record_s": round(recorded_s, 1), "replay_s": round(replayed_s, 1)}
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    print("replay timings", json.dumps(timings), os.cpu_count(), "cpus")


RANKS = """
import torch
import torch.distributed as dist

import envlock

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
x = torch.randn(2, 4_000_000)  # a sum over millions of elements is split across threads
for step in range(2):
    loss = (x[rank] * (step + 1)).sum()
    each = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(each, loss)
    envlock.record(step, rank_losses=torch.stack(each))
dist.destroy_process_group()
"""
# torchrun sets OMP_NUM_THREADS=1 for every rank; this wrapper gives rank 1 two threads when asked.
LAUNCH = """if [ "$RANK" = 1 ] && [ -n "$RANK1_THREADS" ]; then export OMP_NUM_THREADS=$RANK1_THREADS; fi
exec python ranks.py
"""


def _two_ranks(ws: Path, common: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    (ws / "ranks.py").write_text(RANKS)
    (ws / "launch.sh").write_text(LAUNCH)
    rec = str(ws / "ranks.record")
    assert main(["run", *common, "--record", rec, "--", "torchrun", "--nproc_per_node=2", "--no-python",
                 "sh", "launch.sh"]) == 0
    record = load(rec)
    assert record.context["process.world_size"] == 2 and record.ranks is not None
    assert [r.rank for r in record.ranks] == [1] and record.ranks[0].context["process.rank"] == 1
    assert record.code is not None and record.code.files is not None and "ranks.py" in record.code.files
    capfd.readouterr()
    assert main(["run", *common, "--replay", rec]) == 0
    assert main(["run", *common, "--replay", rec, "-e", "RANK1_THREADS=2"]) == 1
    out, err = capfd.readouterr()
    explained = out.split("lock differences that can explain it", 1)[1]
    assert "    rank 1: env.OMP_NUM_THREADS: 1 -> 2\n" in explained, out + err
    assert "    rank 1: determinism.num_threads: 1 -> 2\n" in explained


# Reads a config file, a variable and (in a child Python process) a file and a module found
# through the PYTHONPATH given with -e, all before its first envlock.record() call.
CONFIGURED = """
import json, os, subprocess, sys
lr = float(os.environ.get("LR", json.load(open("cfg.json"))["lr"]))
child = subprocess.run([sys.executable, "-c", "import extra; print(len(open('child.txt').read()) + extra.K)"],
                       capture_output=True, text=True, check=True).stdout
import envlock
x = 1.0
for step in range(2):
    x = x - lr * x + int(child)
    envlock.record(step, loss=x)
"""


def _traced_from_the_start(ws: Path, common: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    """In the container every Python process is traced from its start (the hook mounted into
    it): a config file, a variable and a child's reads before the first ``envlock.record``
    call are in ``[reads]``, nothing is ``late``, the ``PYTHONPATH`` given is kept and recorded
    without the hook, a replay as recorded names nothing, and one with the config and the
    variable changed names both and says nothing went unseen."""
    started = time.perf_counter()
    (ws / "configured.py").write_text(CONFIGURED)
    (ws / "cfg.json").write_text(json.dumps({"lr": 0.1}))
    (ws / "child.txt").write_text("four")
    (ws / "extra").mkdir()
    (ws / "extra" / "extra.py").write_text("K = 3\n")
    rec = str(ws / "configured.record")
    path = ["-e", "PYTHONPATH=/workspace/extra"]
    assert main(["run", *common, *path, "--record", rec, "--", "python", "configured.py"]) == 0
    record = load(rec)
    reads = record.reads
    assert reads is not None and reads.late is None, reads
    assert {"cfg.json", "child.txt", "extra/extra.py"} <= set(reads.files), reads.files
    assert reads.unset is not None and "LR" in reads.unset
    assert record.context["env.PYTHONPATH"] == "/workspace/extra"
    capfd.readouterr()
    assert main(["run", *common, *path, "--replay", rec]) == 0
    (ws / "cfg.json").write_text(json.dumps({"lr": 0.2}))
    assert main(["run", *common, *path, "-e", "LR=0.3", "--replay", rec]) == 1
    out, err = capfd.readouterr()
    explained = out.split("lock differences that can explain it", 1)[1]
    assert "cfg.json changed" in explained and "LR read by the run: (unset) -> 0.3" in explained, out + err
    assert "not looked at" not in out, out
    print(f"traced from the start: 3 runs in {time.perf_counter() - started:.1f} s")
