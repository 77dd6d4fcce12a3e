"""``export -o`` replaces a file only when envlock can prove it wrote it (its marker line, with
the format and the lock id, or in JSON its field), never creates a link's target, and reports
every write error in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.commands.export import written_by_envlock
from envlock.errors import UsageError
from envlock.export.common import has_marker, marker
from envlock.lock import load, save

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example/lab/train@{DIGEST}"
# (format, extra arguments): every format that needs no package index.
FORMATS = [("slurm", ["--command", "python train.py", "--image", IMAGE]),
           ("k8s", ["--command", "python train.py", "--image", IMAGE]),
           ("apptainer", ["--image", IMAGE]),
           ("intoto", []),
           ("cyclonedx", [])]
# Files users keep next to a lock, each naming envlock somewhere near the top.
USER_FILES = {
    "pyproject.toml": '[project]\nname = "mine"\ndependencies = ["envlock-ml>=1.0", "torch"]\n',
    "job.sbatch": "#!/bin/bash\n#SBATCH --gpus=1\nenvlock verify env.lock && python train.py\n",
    ".pre-commit-config.yaml": "repos:\n- repo: local\n  hooks:\n  - id: envlock\n"
                               "    entry: envlock verify env.lock\n",
    "README.md": "# mine\n\nThe environment is locked with envlock (`envlock-export`).\n",
    "sbom.json": json.dumps({"bomFormat": "CycloneDX", "metadata": {"tools": [{"name": "envlock"}],
                             "properties": [{"name": "envlock:id", "value": "x"}]}}),
    "statement.json": json.dumps({"_type": "https://in-toto.io/Statement/v1",
                                  "predicateType": "https://example.org/not-envlock",
                                  "predicate": {"envlock": {"fingerprint": "sha256:00"}}}),
}


@pytest.fixture
def lock_path(restore_lock: LockFactory, tmp_path: Path) -> Path:
    lock = restore_lock(image={"in_container": True, "source": "env", "reference": "registry.example/lab/train:v1",
                               "digest": DIGEST}, packages=[("six", "1.17.0")])
    return save(lock, tmp_path / "env.lock")


def _export(lock_path: Path, fmt: str, extra: list[str], *more: str) -> int:
    return main(["export", str(lock_path), "--to", fmt, *extra, *more])


@pytest.mark.parametrize(("fmt", "extra"), FORMATS)
def test_every_export_carries_its_proof_and_is_replaced_freely(
        lock_path: Path, tmp_path: Path, fmt: str, extra: list[str]) -> None:
    out = tmp_path / f"out.{fmt}"
    assert _export(lock_path, fmt, extra, "-o", str(out)) == 0
    text = out.read_text()
    short_id = load(lock_path).short_id
    if fmt in ("intoto", "cyclonedx"):
        json.loads(text)
    else:
        assert has_marker(text) and f"format={fmt} lock={short_id}" in text
    if fmt == "slurm":
        assert text.startswith("#!/bin/bash\n")  # the shebang stays first
    assert written_by_envlock(out)
    out.write_text(text + "\n")  # its own earlier export: replaced without --force
    assert _export(lock_path, fmt, extra, "-o", str(out)) == 0
    assert out.read_text() == text


@pytest.mark.parametrize("name", sorted(USER_FILES))
@pytest.mark.parametrize(("fmt", "extra"), FORMATS[:1] + FORMATS[3:])
def test_a_user_file_naming_envlock_is_refused_without_force(
        lock_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str, fmt: str, extra: list[str]) -> None:
    user = tmp_path / name
    user.write_text(USER_FILES[name])
    assert not written_by_envlock(user)
    assert _export(lock_path, fmt, extra, "-o", str(user)) == 2
    assert user.read_text() == USER_FILES[name]
    err = capsys.readouterr().err
    assert "not written by envlock export" in err and "--force" in err
    assert _export(lock_path, fmt, extra, "-o", str(user), "--force") == 0
    assert user.read_text() != USER_FILES[name]


def test_the_marker_must_be_a_line_of_its_own_near_the_top(lock_path: Path) -> None:
    lock = load(lock_path)
    line = f"# {marker('slurm', lock)}"
    assert has_marker(f"#!/bin/sh\n{line}\n")
    assert not has_marker(f"echo '{line}'\n")  # quoted inside a command
    assert not has_marker("\n" * 20 + line)  # far below the head
    assert not has_marker(f"# see {marker('slurm', lock)}\n")


def test_a_fifo_in_place_of_the_output_is_refused_without_blocking(
        lock_path: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "job.sbatch"
    os.mkfifo(fifo)
    assert not written_by_envlock(fifo)
    assert _export(lock_path, *FORMATS[0], "-o", str(fifo)) == 2


def test_a_dangling_link_never_creates_its_target(lock_path: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "elsewhere" / "planted.sh"
    target.parent.mkdir()
    link = tmp_path / "job.sbatch"
    link.symlink_to(target)
    assert _export(lock_path, *FORMATS[0], "-o", str(link)) == 2
    assert not target.exists() and link.is_symlink()
    assert "symbolic link" in capsys.readouterr().err
    # The lock writer (capture -o, fmt) refuses the same way.
    lock_link = tmp_path / "new.lock"
    lock_link.symlink_to(tmp_path / "elsewhere" / "new.lock")
    with pytest.raises(UsageError, match="never creates a link's target"):
        save(load(lock_path), lock_link)
    assert not (tmp_path / "elsewhere" / "new.lock").exists()


def test_a_link_to_an_export_updates_its_target(lock_path: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.sbatch"
    assert _export(lock_path, *FORMATS[0], "-o", str(real)) == 0
    link = tmp_path / "job.sbatch"
    link.symlink_to(real)
    assert _export(lock_path, *FORMATS[0], "-o", str(link)) == 0
    assert link.is_symlink() and written_by_envlock(real)


def test_bundle_into_an_unwritable_place_is_one_line(restore_lock: LockFactory, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lock = save(restore_lock(packages=[("six", "1.17.0")]), tmp_path / "env.lock")
    house = tmp_path / "house"
    house.mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where a directory should be: fails even for root
    code = main(["bundle", str(lock), "-o", str(blocker / "bundle"), "--wheelhouse", str(house)])
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("envlock: error: cannot write the bundle to ") and len(err.splitlines()) == 1
    assert "internal error" not in err


def test_any_write_error_is_one_line(lock_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever command meets a read-only or full place: one line naming the file, exit 3."""
    import errno

    from envlock.commands import fmt

    def read_only(_: object) -> int:
        raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/env.lock\n")

    monkeypatch.setattr(fmt, "run", read_only)
    assert main(["fmt", str(lock_path)]) == 3
    err = capsys.readouterr().err
    assert err == "envlock: error: /mnt/ro/env.lock\\n: Read-only file system\n"
