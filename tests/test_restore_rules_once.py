"""Rules that ``restore``, ``run`` and ``pack`` share are written once, and the places that use
them agree: the base a pack recorded, the name its base image is loaded under and what is said
of a pack without one, and the ``envlock/<name>:<id>`` tag. (The build context's line, shared by
both builders, is tested with them in tests/test_restore_clibuild.py.)"""

from __future__ import annotations

import contextlib
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, fake_engine_run

from envlock.commands import main
from envlock.commands.restore import pack_options
from envlock.restore import packdir
from envlock.restore.image import Options, image_tag

from test_pack_restore import BASE_ID, LOCK_IMAGE, RecordingEngine, _pack, _restore  # isort: skip


@pytest.fixture(autouse=True)
def _nothing_of_this_machine(installer_clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No configuration or cache of this machine; uv never taken from the host."""
    monkeypatch.setenv("ENVLOCK_RESTORE_INSTALLER", "pip")


@pytest.mark.parametrize(("recorded", "origin"), [("lock", "lock"), ("table", "table"), ("--base", "--base"),
                                                  ("pulled", "--base"), ("", "--base")])
def test_a_packs_recorded_base_is_read_one_way_by_restore_and_by_pack(recorded: str, origin: str) -> None:
    """``restore PACK`` (``pack_options``) and the Apptainer definition ``pack`` writes plan from
    the same base: its id, its display, its origin (a value no restore writes reads as --base)."""
    base = {"id": BASE_ID, "display": "lab/base:1", "origin": recorded}
    pack = packdir.Pack(Path("/nonexistent"), {"base": base})
    restored = pack_options(Namespace(wheelhouse="wheels", base=None), pack, Options())
    packed = packdir.with_base(Options(), base)
    for opts in (restored, packed):
        assert (opts.base, opts.base_display, opts.base_origin) == (BASE_ID, "lab/base:1", origin)
    assert packdir.with_base(Options(), {}) == Options()
    assert pack_options(Namespace(wheelhouse="wheels", base="my/base:1"), pack, Options(base="my/base:1")).base \
        == "my/base:1"


def _run(monkeypatch: pytest.MonkeyPatch, engine: RecordingEngine, lock: Any, root: Path) -> int:
    """``envlock run PACK -- true`` on ``engine``, the build and the command stood in for."""
    fake_engine_run(monkeypatch, lock, lambda *a, **k: 0)

    @contextlib.contextmanager
    def connect(_: Any) -> Iterator[RecordingEngine]:
        yield engine

    monkeypatch.setattr("envlock.restore.endpoint.connect", connect)
    return main(["run", str(root), "--gpus", "none", "--", "true"])


def _said(err: str, what: str) -> list[str]:
    return [line for line in err.splitlines() if what in line]


def test_restore_and_run_of_a_pack_load_its_base_under_one_name_and_say_the_same(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A pack with its base image: loaded and named ``envlock-pack/base:<id>`` by either command.
    A pack without one (``--no-image``): both say what the build starts from; ``run`` said
    nothing."""
    monkeypatch.chdir(tmp_path)
    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_image = _pack(lock, tmp_path / "a", RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID}))
    without = _pack(lock, tmp_path / "b", None)
    lines: dict[str, list[str]] = {}
    for command in ("restore", "run"):
        engine = RecordingEngine()
        capsys.readouterr()
        code = _restore(monkeypatch, engine, str(with_image)) if command == "restore" \
            else _run(monkeypatch, engine, lock, with_image)
        assert code == 0
        assert engine.loads and engine.images[packdir.base_tag(lock.short_id)] == BASE_ID
        loaded = _said(capsys.readouterr().err, "loaded the base image")
        code = _restore(monkeypatch, RecordingEngine(), str(without)) if command == "restore" \
            else _run(monkeypatch, RecordingEngine(), lock, without)
        assert code == 0
        lines[command] = loaded + _said(capsys.readouterr().err, "the pack holds no base image")
    assert len(lines["restore"]) == 2 and lines["run"] == lines["restore"], lines


def test_the_restored_tag_is_the_one_the_dockerfile_and_dockerfile_only_name(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lock = restore_lock(image=LOCK_IMAGE, packages=[("six", "1.16.0")])
    lock_path = tmp_path / "env.lock"
    lock.save(lock_path)
    tag = image_tag("t", lock.short_id)
    assert tag == f"envlock/t:{lock.short_id}"
    engine = RecordingEngine({"lab/base@" + LOCK_IMAGE["digest"]: BASE_ID})
    assert _restore(monkeypatch, engine, str(lock_path), "--context-dir", str(tmp_path / "work"),
                    "--allow-unpinned-base") == 0
    assert engine.images[tag] == "sha256:" + "ee" * 32  # what the build made is under that tag
    rebuild = (tmp_path / "work" / "context" / "Dockerfile").read_text().splitlines()[1]
    assert f"docker build -t {tag} ." in rebuild, rebuild
    capsys.readouterr()
    assert main(["restore", str(lock_path), "--name", "t", "--dockerfile-only", str(tmp_path / "only")]) == 0
    assert f"docker build -t {tag} " in capsys.readouterr().out
