"""Whose cache: an entry vouches for a file (its hash, its torch build, an index's hashes), so
only the caller's own entries, in a directory of the caller's own, are read or written.

Real directories and real owners: the tests run as root and hand files to ``nobody``.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, LockFactory
from packaging.version import Version

from envlock.errors import UsageError
from envlock.export import index
from envlock.probe import cache, filehashes, statcache
from envlock.probe.packages import record_sha256
from envlock.probing.process import parse_document
from envlock.restore.engine import BuildMode

ROOT = hasattr(os, "getuid") and os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="handing a file to another user needs root")
# An entry as the probe writes it: what import torch told, and the libraries it mapped (none).
FACTS = {"torch": {"version": "2.5.0", "cuda": "99.9-poisoned"}, "determinism": {}, "libraries": [],
         "library_stats": []}


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(directory))
    monkeypatch.setattr(statcache, "SETTLE_NS", 0)
    return directory


def test_own_private_directory_is_used(home: Path) -> None:
    assert statcache.refusal() is None
    cache.cache_write("a" * 64, FACTS)
    assert cache.cache_read("a" * 64) == FACTS


def test_missing_directory_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "new" / "deeper"))
    assert statcache.refusal() is None
    cache.cache_write("a" * 64, FACTS)
    for level in (tmp_path / "new", tmp_path / "new" / "deeper"):
        assert level.stat().st_mode & 0o077 == 0
    assert cache.cache_read("a" * 64) == FACTS


def test_world_writable_directory_is_neither_read_nor_written(home: Path) -> None:
    cache.cache_write("a" * 64, FACTS)
    home.chmod(0o777)  # ENVLOCK_CACHE_DIR=/shared, mode 0777: anyone could have written it
    assert "writable by other users" in (statcache.refusal() or "")
    assert cache.cache_read("a" * 64) is None
    cache.cache_write("b" * 64, FACTS)
    assert not list(home.glob("torch-facts-bbbb*"))
    home.chmod(0o1777)  # sticky does not help: an entry planted first would still be read
    assert statcache.refusal() is not None


def test_group_writable_directory_is_refused(home: Path) -> None:
    home.chmod(0o770)
    assert statcache.refusal() is not None


@needs_root
def test_directory_of_another_user_is_refused(home: Path) -> None:
    cache.cache_write("a" * 64, FACTS)
    os.chown(home, _nobody(), -1)
    assert "belongs to uid" in (statcache.refusal() or "")
    assert cache.cache_read("a" * 64) is None


@needs_root
def test_entry_of_another_user_is_ignored(home: Path) -> None:
    """The reported attack: a torch-facts entry written by someone else in the caller's view."""
    cache.cache_write("a" * 64, FACTS)
    (entry,) = home.glob("torch-facts-*.json")
    os.chown(entry, _nobody(), -1)
    assert cache.cache_read("a" * 64) is None
    os.chown(entry, os.getuid(), -1)
    assert cache.cache_read("a" * 64) == FACTS


def test_entry_others_could_write_is_ignored(home: Path) -> None:
    cache.cache_write("a" * 64, FACTS)
    (entry,) = home.glob("torch-facts-*.json")
    entry.chmod(0o666)
    assert cache.cache_read("a" * 64) is None


