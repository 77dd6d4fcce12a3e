"""The fast paths that read a lock's sealed header instead of the models: ``run`` starting an
image proven for the lock. They answer only where an answer was kept for a lock ``load()``
accepted; a lock the models refuse (edited, its fingerprint wrong, or re-sealed by hand over a
value they refuse) is refused as ``load()`` refuses it, and nothing runs.

The engine is a stand-in with one image whose kept check is the real one (``verify_image_for``
on the lock's own tables, judged by ``check/local.judge``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from helpers import LockFactory, resealed

from envlock.commands import main
from envlock.errors import EXIT_USAGE
from envlock.lock import Header, Lock, read_data, save
from envlock.lock import toml_document as document
from envlock.restore import endpoint
from envlock.restore import run as run_mod
from envlock.restore import verify as verify_mod
from envlock.restore.context import plan
from envlock.restore.engine import ImageInfo
from envlock.restore.image import LABEL_CONTEXT, LABEL_OPTIONS, LABEL_SHORT_ID, Options, options_key
from envlock.restore.restore import verify_image_for

if TYPE_CHECKING:
    from envlock.restore.engine import ContainerEngine

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "sha256:" + "c" * 64
BASE = "python@sha256:" + "a" * 64


class Engine:
    """One image, tagged for the lock with these options' labels."""

    name = "docker"

    def __init__(self, lock: Lock) -> None:
        self.labels = {LABEL_OPTIONS: options_key(Options(base=BASE)),
                       LABEL_SHORT_ID: lock.short_id,
                       LABEL_CONTEXT: "sha256:" + "e" * 64}

    def image(self, ref: str) -> ImageInfo | None:
        return ImageInfo(id=IMAGE, tags=(ref,), labels=self.labels)


@pytest.fixture
def proven(restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Any]]:
    """A lock, an image proven for it (its check kept), and the locks ``run_in_image`` got."""
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVLOCK_NO_CACHE", raising=False)
    lock = restore_lock(packages=[("idna", "3.10"), ("six", "1.17.0")], env={"OMP_NUM_THREADS": "4"})
    path = save(lock, tmp_path / "env.lock")

    def probe_in_image(engine: Any, image: str, **_: Any) -> dict[str, Any]:
        doc = lock.model_dump(mode="json", exclude_none=True)
        doc.pop("envlock")
        return doc

    monkeypatch.setattr(verify_mod, "probe_in_image", probe_in_image)
    engine = Engine(lock)
    verify_image_for(cast("ContainerEngine", engine), plan(lock, Options(base=BASE)), IMAGE, "t")  # what a restore keeps

    @contextlib.contextmanager
    def connect(_: Any) -> Iterator[Engine]:
        yield engine

    got: list[Any] = []

    def run_in_image(engine: Any, known: Any, *a: Any, **k: Any) -> int:
        got.append(known)
        return 0

    def no_restore(*a: Any, **k: Any) -> Any:
        raise AssertionError("the proven image was not found: run restored")

    monkeypatch.setattr(endpoint, "connect", connect)
    monkeypatch.setattr(run_mod, "run_in_image", run_in_image)
    monkeypatch.setattr("envlock.commands.run.restore_image", no_restore)
    monkeypatch.chdir(tmp_path)
    return path, got


def test_run_starts_the_proven_image_from_the_header_alone(proven: tuple[Path, list[Any]]) -> None:
    path, got = proven
    assert main(["run", str(path), "--base", BASE, "--", "true"]) == 0
    assert len(got) == 1 and isinstance(got[0], Header) and got[0].lock is None  # no model built
    assert got[0].short_id == read_data(path)["envlock"]["fingerprint"].split(":")[1][:12]
    assert dict(got[0].env) == {"OMP_NUM_THREADS": "4"}


# What a run of a proven image never needs: the models, the training process's runtime
# (``restore/run`` reads one constant of ``envlock.runtime``), and restore's planning
# (``restore/image`` holds what a proven image is found by).
NOT_ON_THE_RUN_PATH = ("pydantic", "envlock.lock._model", "envlock.runtime.recorder", "envlock.runtime.replay",
                       "importlib.metadata", "envlock.restore.context", "envlock.restore.dockerfile",
                       "envlock.restore.restore", "envlock.restore.ospackages", "envlock.restore.ownwheel",
                       "packaging")


