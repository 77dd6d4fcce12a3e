"""Native code as loaded (``envlock/probe/native.py``): the libraries /proc/self/maps lists, their
sonames read from the ELF file, who vouches for each file (a distribution's RECORD, an OS
package's file list, or its sha256, remembered by stat), and the BLAS/OpenMP runtimes.

Libraries are real shared objects compiled here with gcc and loaded with ctypes in a fresh
interpreter, so what is checked is what the kernel maps and the probe reads back.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, make_dist, make_lock, needs_tool
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import native, ospkgs, rules, statcache
from envlock.probe.filehashes import FileHashes
from envlock.probe.procs import run_tool

LOAD_AND_PROBE = """
import ctypes, json, sys
for path in sys.argv[1:]:
    ctypes.CDLL(path)
from envlock.probe.collect import collect
doc = collect(torch="no", cache=True)
print(json.dumps({"native": doc.get("native"), "errors": doc["probe"]["errors"]}))
"""


def _mapped() -> list[str]:
    """The libraries this test process has mapped (Linux: there always is a maps file)."""
    found = native.loaded_libraries()
    assert found is not None
    return found


def build_library(directory: Path, name: str, soname: str | None, body: str = "int f(void){return 1;}") -> Path:
    """A real shared object (gcc), with ``soname`` as its DT_SONAME when given."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc is needed to build test libraries (scripts/test.sh installs it)"
    source = directory / f"{name}.c"
    source.write_text(body + "\n")
    out = directory / name
    flags = [f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(source), *flags], check=True, timeout=120)
    return out


def probe_after_loading(paths: list[Path], env: dict[str, str]) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", LOAD_AND_PROBE, *map(str, paths)], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _env(tmp_path: Path, *path: Path) -> dict[str, str]:
    pythonpath = os.pathsep.join([str(REPO), *map(str, path)])
    return {**os.environ, "PYTHONPATH": pythonpath, "ENVLOCK_CACHE_DIR": str(tmp_path / "cache")}


def test_maps_lines_become_one_path_per_shared_object() -> None:
    maps = "\n".join([
        "7f00-7f01 r--p 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f01-7f02 r-xp 00001000 08:01 11 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f02-7f03 r--p 00000000 08:01 12 /venv/site/torch/lib/libtorch_cpu.so",
        "7f03-7f04 r--p 00000000 08:01 13 /venv/site/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
        "7f04-7f05 r--p 00000000 08:01 14 /opt/old/libgomp.so.1 (deleted)",
        "7f05-7f06 rw-p 00000000 00:00 0 [heap]",
        "7f06-7f07 rw-p 00000000 00:00 0",
        "7f07-7f08 r--p 00000000 08:01 15 /usr/share/locale/locale-archive",
        "7f08-7f09 r--p 00000000 08:01 16 /data/model.sorted",
        # The interpreter's own extension modules: which are mapped says what the probe imported.
        "7f09-7f0a r--p 00000000 08:01 17 /usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
    ])
    assert native.mapped_libraries(maps) == [
        "/opt/old/libgomp.so.1 (deleted)",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/venv/site/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
        "/venv/site/torch/lib/libtorch_cpu.so",
    ]


