"""A compile cache with real torch (CPU, Inductor's C++ backend, the machine's C++ compiler): a
recorded run compiles cold and saves what it compiled; its replay with the cache compiles warm
(Inductor's and AOTAutograd's caches hit), gives the same bits, and its record names the cache it
loaded; a cache of another torch, or a damaged one, is refused and the command never runs.

Every test starts interpreters that import torch and compile (tens of seconds on two cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, needs_tool

from envlock.commands import main
from envlock.probe import compilecache
from envlock.replay.compare import compare_records
from envlock.replay.record import load

pytestmark = pytest.mark.slow

TRAIN = """
import json, os, sys
import torch
import envlock
from torch._dynamo.utils import counters

if os.environ.get("LOAD_IN_PROCESS"):
    print(json.dumps(envlock.load_compile_cache(os.environ["LOAD_IN_PROCESS"])["loaded"]), file=sys.stderr)


def step(x, y):
    return (torch.sin(x) * y + x.cos()).sum(dim=0)


out = torch.compile(step)(torch.arange(64.0).reshape(8, 8) / 7, torch.ones(8, 8) * 0.3)
envlock.record(0, out=out, first=float(out[0]))
with open(os.environ["COUNTERS"], "w") as fh:
    from envlock.probe.compilestate import collect_compile

    json.dump({"inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"]),
               "loaded": collect_compile([]).get("loaded")}, fh)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    needs_tool("g++")  # Inductor's C++ backend compiles with it
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "train.py").write_text(TRAIN)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("COUNTERS", str(tmp_path / "counters.json"))
    # The recording run compiles into an empty cache of its own, never the user's.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cold"))
    return ws


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``run.rec`` and ``compiled.cache``: a run of TRAIN recorded cold with
    ``--save-compile-cache``, as each test's ``project`` would record it, made once for the tests
    that only need such a record and its cache (the cold compile is most of a test's time). The
    test of the recording itself records its own."""
    needs_tool("g++")
    root = tmp_path_factory.mktemp("recorded")
    ws = root / "ws"
    ws.mkdir()
    (ws / "train.py").write_text(TRAIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ws)
        mp.setenv("PYTHONPATH", str(REPO))
        mp.setenv("COUNTERS", str(root / "counters.json"))
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "cold"))
        assert main(["record", "run.rec", "--save-compile-cache", "compiled.cache", "--",
                     sys.executable, "train.py"]) == 0
    assert _counters(ws)["inductor"].get("fxgraph_cache_miss") == 1  # it compiled cold
    return ws


def _take(recorded: Path, project: Path) -> None:
    """The shared record and its cache, copied into this test's project."""
    for name in ("run.rec", "compiled.cache"):
        shutil.copyfile(recorded / name, project / name)


def _counters(project: Path) -> dict[str, Any]:
    path = project.parent / "counters.json"
    found: dict[str, Any] = json.loads(path.read_text())
    path.unlink()
    return found


def test_a_saved_cache_makes_the_replay_compile_warm_with_the_same_bits(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.rec", "--save-compile-cache", "compiled.cache", "--",
                 sys.executable, "train.py"]) == 0
    first = _counters(project)
    assert first["inductor"].get("fxgraph_cache_miss") == 1 and not first["inductor"].get("fxgraph_cache_hit")
    assert first["loaded"] is None
    header, _, digest = compilecache.read("compiled.cache")
    assert header["torch"] and header["artifacts"]["inductor"] >= 1 and header["artifacts"]["aot_autograd"] >= 1
    assert f"saved the compile cache {digest[:12]}" in capfd.readouterr().err

    assert main(["replay", "run.rec", "--json", "--compile-cache", "compiled.cache"]) == 0
    warm = _counters(project)
    assert warm["inductor"].get("fxgraph_cache_hit") == 1 and not warm["inductor"].get("fxgraph_cache_miss")
    assert warm["aot"].get("autograd_cache_hit") == 1
    assert warm["loaded"] == digest  # the process itself says which cache it runs from
    out, err = capfd.readouterr()
    verdict = json.loads(out)
    assert verdict["same"] and verdict["steps_compared"] == 1, err
    # Beside a divergence the replay would name it: cold then, warm from this file now.
    loaded = [c for c in verdict["context"] if c["key"] == "compile.loaded"]
    assert loaded == [{"key": "compile.loaded", "original": None, "replay": digest, "ranks": []}]

    # Replayed without the cache (and into an empty directory) it compiles cold again.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cold-again"))
    assert main(["replay", "run.rec", "--json"]) == 0
    assert _counters(project)["inductor"].get("fxgraph_cache_miss") == 1


