"""torch.compile's state (``envlock/probe/compilestate.py``): the settings read from config
modules the process imported (never importing them), the Triton version, and each cache
directory's bounded digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers import REPO

from envlock.probe import compilestate


def _fill(directory: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_a_cache_is_digested_by_its_entries_and_sizes(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    _fill(cache, {"fxgraph/ab/entry": b"x" * 10, "triton/0/KERNEL/k.cubin": b"y" * 5})
    first = compilestate.describe_cache("inductor", str(cache))
    assert (first["files"], first["bytes"], len(first["sha256"])) == (2, 15, 64)
    assert "truncated" not in first
    assert compilestate.describe_cache("inductor", str(cache)) == first  # a stable digest
    _fill(cache, {"fxgraph/cd/entry": b"z"})  # a warmer cache
    assert compilestate.describe_cache("inductor", str(cache))["sha256"] != first["sha256"]
    missing = compilestate.describe_cache("triton", str(tmp_path / "none"))
    assert missing == {"kind": "triton", "path": str(tmp_path / "none"), "files": 0, "bytes": 0}


def test_the_digest_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compilestate, "MAX_CACHE_FILES", 3)
    _fill(tmp_path, {f"k{i}": b"." for i in range(5)})
    found = compilestate.describe_cache("triton", str(tmp_path))
    assert found["files"] == 3 and found["truncated"] is True


def test_cache_directories_follow_the_variables_torch_and_triton_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path))
    inductor, triton = (path for _, path in compilestate.cache_dirs())
    assert Path(inductor).name.startswith("torchinductor_")
    assert triton == str(tmp_path / ".triton" / "cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "rel/dir")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "t"))
    assert compilestate.cache_dirs() == [("inductor", os.path.abspath("rel/dir")),
                                         ("triton", str(tmp_path / "t"))]


def test_settings_are_read_only_from_config_modules_already_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torch._inductor.config", "torch._dynamo.config"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert compilestate.read_settings() == {}
    assert "torch._inductor.config" not in sys.modules  # reading never imports them
    config = types.ModuleType("torch._inductor.config")
    config.max_autotune = True  # type: ignore[attr-defined]
    config.max_autotune_gemm_backends = ["ATEN", "TRITON"]  # type: ignore[attr-defined]
    config.cpp = types.SimpleNamespace(simdlen=None, threads=-1)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    assert compilestate.read_settings() == {"inductor.max_autotune": True, "inductor.cpp.threads": -1,
                                            "inductor.max_autotune_gemm_backends": "['ATEN', 'TRITON']"}


def test_the_triton_version_from_the_packages_when_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    packages = [{"name": "numpy", "version": "2.1"}, {"name": "pytorch-triton-rocm", "version": "3.4.0"}]
    assert compilestate.collect_compile(packages)["triton"] == "3.4.0"
    assert "triton" not in compilestate.collect_compile(packages[:1])


READ_INDUCTOR = """
import json, torch
import torch._dynamo.config
import torch._inductor.config as config
config.max_autotune = True
config.fallback_random = True
from envlock.probe.compilestate import read_settings
print(json.dumps(read_settings()))
"""


@pytest.mark.slow  # importing Inductor takes seconds
def test_settings_of_the_real_inductor_config() -> None:
    out = subprocess.run([sys.executable, "-c", READ_INDUCTOR], capture_output=True, text=True,
                         timeout=300, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    settings = json.loads(out.strip().splitlines()[-1])
    assert settings["inductor.max_autotune"] is True and settings["inductor.fallback_random"] is True
    # Every name in the table exists in this torch's config, or it would be silently missing.
    from envlock.probe.rules import COMPILE_SETTINGS

    wanted = {f"{config}.{attr}" for config, attr in COMPILE_SETTINGS}
    assert wanted - set(settings) <= {"inductor.cpp.simdlen"}, wanted - set(settings)  # None: not recorded


NEVER_COMPILES = """
import os
import torch
import envlock
# Imports Inductor (as libraries that ask whether they are compiled do), compiles nothing.
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

x = torch.linspace(0, 1, 64).reshape(8, 8)
envlock.record(0, loss=float((x @ x.T).sum()))
with open(os.environ["CACHE_DIR_OUT"], "w") as fh:
    fh.write(default_cache_dir())
"""


@pytest.mark.slow  # two torch processes
def test_a_process_that_never_compiled_records_no_compile_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Every torch process recorded the user's shared default caches, so another job that
    compiled into them meanwhile was named beside a replay of a script that never compiles
    (``compile.caches.inductor.files: 0 -> 3``). The default directory is torch's own, under a
    private TMPDIR here. Its twin, a process that compiled, is in test_compilecache_torch."""
    from envlock.commands import main
    from envlock.replay.record import load

    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir()
    (ws / "train.py").write_text(NEVER_COMPILES)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("CACHE_DIR_OUT", str(tmp_path / "cache_dir"))
    assert main(["record", "run.rec", "--", sys.executable, "train.py"]) == 0
    default = Path((tmp_path / "cache_dir").read_text())
    assert default.parent == tmp and default.name.startswith("torchinductor_")
    context = load("run.rec").context
    assert "torch.version" in context
    assert not [k for k in context if k.startswith("compile.caches.") or k == "compile.loaded"], context
    # Another job of the same user compiles into the shared default directory meanwhile.
    _fill(default, {"fxgraph/ab/entry": b"x", "aotautograd/cd/entry": b"y", "triton/0/k.so": b"z"})
    capfd.readouterr()
    assert main(["replay", "run.rec", "--json"]) == 0
    verdict = json.loads(capfd.readouterr().out)
    assert verdict["same"] and not [c for c in verdict["context"] if c["key"].startswith("compile.")], verdict
