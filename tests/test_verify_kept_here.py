"""``envlock verify`` run as the program (``python -m envlock``) for its own interpreter answers
a warm verify with the probe run in its own process (``check.kept.probe_here``): no second
interpreter, no models. Each entry is keyed by where its probe ran, so a document of one kind
is never compared with the other's; every change of the environment or the lock is still a
miss, judged through the models by the probe in another interpreter as before. Real files,
real interpreters: each verify is a fresh process that starts as the console script does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import REPO, make_dist, resealed

from envlock.check import kept
from envlock.commands import main
from envlock.errors import EXIT_DRIFT, EXIT_OK
from envlock.lock import read_data

# ``python -m envlock`` as it starts, and what it did: how many probes it started in another
# interpreter and whether pydantic was imported (a judgement through the models).
LAUNCH = """
import atexit, runpy, subprocess, sys
probes = []
start = subprocess.Popen.__init__
def started(self, args, *a, **k):
    probes.extend([1] if any(str(x).rstrip('/').endswith('probe') for x in args) else [])
    start(self, args, *a, **k)
subprocess.Popen.__init__ = started
atexit.register(lambda: sys.stderr.write('\\n@@ %d %s %s\\n' % (
    len(probes), 'pydantic' in sys.modules, 'envlock.lock._header' in sys.modules)))
sys.argv = ['envlock', *sys.argv[1:]]
runpy.run_module('envlock', run_name='__main__', alter_sys=True)
"""


class Ran(NamedTuple):
    rc: int
    out: str
    probes: int  # probes started in another interpreter
    models: bool  # pydantic imported
    header: bool  # the lock's header read (``lock.header``)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock of this interpreter without torch, captured with a distribution ``demo`` 1.0 on a
    directory of ``PYTHONPATH``; every verify of it runs as the program, with these variables."""
    extra = tmp_path / "extra"
    make_dist(extra, "demo", "1.0")
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVLOCK_NO_CACHE", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(extra)]))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["capture", "--no-torch", "--python", sys.executable, "-o", "env.lock"]) == EXIT_OK
    return work


def verify(*flags: str) -> Ran:
    """A verify of ``env.lock`` by ``python -m envlock``, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", LAUNCH, "verify", "--python", sys.executable,
                           *flags, "env.lock"], capture_output=True, text=True, timeout=300, check=False)
    tail = done.stderr.rsplit("\n@@ ", 1)[-1].split()
    assert len(tail) == 3, done.stdout + done.stderr
    return Ran(done.returncode, done.stdout, int(tail[0]), tail[1] == "True", tail[2] == "True")


def forget() -> None:
    shutil.rmtree(Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY, ignore_errors=True)


@pytest.mark.parametrize("flags", [(), ("--json", "--all")])
def test_a_warm_verify_of_the_program_s_own_interpreter_probes_here(workdir: Path, flags: tuple[str, ...]) -> None:
    first = verify(*flags)
    assert first.rc == EXIT_OK and first.probes == 1 and first.models
    second = verify(*flags)
    assert second == first._replace(probes=0, models=False, header=False)


def test_twin_an_answer_kept_by_the_other_probe_is_never_compared(workdir: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A host calling ``main`` probes in another interpreter and keeps its answer; the program
    finds nothing under its own key, and judges."""
    assert main(["verify", "--python", sys.executable, "env.lock"]) == EXIT_OK
    capsys.readouterr()
    assert list((Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY).glob("*.json"))
    ran = verify()
    assert ran.rc == EXIT_OK and ran.probes == 1 and ran.models


def _site(workdir: Path) -> Path:
    return workdir.parent / "extra"