def test_a_library_whose_path_holds_line_breaks_other_than_newline_is_found(tmp_path: Path) -> None:
    """The kernel separates maps lines with "\\n" only: a "\\r", a form feed, "\\x1c" or U+2028 in
    a directory's name is part of the path, which ``str.splitlines`` would cut in two."""
    odd = tmp_path / "cr\rff\x0cfs\x1cls\u2028end"
    odd.mkdir()
    lib = build_library(tmp_path, "libodd.so.1", "libodd.so.1")
    moved = odd / "libodd.so.1"
    shutil.copy(lib, moved)
    out = probe_after_loading([moved], _env(tmp_path))
    entry = next((e for e in out["native"]["libraries"] if e["path"] == str(moved)), None)
    assert entry == {"name": "libodd.so.1", "path": str(moved),
                     "sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}
    assert not any(e["path"].startswith(str(odd)) and e is not entry
                   for e in out["native"]["libraries"])


def test_a_maps_file_that_cannot_be_read_whole_is_an_error_not_an_empty_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Part of the maps file, or none of it, would be a process that loaded fewer libraries."""
    copy = tmp_path / "maps"
    copy.write_bytes(Path("/proc/self/maps").read_bytes())
    whole = native.loaded_libraries(str(copy))
    assert whole and any("/libc.so" in p or "/libc-" in p for p in whole)
    monkeypatch.setattr(native, "MAX_MAPS", copy.stat().st_size - 1)
    with pytest.raises(OSError, match="larger than"):
        native.loaded_libraries(str(copy))
    monkeypatch.undo()
    with pytest.raises(OSError, match="not a regular file"):
        native.loaded_libraries(str(tmp_path))
    with pytest.raises(FileNotFoundError):  # on Linux, where a process has one
        native.loaded_libraries(str(tmp_path / "missing"))


@pytest.mark.parametrize("why", ["unreadable", "over its cap"])
def test_libraries_not_captured_are_no_native_section_and_no_replay_claims_them(
        why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture whose maps could not be read has no ``[native]`` (its error says why), so a
    replay compares no ``native.*`` fact rather than name every library as gone."""
    from envlock.lock._seal import canonical_form
    from envlock.probe.collect import collect
    from envlock.probing.capture import build_lock
    from envlock.replay.compare import compare_records, context_of
    from envlock.replay.record import Meta, Record, Step
    from envlock.replay.report import replay_text

    def record_of(doc: dict[str, Any], loss: float) -> Record:
        meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    where="host", command=["python", "train.py"], exit_code=0)
        return Record(record=meta, context=context_of(canonical_form(build_lock(doc))),
                      steps=[Step(step=0, metrics={"loss": loss})])

    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    lib = build_library(tmp_path, "libstandin.so.1", "libstandin.so.1")
    ctypes.CDLL(str(lib))  # one library no package vouches for: a fact the replay would compare
    captured = collect(torch="no", git=False)
    assert captured["native"]["libraries"] and "native" not in captured["probe"]["errors"]
    if why == "unreadable":
        monkeypatch.setattr(native, "MAPS", str(tmp_path))  # a directory: not a regular file
    else:
        monkeypatch.setattr(native, "MAX_MAPS", 1024)
    missing = collect(torch="no", git=False)
    assert "native" not in missing
    assert missing["probe"]["errors"]["native"].startswith("UnsafeFile")
    original = record_of(captured, 0.5)
    assert any(k.startswith("native.unowned.libstandin") for k in original.context)
    for a, b in ((original, record_of(missing, 0.25)), (record_of(missing, 0.25), original)):
        cmp = compare_records(a, b)
        assert not [c.key for c in cmp.context if c.key.startswith("native.")]
        # The verdict says these facts were not compared, not that they did not differ.
        assert "native.unowned" in cmp.not_compared
        line = next(x for x in replay_text(cmp, "run.record").splitlines() if "not compared" in x)
        assert "native.unowned" in line


def test_the_soname_comes_from_the_elf_file(tmp_path: Path) -> None:
    named = build_library(tmp_path, "libdemo.so.1.2.3", "libdemo.so.1")
    bare = build_library(tmp_path, "libbare.so", None)
    text = tmp_path / "libtext.so"
    text.write_text("not an ELF file")
    assert native.elf_soname(str(named)) == "libdemo.so.1"
    assert native.elf_soname(str(bare)) is None
    assert native.elf_soname(str(text)) is None
    assert native.elf_soname(str(tmp_path / "missing.so")) is None
    libc = [p for p in _mapped() if "/libc.so" in p or "/libc-" in p]
    assert libc and native.elf_soname(libc[0]) == "libc.so.6"


