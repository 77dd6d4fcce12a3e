"""The check inside a restored image runs once per image: what the probe printed there is kept
per image id (``envlock.restore.inside``) and judged again by the next restore; ``run`` starts
an image whose kept check passed without restoring.

The engine here is a stand-in that counts the probe's runs: the probe's document is the lock's
own tables, so the judgement is the real one (``check/local.judge`` through ``build_lock``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.lock import Lock
from envlock.restore import inside
from envlock.restore import verify as verify_mod
from envlock.restore.context import Plan, plan
from envlock.restore.engine import ImageInfo
from envlock.restore.image import LABEL_CONTEXT, LABEL_OPTIONS, LABEL_SHORT_ID, Options, options_key
from envlock.restore.restore import verify_image_for
from envlock.restore.run import ready_image

IMAGE = "sha256:" + "c" * 64
OTHER = "sha256:" + "d" * 64


class Engine:
    """An engine with one image (``labels`` on the tag) that records every probe it runs."""

    def __init__(self, name: str = "docker", labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.labels = labels or {}
        self.probed: list[str] = []

    def image(self, ref: str) -> ImageInfo | None:
        return ImageInfo(id=IMAGE, tags=(ref,), labels=self.labels) if self.labels else None


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    monkeypatch.delenv("ENVLOCK_NO_CACHE", raising=False)


@pytest.fixture
def lock(restore_lock: LockFactory) -> Lock:
    return restore_lock(packages=[("six", "1.17.0")])


@pytest.fixture
def the_plan(lock: Lock) -> Plan:
    return plan(lock, Options(base="python@sha256:" + "a" * 64))


@pytest.fixture(autouse=True)
def probe(lock: Lock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe inside ``image`` finds the lock's own environment (a document of its tables)."""

    def probe_in_image(engine: Engine, image: str, **_: Any) -> dict[str, Any]:
        engine.probed.append(image)
        doc = lock.model_dump(mode="json", exclude_none=True)
        doc.pop("envlock")
        return doc

    monkeypatch.setattr(verify_mod, "probe_in_image", probe_in_image)


def entries() -> list[Path]:
    return sorted((Path(os.environ["ENVLOCK_CACHE_DIR"]) / "restore" / inside.DIRECTORY).glob("check-*.json"))


def test_the_check_runs_once_per_image_and_is_judged_again(the_plan: Plan) -> None:
    engine: Any = Engine()
    said: list[str] = []
    first = verify_image_for(engine, the_plan, IMAGE, "envlock/x:1", say=said.append)
    second = verify_image_for(engine, the_plan, IMAGE, "envlock/x:1", say=said.append)
    assert engine.probed == [IMAGE]
    assert first[1].ok and second[1] == first[1]
    assert said[0] == "verifying: running the probe inside a fresh container"
    assert said[1].startswith(f"verified before: the check inside {IMAGE[7:19]} ran at ")
    assert len(entries()) == 1


def test_twin_another_image_id_runs_the_check_again(the_plan: Plan) -> None:
    """`docker commit` over the tag, or a rebuild: the tag's image has another id, so another
    key; the first image's entry does not answer for it."""
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "envlock/x:1")
    verify_image_for(engine, the_plan, OTHER, "envlock/x:1")
    assert engine.probed == [IMAGE, OTHER]
    assert len(entries()) == 2


def test_twin_another_lock_or_engine_host_or_probe_runs_it_again(
        the_plan: Plan, lock: Lock, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "t")
    edited = restore_lock(packages=[("six", "1.17.0")], envlock={"note": "edited"})
    assert edited.envlock.integrity != lock.envlock.integrity
    assert inside.find("docker", edited, IMAGE) is None
    assert inside.find("podman", lock, IMAGE) is None
    assert inside.find("docker", lock, IMAGE) is not None
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "elsewhere", "6.1", "#1", "x86_64")))
    assert inside.find("docker", lock, IMAGE) is None
    monkeypatch.undo()
    monkeypatch.setattr("envlock.probe.source.digest", lambda directory=None: "another probe")
    assert inside.find("docker", lock, IMAGE) is None


def test_nothing_is_kept_for_an_image_that_can_change_under_its_id(the_plan: Plan) -> None:
    """A Charliecloud directory image can be edited in place: its check runs every time."""
    engine: Any = Engine(name="charliecloud")
    verify_image_for(engine, the_plan, IMAGE, "t")
    verify_image_for(engine, the_plan, IMAGE, "t")
    assert engine.probed == [IMAGE, IMAGE] and entries() == []


