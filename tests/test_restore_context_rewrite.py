"""A build context envlock wrote is rewritten whole by the next build of the same lock, the OS
package check of a system-Python restore included (its second build failed: "ospkgs.py
appeared while envlock was writing")."""

from __future__ import annotations

from pathlib import Path

from envlock.restore import outdir
from envlock.restore.ospackages import CHECK_SCRIPT


def test_every_file_a_context_can_hold_is_envlocks_to_replace(tmp_path: Path) -> None:
    files = {"Dockerfile": "FROM x\n", "requirements/base.txt": "six==1.17.0\n", CHECK_SCRIPT: "print(1)\n"}
    outdir.write(tmp_path / "ctx", files, {})
    outdir.write(tmp_path / "ctx", {**files, CHECK_SCRIPT: "print(2)\n"}, {}, force=True)
    assert (tmp_path / "ctx" / CHECK_SCRIPT).read_text() == "print(2)\n"
    assert CHECK_SCRIPT in outdir.GENERATED


def test_twin_a_file_of_the_user_next_to_it_still_refuses(tmp_path: Path) -> None:
    import pytest

    from envlock.errors import UsageError

    outdir.write(tmp_path / "ctx", {"Dockerfile": "FROM x\n"}, {})
    (tmp_path / "ctx" / "notes.md").write_text("mine\n")
    outdir.write(tmp_path / "ctx", {"Dockerfile": "FROM y\n"}, {}, force=True)  # only envlock's names go
    assert (tmp_path / "ctx" / "notes.md").read_text() == "mine\n"
    (tmp_path / "ctx" / ".envlock-context").unlink()
    with pytest.raises(UsageError):
        outdir.write(tmp_path / "ctx", {"Dockerfile": "FROM z\n"}, {}, force=True)


def test_a_file_envlock_wrote_and_no_longer_writes_goes(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    outdir.write(ctx, {"Dockerfile": "FROM x\n", "requirements/old.txt": "six\n"}, {})
    (ctx / "requirements" / "mine.txt").write_text("mine\n")
    said: list[str] = []
    outdir.write(ctx, {"Dockerfile": "FROM y\n"}, {}, force=True, say=said.append)
    assert not (ctx / "requirements" / "old.txt").exists()
    assert (ctx / "requirements" / "mine.txt").read_text() == "mine\n"
    assert (ctx / "Dockerfile").read_text() == "FROM y\n"
    assert said and "requirements/mine.txt" in said[0]
    outdir.write(ctx, {"Dockerfile": "FROM z\n"}, {}, force=True)
    assert set(outdir.read_manifest(ctx)) == {"Dockerfile"}

