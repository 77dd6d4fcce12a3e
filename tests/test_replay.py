"""Replaying an experiment changes nothing it was not asked to, and names one environment once:
the id leaves process state out, restore's facts give one verdict, the workspace's locks are
protected in `envlock run`, a lock is found upward, envlock's own wheel is reproducible.
(The same promises with a real engine: ``test_replay_integration.py``.)"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import make_lock

from envlock.commands import main
from envlock.drift.compare import compare
from envlock.drift.expected import Restored, allow, restored_here
from envlock.errors import EnvlockError
from envlock.lock import PROTECTED_ENV, REPLAY_DIR, Lock, find_lock, load, project_root, save


def _process_lock() -> Lock:
    return make_lock(seeds={"seed": 3, "seed_source": "envlock", "torch_initial_seed": 3},
                     determinism={"torch_loaded": True, "deterministic_algorithms": True,
                                  "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "4"},
                                  "process_env": ["CUBLAS_WORKSPACE_CONFIG"]})


def test_process_state_is_outside_the_fingerprint() -> None:
    shell = make_lock(determinism={"torch_loaded": True, "deterministic_algorithms": False,
                                   "env": {"OMP_NUM_THREADS": "4"}})
    process = _process_lock()
    assert shell.envlock.fingerprint == process.envlock.fingerprint
    assert shell.envlock.integrity != process.envlock.integrity


def test_variables_set_before_start_stay_in_the_fingerprint() -> None:
    """Over-exclusion twin: a numerics variable the process inherited is the environment."""
    a = make_lock(determinism={"env": {"OMP_NUM_THREADS": "4"}})
    b = make_lock(determinism={"env": {"OMP_NUM_THREADS": "8"}})
    c = make_lock(determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}})
    assert len({a.envlock.fingerprint, b.envlock.fingerprint, c.envlock.fingerprint}) == 3
    assert make_lock(packages=[("six", "1.16.0")]).envlock.fingerprint != \
        make_lock(packages=[("six", "1.17.0")]).envlock.fingerprint


def test_the_image_identity_is_where_the_stack_ran_not_what_it_is() -> None:
    a = make_lock(image={"in_container": True, "id": "sha256:" + "a" * 64, "source": "env"})
    b = make_lock(image={"in_container": True, "id": "sha256:" + "b" * 64, "source": "env"})
    assert a.envlock.fingerprint == b.envlock.fingerprint
    assert not compare(a, b).ok  # still compared: another image is breaking drift


def test_diff_lists_process_state_apart_and_compares_it_on_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(make_lock(determinism={"torch_loaded": True, "deterministic_algorithms": False,
                                "env": {"OMP_NUM_THREADS": "4"}}), tmp_path / "a.lock")
    save(_process_lock(), tmp_path / "b.lock")
    assert main(["diff", str(tmp_path / "a.lock"), str(tmp_path / "b.lock")]) == 0
    text = capsys.readouterr().out
    assert "describe the same environment" in text and "process state differs" in text
    assert "seeds.seed" in text
    assert main(["diff", str(tmp_path / "a.lock"), str(tmp_path / "b.lock"), "--process-state"]) == 1


# -- one verdict ------------------------------------------------------------------------------


def test_restore_facts_round_trip_and_bind_to_the_lock(tmp_path: Path) -> None:
    lock = make_lock(packages=[("six", "1.16.0")])
    facts = Restored(lock.envlock.fingerprint or "", skipped=("myproj",), own="envlock-ml",
                     os_packages_restored=False)
    path = tmp_path / "restored.json"
    path.write_text(facts.to_json())
    assert restored_here(lock, str(path)) == facts
    other = make_lock(packages=[("six", "1.17.0")])
    assert restored_here(other, str(path)) is None  # another environment: nothing allowed for
    for junk in ("", "[]", '{"skipped": 1}', "{" * 10):
        path.write_text(junk)
        assert restored_here(lock, str(path)) is None


def test_envlock_itself_from_the_restoring_envlock_is_info_its_version_is_not() -> None:
    lock = make_lock(packages=[{"name": "envlock-ml", "version": "0.1.0", "source": "local",
                                "url": "file:///home/me/envlock", "record_sha256": "0" * 64}])
    inside = make_lock(packages=[{"name": "envlock-ml", "version": "0.1.0", "record_sha256": "0" * 64}])
    facts = Restored(lock.envlock.fingerprint or "", own="envlock-ml")
    judged = allow(compare(lock, inside), facts, lock)
    assert judged.ok and {d.severity for d in judged.differences} == {"info"}
    newer = make_lock(packages=[{"name": "envlock-ml", "version": "0.2.0", "record_sha256": "0" * 64}])
    assert not allow(compare(lock, newer), facts, lock).ok
    rebuilt = make_lock(packages=[{"name": "envlock-ml", "version": "0.1.0", "record_sha256": "1" * 64}])
    assert not allow(compare(lock, rebuilt), facts, lock).ok  # another build of a local install


def test_an_editable_envlock_is_judged_by_version_not_by_its_path_hook() -> None:
    lock = make_lock(packages=[{"name": "envlock-ml", "version": "0.1.0", "source": "editable",
                                "url": "file:///home/me/envlock", "record_sha256": "0" * 64}])
    inside = make_lock(packages=[{"name": "envlock-ml", "version": "0.1.0", "record_sha256": "1" * 64}])
    assert allow(compare(lock, inside), Restored("x", own="envlock-ml"), lock).ok


# -- run protects the workspace's locks --------------------------------------------------------


def test_a_save_onto_a_protected_lock_goes_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lock = make_lock(packages=[("six", "1.16.0")])
    target = tmp_path / "env.lock"
    save(lock, target)
    before = target.read_bytes()
    monkeypatch.setenv(PROTECTED_ENV, os.pathsep.join([str(tmp_path / "other.lock"), str(target)]))
    monkeypatch.chdir(tmp_path)
    written = lock.save("env.lock")
    assert written == tmp_path / REPLAY_DIR / "env.lock" and written.is_file()
    assert target.read_bytes() == before
    assert "stays as it is" in capsys.readouterr().err
    # Another lock in the same directory is not protected and is written where asked.
    assert lock.save("mine.lock") == Path("mine.lock") and (tmp_path / "mine.lock").is_file()


def test_a_read_only_mount_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(src: str, dst: str) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(os, "replace", busy)
    with pytest.raises(EnvlockError, match="read-only here") as exc:
        save(make_lock(), tmp_path / "env.lock")
    assert "another name" in (exc.value.hint or "")


def test_run_protects_the_replayed_lock_and_the_workspaces_locks(tmp_path: Path) -> None:
    from envlock.restore.run import protected_locks

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    save(make_lock(), ws / "env.lock")
    save(make_lock(), ws / "sub" / "replayed.lock")
    (ws / "notes.lock").write_text("not a lock of envlock's\n")
    (ws / "link.lock").symlink_to(ws / "env.lock")
    save(make_lock(), tmp_path / "outside.lock")
    found = protected_locks(ws.resolve(), ws / "sub" / "replayed.lock")
    assert found == [(str((ws / "env.lock").resolve()), "/workspace/env.lock"),
                     (str((ws / "sub" / "replayed.lock").resolve()), "/workspace/sub/replayed.lock")]
    assert protected_locks(ws.resolve(), tmp_path / "outside.lock") == found[:1]


# -- the lock is found upward ------------------------------------------------------------------


def test_the_lock_is_found_upward_up_to_the_repository_root(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    deep = repo / "src" / "model"
    deep.mkdir(parents=True)
    (repo / ".git").mkdir()
    assert find_lock(deep) is None and project_root(deep) == repo
    (tmp_path / "env.lock").write_text("")  # above the repository: not this project's
    assert find_lock(deep) is None
    (repo / "env.lock").write_text("")
    assert find_lock(deep) == repo / "env.lock"
    (deep / "env.lock").write_text("")
    assert find_lock(deep) == deep / "env.lock"


def test_commands_read_the_projects_lock_from_a_subdirectory_and_name_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    deep = repo / "src" / "model"
    deep.mkdir(parents=True)
    (repo / ".git").mkdir()
    monkeypatch.chdir(deep)
    assert main(["show"]) == 2
    err = capsys.readouterr().err
    assert "env.lock not found here or in a parent directory" in err
    assert "envlock capture -o ../../env.lock" in err  # the project root, not a second lock here
    save(make_lock(), repo / "env.lock")
    for argv in (["show"], ["fmt", "--check"], ["export", "--to", "intoto"]):
        assert main(argv) == 0, argv
        assert "envlock: reading ../../env.lock" in capsys.readouterr().err
    assert not (deep / "env.lock").exists()
    assert load(repo / "env.lock")


def test_a_missing_lock_outside_a_repository_names_the_search_up_to_the_filesystem_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a repository the search goes on to /, and says so (it used to say "up to .")."""
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    # A temporary directory inside a repository (a CI workspace) ends the search at its root.
    top = next((d for d in deep.parents if os.path.lexists(d / ".git")), Path("/"))
    assert main(["show"]) == 2
    assert f"not found here or in a parent directory (up to {top})" in capsys.readouterr().err