def test_link_or_fifo_in_place_of_an_entry_is_ignored_without_blocking(home: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": cache.CACHE_FORMAT, "key": "a" * 64, "facts": FACTS}))
    target.chmod(0o600)
    os.symlink(target, home / f"torch-facts-{'a' * 32}.json")
    assert cache.cache_read("a" * 64) is None
    os.mkfifo(home / f"torch-facts-{'b' * 32}.json", 0o600)
    assert cache.cache_read("b" * 64) is None  # opened without blocking, then refused


def test_oversized_entry_is_ignored(home: Path) -> None:
    (home / "big.json").write_bytes(b" " * 100)
    assert statcache.read_cache(str(home / "big.json"), 99) is None
    assert statcache.read_cache(str(home / "big.json"), 100) == b" " * 100


@needs_root
def test_record_digest_of_another_user_is_not_trusted(home: Path, tmp_path: Path) -> None:
    record = tmp_path / "x-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("x/__init__.py,sha256=AAAA,4\nx-1.0.dist-info/RECORD,,\n")
    os.utime(record, ns=(1, 1))
    real = record_sha256(str(record))
    digests = statcache.RecordDigests()
    assert digests(str(record)) == real
    digests.save()
    (entry,) = home.glob("records-*.json")
    doc = json.loads(entry.read_text())
    doc["entries"][str(record)][1] = "0" * 64  # the all-zero record_sha256 of the report
    entry.write_text(json.dumps(doc))
    assert statcache.RecordDigests()(str(record)) == "0" * 64  # own file: trusted, as intended
    os.chown(entry, _nobody(), -1)
    assert statcache.RecordDigests()(str(record)) == real


@needs_root
def test_file_hashes_in_a_directory_of_another_user_are_not_read(tmp_path: Path) -> None:
    directory = tmp_path / "hashes"
    directory.mkdir(mode=0o700)
    hashes = filehashes.FileHashes(["/site"], directory=str(directory))
    path = hashes.path
    Path(path).write_text(json.dumps({"kind": filehashes.KIND, "format": filehashes.FORMAT,
                                      "prefix": sys.prefix, "sites": ["/site"],
                                      "entries": {"/site/a": [1, 2, 3, 4, 5, "00"]}}))
    assert filehashes.load(path, sys.prefix, ["/site"])
    os.chown(directory, _nobody(), -1)
    assert filehashes.load(path, sys.prefix, ["/site"]) == {}
    os.chown(directory, os.getuid(), -1)
    directory.chmod(0o777)
    assert filehashes.load(path, sys.prefix, ["/site"]) == {}


class _Counting(index.SimpleIndex):
    def __init__(self, url: str, cache_root: Path, sha: str) -> None:
        super().__init__(url, cache=cache_root)
        self.fetches = 0
        self.sha = sha

    def _fetch(self, name: str) -> list[index.IndexFile]:
        self.fetches += 1
        return [index.IndexFile("demo-1.0-py3-none-any.whl", self.url + "demo/demo-1.0-py3-none-any.whl",
                                self.sha)]


def test_index_listing_is_bound_to_its_index_and_owner(home: Path) -> None:
    one = _Counting("http://127.0.0.1:1/one/simple", home, "1" * 64)
    assert one.files("demo", Version("1.0"))[0].sha256 == "1" * 64
    assert one.files("demo", Version("1.0"))[0].sha256 == "1" * 64 and one.fetches == 1
    # An entry of another index moved in place of this one's is a miss, not its hashes.
    two = _Counting("http://127.0.0.1:1/two/simple", home, "2" * 64)
    src, dst = one._cache_path("demo"), two._cache_path("demo")
    assert src is not None and dst is not None
    dst.parent.mkdir(mode=0o700, parents=True)
    dst.write_bytes(src.read_bytes())
    assert two.files("demo", Version("1.0"))[0].sha256 == "2" * 64 and two.fetches == 1


@needs_root
def test_index_listing_another_user_owns_is_a_miss(home: Path) -> None:
    one = _Counting("http://127.0.0.1:1/one/simple", home, "1" * 64)
    one.files("demo", Version("1.0"))
    src = one._cache_path("demo")
    assert src is not None and src.is_file()
    mine = _Counting("http://127.0.0.1:1/one/simple", home, "1" * 64)
    mine.files("demo", Version("1.0"))
    assert mine.fetches == 0  # the twin: this user's own entry is used
    os.chown(src, _nobody(), -1)
    again = _Counting("http://127.0.0.1:1/one/simple", home, "1" * 64)
    again.files("demo", Version("1.0"))
    assert again.fetches == 1


@needs_root
@pytest.mark.slow  # the probe imports torch in a fresh interpreter
def test_poisoned_torch_facts_in_a_shared_directory_are_not_captured(tmp_path: Path) -> None:
    """End to end, as reported: another user's entry for this very key, in a shared 0777
    directory, and a probe that must import torch instead of recording CUDA 99.9-poisoned."""
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    os.chown(shared, _nobody(), -1)
    env = {k: v for k, v in os.environ.items() if k not in ("ENVLOCK_SEED", "ENVLOCK_NO_CACHE")}
    env["ENVLOCK_CACHE_DIR"] = str(shared)
    key = subprocess.run([sys.executable, "-c", "from envlock.probe.cache import torch_cache_key;"
                          "print(torch_cache_key())"], env=dict(env, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert len(key) == 64
    real = parse_document(subprocess.run([sys.executable, str(REPO / "envlock" / "probe")],
                                         env=env, capture_output=True, check=True).stdout, "here")
    facts = {"torch": dict(real["torch"], cuda="99.9-poisoned"),
             "determinism": {k: v for k, v in real["determinism"].items()
                             if k not in ("env", "late")}}
    entry = shared / f"torch-facts-{key[:32]}.json"
    entry.write_text(json.dumps({"format": cache.CACHE_FORMAT, "key": key, "facts": facts}))
    os.chown(entry, _nobody(), -1)
    doc = parse_document(subprocess.run([sys.executable, str(REPO / "envlock" / "probe")],
                                        env=env, capture_output=True, check=True).stdout, "here")
    assert doc["probe"]["torch_facts"] == "live"
    assert doc["torch"].get("cuda") == real["torch"].get("cuda") != "99.9-poisoned"
    assert entry.stat().st_uid == _nobody()  # and nothing of ours was written there
    assert [p.name for p in shared.iterdir()] == [entry.name]


def test_capture_says_why_the_cache_is_not_used(home: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    home.chmod(0o777)
    assert main(["capture", "--no-torch", "-o", str(tmp_path / "env.lock")]) == 0
    err = capsys.readouterr().err
    assert "note: cache not used (neither read nor written): " in err and "writable by other users" in err
    assert list(home.iterdir()) == []
    home.chmod(0o700)  # the twin: a private directory is used without a word
    assert main(["capture", "--no-torch", "-o", str(tmp_path / "env.lock"), "--force"]) == 0
    assert "cache not used" not in capsys.readouterr().err


class _Sentinel(Exception):
    pass


class _Engine:
    def remove_stale(self) -> None:
        pass

    def build_mode(self) -> BuildMode:
        return BuildMode()

    def image(self, ref: str) -> None:
        raise _Sentinel  # the cache lookup by the lock's tag is reached: the build would go ahead


def test_restore_does_not_build_in_a_shared_cache_directory(home: Path, tmp_path: Path,
                                                             restore_lock: LockFactory) -> None:
    from envlock.restore.image import Options
    from envlock.restore.restore import restore

    lock = restore_lock(packages=[("six", "1.17.0")])
    options = Options(base="python@sha256:" + "a" * 64)
    home.chmod(0o777)
    with pytest.raises(UsageError, match=r"refusing to build in the cache directory: .* writable by other"):
        restore(lock, options, engine=_Engine(), name="x")  # type: ignore[arg-type]
    with pytest.raises(_Sentinel):  # --context-dir of one's own: goes ahead
        restore(lock, options, engine=_Engine(), name="x", workdir=tmp_path / "ctx")  # type: ignore[arg-type]
    home.chmod(0o700)
    with pytest.raises(_Sentinel):  # the twin: a private cache directory goes ahead
        restore(lock, options, engine=_Engine(), name="x")  # type: ignore[arg-type]
