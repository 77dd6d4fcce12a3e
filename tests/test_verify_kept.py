"""A plain ``envlock verify`` of an unchanged lock in an unchanged environment is answered by the
one before it (``check/kept``), from the lock's sealed header and the probe's document, without
the models; its output is the same, in text, ``--json`` and ``--all``. Anything that changed (the
environment, the lock, a lock re-sealed by hand over a value the models refuse) is judged by the
models again, and a drift is never kept. A real probe, in-process CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, resealed

from envlock.check import kept
from envlock.commands import main
from envlock.errors import EXIT_DRIFT, EXIT_OK, EXIT_USAGE, LockTampered
from envlock.lock import load, read_data


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lock of this interpreter without torch: verify then never imports it."""
    path = tmp_path_factory.mktemp("kept") / "env.lock"
    assert main(["capture", "--no-torch", "--python", sys.executable, "-o", str(path)]) == EXIT_OK
    return path


@pytest.fixture
def lock_path(captured: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVLOCK_NO_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "env.lock"
    path.write_bytes(captured.read_bytes())
    yield path


def _verify(lock: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a verify."""
    rc = main(["verify", "--python", sys.executable, str(lock), *flags])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every verify judged through the models (``check/local.check``), counted."""
    import envlock.commands.verify as verify_cmd

    calls: list[object] = []
    from envlock.check.local import check as real  # what verify_cmd.check names

    def counting(*a: object, **k: object) -> object:
        calls.append(a)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_cmd, "check", counting)
    return calls


@pytest.mark.parametrize("flags", [[], ["--json"], ["--all"], ["--json", "--all"]])
def test_the_second_verify_is_the_first_one_s_answer(lock_path: Path, judged: list[object], flags: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    first = _verify(lock_path, flags, capsys)
    second = _verify(lock_path, flags, capsys)
    assert first == second and first[0] == EXIT_OK and first[1]
    assert len(judged) == 1  # the second was not judged through the models


def test_a_kept_answer_builds_no_model(lock_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """In a fresh interpreter: the answer comes without pydantic or the models being imported.
    The variables are the child's in both runs (``PYTHONPATH`` is one the lock records)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    code = ("import sys\nfrom envlock.commands import main\n"
            f"rc = main(['verify', '--python', sys.executable, {str(lock_path)!r}])\n"
            "sys.stderr.write(repr([m for m in ('pydantic', 'envlock.lock._model', 'envlock.drift.compare', 'envlock.report.render') "
            "if m in sys.modules]))\nsys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == EXIT_OK and done.stderr.endswith("[]"), done.stdout + done.stderr


def test_twin_a_changed_environment_is_judged_again(lock_path: Path, judged: list[object],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a variable the lock records
    changed = _verify(lock_path, [], capsys)
    assert len(judged) == 2
    shutil.rmtree(Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY)
    assert changed == _verify(lock_path, [], capsys)  # what a verify with nothing kept says
    assert changed[0] == EXIT_DRIFT


def test_twin_a_drift_is_never_kept(lock_path: Path, judged: list[object], capsys: pytest.CaptureFixture[str]) -> None:
    table = read_data(lock_path)
    table["python"] = {**table["python"], "version": "3.0.1"}
    lock_path.write_text(resealed(table), encoding="utf-8")  # a valid lock of another Python
    assert _verify(lock_path, [], capsys)[0] == EXIT_DRIFT
    assert _verify(lock_path, [], capsys)[0] == EXIT_DRIFT
    assert len(judged) == 2
    assert not list((Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY).glob("*.json"))


@pytest.mark.parametrize("edit", [
    {"env": {"HF_TOKEN": "hf_" + "a1B2c3D4e5" * 3}},  # a secret in clear
    {"packages": [{"name": "six ; curl evil", "version": "1.17.0"}]},  # not a distribution's name
])
def test_a_resealed_edit_the_models_refuse_is_refused_after_a_kept_answer(
        lock_path: Path, edit: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """The kept answer is for the lock load() accepted; the edit is another integrity, so the
    models read it and refuse it: never "OK"."""
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    table = read_data(lock_path)
    table.update(edit)
    lock_path.write_text(resealed(table), encoding="utf-8")
    rc, _, err = _verify(lock_path, [], capsys)
    assert rc == EXIT_USAGE and "does not match the lock schema" in err


def test_twin_a_lock_whose_fingerprint_disagrees_is_refused_as_load_refuses_it(
        lock_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    text = lock_path.read_text(encoding="utf-8")
    fingerprint = read_data(lock_path)["envlock"]["fingerprint"]
    lock_path.write_text(text.replace(fingerprint, "sha256:" + "0" * 64), encoding="utf-8")
    rc, _, err = _verify(lock_path, [], capsys)
    with pytest.raises(LockTampered) as refused:
        load(lock_path)
    assert rc == EXIT_USAGE and refused.value.message in err


def test_no_cache_reads_no_kept_answer(lock_path: Path, judged: list[object], monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    monkeypatch.setenv("ENVLOCK_NO_CACHE", "1")
    shutil.rmtree(Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY)
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    assert len(judged) == 3
    assert not (Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY).exists()  # and keeps none


def test_a_lock_replaced_while_it_is_verified_keeps_no_answer(lock_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The header is read, then the file is replaced (another valid lock: a note added) before
    the models read it: the answer given is the new lock's, and it is not kept under the key of
    the lock the header read."""
    import envlock.commands.verify as verify_cmd

    table = read_data(lock_path)
    table["envlock"] = {**table["envlock"], "note": "replaced"}
    other = resealed(table)
    from envlock.check.local import check as real  # what verify_cmd.check names

    def replacing(*a: object, **k: object) -> object:
        lock_path.write_text(other, encoding="utf-8")
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_cmd, "check", replacing)
    assert _verify(lock_path, [], capsys)[0] == EXIT_OK
    assert not list((Path(os.environ["ENVLOCK_CACHE_DIR"]) / kept.DIRECTORY).glob("*.json"))


def test_twin_the_no_cache_option_reads_no_kept_answer(lock_path: Path, judged: list[object],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-cache`` bypasses every cache: nothing is read from the directory."""
    assert _verify(lock_path, ["--no-cache"], capsys)[0] == EXIT_OK
    assert _verify(lock_path, ["--no-cache"], capsys)[0] == EXIT_OK
    assert len(judged) == 2
