"""``envlock cache list|prune``: restore's entries with their sizes, pruned by age, never
from under a running restore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from envlock.commands import main
from envlock.restore import cachedir


@pytest.fixture
def root(installer_clean: Path) -> Path:
    """Restore's cache with one entry of each kind: an unpacked pack, a build context whose
    wheel is a hard link to the pack's, an envlock wheel, a uv binary, the kept checks inside
    images; and what is not an entry."""
    from envlock.restore.restore import cache_dir

    root = cache_dir()
    pack = root / "packs" / ("pack-" + "0" * 16)
    (pack / "wheels").mkdir(parents=True)
    (pack / "pack.json").write_text("{}")
    (pack / "wheels" / "six.whl").write_bytes(b"w" * 300_000)
    context = root / "demo-0123456789ab" / "context" / "wheels"
    context.mkdir(parents=True)
    os.link(pack / "wheels" / "six.whl", context / "six.whl")
    (root / "demo-0123456789ab" / "build.log").write_bytes(b"l" * 1000)
    (root / "envlock-wheel").mkdir()
    (root / "envlock-wheel" / "envlock_ml-0.1.0-py3-none-any.whl").write_bytes(b"e" * 2000)
    (root / "uv" / "uv-0.9.0-py3-none-manylinux_2_17_x86_64").mkdir(parents=True)
    (root / "uv" / "uv-0.9.0-py3-none-manylinux_2_17_x86_64" / "uv").write_bytes(b"u" * 50_000)
    (root / "inside").mkdir()
    (root / "inside" / ("check-" + "0" * 40 + ".json")).write_bytes(b"k" * 700)
    (root / "charliecloud" / "images").mkdir(parents=True)  # restored images: not an entry
    (root / "charliecloud" / "images" / "big").write_bytes(b"c" * 400_000)
    return root


def _age(path: Path, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(path, (t, t))


def test_list_shows_every_entry_with_its_size_once(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    kinds = {e["kind"]: e["bytes"] for e in listed["entries"]}
    # The wheel the context hard-links from the pack counts once, in the pack.
    assert kinds == {"pack": 300_002, "uv": 50_000, "envlock wheel": 2000, "context": 1000,
                     "kept checks": 700}
    assert listed["total_bytes"] == 353_702 and listed["root"] == str(root)
    assert main(["cache", "list"]) == 0
    text = capsys.readouterr().out
    assert "5 entries, 354 kB, in" in text and "charliecloud" not in text
    assert "demo-0123456789ab" in text and "just now" in text


def test_prune_removes_what_no_restore_used_for_the_age_given(root: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    _age(root / "packs" / ("pack-" + "0" * 16), 40)
    _age(root / "demo-0123456789ab", 10)
    assert main(["cache", "prune", "--older-than", "30d", "--dry-run"]) == 0
    assert "would remove pack" in capsys.readouterr().out
    assert (root / "packs" / ("pack-" + "0" * 16)).is_dir()
    assert main(["cache", "prune", "--older-than", "30d"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 entry, 300 kB" in out and "4 used more recently stay" in out
    assert not (root / "packs" / ("pack-" + "0" * 16)).exists()
    assert (root / "demo-0123456789ab" / "context" / "wheels" / "six.whl").read_bytes() == b"w" * 300_000
    assert main(["cache", "prune", "--older-than", "9"]) == 0  # a bare number is days
    assert not (root / "demo-0123456789ab").exists()
    assert main(["cache", "prune"]) == 0
    assert {p.name for p in root.iterdir()} == {"packs", "envlock-wheel", "uv", "charliecloud"}
    assert (root / "charliecloud" / "images" / "big").is_file()


@pytest.mark.parametrize("age", ["soon", "-1d", "nan", "inf", ""])
def test_a_bad_age_is_a_usage_error(age: str, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "prune", f"--older-than={age}"]) == 2
    assert "is not an age such as 30d" in capsys.readouterr().err
    assert (root / "demo-0123456789ab").is_dir()


def test_prune_refuses_while_a_restore_uses_the_cache(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another envlock process restoring (it holds the cache as a restore does): prune removes
    nothing and says why; once it is gone, prune works."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from envlock.restore import cachedir\n"
         "with cachedir.in_use(Path(sys.argv[1]), print):\n    print('held', flush=True); sys.stdin.read()",
         str(root)], env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert main(["cache", "prune"]) == 3
        err = capsys.readouterr().err
        assert "is using the cache" in err and "nothing was removed" in err
        assert len(cachedir.entries(root)) == 5
    finally:
        holder.communicate("", timeout=60)
    assert main(["cache", "prune"]) == 0
    assert cachedir.entries(root) == []


def test_a_restore_started_during_a_prune_waits_for_it(root: Path) -> None:
    import threading

    waiting, done = threading.Event(), threading.Event()
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        waiting.set()

    def restore() -> None:
        with cachedir.in_use(root, say):
            done.set()

    with cachedir.hold(root, exclusive=True):  # a prune (flock tells file descriptions apart)
        thread = threading.Thread(target=restore)
        thread.start()
        assert waiting.wait(60) and not done.is_set()
    thread.join(60)
    assert done.is_set() and said == ["waiting for `envlock cache prune` to finish"]