def test_load_compile_cache_in_process_then_compile_hits(project: Path, tmp_path: Path, recorded: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _take(recorded, project)
    digest = compilecache.read("compiled.cache")[2]
    env = {**os.environ, "LOAD_IN_PROCESS": "compiled.cache", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh")}
    proc = subprocess.run([sys.executable, "train.py"], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    found = _counters(project)
    assert found["inductor"].get("fxgraph_cache_hit") == 1 and found["loaded"] == digest
    # A damaged file is refused in the process too: CompileCacheRefused, nothing loaded.
    damaged = tmp_path / "damaged.cache"
    damaged.write_bytes(Path("compiled.cache").read_bytes()[:-3])
    proc = subprocess.run([sys.executable, "-c", f"import envlock; envlock.load_compile_cache({str(damaged)!r})"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert "CompileCacheRefused" in proc.stderr and "damaged" in proc.stderr


def test_a_cache_of_another_torch_is_refused_by_the_commands_own_torch(
        project: Path, tmp_path: Path, recorded: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """No lock to judge it by: the loader, under the command's torch, refuses it (exit 2) and
    the command never starts."""
    _take(recorded, project)
    header, payload, _ = compilecache.read("compiled.cache")
    assert payload is not None
    compilecache.write(str(tmp_path / "foreign.cache"), {**header, "torch": "2.0.0"}, payload)
    capfd.readouterr()
    assert main(["replay", "run.rec", "--compile-cache", str(tmp_path / "foreign.cache")]) == 2
    err = capfd.readouterr().err
    triton = f"Triton {header['triton']}" if header["triton"] else "no Triton"
    assert f"made by torch 2.0.0 ({triton}); this environment has torch {header['torch']} ({triton})" in err, err
    assert "nothing was run" in err and not (tmp_path / "counters.json").exists()


def test_a_replay_with_the_cache_names_no_directory_envlock_made(
        project: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Recorded and replayed with ``--compile-cache``, each run loads the cache into a fresh
    temporary directory of envlock's that TORCHINDUCTOR_CACHE_DIR names: a new path at every
    run, which was named as a cause of every such replay. What the runs started from is
    ``compile.loaded``. The caches of these processes, which compiled, are recorded. Its twin:
    a directory the user chose is recorded and named."""
    assert main(["record", "cold.rec", "--save-compile-cache", "compiled.cache", "--",
                 sys.executable, "train.py"]) == 0
    _counters(project)
    digest = compilecache.read("compiled.cache")[2]
    assert main(["record", "warm.rec", "--compile-cache", "compiled.cache", "--", sys.executable, "train.py"]) == 0
    _counters(project)
    warm = load("warm.rec").context
    files = warm["compile.caches.inductor.files"]
    assert warm["compile.loaded"] == digest and isinstance(files, int) and files > 0
    assert "env.TORCHINDUCTOR_CACHE_DIR" not in warm
    capfd.readouterr()
    assert main(["replay", "warm.rec", "--json", "--compile-cache", "compiled.cache"]) == 0
    assert _counters(project)["loaded"] == digest
    verdict = json.loads(capfd.readouterr().out)
    assert verdict["same"] and verdict["context"] == [], verdict["context"]
    # The user's own directory, where the first run compiled cold, is a fact and a cause.
    cold = load("cold.rec").context
    files = cold["compile.caches.inductor.files"]
    assert cold["env.TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cold") and isinstance(files, int) and files > 0
    named = {c.key for c in compare_records(load("cold.rec"), load("warm.rec")).context}
    assert {"env.TORCHINDUCTOR_CACHE_DIR", "compile.loaded"} <= named, named