def _install(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dist(_site(workdir), "demo-extra", "2.0")


def _upgrade(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.rmtree(_site(workdir) / "demo-1.0.dist-info")
    make_dist(_site(workdir), "demo", "1.1")


def _remove(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.rmtree(_site(workdir) / "demo-1.0.dist-info")


def _variable(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a variable the lock records


@pytest.mark.slow  # five verifies, each a fresh interpreter
@pytest.mark.parametrize("change", [_install, _upgrade, _remove, _variable])
def test_twin_a_changed_environment_is_a_miss_judged_as_before(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                               change: Callable[[Path, pytest.MonkeyPatch], None]) -> None:
    assert verify().rc == EXIT_OK
    assert verify().probes == 0
    change(workdir, monkeypatch)
    changed = verify()
    assert changed.rc == EXIT_DRIFT and changed.probes == 1 and changed.models
    forget()
    assert verify() == changed  # what a verify with nothing kept says


@pytest.mark.slow
@pytest.mark.parametrize("resealed_note", [True, False])
def test_twin_an_edited_lock_is_judged_again(workdir: Path, resealed_note: bool) -> None:
    """A lock edited and re-sealed, or only its text changed (a comment: the same header): the
    entry is named by the lock's text, so either is judged again before it is answered."""
    assert verify().rc == EXIT_OK and verify().probes == 0
    path = workdir / "env.lock"
    if resealed_note:
        table = read_data(path)
        table["envlock"] = {**table["envlock"], "note": "edited"}
        path.write_text(resealed(table), encoding="utf-8")
    else:
        path.write_text("# reviewed\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    ran = verify()
    assert ran.rc == EXIT_OK and ran.probes == 1 and ran.models
    assert verify() == ran._replace(probes=0, models=False, header=False)


def test_a_program_started_with_a_flag_that_changes_its_path_probes_elsewhere(workdir: Path) -> None:
    """``-s`` (no user site directory): this process's path is not the probe's, so the probe
    runs in another interpreter, every time."""
    for _ in range(2):
        done = subprocess.run([sys.executable, "-s", "-c", LAUNCH, "verify", "--python", sys.executable,
                               "env.lock"], capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == EXIT_OK and done.stderr.rsplit("\n@@ ", 1)[-1].split()[0] == "1"


@pytest.mark.slow
def test_twin_changed_torch_facts_are_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock with torch: the probe here reads torch's facts from the cache the other probe
    wrote, never imports torch; facts that changed are a miss and judged as drift, and with
    none kept the probe in another interpreter answers."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(cache))
    monkeypatch.delenv("ENVLOCK_NO_CACHE", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "--python", sys.executable, "-o", "env.lock"]) == EXIT_OK
    assert "torch" in read_data(tmp_path / "env.lock")
    first = verify()
    assert first.rc == EXIT_OK
    assert verify() == first._replace(probes=0, models=False, header=False)
    facts = next(cache.glob("torch-facts-*.json"))
    entry = json.loads(facts.read_text(encoding="utf-8"))
    entry["facts"]["torch"]["version"] = "2.0.0+cpu"
    facts.write_text(json.dumps(entry), encoding="utf-8")
    changed = verify()
    assert changed.rc == EXIT_DRIFT and changed.probes == 1 and changed.models
    facts.unlink()  # none kept: the probe in another interpreter imports torch
    ran = verify()
    assert ran.rc == EXIT_OK and ran.probes == 1 and ran.models


def test_the_probe_here_never_imports_torch(tmp_path: Path) -> None:
    """With no torch facts kept, the document says so and torch stays unimported: the probe in
    another interpreter is the one that imports it."""
    code = ("import json, sys\nfrom envlock.probing.capture import run_probe_as_fresh\n"
            "from envlock.probe.collect import CACHED_ONLY, collect\n"
            "doc = collect(torch=CACHED_ONLY, cache=True, hash_cache=True)\n"
            "print(json.dumps([run_probe_as_fresh(torch=True) is None, 'torch' in doc,"
            " doc['probe']['errors'].get('torch'), 'torch' in sys.modules]))\n")
    env = {**os.environ, "ENVLOCK_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop("ENVLOCK_NO_CACHE", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == [True, False, "no cached torch facts", False]
