"""The ``--deep`` stat cache: a file is read again only when its stat says it may have changed.

Real files in real directories, real ``os.stat``: every case below is one a user can cause
with an editor, ``touch``, ``cp`` or a reinstall. A file is cached only once its mtime and
ctime are ``RACY_NS`` old by the cache's clock: the sites are built once per module, and every
check runs with a clock that reads ``RACY_NS`` after the last of their files was written, so to
the cache they are old, and whatever a test writes afterwards is racily new.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.probe import deep, filehashes
from envlock.probe.filehashes import FileHashes
from envlock.report.verify import deep_summary

INFO = "demo-1.0.dist-info"
# One private site per test that edits files; all are aged by the one clock of ``Aged``.
SITES = ("clean", "utime", "inode", "racy", "corrupt", "added", "nocache", "fuzz", "bounded", "theirs")


def _rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install(site: Path, files: dict[str, bytes], wrong: tuple[str, ...] = ()) -> None:
    """A distribution as an installer leaves it; ``wrong`` files get another hash in RECORD."""
    lines = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        lines.append(f"{rel},{_rec(data + b'x' if rel in wrong else data)},{len(data)}")
    (site / INFO).mkdir(parents=True, exist_ok=True)
    (site / INFO / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    lines.append(f"{INFO}/METADATA,{_rec((site / INFO / 'METADATA').read_bytes())},")
    lines.append(f"{INFO}/RECORD,,")
    (site / INFO / "RECORD").write_text("\n".join(lines) + "\n")


def _demo_files() -> dict[str, bytes]:
    files = {"demo/__init__.py": b"VALUE = 1\n", "demo/data.bin": bytes(range(256)) * 8192}
    files.update({f"demo/sub/m{i:02d}.py": f"X = {i}\n".encode() for i in range(20)})
    return files


class Aged:
    """Sites built once, and the instant just past the racy window of the newest of their
    files (ctime included: it cannot be set back, which is why a clock is passed instead)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        newest = max(max(p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in root.rglob("*"))
        self.at = newest + filehashes.RACY_NS + 1

    def __call__(self, name: str) -> Path:
        return self.root / name

    def now_ns(self) -> int:
        return self.at


@pytest.fixture(scope="module")
def aged(tmp_path_factory: pytest.TempPathFactory) -> Aged:
    root = tmp_path_factory.mktemp("aged")
    for name in SITES:
        _install(root / name, _demo_files())
    _install(root / "many", {f"many/m{i:04d}.py": f"x = {i}\n".encode() for i in range(2500)},
             wrong=("many/m0042.py",))
    return Aged(root)


def _check(site: Path, cache: Path, now_ns: Callable[[], int], read: bool = True,
           **kw: Any) -> dict[str, Any]:
    """One deep check of ``site`` with the cache in ``cache``, at the instant ``now_ns`` reads."""
    hashes = FileHashes([str(site)], read=read, directory=str(cache), now_ns=now_ns)
    report = deep.check([("demo", str(site), INFO)], workers=2, stat_cache=hashes, **kw)
    hashes.save()
    report["stat_cache"] = hashes.state
    return report


def _entries(cache: Path, site: Path) -> dict[str, Any]:
    return filehashes.load(filehashes.cache_path([str(site)], str(cache)), sys.prefix, [str(site)])


def test_a_second_clean_run_reads_nothing_and_equals_a_no_cache_run(
        aged: Aged, tmp_path: Path) -> None:
    site = aged("clean")
    first = _check(site, tmp_path, aged.now_ns)
    assert (first["hashed_files"], first["cached_files"]) == (first["files"], 0) == (23, 0)
    assert first["hashed_bytes"] == first["bytes"] > 2_000_000
    second = _check(site, tmp_path, aged.now_ns)
    assert (second["hashed_files"], second["hashed_bytes"]) == (0, 0)
    assert (second["cached_files"], second["cached_bytes"]) == (23, first["bytes"])
    full = _check(site, tmp_path, aged.now_ns, read=False)
    assert full["stat_cache"] == "ignored" and second["stat_cache"] == "used"
    assert full["hashed_files"] == 23 and full["cached_files"] == 0
    assert second["dists"] == full["dists"] == {}
    assert second["digests"] == full["digests"] == first["digests"]
    line = deep_summary(second)
    assert "0 re-hashed, 23 unchanged since the last check by size/mtime/ctime" in line
    assert "--no-cache re-hashes all" in line and "every file matches RECORD" in line
    assert "unchanged" not in deep_summary(full) and "hashed in" in deep_summary(full)
    ticks: list[tuple[int, int, int, int]] = []
    _check(site, tmp_path, aged.now_ns, progress=lambda *a: ticks.append(a))
    assert ticks[-1][0] == ticks[-1][1] == 23 and ticks[-1][2] == ticks[-1][3]


def test_same_size_edit_with_mtime_set_back_is_found_by_its_ctime(
        aged: Aged, tmp_path: Path) -> None:
    site = aged("utime")
    _check(site, tmp_path, aged.now_ns)
    path = site / "demo" / "sub" / "m07.py"
    before = path.stat()
    path.write_bytes(b"X = 9\n")  # same length as "X = 7\n"
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns
    report = _check(site, tmp_path, aged.now_ns)
    assert report["dists"] == {"demo": {"modified": ["demo/sub/m07.py"]}}
    assert report["hashed_files"] == 1 and report["cached_files"] == 22


def test_a_file_replaced_by_another_inode_with_same_size_and_mtime_is_found(
        aged: Aged, tmp_path: Path) -> None:
    """ext4, xfs and tmpfs also give the renamed inode a new ctime; the inode is checked
    for file systems that do not."""
    site = aged("inode")
    _check(site, tmp_path, aged.now_ns)
    path = site / "demo" / "data.bin"
    before = path.stat()
    other = site / "demo" / ".data.bin.new"
    other.write_bytes(bytes(reversed(range(256))) * 8192)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)  # an editor's save: a new inode under the old name
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ino != before.st_ino
    report = _check(site, tmp_path, aged.now_ns)
    assert report["dists"] == {"demo": {"modified": ["demo/data.bin"]}}
    assert report["hashed_files"] == 1