def test_a_library_from_outside_any_package_is_named_by_its_soname_and_hash(tmp_path: Path) -> None:
    lib = build_library(tmp_path, "libstandin.so.1.0", "libstandin.so.1")
    out = probe_after_loading([lib], _env(tmp_path))
    entry = next(e for e in out["native"]["libraries"] if e["path"] == str(lib))
    assert entry == {"name": "libstandin.so.1", "path": str(lib),
                     "sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}
    assert "native" not in out["errors"]
    db = ospkgs.load("/")
    if db is not None and db.manager == "dpkg":  # the test image is Debian: libc is libc6's
        libc = next(e for e in out["native"]["libraries"] if e["name"] == "libc.so.6")
        assert libc.get("os_package") == "libc6" and "sha256" not in libc


def test_a_library_whose_soname_holds_a_plus_is_kept_in_a_replay_record(tmp_path: Path) -> None:
    """``libstdc++.so.6``, ``libfoo+cu121.so``: a soname with ``+`` is a record's context key
    like any other, written, read back and compared."""
    from envlock.lock._seal import canonical_form
    from envlock.replay.compare import compare_records, context_of
    from envlock.replay.record import Meta, Record, Step, dumps, loads, seal

    def record_of(lib: Path, loss: float) -> Record:
        out = probe_after_loading([lib], _env(tmp_path))
        meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    where="host", command=["python", "train.py"], exit_code=0)
        rec = Record(record=meta, context=context_of(canonical_form(make_lock(native=out["native"]))),
                     steps=[Step(step=0, metrics={"loss": loss})])
        return loads(dumps(seal(rec)))

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = build_library(tmp_path / "a", "libfoo+cu121.so", "libfoo+cu121.so")
    rebuilt = build_library(tmp_path / "b", "libfoo+cu121.so", "libfoo+cu121.so", "int f(void){return 2;}")
    original, replay = record_of(first, 0.5), record_of(rebuilt, 0.25)
    key = "native.unowned.libfoo+cu121.so"
    assert str(first) in str(original.context.get(key)), sorted(original.context)
    change = next(c for c in compare_records(original, replay).context if c.key == key)
    assert str(first) in str(change.original) and str(rebuilt) in str(change.replay)


def _fastmath(tmp_path: Path) -> tuple[Path, Path]:
    """(a site directory, the library its distribution "fastmath" ships and lists in RECORD)."""
    site = tmp_path / "site"
    dist = make_dist(site, "fastmath", "1.0")
    (site / "fastmath").mkdir()
    lib = build_library(site / "fastmath", "libfastmath.so.2", "libfastmath.so.2")
    with (dist / "RECORD").open("a") as fh:
        fh.write("fastmath/libfastmath.so.2,sha256=abc,100\n")
    return site, lib


def test_a_library_a_distribution_ships_is_vouched_for_by_its_record(tmp_path: Path) -> None:
    site, lib = _fastmath(tmp_path)
    out = probe_after_loading([lib], _env(tmp_path, site))
    entry = next(e for e in out["native"]["libraries"] if e["name"] == "libfastmath.so.2")
    assert entry == {"name": "libfastmath.so.2", "path": str(lib.resolve()),
                     "distribution": "fastmath", "file": "fastmath/libfastmath.so.2"}


