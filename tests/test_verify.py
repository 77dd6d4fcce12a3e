"""One verify (``envlock.check.local``): the lock is read once, its tables choose the probe, the
probe runs beside the rest of the work and never outlives the command.

These run the real CLI in-process against a real probe; a wrapper around ``ProbeProcess``
counts the processes started and checks that none is left running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envlock.check.local import probe_wanted, probe_wanted_for
from envlock.commands import main
from envlock.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from envlock.probe.procs import pid_alive
from envlock.probing import process as probeproc
from envlock.probing.capture import StartedProbe


@pytest.fixture()
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[probeproc.ProbeProcess]]:
    """Every ProbeProcess started while the test runs (real ones, only recorded)."""
    started: list[probeproc.ProbeProcess] = []
    real_init = probeproc.ProbeProcess.__init__

    def init(self: probeproc.ProbeProcess, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]  # passed through as given
        started.append(self)

    monkeypatch.setattr(probeproc.ProbeProcess, "__init__", init)
    yield started
    for proc in started:
        proc.cancel()


def _gone(proc: probeproc.ProbeProcess) -> bool:
    return proc.proc.returncode is not None and not pid_alive(proc.proc.pid)


@pytest.fixture(scope="module")
def lock_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lock of this interpreter without torch: verify then never imports it."""
    path = tmp_path_factory.mktemp("verify") / "env.lock"
    assert main(["capture", "--no-torch", "--python", sys.executable, "-o", str(path)]) == EXIT_OK
    return path


@pytest.mark.parametrize(("tables", "torch", "wanted"), [
    ({"python"}, None, (False, False)),
    ({"torch"}, None, (True, False)),
    ({"torch", "canary"}, None, (True, True)),
    ({"torch", "canary"}, False, (False, False)),
    ({"python"}, True, (True, False)),
    ({"canary"}, None, (False, False)),
])
def test_the_lock_s_tables_choose_the_probe(tables: set[str], torch: bool | None,
                                            wanted: tuple[bool, bool]) -> None:
    assert probe_wanted(tables, torch) == wanted


def test_a_lock_already_read_chooses_by_the_sections_it_has() -> None:
    from helpers import full_lock, make_lock

    lock = full_lock()  # torch and canary both recorded
    assert probe_wanted_for(lock) == (True, True)
    assert probe_wanted_for(lock.model_copy(update={"canary": None})) == (True, False)
    assert probe_wanted_for(lock, torch=False) == (False, False)
    assert probe_wanted_for(make_lock()) == (False, False)