def test_a_racily_fresh_file_is_not_stored(aged: Aged, tmp_path: Path) -> None:
    site = aged("racy")
    path = site / "demo" / "sub" / "m03.py"
    path.write_bytes(b"X = 3\n")  # same bytes, written now: within the racy window
    first = _check(site, tmp_path, aged.now_ns)
    stored = _entries(tmp_path, site)
    assert len(stored) == 22 and str(path) not in stored
    # Hashed again however often it is checked, until it is older than the window.
    second = _check(site, tmp_path, aged.now_ns)
    assert second["hashed_files"] == 1 and first["dists"] == second["dists"] == {}
    written = max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
    later = _check(site, tmp_path, lambda: written + filehashes.RACY_NS + 1)  # the window passed
    assert later["hashed_files"] == 1 and str(path) in _entries(tmp_path, site)
    assert _check(site, tmp_path, aged.now_ns)["hashed_files"] == 0
    fresh = tmp_path / "fresh"
    _install(fresh, _demo_files())
    assert _check(fresh, tmp_path, aged.now_ns)["hashed_files"] == 23
    assert _entries(tmp_path, fresh) == {}


_VALID_HEAD = {"kind": filehashes.KIND, "format": filehashes.FORMAT, "prefix": sys.prefix}


def test_corrupt_truncated_foreign_or_wrong_type_cache_is_ignored_and_rewritten(
        aged: Aged, tmp_path: Path) -> None:
    site = aged("corrupt")
    good = tmp_path / "good"
    _check(site, good, aged.now_ns)
    _check(site, good, aged.now_ns)
    path = filehashes.cache_path([str(site)], str(good))
    valid = Path(path).read_bytes()
    real = json.loads(valid)
    target = str(site / "demo" / "__init__.py")
    sig = real["entries"][target][:5]
    head = {**_VALID_HEAD, "sites": [str(site)]}
    cases: dict[str, bytes] = {
        "empty": b"",
        "truncated": valid[: len(valid) // 2],
        "not json": b"\x00\xff garbage",
        "nested too deep": b"[" * 100000,
        "a list": b"[1, 2, 3]",
        "another format": json.dumps({**real, "format": filehashes.FORMAT + 1}).encode(),
        "another kind": json.dumps({**real, "kind": "something-else"}).encode(),
        "another environment": json.dumps({**real, "prefix": "/elsewhere"}).encode(),
        "entries a list": json.dumps({**head, "entries": [1]}).encode(),
        "entries of wrong types": json.dumps({**head, "entries": {
            target: "x", str(site / "demo" / "data.bin"): [1, 2, 3],
            str(site / INFO / "METADATA"): [*sig, 5]}}).encode(),
    }
    for name, data in cases.items():
        cache = tmp_path / name.replace(" ", "-")
        cache.mkdir()
        Path(filehashes.cache_path([str(site)], str(cache))).write_bytes(data)
        report = _check(site, cache, aged.now_ns)
        assert report["hashed_files"] == 23 and report["dists"] == {}, name
        again = _check(site, cache, aged.now_ns)  # rewritten: now loadable and used
        assert again["hashed_files"] == 0 and again["dists"] == {}, name
    # A directory where the file should be: nothing to read, nothing written, no exception.
    blocked = tmp_path / "blocked"
    os.makedirs(filehashes.cache_path([str(site)], str(blocked)))
    assert _check(site, blocked, aged.now_ns)["dists"] == {}


@pytest.mark.skipif(os.getuid() != 0, reason="handing a file to another user needs root")
def test_another_users_cache_vouches_for_nothing(aged: Aged, tmp_path: Path) -> None:
    """Another user's file, valid in every other way, is not read: every file is hashed."""
    site = aged("theirs")
    good = tmp_path / "good"
    _check(site, good, aged.now_ns)
    _check(site, good, aged.now_ns)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    Path(filehashes.cache_path([str(site)], str(theirs))).write_bytes(
        Path(filehashes.cache_path([str(site)], str(good))).read_bytes())
    assert _check(site, theirs, aged.now_ns)["hashed_files"] == 0  # the twin: as its owner's, it is used
    os.chown(filehashes.cache_path([str(site)], str(theirs)), 12345, 12345)
    assert _check(site, theirs, aged.now_ns)["hashed_files"] == 23


def test_added_and_missing_files_are_named_with_a_warm_cache(
        aged: Aged, tmp_path: Path) -> None:
    site = aged("added")
    _check(site, tmp_path, aged.now_ns)
    gone = site / "demo" / "sub" / "m11.py"
    gone.unlink()
    (site / "demo" / "sub" / "patch.py").write_text("X = 0\n")
    report = _check(site, tmp_path, aged.now_ns)
    assert report["dists"] == {"demo": {"added": ["demo/sub/patch.py"],
                                        "missing": ["demo/sub/m11.py"]}}
    assert report["hashed_files"] == 1 and report["cached_files"] == 22
    # The entry of a file no longer there is dropped when the cache is written.
    assert str(gone) not in _entries(tmp_path, site) and len(_entries(tmp_path, site)) == 22


def test_no_cache_trusts_nothing_and_rewrites_the_cache(
        aged: Aged, tmp_path: Path) -> None:
    """A cache that lies (right stat, wrong hash) is believed by a normal run; --no-cache
    re-reads every file and replaces it with what it read."""
    site = aged("nocache")
    _check(site, tmp_path, aged.now_ns)
    path = filehashes.cache_path([str(site)], str(tmp_path))
    doc = json.loads(Path(path).read_bytes())
    target = str(site / "demo" / "sub" / "m05.py")
    doc["entries"][target][5] = "A" * 43
    Path(path).write_text(json.dumps(doc))
    assert _check(site, tmp_path, aged.now_ns)["dists"] == {"demo": {"modified": ["demo/sub/m05.py"]}}
    full = _check(site, tmp_path, aged.now_ns, read=False)
    assert full["dists"] == {} and full["hashed_files"] == 23
    after = _check(site, tmp_path, aged.now_ns)
    assert after["dists"] == {} and after["hashed_files"] == 0


def test_the_cache_is_bounded(aged: Aged, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    site = aged("bounded")
    for i in range(filehashes.MAX_ENVIRONMENTS + 5):  # files of environments checked earlier
        (tmp_path / f"filehashes-old{i:02d}.json").write_text("{}")
        os.utime(tmp_path / f"filehashes-old{i:02d}.json", (1000 + i, 1000 + i))
    monkeypatch.setattr(filehashes, "MAX_ENTRIES", 3)
    _check(site, tmp_path, aged.now_ns)
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("filehashes-"))
    assert len(names) == filehashes.MAX_ENVIRONMENTS
    assert "filehashes-old00.json" not in names  # the oldest went, this one stayed
    assert os.path.basename(filehashes.cache_path([str(site)], str(tmp_path))) in names
    stored = _entries(tmp_path, site)
    assert len(stored) == 3 and str(site / "demo" / "data.bin") in stored  # the biggest stay


_CONCURRENT = """
import json, sys
from envlock.probe import deep
from envlock.probe.filehashes import FileHashes

site, cache, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
found = []
for n in range(6):
    hashes = FileHashes([site], read=n % 2 == 0, directory=cache, now_ns=lambda: at)
    report = deep.check([("many", site, "demo-1.0.dist-info")], workers=2, processes=True,
                        stat_cache=hashes)
    hashes.save()
    found.append(report["dists"])
print(json.dumps(found))
"""


def test_concurrent_checks_sharing_one_cache_all_succeed(aged: Aged,
                                                         tmp_path: Path) -> None:
    site = aged("many")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(site), str(tmp_path),
                               str(aged.at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert json.loads(out) == [{"many": {"modified": ["many/m0042.py"]}}] * 6
    assert [n for n in os.listdir(tmp_path)] == [
        os.path.basename(filehashes.cache_path([str(site)], str(tmp_path)))]  # no temp files left
    assert len(_entries(tmp_path, site)) == 2501
    report = deep.check([("many", str(site), INFO)], workers=2,
                        stat_cache=FileHashes([str(site)], directory=str(tmp_path)))
    assert report["hashed_files"] == 0


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=7)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=300), entries=st.dictionaries(st.sampled_from(["a", "b", "c"]), _JSON),
       shaped=st.booleans())