def test_the_same_soname_from_another_file_is_told_apart(tmp_path: Path) -> None:
    """Two copies of one library (the wheel's, a cluster module's): same name, other owner."""
    site, shipped = _fastmath(tmp_path)
    elsewhere = tmp_path / "module" / "libfastmath.so.2"
    elsewhere.parent.mkdir()
    shutil.copy(shipped, elsewhere)
    ours = probe_after_loading([shipped], _env(tmp_path, site))
    theirs = probe_after_loading([elsewhere], _env(tmp_path, site))
    a = next(e for e in ours["native"]["libraries"] if e["name"] == "libfastmath.so.2")
    b = next(e for e in theirs["native"]["libraries"] if e["name"] == "libfastmath.so.2")
    assert a["distribution"] == "fastmath" and "distribution" not in b
    assert b["sha256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()


def test_hashes_are_remembered_by_stat_and_taken_again_when_the_file_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(statcache, "SETTLE_NS", 0)
    lib = build_library(tmp_path, "libonce.so", "libonce.so")
    hashed: list[str] = []
    real = native.file_sha256

    def counted(path: str) -> str | None:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(native, "file_sha256", counted)

    def describe() -> dict[str, Any]:
        entries = native.describe_libraries([str(lib)], {}, {}, None, FileHashes(["<t>"], racy_ns=0))
        return entries[0]

    first = describe()
    assert hashed == [str(lib)] and first["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert describe() == first and hashed == [str(lib)]  # the stat is unchanged: not read again
    data = lib.read_bytes()
    lib.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    again = describe()
    assert hashed == [str(lib), str(lib)] and again["sha256"] != first["sha256"]


def test_no_cache_hashes_every_library_and_writes_nothing(tmp_path: Path) -> None:
    lib = build_library(tmp_path, "libnocache.so", "libnocache.so")
    entries = native.describe_libraries([str(lib)], {}, {}, None, native.NoHashes())
    assert entries[0]["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()


def test_a_deleted_library_is_told_as_such() -> None:
    entries = native.describe_libraries(["/opt/old/libgomp.so.1 (deleted)"], {}, {}, None,
                                        native.NoHashes())
    assert entries == [{"name": "libgomp.so.1", "path": "/opt/old/libgomp.so.1", "deleted": True}]


def test_os_owners_are_looked_up_in_merged_usr_spellings(tmp_path: Path) -> None:
    """dpkg lists /lib/x86_64-linux-gnu/libc.so.6; a merged-/usr system maps /usr/lib/..."""
    root = Path(__file__).parent / "fixtures" / "ospkgs" / "dpkg"
    db = ospkgs.load(str(root))
    assert db is not None
    listed = (root / "var/lib/dpkg/info/libc6:amd64.list").read_text().split()
    lib = next(p for p in listed if "/libc.so" in p)
    mapped = "/usr" + lib if not lib.startswith("/usr/") else lib
    entries = native.describe_libraries([mapped], {}, {}, db.file_owners, native.NoHashes())
    assert entries[0]["os_package"] == "libc6" and "sha256" not in entries[0]


def test_apk_names_the_package_of_a_library() -> None:
    text = ("P:openblas\nV:0.3.28-r0\nA:x86_64\nF:usr/lib\nR:libopenblas.so.3\nR:README\n\n"
            "P:py3-numpy\nV:2.1-r0\nA:x86_64\nF:usr/lib/python3.12/site-packages/numpy-2.1.dist-info\n"
            "R:METADATA\n")
    _, paths = ospkgs.parse_apk_installed(text)
    assert paths["/usr/lib/libopenblas.so.3"] == "openblas"
    assert paths["/usr/lib/python3.12/site-packages/numpy-2.1.dist-info"] == "py3-numpy"
    assert "/usr/lib/README" not in paths
    db = ospkgs.Database("apk", [], "/", paths)
    assert db.file_owners(["/usr/lib/libopenblas.so.3", "/usr/lib/libother.so"]) == {
        "/usr/lib/libopenblas.so.3": "openblas"}


RPM_SPEC = """Name: {name}
Version: 1.0
Release: 1
Summary: a package whose database entry lists a library of this host
License: MIT
BuildArch: noarch
%description
Recorded with --justdb: its file list is in the database, nothing is written.
%install
mkdir -p %{{buildroot}}{directory}
: > %{{buildroot}}{path}
%files
{path}
"""


def rpm_database(tmp_path: Path, name: str, path: str) -> Path:
    """A real rpm database of the test's own holding one package that lists ``path``: built with
    rpmbuild and recorded with ``rpm -i --justdb``. Returns a home directory whose
    ``.rpmmacros`` names that database, so that a plain ``rpm`` (HOME set to it) reads it."""
    rpmbuild, rpm = needs_tool("rpmbuild"), needs_tool("rpm")
    spec = tmp_path / f"{name}.spec"
    spec.write_text(RPM_SPEC.format(name=name, path=path, directory=os.path.dirname(path)))
    out, db, home = tmp_path / "rpms", tmp_path / "rpmdb", tmp_path / "home"
    home.mkdir()
    (home / ".rpmmacros").write_text(f"%_dbpath {db}\n")
    env = {**os.environ, "HOME": str(home)}
    subprocess.run([rpmbuild, "-bb", "--define", f"_topdir {tmp_path / 'rpmbuild'}", "--define",
                    f"_rpmdir {out}", "--define", "__spec_install_post %{nil}", "--define",
                    "_build_id_links none", str(spec)], env=env, check=True, capture_output=True, timeout=120)
    subprocess.run([rpm, "--initdb"], env=env, check=True, capture_output=True, timeout=60)
    package = next(out.glob("*/*.rpm"))
    subprocess.run([rpm, "-i", "--justdb", "--nodeps", str(package)], env=env, check=True,
                   capture_output=True, timeout=60)
    return home


def test_rpm_names_the_package_of_a_library_in_one_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real rpm database says which package lists the libm this process mapped: one ``rpm -qf``
    for every library asked about, each answer told apart by the file it names; a library no
    package lists is hashed as before."""
    mapped = _mapped()
    libm = next(p for p in mapped if os.path.basename(p).startswith("libm.so"))
    libc = next(p for p in mapped if os.path.basename(p).startswith("libc.so"))
    listed = max(ospkgs.merged_usr_spellings(libm), key=len)  # rpm-based systems list /usr/lib64/...
    monkeypatch.setenv("HOME", str(rpm_database(tmp_path, "claims-libm", listed)))
    calls: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> tuple[int | None, bytes, str]:
        calls.append(argv)
        return run_tool(argv, timeout)

    db = ospkgs.Database("rpm", [], "/", run=run)
    entries = {e["path"]: e for e in native.describe_libraries(
        [libm, libc], {}, {}, db.file_owners, native.NoHashes())}
    assert entries[libm]["os_package"] == "claims-libm" and "sha256" not in entries[libm]
    assert "os_package" not in entries[libc] and len(entries[libc]["sha256"]) == 64
    assert len(calls) == 1 and calls[0][:4] == ["rpm", "-qf", "--queryformat", ospkgs.RPM_FILES_QUERYFORMAT]
    assert {libm, libc} <= set(calls[0][5:])


def test_rpm_that_cannot_answer_leaves_the_libraries_to_their_hashes() -> None:
    """rpm missing or past its deadline (the runner's None): no owner, never an error."""
    def run(argv: list[str], timeout: float) -> tuple[int | None, bytes, str]:
        assert timeout == ospkgs.RPM_OWNERS_TIMEOUT
        return None, b"", "rpm timed out after 10s"

    db = ospkgs.Database("rpm", [], "/", run=run)
    assert db.file_owners(["/usr/lib64/libm.so.6"]) == {}
    assert ospkgs.Database("rpm", [], "/").file_owners(["/usr/lib64/libm.so.6"]) == {}


RPM_FILES = ("/usr/lib64/libm.so.6\tglibc\n/usr/lib64/libc.so.6\tglibc\n"
             "file /opt/x/libfoo.so is not owned by any package\n/usr/lib64/a\tb.so\tweird-name\n")


def test_rpm_files_output_is_read_by_the_file_each_line_names() -> None:
    wanted = {"/usr/lib64/libm.so.6", "/opt/x/libfoo.so", "/usr/lib64/a\tb.so", "/lib64/libm.so.6"}
    assert ospkgs.parse_rpm_files(RPM_FILES, wanted) == {
        "/usr/lib64/libm.so.6": "glibc", "/usr/lib64/a\tb.so": "weird-name"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(RPM_FILES.splitlines()) | st.text(max_size=60), max_size=12),
       st.lists(st.sampled_from(["/usr/lib64/libm.so.6", "/opt/x/libfoo.so", "/usr/lib64/a\tb.so"])
                | st.text(max_size=20), max_size=6))
def test_fuzz_rpm_files_never_raise_and_name_only_asked_files_and_valid_packages(
        lines: list[str], wanted: list[str]) -> None:
    found = ospkgs.parse_rpm_files("\n".join(lines), set(wanted))
    assert set(found) <= set(wanted)
    assert all(ospkgs.spec(name, "noarch", "1") is not None for name in found.values())


def test_runtimes_through_threadpoolctl_with_real_numpy_and_torch() -> None:
    import numpy  # noqa: F401  (loads OpenBLAS)
    import threadpoolctl  # noqa: F401  (a dev dependency: the tests exercise it)
    import torch  # noqa: F401  (loads its OpenMP runtime)

    runtimes, source = native.collect_runtimes(_mapped())
    assert source == "threadpoolctl"
    blas = next(r for r in runtimes if r["api"] == "blas")
    assert blas["implementation"] == "openblas" and blas["version"] and blas["architecture"]
    assert isinstance(blas["num_threads"], int) and blas["num_threads"] >= 1
    openmp = next(r for r in runtimes if r["api"] == "openmp")
    assert openmp["library"].startswith("libgomp") and "/torch/" in openmp["path"]


def test_without_threadpoolctl_runtimes_are_named_from_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # an import of it now fails
    paths = ["/venv/site/torch/lib/libgomp.so.1", "/venv/site/numpy.libs/libscipy_openblas64_-32a4b2a6.so",
             "/usr/lib/libiomp5.so", "/opt/intel/lib/libmkl_rt.so.2", "/usr/lib/libc.so.6",
             "/usr/lib/libompitrace.so"]
    runtimes, source = native.collect_runtimes(paths)
    assert source == "maps"
    assert [(r["api"], r["implementation"], r["library"]) for r in runtimes] == [
        ("blas", "mkl", "libmkl_rt.so.2"), ("blas", "openblas", "libscipy_openblas64_-32a4b2a6.so"),
        ("openmp", "openmp", "libgomp.so.1"), ("openmp", "openmp", "libiomp5.so")]


# Real file names (sonames where they have one) of libraries that decide numbers, with what
# threadpoolctl calls those that are BLAS or OpenMP runtimes.
NUMERICS_NAMES = [
    ("libcudart.so.13", None), ("libcudnn_ops.so.9", None), ("libcublasLt.so.13", None),
    ("libcusparseLt.so.0", None), ("libnccl.so.2", None), ("libnvrtc-builtins.so.13.0", None),
    ("libnvJitLink.so.13", None), ("libamdhip64.so.6", None), ("libMIOpen.so.1", None),
    ("librccl.so.1", None), ("librocblas.so.4", None), ("libhipblas.so.2", None),
    ("libhipblaslt.so.0", None), ("librocfft.so.0", None), ("librocrand.so.1", None),
    ("librocsolver.so.0", None), ("librocsparse.so.1", None), ("libhipfft.so.0", None),
    ("libhipsparse.so.1", None), ("libmkl_core.so.2", None), ("libblas.so.3", None),
    ("liblapack.so.3", None),
    ("libmkl_rt.so.2", ("blas", "mkl")),
    ("libopenblas.so.0", ("blas", "openblas")),
    ("libopenblasp-r0-085ca80a.3.9.so", ("blas", "openblas")),  # scipy 1.5's wheel
    ("libopenblasp-r0-2ecf47d5.3.7.dev.so", ("blas", "openblas")),  # numpy 1.17's
    ("libopenblas64_p-r0-0cf96a72.3.23.dev.so", ("blas", "openblas")),  # numpy 1.26's
    ("libopenblas_haswellp-r0.2.20.so", ("blas", "openblas")),
    ("libopenblaso.so.0", ("blas", "openblas")),
    ("libscipy_openblas64_-ff651d7f.so", ("blas", "openblas")),  # numpy 2's
    ("libblis.so.4", ("blas", "blis")), ("libflexiblas.so.3", ("blas", "flexiblas")),
    ("libgomp.so.1", ("openmp", "openmp")), ("libgomp-a34b3233.so.1", ("openmp", "openmp")),
    ("libiomp5.so", ("openmp", "openmp")), ("libomp.so.5", ("openmp", "openmp")),
]
# Names that begin like one of them and are something else.
NOT_NUMERICS = ["librocksdb.so.8", "librocm_smi64.so.7", "libroctx64.so.4", "librocprofiler64.so.2",
                "libompl.so.17", "libomptarget.so.17", "libompitrace.so", "libcurl.so.4",
                "libcupti.so.13", "libcuda.so.1", "libblosc2.so.2",
                "libstdc++.so.6", "libhipblasfoo.so", "libopenblastic.so",
                "libc.so.6", "libopenjp2.so.7"]


@pytest.mark.parametrize(("name", "runtime"), NUMERICS_NAMES)
def test_a_library_that_decides_numbers_is_one_by_its_name(name: str, runtime: tuple[str, str] | None) -> None:
    assert rules.numerics_library(name)
    assert rules.numerics_runtime(name) == runtime


@pytest.mark.parametrize("name", NOT_NUMERICS)
def test_a_library_named_like_one_that_decides_numbers_is_not_one(name: str) -> None:
    assert not rules.numerics_library(name)
    assert rules.numerics_runtime(name) is None


@pytest.mark.parametrize("name", ["libhipblaslt.so.0", "librocfft.so.0", "librocsparse.so.1",
                                  "libopenblasp-r0-085ca80a.3.9.so"])
def test_a_numerics_library_loaded_from_another_file_is_breaking(name: str) -> None:
    from envlock.drift.compare import compare

    def lock(path: str, **owner: str) -> Any:
        return make_lock(native={"libraries": [{"name": name, "path": path, **owner}], "runtimes": []})

    ours = lock(f"/venv/site/torch/lib/{name}", distribution="torch", file=f"torch/lib/{name}")
    cluster = lock(f"/opt/rocm/lib/{name}", sha256="a" * 64)
    found = {d.path: d for d in compare(ours, cluster).differences}
    assert found[f"native.libraries.{name}"].severity == "breaking"


def test_runtimes_named_from_files_are_the_numerics_rule_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without threadpoolctl a runtime is named by the same rule the comparator judges by:
    every name it counts as a runtime, none it does not."""
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    names = [name for name, _ in NUMERICS_NAMES] + NOT_NUMERICS
    runtimes, source = native.collect_runtimes([f"/opt/lib/{name}" for name in names])
    assert source == "maps"
    assert sorted((r["library"], (r["api"], r["implementation"])) for r in runtimes) == sorted(
        (name, runtime) for name, runtime in NUMERICS_NAMES if runtime is not None)


def test_importing_threadpoolctl_leaves_the_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """threadpoolctl sets KMP_DUPLICATE_LIB_OK when imported; a capture must not change the
    environment of the process it describes (nor record its own mark in [env])."""
    monkeypatch.delitem(sys.modules, "threadpoolctl", raising=False)
    monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
    _, source = native.collect_runtimes(_mapped())
    assert source == "threadpoolctl" and "KMP_DUPLICATE_LIB_OK" not in os.environ
    monkeypatch.delitem(sys.modules, "threadpoolctl")
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "FALSE")  # the user's own setting stays
    native.collect_runtimes(_mapped())
    assert os.environ["KMP_DUPLICATE_LIB_OK"] == "FALSE"
