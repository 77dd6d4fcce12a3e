"""The probe's stat-keyed caches: the OS package database and what RECORD files yield.

Each entry is keyed by (dev, inode, size, mtime_ns, ctime_ns) of the file it was read from and
is written only for a file that last changed more than ``SETTLE_NS`` ago by the cache's clock.
Files written by a test have just changed, so the tests that want an entry stored set
``SETTLE_NS`` to 0; the tests of the window itself keep it and pass a clock. The probe's own
document must be the same with and without every statcache.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import make_dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.probe import cache, ospkgs, packages, statcache
from envlock.probe.collect import collect, collect_os_packages
from envlock.probing.process import parse_document

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ospkgs"
SETTLE_NS = statcache.SETTLE_NS  # the real window, before a fixture sets it to 0


def _changed(path: Path) -> int:
    """When ``path`` last changed, as the racy rule reads it."""
    st = path.stat()
    return max(st.st_mtime_ns, st.st_ctime_ns)


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(home))
    monkeypatch.setattr(statcache, "SETTLE_NS", 0)
    return home


@pytest.fixture
def dpkg_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "dpkg", root)
    return root


class Parses:
    """Counts the real parser's calls, to tell a cached read from a live one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = ospkgs.parse_dpkg_status

        def counted(text: str) -> list[dict[str, str]]:
            self.calls += 1
            return real(text)

        monkeypatch.setattr(ospkgs, "parse_dpkg_status", counted)

    def load(self, root: Path, now_ns: statcache.Clock | None = None
             ) -> tuple[dict[str, object], bool]:
        """(the document of a cached load, whether it parsed the file)."""
        before = self.calls
        db = statcache.load_os_packages(str(root), now_ns=now_ns or time.time_ns)
        assert db is not None
        return db.document(), self.calls > before


def _entry(home: Path) -> Path:
    (entry,) = home.glob("ospkgs-*.json")
    return entry


STANZA = "\nPackage: newtool\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.0-1\n"


# -- OS packages ----------------------------------------------------------------------------