def test_replay_without_arguments_asks_for_the_record_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The command is optional (the recorded one is the default): not named as required."""
    assert main(["replay"]) == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: REC" in err and "cmd" not in err.split("required:")[1]


def test_restore_run_bundle_pack_diff_and_record_read_the_projects_lock_from_a_subdirectory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands._parser import build_parser
    from envlock.commands.run import split_run_args
    from envlock.replay.record import load as load_record

    repo = tmp_path / "repo"
    deep = repo / "src" / "model"
    deep.mkdir(parents=True)
    (repo / ".git").mkdir()
    monkeypatch.chdir(deep)
    python = {"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv",
              "prefix": "/opt/venv", "soabi": "cpython-311-x86_64-linux-gnu"}
    # No lock anywhere: run (even `run -- CMD`) says so in one line, pointing at the project root.
    assert main(["run", "--gpus", "none", "--", "python", "t.py"]) == 2
    assert "envlock capture -o ../../env.lock" in capsys.readouterr().err
    save(make_lock(packages=[], python=python), repo / "env.lock")
    save(make_lock(packages=[("six", "1.17.0")], python=python), deep / "other.lock")
    said = "envlock: reading ../../env.lock"

    # run: with no lock, `--` comes first (after run's options) and the lock is found upward ...
    for argv in (["run", "--", "python", "t.py"], ["run", "--gpus", "none", "--", "python", "t.py"]):
        args = build_parser().parse_args(argv)
        assert split_run_args(args) == ["python", "t.py"] and args.lock == "../../env.lock", argv
        assert said in capsys.readouterr().err
    # ... also without `--`, when the first word names no path and no lock file ...
    args = build_parser().parse_args(["run", "--gpus", "none", "python", "t.py", "--gpus", "all"])
    assert split_run_args(args) == ["python", "t.py", "--gpus", "all"] and args.lock == "../../env.lock"
    assert args.gpus == "none" and said in capsys.readouterr().err
    # ... while a missing lock file is still that lock, reported as missing, not run as a command.
    args = build_parser().parse_args(["run", "missing.lock", "python", "t.py"])
    assert split_run_args(args) == ["python", "t.py"] and args.lock == "missing.lock"
    # ... and a lock given first is that lock, read silently.
    args = build_parser().parse_args(["run", "other.lock", "--gpus", "none", "--", "python", "t.py"])
    assert split_run_args(args) == ["python", "t.py"] and args.lock == "other.lock"
    assert args.gpus == "none" and said not in capsys.readouterr().err

    assert main(["restore", "--base", "python@sha256:" + "b" * 64, "--dockerfile-only", "ctx"]) == 0
    assert said in capsys.readouterr().err and (deep / "ctx" / "Dockerfile").is_file()
    assert main(["bundle", "-o", "wheels", "--wheelhouse", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert said in err and "envlock restore ../../env.lock --wheelhouse wheels" in out
    assert main(["pack", "-o", "pack", "--no-image", "--no-download"]) == 0
    assert said in capsys.readouterr().err and (deep / "pack" / "env.lock").read_bytes() == \
        (repo / "env.lock").read_bytes()
    # diff with one lock: the project's lock against it.
    assert main(["diff", "other.lock"]) == 1
    out, err = capsys.readouterr()
    assert said in err and "six 1.17.0 only in other.lock" in out, out
    # record: the run belongs to the project's lock, named relative to the record.
    assert main(["record", "run.record", "--", sys.executable, "-c", "pass"]) == 0
    assert said in capsys.readouterr().err
    assert load_record(deep / "run.record").record.lock == "../../env.lock"
    # replay reads the lock the record names, and says which.
    assert main(["replay", "run.record"]) == 0
    assert said in capsys.readouterr().err
    assert not (deep / "env.lock").exists()


# -- envlock's own wheel --------------------------------------------------------------------------


@pytest.mark.slow
def test_envlocks_own_wheel_is_reproducible_and_installs_the_same_files(tmp_path: Path) -> None:
    """Built from this source tree twice: the same bytes (restore's cache key covers it); installed
    into a venv and packed again from there: the same bytes once more, so the image gets exactly
    the files the lock's envlock had."""
    from envlock._files import sha256_file
    from envlock.restore.ownwheel import own_wheel

    first, second, third = (tmp_path / n for n in ("a", "b", "c"))
    for d in (first, second, third):
        d.mkdir()
    built = own_wheel(first)
    assert sha256_file(built) == sha256_file(own_wheel(second))
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
    assert "envlock/probe/__main__.py" in names and names[-1].endswith(".dist-info/RECORD")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(built)], check=True, timeout=300)
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); from pathlib import Path; "
            f"from envlock.restore.ownwheel import own_wheel; print(own_wheel(Path({str(third)!r})))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=300, check=True, cwd=tmp_path)
    repacked = Path(out.stdout.strip())
    assert sha256_file(repacked) == sha256_file(built)


@pytest.mark.slow
def test_one_id_from_a_shell_and_in_process(tmp_path: Path) -> None:
    """The same venv (this one, with torch): `envlock capture` from a shell, and a training
    process that seeded everything and turned deterministic() on, give one id."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    shell = subprocess.run([sys.executable, "-m", "envlock", "capture", "-o", "shell.lock",
                            "--python", sys.executable], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600, check=False)
    assert shell.returncode == 0, shell.stderr
    code = ("import envlock; envlock.seed_everything(3); envlock.deterministic(); "
            "envlock.capture().save('process.lock')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    a, b = load(tmp_path / "shell.lock"), load(tmp_path / "process.lock")
    assert b.seeds.seed == 3 and b.determinism.deterministic_algorithms is True
    assert a.envlock.fingerprint == b.envlock.fingerprint
