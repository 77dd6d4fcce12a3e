"""The Apptainer definition a pack carries: built from the pack's base archive and wheels, with
no network, and inert whatever the lock holds (no Apptainer here: the text is what is tested)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.errors import EnvlockError
from envlock.export import apptainer
from envlock.export.pack import PackOptions, pack
from envlock.restore import context as ctx
from envlock.restore.image import Options
from envlock.restore.restore import prepare

from test_restore_run_bundle import make_wheel  # isort: skip

DIGEST = "sha256:" + "ab" * 32
IMAGE = {"reference": "registry.example/lab/train:1", "digest": DIGEST}
SECTIONS = ("%files", "%post", "%environment", "%labels", "%runscript")


def _sections(text: str) -> list[str]:
    """Every line that opens a section (Apptainer: a line starting with ``%``)."""
    return [line for line in text.splitlines() if line.startswith("%")]


@pytest.fixture
def house(tmp_path: Path) -> Path:
    d = tmp_path / "house"
    d.mkdir()
    for name, version in [("six", "1.16.0"), ("pip", "23.0.1"), ("setuptools", "66.1.1")]:
        make_wheel(d, name, version)
    return d


def test_a_pack_carries_a_definition_that_builds_from_its_own_files(
        restore_lock: LockFactory, house: Path, tmp_path: Path, installer_clean: Path) -> None:
    lock = restore_lock(image=IMAGE, determinism={"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}})
    lock_path = tmp_path / "env.lock"
    lock.save(lock_path)
    out = tmp_path / "pack"
    pack(lock, lock_path, out, PackOptions(wheelhouses=(house,), download=False, image=False), engine=None)
    text = (out / apptainer.DEFINITION).read_text()
    assert json.loads((out / "pack.json").read_text())["apptainer"] == apptainer.DEFINITION
    assert apptainer.DEFINITION in (out / "SHA256SUMS").read_text()
    # Without a saved base (--no-image) the base comes by digest; the wheels from the pack.
    assert f"Bootstrap: docker\nFrom: registry.example/lab/train@{DIGEST}\n" in text
    assert _sections(text) == list(SECTIONS)
    assert "    wheels /tmp/envlock-wheels/pack\n" in text
    installs = [line for line in text.splitlines() if " -m pip install " in line]
    assert installs and all("--no-index --find-links /tmp/envlock-wheels/pack" in line for line in installs)
    assert "/opt/venv/bin/python -m pip install" in text and "python3 -m venv /opt/venv" in text
    copied = [line.split()[0] for line in text.splitlines() if line.startswith("    apptainer/requirements/")]
    assert copied, text
    for src in copied:
        assert (out / src).is_file()
        assert "six==1.16.0" in (out / src).read_text() or "pip==" in (out / src).read_text()
    assert "export CUBLAS_WORKSPACE_CONFIG=:4096:8" in text
    assert "export PATH=/opt/venv/bin:\"$PATH\"" in text
    assert text.rstrip().endswith('exec "$@"')


def test_with_the_base_archive_it_bootstraps_from_the_archive(restore_lock: LockFactory, house: Path) -> None:
    from envlock.restore.wheelhouse import select

    lock = restore_lock(image=IMAGE)
    options = Options(wheelhouse=house, base="sha256:" + "cd" * 32, base_origin="lock",
                          base_display="registry.example/lab/train:1")
    plan = ctx.plan(lock, options, None, select(house, lock.packages))
    text = apptainer.pack_definition(plan, archive="image/base.docker.tar", wheels_dir="wheels")[apptainer.DEFINITION]
    assert text.splitlines()[2:4] == ["Bootstrap: docker-archive", "From: image/base.docker.tar"]
    assert "org.opencontainers.image.base.name registry.example/lab/train:1" in text


PAYLOADS = ["\n%post\n    zqpwn", "\n%runscript\nzqpwn", "%files /etc/passwd /x", "{{ zq }}", "$(zqpwn)",
            "`zqpwn`", "'; zqpwn; '", "\r%post zqpwn", "\u2028%post", "a\x85%post"]


def _definition(restore_lock: LockFactory, house: Path, **sections: Any) -> str | None:
    """The pack's definition for a lock of ``sections``; None when the lock model itself refuses
    the value (it never reaches a lock, let alone a definition), or when preparing or rendering
    refuses it, which must be a usage error (exit 2)."""
    try:
        lock = restore_lock(**sections)
    except EnvlockError:
        return None
    try:
        plan, _ = prepare(lock, Options(wheelhouse=house, base="sha256:" + "cd" * 32), None)
        return apptainer.pack_definition(plan, archive="image/base.docker.tar",
                                         wheels_dir="wheels")[apptainer.DEFINITION]
    except EnvlockError as exc:
        assert exc.exit_code == 2
        return None


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("where", ["env", "venv", "image"])
def test_a_hostile_lock_value_is_refused_or_inert(payload: str, where: str, restore_lock: LockFactory,
                                                 house: Path) -> None:
    sections: dict[str, Any] = {"image": IMAGE}
    if where == "env":
        sections["determinism"] = {"env": {"XLA_FLAGS": payload}}
    elif where == "venv":
        sections["python"] = {"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv",
                              "prefix": "/opt/" + payload, "soabi": "cpython-311-x86_64-linux-gnu"}
    else:
        sections["image"] = {"reference": "registry.example/" + payload, "digest": DIGEST}
    text = _definition(restore_lock, house, **sections)
    if text is None:
        return
    assert _sections(text) == list(SECTIONS)
    assert "zqpwn" not in text or all("zqpwn" not in w for w in _bare_words(text))
    assert "{{" not in text and "}}" not in text


def _bare_words(text: str) -> list[str]:
    """The words a shell would run in %post and %environment, quoted ones excluded."""
    words: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") and not line.startswith("    #"):
            try:
                words += [w for w in shlex.split(line, posix=True) if re.search(r"[`$;|&]", w)]
            except ValueError:
                words.append(line)
    return words


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=1, max_size=40))
def test_any_env_value_reads_back_as_written_or_is_refused(restore_lock: LockFactory, house: Path,
                                                          value: str) -> None:
    text = _definition(restore_lock, house, image=IMAGE, determinism={"env": {"XLA_FLAGS": value}})
    if text is None:
        return
    assert _sections(text) == list(SECTIONS)
    line = next(x for x in text.splitlines() if x.startswith("    export XLA_FLAGS="))
    assert shlex.split(line.strip())[1] == f"XLA_FLAGS={value}"