def test_verify_starts_one_probe(lock_path: Path, spawned: list[probeproc.ProbeProcess],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--python", sys.executable, str(lock_path)]) == EXIT_OK
    assert "OK: the environment matches the lock" in capsys.readouterr().out
    assert len(spawned) == 1, [p.argv for p in spawned]
    assert "--no-torch" in spawned[0].argv  # the lock has no [torch]: decided from its tables
    assert _gone(spawned[0])


def test_a_lock_that_fails_to_load_leaves_no_probe_running(
        tmp_path: Path, lock_path: Path, spawned: list[probeproc.ProbeProcess],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A key the models refuse, the seal recomputed by hand over it: the sealed header accepts
    it, so the probe starts, and the models refuse it while the probe runs."""
    from helpers import resealed

    from envlock.lock import read_data

    table = read_data(lock_path)
    table["python"] = {**table["python"], "extra": 1}
    tampered = tmp_path / "env.lock"
    tampered.write_text(resealed(table))
    assert main(["verify", "--python", sys.executable, str(tampered)]) == EXIT_USAGE
    assert "unknown key 'extra'" in capsys.readouterr().err
    assert spawned and all(_gone(p) for p in spawned)


def test_twin_a_lock_whose_seal_fails_starts_no_probe(
        tmp_path: Path, lock_path: Path, spawned: list[probeproc.ProbeProcess],
        capsys: pytest.CaptureFixture[str]) -> None:
    tampered = tmp_path / "env.lock"
    tampered.write_text(lock_path.read_text().replace("[python]", "[python]\nextra = 1", 1))
    assert main(["verify", "--python", sys.executable, str(tampered)]) == EXIT_USAGE
    assert "unknown key 'extra'" in capsys.readouterr().err
    assert spawned == []


def test_a_missing_lock_starts_nothing(tmp_path: Path, spawned: list[probeproc.ProbeProcess],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--python", sys.executable, str(tmp_path / "env.lock")]) == EXIT_USAGE
    assert "not found" in capsys.readouterr().err
    assert spawned == []


def test_ctrl_c_while_the_probe_runs_stops_it(
        lock_path: Path, spawned: list[probeproc.ProbeProcess], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(self: StartedProbe) -> object:
        raise KeyboardInterrupt  # Ctrl-C while waiting for the probe's document

    monkeypatch.setattr(StartedProbe, "result", interrupted)
    assert main(["verify", "--python", sys.executable, str(lock_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "envlock: interrupted\n"
    assert len(spawned) == 1 and _gone(spawned[0])


def test_a_usage_error_starts_nothing(
        lock_path: Path, spawned: list[probeproc.ProbeProcess], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(lock_path), "--strickt"]) == EXIT_USAGE
    assert "unrecognized arguments: --strickt" in capsys.readouterr().err
    assert spawned == []


def test_the_probe_starts_before_the_models_and_the_comparator_are_imported(lock_path: Path) -> None:
    """What the overlap is for: the probe's run hides the cost of pydantic and the comparator.
    A fresh interpreter, because this one has imported them all already."""
    from helpers import REPO

    code = ("import sys\n"
            "from envlock.probing import process as probeproc\n"
            "seen = []\n"
            "real = probeproc.ProbeProcess.__init__\n"
            "def init(self, *args, **kwargs):\n"
            "    seen.append(sorted(m for m in ('pydantic', 'envlock.model', 'envlock.drift.compare')\n"
            "                       if m in sys.modules))\n"
            "    real(self, *args, **kwargs)\n"
            "probeproc.ProbeProcess.__init__ = init\n"
            "from envlock.commands import main\n"
            f"rc = main(['verify', '--python', sys.executable, {str(lock_path)!r}])\n"
            "sys.stderr.write(repr(seen))\n"
            "sys.exit(rc)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert out.stderr.endswith("[[]]"), out.stderr


def test_the_lock_being_verified_is_not_an_untracked_file_of_the_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """capture leaves the lock it writes out of [git]; verify leaves out the lock it reads, or
    a lock not committed yet would show as a new untracked file on every verify."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "--no-torch", "--python", sys.executable]) == EXIT_OK
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["verify", "--all", "--python", sys.executable, "../env.lock"]) == EXIT_OK
    assert "git." not in capsys.readouterr().out
    # Its twin: any other new file still counts.
    (tmp_path / "notes.txt").write_text("x")
    assert main(["verify", "--all", "--python", sys.executable, "../env.lock"]) == EXIT_OK
    assert re.search(r"info +git\.untracked +0 -> 1\n", capsys.readouterr().out)


def test_ctrl_c_beside_the_probe_stops_it_and_is_answered_when_envlock_waits(tmp_path: Path) -> None:
    """Wherever Ctrl-C lands while the probe runs (inside a third-party import, say), the probe
    is killed at once and the interrupt is raised where envlock waits on it, at once: the killed
    interpreter is not started again to ask whether it is a Python (this one would hang that
    question out for its 10 s)."""
    fake = tmp_path / "python"
    started = tmp_path / "started"
    # A probe that would hang, and says each time it is started.
    fake.write_text(f"#!/bin/sh\necho started >> {started}\nexec sleep 60\n")
    fake.chmod(0o755)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), StartedProbe(str(fake), torch=False) as probe:
        deadline = time.monotonic() + 60
        # It runs once the line is there (the shell creates the file before it writes to it, and
        # a Ctrl-C between the two would leave it empty); a second start would add a line.
        while not (started.exists() and started.read_text()):
            assert time.monotonic() < deadline, "the probe never started"
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        busy = sum(range(10_000))  # work beside the probe goes on: nothing is raised here
        assert busy and probe.interrupted and probe.process is not None
        assert probe.process.proc.wait(timeout=10) == -signal.SIGKILL
        probe.result()
    assert started.read_text() == "started\n"  # the killed interpreter was not started again
    assert signal.getsignal(signal.SIGINT) is before


def test_an_interrupt_after_the_document_is_still_an_interrupt(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), StartedProbe(sys.executable, torch=False) as probe:
        doc = probe.result()
        assert doc["packages"]
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10_000))
