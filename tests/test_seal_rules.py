"""A lock sealed by an earlier envlock, whose id covered process state and the image, is told
apart from an edited one: its content is as sealed, only the id rule changed, and `fmt`
re-seals it. Its twin, a real edit, is still an edit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envlock.commands import main
from envlock.errors import EXIT_OK, EXIT_USAGE, LockTampered
from envlock.lock import load

EARLIER = Path(__file__).parent / "fixtures" / "sealed" / "rich-earlier-id-rule.lock"


def test_a_lock_sealed_under_the_earlier_id_rule_is_named_as_such(tmp_path: Path) -> None:
    lock = tmp_path / "env.lock"
    shutil.copy(EARLIER, lock)
    with pytest.raises(LockTampered, match="sealed by an earlier envlock") as info:
        load(lock)
    assert "fmt" in (info.value.hint or "")
    assert load(lock, verify_seal=False).envlock.integrity  # the content's own seal holds


def test_fmt_reseals_it_and_changes_only_the_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "env.lock"
    shutil.copy(EARLIER, lock)
    before = load(lock, verify_seal=False)
    assert main(["fmt", str(lock)]) == EXIT_OK
    after = load(lock)
    assert after.short_id != before.short_id
    strip = {"envlock": {"fingerprint", "integrity"}}
    assert after.model_dump(exclude=strip) == before.model_dump(exclude=strip)


def test_twin_an_edit_of_the_content_is_still_an_edit(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "env.lock"
    text = EARLIER.read_text(encoding="utf-8")
    edited = text.replace('libc_version = "2.36"', 'libc_version = "2.35"', 1)
    assert edited != text
    lock.write_text(edited, encoding="utf-8")
    assert main(["show", str(lock)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "edited after capture" in err and "earlier envlock" not in err