def test_fuzz_any_cache_file_is_loaded_without_raising(
        aged: Aged, tmp_path: Path, junk: bytes, entries: dict[str, Any],
        shaped: bool) -> None:
    site = aged("fuzz")
    files = [str(site / "demo" / "sub" / f"m0{i}.py") for i in range(3)]
    path = Path(filehashes.cache_path([str(site)], str(tmp_path)))
    path.parent.mkdir(exist_ok=True)
    if shaped:  # a well-formed head, so the entries themselves reach the lookup
        named = {files["abc".index(k)]: v for k, v in entries.items()}
        data = json.dumps({**_VALID_HEAD, "sites": [str(site)], "entries": named}).encode()
    else:
        data = junk
    path.write_bytes(data)
    loaded = filehashes.load(str(path), sys.prefix, [str(site)])
    assert isinstance(loaded, dict)
    hashes = FileHashes([str(site)], directory=str(tmp_path), now_ns=aged.now_ns)
    found = hashes.lookup(files)
    assert len(found) == 3 and all(h is None or h.startswith("sha256=") for h in found)
    hashes.store(range(3), [_rec((Path(f)).read_bytes()) for f in files])
    assert hashes.save()
    assert [h for h in FileHashes([str(site)], directory=str(tmp_path)).lookup(files)] == [
        _rec(Path(f).read_bytes()) for f in files]