def test_the_run_path_imports_no_pydantic_before_the_engine() -> None:
    """What ``run`` imports on its way to a proven image: the command, the endpoint, the proven
    image's lookup, the kept check and the run itself. None of it may import what
    ``NOT_ON_THE_RUN_PATH`` names."""
    modules = ["envlock.commands.run", "envlock.commands.restore", "envlock.restore.endpoint",
               "envlock.restore.image", "envlock.restore.inside", "envlock.restore.run",
               "envlock.replay.compilecache", "envlock.commands._recording"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print([m for m in {(*NOT_ON_THE_RUN_PATH, 'docker')!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def _resealed(path: Path, edit: dict[str, Any]) -> None:
    """``path`` with ``edit`` applied to its tables and both hashes recomputed over them: a hand
    edit by someone who knows the seal."""
    table = read_data(path)
    for key, value in edit.items():
        table[key] = value
    path.write_text(resealed(table), encoding="utf-8")


@pytest.mark.parametrize("edit", [
    {"env": {"OMP_NUM_THREADS": "4", "HF_TOKEN": "hf_" + "a1B2c3D4e5" * 3}},  # a secret in clear
    {"packages": [{"name": "six ; curl evil", "version": "1.17.0"}]},  # not a distribution's name
])
def test_a_resealed_edit_the_models_refuse_never_runs(proven: tuple[Path, list[Any]], edit: dict[str, Any],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path, got = proven
    _resealed(path, edit)
    assert main(["run", str(path), "--base", BASE, "--", "true"]) == EXIT_USAGE
    assert not got
    assert "does not match the lock schema" in capsys.readouterr().err


def test_a_lock_whose_fingerprint_disagrees_is_refused_as_load_refuses_it(
        proven: tuple[Path, list[Any]], capsys: pytest.CaptureFixture[str]) -> None:
    path, got = proven
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('"OMP_NUM_THREADS" = "4"', '"OMP_NUM_THREADS" = "8"')
                    if '"OMP_NUM_THREADS" = "4"' in text else text.replace('OMP_NUM_THREADS = "4"', 'OMP_NUM_THREADS = "8"'),
                    encoding="utf-8")
    assert path.read_text(encoding="utf-8") != text
    assert main(["run", str(path), "--base", BASE, "--", "true"]) == EXIT_USAGE
    assert not got
    assert "edited after capture" in capsys.readouterr().err


def test_twin_a_table_rewritten_with_the_same_content_still_runs_through_the_models(
        proven: tuple[Path, list[Any]]) -> None:
    """Rows reordered: the table no longer hashes to its seal, the models' form still does. The
    header comes from the models and the proven image is found all the same."""
    path, got = proven
    table = read_data(path)
    table["packages"] = list(reversed(table["packages"]))
    path.write_text(document(table), encoding="utf-8")
    assert main(["run", str(path), "--base", BASE, "--", "true"]) == 0
    assert len(got) == 1 and isinstance(got[0], Header) and got[0].lock is not None


@pytest.mark.parametrize("remembered", [False, True])
def test_a_proven_run_imports_no_model_in_a_fresh_interpreter(proven: tuple[Path, list[Any]],
                                                              remembered: bool) -> None:
    """The whole command in a fresh interpreter, the engine a stand-in with the proven image: the
    run reaches the engine having imported neither pydantic nor the models (naming
    ``lock.load`` is enough to import them), nor does the run itself in an image whose venv was
    restored onto another base (the variable it sets is the comparator's). ``remembered``: an
    earlier ``restore --base`` of the lock left its options for a plain run; given again, the
    proven image is found as given, and the remembered ones (read through the models) are not
    needed."""
    path, _ = proven
    if remembered:
        import argparse

        from envlock.commands._recording import remember_restore_options
        from envlock.lock import header

        args = argparse.Namespace(base=BASE, wheelhouse=None, index_url=None, allow_http=False,
                                  allow_unpinned_base=False, skip_local=False, venv=None, python=None,
                                  engine=None, name=None)
        remember_restore_options(args, header(path).short_id, str(path))
        assert any((Path(os.environ["ENVLOCK_CACHE_DIR"])).rglob("*.json"))
    code = f"""
import contextlib, sys
from envlock.lock import header
from envlock.restore import endpoint
from envlock.restore import run as run_mod
from envlock.restore.engine import ImageInfo, RunResult
from envlock.restore.image import LABEL_CONTEXT, LABEL_OPTIONS, LABEL_SHORT_ID, Options, options_key

short = header({str(path)!r}).short_id
labels = {{LABEL_OPTIONS: options_key(Options(base={BASE!r})), LABEL_SHORT_ID: short,
          LABEL_CONTEXT: "sha256:" + "e" * 64}}

class Engine:
    name = "docker"
    def image(self, ref):
        return ImageInfo(id={IMAGE!r}, tags=(ref,), labels=labels)
    def run(self, spec, on_stdout=None, on_stderr=None):
        sys.stderr.write(repr([m for m in {NOT_ON_THE_RUN_PATH!r} if m in sys.modules]))
        return RunResult(0, b"", b"")

@contextlib.contextmanager
def connect(_):
    yield Engine()

def run_in_image(*a, **k):
    sys.stderr.write(repr([m for m in {NOT_ON_THE_RUN_PATH!r} if m in sys.modules]))
    return 0

real_run_in_image = run_mod.run_in_image
endpoint.connect = connect
run_mod.run_in_image = run_in_image
from envlock.commands import main
rc = main(["run", {str(path)!r}, "--base", {BASE!r}, "--gpus", "none", "--", "true"])
real_run_in_image(Engine(), header({str(path)!r}), {IMAGE!r}, "t", run_mod.RunOptions(command=["true"], gpus="none"),
                  python="/opt/venv/bin/python", os_packages_restored=False)
sys.exit(rc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0 and done.stderr.endswith("[][]"), done.stdout + done.stderr