def test_no_cache_runs_the_check_again_and_keeps_it(the_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "t")
    monkeypatch.setenv("ENVLOCK_NO_CACHE", "1")
    verify_image_for(engine, the_plan, IMAGE, "t")
    monkeypatch.delenv("ENVLOCK_NO_CACHE")
    verify_image_for(engine, the_plan, IMAGE, "t")
    assert engine.probed == [IMAGE, IMAGE]


@pytest.mark.parametrize("content", [b"", b"{not json", b"\xff\xfe", b"[]", b'{"format": 1}',
                                     b"9" * 5000, b"[" * 100000])
def test_a_corrupt_entry_is_a_miss_and_is_replaced(the_plan: Plan, content: bytes) -> None:
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "t")
    (path,) = entries()
    path.write_bytes(content)
    _, cmp = verify_image_for(engine, the_plan, IMAGE, "t")
    assert cmp.ok and engine.probed == [IMAGE, IMAGE]
    assert json.loads(path.read_text())["document"]  # written anew


def test_a_kept_document_this_envlock_refuses_runs_the_check_again(the_plan: Plan) -> None:
    """Valid JSON with the right key, but a document no lock can be made of (a hand edit, an
    older probe's field): the probe runs again instead of the restore failing."""
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "t")
    (path,) = entries()
    entry = json.loads(path.read_text())
    entry["document"]["python"]["version"] = "not a version"
    path.write_text(json.dumps(entry))
    _, cmp = verify_image_for(engine, the_plan, IMAGE, "t")
    assert cmp.ok and engine.probed == [IMAGE, IMAGE]


def test_an_unusable_cache_directory_only_costs_the_check(
        the_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache directory that cannot be made (a file is in its place): nothing is kept, the
    check runs each time, nothing fails."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(blocker))
    engine: Any = Engine()
    for _ in range(2):
        _, cmp = verify_image_for(engine, the_plan, IMAGE, "t")
        assert cmp.ok
    assert engine.probed == [IMAGE, IMAGE]


def test_twin_an_entry_in_a_directory_others_can_write_is_not_trusted(
        the_plan: Plan, lock: Lock) -> None:
    """A kept check vouches for an image: one others could have planted is not read."""
    engine: Any = Engine()
    verify_image_for(engine, the_plan, IMAGE, "t")
    (path,) = entries()
    path.parent.chmod(0o777)
    assert inside.find("docker", lock, IMAGE) is None
    path.parent.chmod(0o700)
    assert inside.find("docker", lock, IMAGE) is not None


def test_run_starts_an_image_restored_with_these_options_whose_check_passed(
        the_plan: Plan, lock: Lock) -> None:
    opts = Options(base="python@sha256:" + "a" * 64)
    labels = {LABEL_OPTIONS: options_key(opts), LABEL_SHORT_ID: lock.short_id,
              LABEL_CONTEXT: "sha256:" + "e" * 64}
    engine: Any = Engine(labels=labels)
    assert ready_image(engine, lock, opts, "x") is None  # never checked: run restores and checks
    verify_image_for(engine, the_plan, IMAGE, "t")
    ready = ready_image(engine, lock, opts, "x")
    assert ready is not None
    assert (ready.image_id, ready.tag, ready.python) == (IMAGE, f"envlock/x:{lock.short_id}", the_plan.python)
    assert engine.probed == [IMAGE]


@pytest.mark.parametrize("change", ["options", "short id", "no context", "failed"])
def test_twin_run_restores_when_the_image_is_not_proven_for_these_options(
        the_plan: Plan, lock: Lock, change: str) -> None:
    opts = Options(base="python@sha256:" + "a" * 64)
    labels = {LABEL_OPTIONS: options_key(opts), LABEL_SHORT_ID: lock.short_id,
              LABEL_CONTEXT: "sha256:" + "e" * 64}
    engine: Any = Engine(labels=labels)
    verify_image_for(engine, the_plan, IMAGE, "t")
    if change == "options":
        labels[LABEL_OPTIONS] = options_key(Options(base="python@sha256:" + "b" * 64))
    elif change == "short id":
        labels[LABEL_SHORT_ID] = "0" * 12
    elif change == "no context":
        del labels[LABEL_CONTEXT]
    else:
        kept = inside.find("docker", lock, IMAGE)
        assert kept is not None
        inside.keep("docker", lock, IMAGE, python=kept.python, restored=kept.restored,
                    document=kept.document, ok=False)
    assert ready_image(engine, lock, opts, "x") is None