def test_os_database_is_reused_and_equals_a_live_read(cache_home: Path, dpkg_root: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    parses = Parses(monkeypatch)
    live = ospkgs.load(str(dpkg_root))
    assert live is not None
    first, parsed = parses.load(dpkg_root)
    assert parsed and first == live.document()
    second, parsed = parses.load(dpkg_root)
    assert not parsed, "an unchanged status file is not parsed again"
    assert second == live.document()
    db = statcache.load_os_packages(str(dpkg_root))
    assert db is not None and db.packages == live.packages and db.manager == "dpkg"


@pytest.mark.parametrize("change", ["append", "rewrite_same_size_and_mtime", "rename_over", "chmod",
                                    "apk_appears"])
def test_each_change_of_the_key_makes_the_next_read_live(cache_home: Path, dpkg_root: Path,
                                                         monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    parses = Parses(monkeypatch)
    status = dpkg_root / ospkgs.DPKG_STATUS
    parses.load(dpkg_root)
    assert not parses.load(dpkg_root)[1]
    st = status.stat()
    text = status.read_text()
    if change == "append":
        status.write_text(text + STANZA)
    elif change == "rewrite_same_size_and_mtime":
        # Same bytes count, same mtime afterwards: only the ctime tells.
        status.write_text(text.replace("Version: 3.134", "Version: 3.135"))
        os.utime(status, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert status.stat().st_size == st.st_size and status.stat().st_mtime_ns == st.st_mtime_ns
    elif change == "rename_over":
        new = status.with_name("status-new")
        new.write_text(text + STANZA)
        os.replace(new, status)
    elif change == "chmod":
        status.chmod(0o600)
    elif change == "apk_appears":
        (dpkg_root / ospkgs.APK_INSTALLED).parent.mkdir(parents=True)
        (dpkg_root / ospkgs.APK_INSTALLED).write_text("P:x\nV:1\n")
    doc, parsed = parses.load(dpkg_root)
    assert parsed
    live = ospkgs.load(str(dpkg_root))
    assert live is not None and doc == live.document()
    if change in ("append", "rename_over"):
        assert "newtool:amd64=1.0-1" in doc["packages"]  # type: ignore[operator]
    if change == "rewrite_same_size_and_mtime":
        assert "adduser:all=3.135" in doc["packages"]  # type: ignore[operator]


def test_another_parser_or_root_is_another_key(cache_home: Path, dpkg_root: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    parses = Parses(monkeypatch)
    parses.load(dpkg_root)
    monkeypatch.setattr(statcache, "_parser_digest", lambda: "a newer ospkgs.py")
    assert parses.load(dpkg_root)[1]
    other = tmp_path / "other"
    shutil.copytree(dpkg_root, other)
    assert parses.load(other)[1]
    assert len(list(cache_home.glob("ospkgs-*.json"))) == 2


def test_a_file_that_just_changed_is_not_remembered(cache_home: Path, dpkg_root: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the settle time a second change could leave the same stat: read it every time;
    once it has passed, the file is remembered."""
    monkeypatch.setattr(statcache, "SETTLE_NS", SETTLE_NS)
    parses = Parses(monkeypatch)
    changed = _changed(dpkg_root / ospkgs.DPKG_STATUS)
    within, past = (lambda: changed + SETTLE_NS), (lambda: changed + SETTLE_NS + 1)
    assert parses.load(dpkg_root, within)[1] and parses.load(dpkg_root, within)[1]
    assert not list(cache_home.glob("ospkgs-*.json"))
    assert parses.load(dpkg_root, past)[1] and not parses.load(dpkg_root, within)[1]
    assert len(list(cache_home.glob("ospkgs-*.json"))) == 1


def test_corrupt_and_foreign_entries_are_ignored_and_rewritten(cache_home: Path, dpkg_root: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    parses = Parses(monkeypatch)
    expected, _ = parses.load(dpkg_root)
    good = json.loads(_entry(cache_home).read_text())
    bad_entries: list[bytes] = [
        b"{not json", b"", b"\xff\xfe", b"[]",
        json.dumps(dict(good, key=[*good["key"][:2], [None, None]])).encode(),
        json.dumps(dict(good, format=99)).encode(),
        json.dumps(dict(good, specs=["no pin"])).encode(),
        json.dumps(dict(good, specs=[*good["specs"], "x:amd64=1\nrm"])).encode(),
        json.dumps(dict(good, packages=[{"name": 1, "version": "1", "arch": "all"}])).encode(),
        json.dumps(dict(good, packages=[{"name": "a", "version": "1"}])).encode(),
        json.dumps(dict(good, apk_dirs={"/x": "y"})).encode(),
        json.dumps(dict(good, manager="rpm")).encode(),
    ]
    for bad in bad_entries:
        _entry(cache_home).write_bytes(bad)
        doc, parsed = parses.load(dpkg_root)
        assert parsed and doc == expected, bad[:60]
        assert json.loads(_entry(cache_home).read_text()) == good


def test_apk_database_is_cached_with_its_directory_map(cache_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "apk"
    shutil.copytree(FIXTURES / "apk", root)
    live = ospkgs.load(str(root))
    first = statcache.load_os_packages(str(root))
    second = statcache.load_os_packages(str(root))
    assert live is not None and first is not None and second is not None
    assert second.document() == live.document() and second.apk_dirs == live.apk_dirs
    assert json.loads(_entry(cache_home).read_text())["manager"] == "apk"


def test_no_database_file_is_never_cached(cache_home: Path, tmp_path: Path) -> None:
    assert statcache.load_os_packages(str(tmp_path / "empty")) is None
    assert not cache_home.exists()


def test_owners_and_marks_are_the_same_from_the_cache(cache_home: Path, dpkg_root: Path) -> None:
    site = "/usr/lib/python3/dist-packages"
    locations = {"six": site + "/six-1.16.0.egg-info", "pyyaml": site + "/PyYAML-6.0.dist-info"}

    def run(use_cache: bool) -> tuple[Any, list[dict[str, Any]]]:
        pkgs: list[dict[str, Any]] = [{"name": "six", "version": "1.16.0", "source": "index"},
                                      {"name": "pyyaml", "version": "6.0", "source": "index"}]
        doc = collect_os_packages(pkgs, dict(locations), root=str(dpkg_root), cache=use_cache)
        return doc, pkgs

    live = run(False)
    assert not cache_home.exists(), "without the cache nothing is written"
    assert run(True) == live and run(True) == live


# -- fuzz: whatever the cache file holds, the loader returns a valid database or nothing ------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
_pkg = st.fixed_dictionaries({"name": st.text(max_size=10), "version": st.text(max_size=10),
                              "arch": st.text(max_size=6)}, optional={"source": st.text(max_size=6)})
_spec = st.from_regex(r"\A[a-z0-9][a-z0-9+.-]{0,8}:(amd64|all)=[0-9][a-z0-9.~:+-]{0,8}\Z")
KEY: list[Any] = ["/", "digest", [[1, 2, 3, 4, 5], None]]


def _check(db: ospkgs.Database | None) -> None:
    if db is None:
        return
    import re

    assert db.manager in ("dpkg", "apk")
    for spec in db.specs():
        assert re.fullmatch(ospkgs.SPEC_PATTERN, spec)
    db.owners([])


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_json)
def test_loader_fuzz_arbitrary_json(entry: Any) -> None:
    _check(statcache.database_from_entry(entry, KEY, "/"))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["dpkg", "apk", "rpm", 3]), st.lists(_pkg | _json, max_size=5),
       st.lists(_spec | st.text(max_size=12), max_size=5),
       st.none() | st.dictionaries(st.text(max_size=6), st.text(max_size=6) | st.integers(), max_size=3),
       st.sampled_from([KEY, [*KEY[:2], [None, None]]]))
def test_loader_fuzz_entry_shapes(manager: Any, pkgs: list[Any], specs: list[Any], dirs: Any,
                                  key: list[Any]) -> None:
    entry = {"format": statcache.OSPKGS_FORMAT, "key": key, "manager": manager, "packages": pkgs,
             "specs": specs, "apk_dirs": dirs}
    db = statcache.database_from_entry(entry, KEY, "/")
    _check(db)
    if db is not None:
        assert key == KEY and db.specs() == specs and db.packages == pkgs
    # Whatever is on disk, loading through a file never raises either.
    json.dumps(entry)


# -- who owns a system distribution: dpkg's file lists --------------------------------------

SITE = "/usr/lib/python3/dist-packages"
WANTED = {SITE + "/six-1.16.0.egg-info", SITE + "/PyYAML-6.0.dist-info", SITE + "/orphan-1.0.dist-info"}


class Scans:
    """Counts the real scans of the file lists."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = ospkgs.dpkg_owners

        def counted(info_dir: str, wanted: set[str], reads: Any = None,
                    kind: tuple[bytes, str] = ospkgs.DISTRIBUTIONS) -> dict[str, str]:
            self.calls += 1
            return real(info_dir, wanted, reads, kind)

        monkeypatch.setattr(ospkgs, "dpkg_owners", counted)

    def owners(self, root: Path) -> tuple[dict[str, str], bool]:
        before = self.calls
        found = statcache.dpkg_owners(str(root / ospkgs.DPKG_INFO), set(WANTED))
        return found, self.calls > before


def _live_owners(root: Path) -> dict[str, str]:
    return ospkgs.dpkg_owners(str(root / ospkgs.DPKG_INFO), set(WANTED))


def test_owners_are_remembered_and_equal_a_live_scan(cache_home: Path, dpkg_root: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    live = _live_owners(dpkg_root)
    assert live == {SITE + "/six-1.16.0.egg-info": "python3-six", SITE + "/PyYAML-6.0.dist-info": "python3-yaml"}
    scans = Scans(monkeypatch)
    assert scans.owners(dpkg_root) == (live, True)
    assert scans.owners(dpkg_root) == (live, False)
    db = statcache.load_os_packages(str(dpkg_root))
    assert db is not None and db.owners(WANTED) == {SITE + "/six-1.16.0.egg-info": ("python3-six", "1.16.0-4"),
                                                    SITE + "/PyYAML-6.0.dist-info": ("python3-yaml", "6.0-3+b2")}


@pytest.mark.parametrize("change", ["edit_a_list_read", "add_a_list", "remove_a_list_read", "chmod_a_list_read"])
def test_each_change_of_the_lists_makes_the_next_scan_live(cache_home: Path, dpkg_root: Path,
                                                           monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    scans = Scans(monkeypatch)
    info = dpkg_root / ospkgs.DPKG_INFO
    scans.owners(dpkg_root)
    assert not scans.owners(dpkg_root)[1]
    six = info / "python3-six.list"
    if change == "edit_a_list_read":
        st = six.stat()
        six.write_text(six.read_text().replace("six-1.16.0.egg-info", "six-1.16.1.egg-info"))
        os.utime(six, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "add_a_list":
        (info / "python3-aaa.list").write_text(f"/.\n{SITE}/orphan-1.0.dist-info\n")
    elif change == "remove_a_list_read":
        six.unlink()
    elif change == "chmod_a_list_read":
        six.chmod(0o600)
    found, scanned = scans.owners(dpkg_root)
    assert scanned and found == _live_owners(dpkg_root)
    if change == "add_a_list":
        assert found[SITE + "/orphan-1.0.dist-info"] == "python3-aaa"
    if change in ("edit_a_list_read", "remove_a_list_read"):
        assert SITE + "/six-1.16.0.egg-info" not in found


def test_owner_entries_are_kept_for_the_latest_sets_of_distributions(cache_home: Path, dpkg_root: Path) -> None:
    info = str(dpkg_root / ospkgs.DPKG_INFO)
    for i in range(statcache.OWNERS_MAX_ENTRIES + 4):
        statcache.dpkg_owners(info, {f"{SITE}/pkg{i}-1.0.dist-info"})
    assert len(list(cache_home.glob("ospkgs-owners-*.json"))) == statcache.OWNERS_MAX_ENTRIES


def test_corrupt_or_foreign_owner_entries_are_ignored_and_rewritten(cache_home: Path, dpkg_root: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    scans = Scans(monkeypatch)
    live, _ = scans.owners(dpkg_root)
    (entry,) = cache_home.glob("ospkgs-owners-*.json")
    good = json.loads(entry.read_text())
    for bad in (b"{", b"null", json.dumps(dict(good, found={"/not/wanted": "x"})).encode(),
                json.dumps(dict(good, reads=[["../status", good["reads"][0][1]]])).encode(),
                json.dumps(dict(good, key=[*good["key"][:2], ["/other"]])).encode(),
                json.dumps(dict(good, dir=[0, 0, 0, 0, 0])).encode()):
        entry.write_bytes(bad)
        assert scans.owners(dpkg_root) == (live, True)
        assert json.loads(entry.read_text()) == good


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_json)
def test_owner_entry_fuzz(dpkg_root: Path, entry: Any) -> None:
    info = str(dpkg_root / ospkgs.DPKG_INFO)
    key: list[Any] = [info, "digest", sorted(WANTED)]
    for candidate in (entry, {"format": statcache.OSPKGS_FORMAT, "key": key, "dir": entry, "reads": entry,
                              "found": entry}):
        found = statcache.owners_from_entry(candidate, key, info)
        assert found is None or (isinstance(found, dict) and set(found) <= WANTED)


# -- RECORD digests -------------------------------------------------------------------------


# `site` (conftest.py): an isolated sys.path holding only the fake distributions a test writes.


def test_every_record_digest_is_remembered_by_stat(cache_home: Path, site: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    make_dist(site, "small", "1.0")
    record = str(site / "small-1.0.dist-info" / "RECORD")
    live = packages.record_sha256(record)
    digests = statcache.RecordDigests()
    assert digests(record) == live
    digests.save()
    calls: list[str] = []

    def recompute(path: str) -> str:
        calls.append(path)
        return "recomputed"

    monkeypatch.setattr(statcache, "record_sha256", recompute)
    assert statcache.RecordDigests()(record) == live and calls == []
    # Same size, same mtime, other content: the ctime moved, so it is read again.
    st = os.stat(record)
    data = Path(record).read_bytes()
    Path(record).write_bytes(data.replace(b"sha256=", b"sha256_", 1))
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert statcache.RecordDigests()(record) == "recomputed" and calls == [record]


def test_records_of_removed_distributions_are_dropped(cache_home: Path, site: Path) -> None:
    old = make_dist(site, "pkg", "1.0")
    digests = statcache.RecordDigests()
    digests(str(old / "RECORD"))
    digests.save()
    shutil.rmtree(old)  # upgraded: another dist-info, another RECORD
    new = make_dist(site, "pkg", "2.0")
    digests = statcache.RecordDigests()
    assert str(old / "RECORD") in digests.entries
    digests(str(new / "RECORD"))
    digests.save()
    assert list(statcache.RecordDigests().entries) == [str(new / "RECORD")]


def test_a_record_that_just_changed_is_not_remembered(cache_home: Path, site: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statcache, "SETTLE_NS", SETTLE_NS)
    make_dist(site, "fresh", "1.0")
    record = site / "fresh-1.0.dist-info" / "RECORD"
    changed = _changed(record)
    digests = statcache.RecordDigests(now_ns=lambda: changed + SETTLE_NS)
    digests(str(record))
    digests.save()
    assert not list(cache_home.glob("records-*.json"))
    digests = statcache.RecordDigests(now_ns=lambda: changed + SETTLE_NS + 1)
    digests(str(record))
    digests.save()
    assert list(statcache.RecordDigests().entries) == [str(record)]


def _torch_site(site: Path) -> Path:
    lib = site / "torch" / "lib" / "libtorch_cpu.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\0" * 8)
    info = site / "torch-9.9.9.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("torch/lib/libtorch_cpu.so,sha256=x,8\ntorch/__init__.py,sha256=y,1\n"
                                 "../../bin/torchrun.so,sha256=z,1\ntorch-9.9.9.dist-info/RECORD,,\n")
    (site / "torch" / "__init__.py").write_text("")
    return lib


def test_torch_key_is_the_same_with_remembered_scans(cache_home: Path, site: Path) -> None:
    lib = _torch_site(site)
    live = cache.torch_cache_key()
    digests = statcache.RecordDigests()
    assert live is not None and cache.torch_cache_key(digests) == live
    digests.save()
    again = statcache.RecordDigests()
    assert again.scans, "the scan was stored"
    assert cache.torch_cache_key(again) == live
    # The libraries RECORD names are still stat'ed on every run.
    st = lib.stat()
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache.torch_cache_key(statcache.RecordDigests()) == cache.torch_cache_key() != live


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_json)
def test_records_file_fuzz(tmp_path: Path, entry: Any) -> None:
    """Whatever the records file holds, digests and scans are the live ones."""
    home = tmp_path / "fuzz"
    home.mkdir(exist_ok=True)
    record = home / "RECORD"
    record.write_text("a/b.so,sha256=x,1\n")
    os.environ["ENVLOCK_CACHE_DIR"] = str(home)
    try:
        digests = statcache.RecordDigests()
        Path(digests.path).write_text(json.dumps({"format": statcache.RECORDS_FORMAT,
                                                  "entries": {str(record): entry}, "scans": {str(record): entry}}))
        loaded = statcache.RecordDigests()
        assert loaded(str(record)) == packages.record_sha256(str(record))
        assert loaded.scan(str(record)) == statcache.scan_record(str(record))
        Path(digests.path).write_text(json.dumps(entry))
        assert statcache.RecordDigests()(str(record)) == packages.record_sha256(str(record))
    finally:
        del os.environ["ENVLOCK_CACHE_DIR"]


# -- the probe's document is the same with and without every cache --------------------------


def test_probe_document_is_the_same_with_and_without_the_caches(cache_home: Path, tmp_path: Path) -> None:
    def doc(use_cache: bool) -> dict[str, Any]:
        out = collect(torch="no", cwd=str(tmp_path), cache=use_cache)
        out["probe"].pop("duration_ms")
        return out

    live = doc(False)
    assert not cache_home.exists()
    first = doc(True)
    assert {p.name.split("-")[0] for p in cache_home.iterdir()} >= {"records"}
    assert first == live and doc(True) == live


@pytest.mark.slow
def test_concurrent_probes_share_one_cache(tmp_path: Path) -> None:
    """Four probes filling one empty cache at once: every document is the live one, and what
    is left is whole entries (written through a temp file and a rename), no temp files."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from helpers import REPO

    home = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("ENVLOCK_NO_CACHE", "ENVLOCK_CACHE_DIR")}
    env["ENVLOCK_CACHE_DIR"] = str(home)

    def probe(*args: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, str(REPO / "envlock" / "probe"), "--no-torch", *args],
                             capture_output=True, check=True, cwd=tmp_path, env=env, timeout=300).stdout
        doc: dict[str, Any] = parse_document(out, "")
        doc["probe"].pop("duration_ms")
        return doc

    live = probe("--no-cache")
    assert not home.exists()
    with ThreadPoolExecutor(4) as pool:
        docs = list(pool.map(lambda _: probe(), range(4)))
    assert all(doc == live for doc in docs)
    assert probe() == live
    entries = list(home.iterdir())
    assert entries  # the four probes wrote the cache they then agreed with
    for entry in entries:
        assert not entry.name.startswith(".tmp-")
        json.loads(entry.read_text())
