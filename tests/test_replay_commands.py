"""The seams of ``record`` / ``replay`` / ``run --record/--replay`` on this host, with real
processes: a command that cannot run as recorded (another ``python`` on PATH, a missing module)
is named as such, never as a numeric divergence; a signal's exit code is the same in the record
and its replay; tolerances are finite numbers; ``--against`` compares what the two runs read;
a container record keeps the restore options its replay reuses; a record written before these
additions still reads and replays."""

from __future__ import annotations

import json
import os
import venv
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, fake_engine_run
from test_replay_record import hf_repo, meta, rec  # noqa: F401 - hf_repo: the project fixture's

from envlock.commands import main
from envlock.lock import save
from envlock.replay.record import Record, load

FIXTURES = Path(__file__).parent / "fixtures"

# FAIL=start: the import a missing module makes fail, before any step; FAIL=late: an exit
# after two steps; FAIL=signal: killed by SIGTERM after two steps.
SCRIPT = """
import os, signal, sys
if os.environ.get("FAIL") == "start":
    print("about to import", file=sys.stderr)
    import a_module_this_environment_lacks
import envlock
for step in range(3):
    envlock.record(step, loss=0.5 * step)
    if step == 1 and os.environ.get("FAIL") == "late":
        sys.exit(5)
    if step == 1 and os.environ.get("FAIL") == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
open("out.txt", "w").write("done")
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with its own ``.venv`` (no pip: envlock comes from PYTHONPATH, and what a
    recording process runs of it is stdlib-only), activated: a recorded ``python train.py``
    finds its ``python`` on PATH."""
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.csv").write_text("1,2\n")
    venv.create(tmp_path / ".venv", with_pip=False, symlinks=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FAIL", raising=False)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / ".venv" / "bin") + os.pathsep + os.environ.get("PATH", ""))
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path


# -- a command that cannot run as recorded ---------------------------------------------------------


def test_the_record_keeps_the_program_and_the_interpreter_the_command_ran(project: Path) -> None:
    assert main(["record", "run.record", "--", "python", "train.py"]) == 0
    r = load(project / "run.record")
    # The venv's bin/python, not the base interpreter its symlink points at: the venv is what runs.
    assert r.record.program == str(project / ".venv" / "bin" / "python")
    assert r.context["python.executable"] == str(project / ".venv" / "bin" / "python")
    assert r.context["python.prefix"] == str(project / ".venv")


def test_another_python_on_path_is_refused_before_it_runs(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: the recorded bare ``python`` found in another environment ran, failed
    with ModuleNotFoundError, and was reported as "DIVERGED ... 0 steps compared"."""
    assert main(["capture", "--no-torch", "--python", ".venv", "-o", "env.lock"]) == 0
    assert main(["record", "run.record", "--lock", "env.lock", "--", "python", "train.py"]) == 0
    other = project / "other-env" / "bin"
    other.mkdir(parents=True)
    marker = project / "ran"
    (other / "python").write_text(f"#!/bin/sh\ntouch {marker}\necho 'ModuleNotFoundError' >&2\nexit 1\n")
    (other / "python").chmod(0o755)
    monkeypatch.setenv("PATH", str(other) + os.pathsep + os.environ["PATH"])
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 3
    out, err = capsys.readouterr()
    assert f"the recorded command's 'python' runs {other / 'python'} here, but the record ran " \
           f"{project / '.venv' / 'bin' / 'python'} (Python environment {project / '.venv'})" in err
    assert f"hint: activate the environment it ran in ({project / '.venv'}) or a venv restored from its lock " \
           "(envlock restore LOCK|PACK --target venv DIR), or give the command to run after --: envlock replay " \
           f"run.record -- {project / '.venv' / 'bin' / 'python'} ..." in err
    assert "DIVERGED" not in out + err and not marker.exists()
    # The same word given after -- is the same command: refused too; a path is a choice.
    assert main(["replay", "run.record", "--", "python", "train.py"]) == 3
    assert main(["replay", "run.record", "--", str(project / ".venv" / "bin" / "python"), "train.py"]) == 0


def test_the_recorded_python_in_a_venv_restored_from_the_lock_is_the_same_program(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`replay REC -- python train.py` in a venv restored from the record's lock (`restore PACK
    --target venv DIR`, which marks it) runs there: the same environment at another path. A venv
    restored from another lock is still refused, and where the original environment is gone the
    hint sends the user to a restore, not to its path."""
    import shutil

    from envlock.restore.venvtarget import RESTORED

    assert main(["capture", "--no-torch", "--python", ".venv", "-o", "env.lock"]) == 0
    assert main(["record", "run.record", "--lock", "env.lock", "--", "python", "train.py"]) == 0
    restored = project / "restored"
    venv.create(restored, with_pip=False, symlinks=True)
    fingerprint = load(project / "run.record").record.lock_fingerprint
    (restored / RESTORED).write_text(f"{fingerprint}\n")
    monkeypatch.setenv("PATH", str(restored / "bin") + os.pathsep + os.environ["PATH"])
    capsys.readouterr()
    assert main(["replay", "run.record", "--", "python", "train.py"]) == 0
    err = capsys.readouterr().err
    assert f"python runs {restored / 'bin' / 'python'}, in a venv restored from the record's lock" in err
    (restored / RESTORED).write_text("sha256:" + "0" * 64 + "\n")  # another lock's venv
    shutil.rmtree(project / ".venv")
    assert main(["replay", "run.record"]) == 3
    err = capsys.readouterr().err
    hint = err.split("hint: ")[1]
    assert ".venv" not in hint and "envlock replay run.record -- DIR/bin/python ..." in hint, err


def test_a_command_that_fails_before_a_step_is_a_failed_command(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.record", "--output", "out.txt", "--", "python", "train.py"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("FAIL", "start")
    assert main(["replay", "run.record"]) == 3
    out, err = capsys.readouterr()
    assert out.startswith("FAILED: the replayed command exited with 1 before it recorded a step; "
                          "nothing was compared with run.record\n"), out
    assert "    | about to import" in out and "ModuleNotFoundError: No module named " \
           "'a_module_this_environment_lacks'" in out
    assert "DIVERGED" not in out and "lock differences" not in out and "output out.txt" not in out
    assert "ModuleNotFoundError" in err  # the command's stderr still reaches the user as it comes
    assert main(["replay", "run.record", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] == 1 and doc["same"] is False and doc["divergences"] == []
    assert doc["stderr_tail"][-1].startswith("ModuleNotFoundError")


def test_twin_a_command_that_fails_after_its_steps_diverges(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What it recorded is compared: the divergence is the missing step and the exit code."""
    assert main(["record", "run.record", "--", "python", "train.py"]) == 0
    monkeypatch.setenv("FAIL", "late")
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGED" in out and "FAILED" not in out
    assert "3 steps recorded (original) != 2 steps recorded (replay)" in out
    assert "also: exit code of the command: 0 != 5" in out


def test_a_failure_the_original_had_too_is_reproduced(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAIL", "start")
    assert main(["record", "run.record", "--", "python", "train.py"]) == 1
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: the replay reproduced run.record (bit-identical; 0 steps compared)\n")
    assert "  note: both runs failed before recording a step, with exit code 1: the failure is " \
           "what was reproduced\n" in out
    assert main(["replay", "run.record", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["same"] is True and doc["exit_code"] == 1 and doc["failed"] is None


def test_twin_a_replay_that_succeeds_has_no_failure_note(project: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.record", "--", "python", "train.py"]) == 0
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: the replay reproduced run.record") and "note:" not in out


def test_a_signal_is_one_exit_code_in_the_record_and_its_replay(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``record`` mapped a signal (3), ``replay`` compared the raw -15 with it."""
    monkeypatch.setenv("FAIL", "signal")
    assert main(["record", "run.record", "--", "python", "train.py"]) == 3
    assert load(project / "run.record").record.exit_code == 3
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 0
    assert "OK: the replay reproduced run.record (bit-identical; 2 steps compared)" in capsys.readouterr().out


# -- tolerances ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e400", "x"])
def test_a_tolerance_is_a_finite_number_not_below_zero(project: Path, value: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rec([1.0]).save(project / "a.record")
    for option in ("--rtol", "--atol"):
        given = f"{option}={value}"  # argparse takes "-inf" after a space for an option
        assert main(["replay", "a.record", given]) == 2
        assert main(["replay", "a.record", given, "--", "true"]) == 2
        assert main(["replay", "a.record", "--against", "a.record", given]) == 2
        assert main(["run", "env.lock", "--replay", "a.record", given, "--", "true"]) == 2
        assert f"argument {option}: {value!r} is not a finite number >= 0" in capsys.readouterr().err


def test_twin_finite_tolerances_are_taken(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec([1.0]).save(project / "a.record")
    rec([1.0 + 1e-12]).save(project / "b.record")
    assert main(["replay", "a.record", "--against", "b.record", "--rtol", "0", "--atol", "1e-9"]) == 0
    assert "within rtol=0.0 atol=1e-09" in capsys.readouterr().out


# -- replay --against compares the two records' inputs -------------------------------------------


def test_against_compares_what_each_run_read_not_the_disk(project: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "a.record", "--input", "data", "--", "python", "train.py"]) == 0
    (project / "data" / "d.csv").write_text("1,3\n")
    assert main(["record", "b.record", "--input", "data", "--", "python", "train.py"]) == 0
    (project / "data" / "d.csv").write_text("1,2\n")  # the disk holds a.record's data again
    a, b = load(project / "a.record"), load(project / "b.record")
    assert a.inputs[0].sha256 != b.inputs[0].sha256
    capsys.readouterr()
    assert main(["replay", "a.record", "--against", "b.record"]) == 1
    out = capsys.readouterr().out
    assert f"input drift: data content changed: {a.inputs[0].sha256} -> {b.inputs[0].sha256}" in out
    assert main(["replay", "a.record", "--against", "b.record", "--json"]) == 1
    assert [(d["name"], d["what"]) for d in json.loads(capsys.readouterr().out)["inputs"]] == [("data", "content")]


def test_against_names_an_input_only_one_run_read(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "a.record", "--input", "data", "--", "python", "train.py"]) == 0
    assert main(["record", "b.record", "--input", "train.py", "--", "python", "train.py"]) == 0
    capsys.readouterr()
    assert main(["replay", "a.record", "--against", "b.record"]) == 1
    out = capsys.readouterr().out
    assert "input drift: data missing: " in out and "-> not recorded" in out
    assert "input drift: train.py added: not recorded -> " in out


def test_twin_against_with_the_same_inputs_is_ok(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "a.record", "--input", "data", "--", "python", "train.py"]) == 0
    assert main(["record", "b.record", "--input", "data", "--", "python", "train.py"]) == 0
    (project / "data" / "d.csv").write_text("changed since\n")  # the disk is not what is compared
    capsys.readouterr()
    assert main(["replay", "a.record", "--against", "b.record"]) == 0


# -- a record written before these additions -----------------------------------------------------


def test_a_record_of_the_first_format_reads_and_replays(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written by envlock before ``program``, ``[restore]`` and the python context keys."""
    old = project / "old.record"
    old.write_bytes((FIXTURES / "replay-record-v1" / "run.record").read_bytes())
    r = load(old)
    assert r.record.program is None and r.restore is None
    assert main(["replay", "old.record"]) == 0
    assert "OK: the replay reproduced old.record" in capsys.readouterr().out


# -- run --record keeps the restore options, run --replay reuses them ----------------------------


@pytest.fixture
def fake_run(restore_lock: LockFactory, project: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``run`` without an engine: each restore's (args, options, keywords) is kept; the command "runs" by
    writing ``STDERR`` to its stderr and exiting with ``EXIT``."""
    lock = restore_lock(packages=[("six", "1.17.0")])
    save(lock, project / "env.lock")
    seen: list[Any] = []
    command: dict[str, Any] = {"STDERR": b"", "EXIT": 0}

    def run_in_image(*_: Any, **__: Any) -> int:
        opts = _[4]
        if opts.stderr_tail is not None:
            opts.stderr_tail.feed(command["STDERR"])
        return int(command["EXIT"])

    fake_engine_run(monkeypatch, lock, run_in_image, builds=seen)
    seen.append(command)
    return seen


def test_run_replay_reuses_the_restore_options_of_run_record(
        fake_run: list[Any], project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (project / "wheels").mkdir()
    (project / "runs").mkdir()
    token = "hunter2hunter2hunter2"
    assert main(["run", "env.lock", "--base", "python:3.12-slim", "--allow-unpinned-base",
                 "--wheelhouse", "wheels", "--name", "exp1", "--index-url",
                 f"https://me:{token}@index.example/simple", "--record", "runs/r.record",
                 "--", "python", "train.py"]) == 0
    text = (project / "runs" / "r.record").read_text()
    assert token not in text and "index.example" not in text
    kept = load(project / "runs" / "r.record").restore
    assert kept is not None
    assert (kept.base, kept.allow_unpinned_base, kept.wheelhouse, kept.name, kept.withheld) == (
        "python:3.12-slim", True, "../wheels", "exp1", ["index_url"])
    assert kept.index_url is None and kept.skip_local is None
    assert "--index-url held a credential and is not kept in runs/r.record" in capsys.readouterr().err

    # The withheld option must be given again; the others are reused and named in one line.
    assert main(["run", "env.lock", "--replay", "runs/r.record"]) == 2
    assert "runs/r.record was recorded with --index-url, which held a credential" in capsys.readouterr().err
    (project / "elsewhere").mkdir()
    monkeypatch.chdir(project / "elsewhere")
    assert main(["run", "../env.lock", "--name", "exp2", "--index-url", "https://index.example/simple",
                 "--replay", "../runs/r.record"]) == 0
    args, options, _ = fake_run[-1]
    assert (options.base, options.allow_unpinned_base, options.wheelhouse, args.name) == (
        "python:3.12-slim", True, project / "wheels", "exp2")
    assert options.index_url == "https://index.example/simple"
    err = capsys.readouterr().err
    assert (f"envlock: reusing the restore options ../runs/r.record was recorded with: --base "
            f"python:3.12-slim --allow-unpinned-base --wheelhouse {project / 'wheels'}\n") in err


def test_a_record_of_run_pack_names_the_pack_and_its_id_never_the_cache(
        fake_run: list[Any], project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`run PACK --record`: the record holds the pack (relative to the record, as a lock is)
    and its id; the lock unpacked in envlock's cache is not named, nor in replay's hint."""
    from test_restore_run_bundle import make_wheel

    from envlock.export.pack import PackOptions, pack
    from envlock.lock import load as load_lock
    from envlock.restore.packdir import open_pack

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(project / "cache"))
    house = project / "house"
    house.mkdir()
    make_wheel(house, "six", "1.17.0")
    pack(load_lock(project / "env.lock"), project / "env.lock", project / "p.tar",
         PackOptions(wheelhouses=(house,), download=False, image=False), engine=None)
    (project / "runs").mkdir()
    assert main(["run", "p.tar", "--record", "runs/r.record", "--", "python", "train.py"]) == 0
    meta = load(project / "runs" / "r.record").record
    assert meta.pack == "../p.tar" and meta.lock is None
    assert meta.pack_id == open_pack(project / "p.tar", project / "unpacked").id
    assert "cache" not in (project / "runs" / "r.record").read_text()
    capsys.readouterr()
    assert main(["replay", "runs/r.record"]) == 2
    assert "replay it there: envlock run p.tar --replay runs/r.record" in capsys.readouterr().err


def test_twin_a_record_of_a_run_without_restore_options_keeps_none(
        fake_run: list[Any], project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "env.lock", "--record", "r.record", "--", "python", "train.py"]) == 0
    assert load(project / "r.record").restore is None
    assert main(["run", "env.lock", "--replay", "r.record"]) == 0
    assert "reusing" not in capsys.readouterr().err
    args, options, _ = fake_run[-1]
    assert options.base is None and options.wheelhouse is None and args.name is None


def test_a_failed_command_in_the_image_is_a_failed_command(
        fake_run: list[Any], project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = fake_run[0]
    assert main(["run", "env.lock", "--record", "r.record", "--", "python", "train.py"]) == 0
    command.update(STDERR=b"Traceback\nModuleNotFoundError: No module named 'torch'\n", EXIT=1)
    capsys.readouterr()
    assert main(["run", "env.lock", "--replay", "r.record"]) == 3
    out = capsys.readouterr().out
    assert out == ("FAILED: the replayed command exited with 1 before it recorded a step; nothing was "
                   "compared with r.record\n  the last lines of its stderr:\n    | Traceback\n"
                   "    | ModuleNotFoundError: No module named 'torch'\n")


def test_the_restore_options_round_trip_and_an_edit_is_tampering(tmp_path: Path) -> None:
    from envlock.replay.record import RestoreOptions, seal

    r = seal(Record(record=meta(where="container"), restore=RestoreOptions(base="b", skip_local=True)))
    r.save(tmp_path / "r.record")
    assert load(tmp_path / "r.record") == r
    path = tmp_path / "r.record"
    path.write_text(path.read_text().replace('base = "b"', 'base = "c"'))
    from envlock.errors import LockTampered

    with pytest.raises(LockTampered):
        load(path)


# -- the replay's page ---------------------------------------------------------------------------


def test_replay_report_writes_the_page_of_a_real_replay(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                        restore_lock: LockFactory,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``replay --report``: the command really runs again, and the page holds its verdict, both
    commands, the metric's plot and the lock beside the record, folded in."""
    save(restore_lock(), project / "env.lock")
    assert main(["record", "run.record", "--output", "out.txt", "--", "python", "train.py"]) == 0
    capsys.readouterr()
    (project / "out.txt").unlink()
    assert main(["replay", "run.record", "--report", "replay.html"]) == 0
    assert capsys.readouterr().out.startswith("OK: the replay reproduced run.record")
    page = (project / "replay.html").read_text()
    assert '<p class="verdict ok" id="verdict">OK: the replay reproduced run.record' in page
    assert page.count("<figure><svg") == 1 and "out.txt" in page and "[envlock]" in page
    assert (project / "out.txt").exists()


def test_replay_report_without_the_extra_stops_before_the_command_runs(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    assert main(["record", "run.record", "--output", "out.txt", "--", "python", "train.py"]) == 0
    (project / "out.txt").unlink()
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    capsys.readouterr()
    assert main(["replay", "run.record", "--report", "replay.html"]) == 2
    assert "envlock-ml[report]" in capsys.readouterr().err
    assert not (project / "out.txt").exists() and not (project / "replay.html").exists()
