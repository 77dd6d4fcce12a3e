"""What a replay record's context keeps of native code (``drift/native.context_form``), and what
a replay names from it: a library rebuilt or upgraded at one path, two BLAS/OpenMP runtimes of
one kind, and a runtime's field only one process could learn (verify's rule, ``learnt_by_both``).
Built from real parts where the machine has them: shared objects compiled here, their RECORD
read by the probe, this host's package database, threadpoolctl's own answer."""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import make_lock

from envlock.drift.compare import compare
from envlock.drift.native import context_form, runtime_keys
from envlock.lock import Lock
from envlock.lock._seal import canonical_form
from envlock.probe.collect import collect_os_packages
from envlock.probe.native import (
    NoHashes,
    _from_threadpoolctl,
    describe_libraries,
    distribution_files,
)
from envlock.probe.packages import RecordReader
from envlock.replay.compare import compare_records, context_of
from envlock.replay.record import Meta, Record, Step

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "double dot(const double *a, const double *b, int n) {\n" \
         "  double s = 0; for (int i = 0; i < n; i++) s += a[i] * b[i]; return s;\n}\n"


def _record(lock: Lock, loss: float = 0.5) -> Record:
    meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                where="host", command=["python", "train.py"], exit_code=0)
    return Record(record=meta, context=context_of(canonical_form(lock)), steps=[Step(step=0, metrics={"loss": loss})])


def _changes(original: Lock, replay: Lock) -> dict[str, Any]:
    return {c.key: c for c in compare_records(_record(original), _record(replay, 0.25)).context}


# -- a library at one path, other bytes ------------------------------------------------------------

def _build(out: Path, *flags: str) -> None:
    """A shared object with the soname of a numerics library, compiled here with ``flags``."""
    src = out.parent / "dot.c"
    src.write_text(SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-Wl,-soname,libopenblas.so.0", "-o", str(out), str(src)],
                   check=True, capture_output=True)


def _install(site: Path, *flags: str) -> dict[str, Any]:
    """The wheel ``fastblas 1.0`` installed into ``site`` as pip leaves it (the library and a
    RECORD with its hash), its library built with ``flags``; returns the lock's sections as
    the probe describes them (its own RECORD reader, owners and library description)."""
    lib = site / "fastblas" / "lib" / "libopenblas.so.0"
    lib.parent.mkdir(parents=True, exist_ok=True)
    _build(lib, *flags)
    data = lib.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    info = site / "fastblas-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastblas\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"fastblas/lib/libopenblas.so.0,sha256={digest},{len(data)}\n"
                                 "fastblas-1.0.dist-info/METADATA,,\nfastblas-1.0.dist-info/RECORD,,\n")
    reader = RecordReader()
    record_sha256 = reader(str(info / "RECORD"))
    owners = distribution_files([("fastblas", str(site), info.name)], reader.libraries_of)
    libraries = describe_libraries([str(lib.resolve())], owners, {}, None, NoHashes())
    return {"packages": [{"name": "fastblas", "version": "1.0", "record_sha256": record_sha256}],
            "native": {"libraries": libraries, "runtimes": []}}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_wheel_rebuilt_at_one_version_and_path_is_named_by_its_library(tmp_path: Path) -> None:
    """The same distribution and version, its library at the same path, built -O2 then -O3
    -ffast-math (other sums): the where of the library and the package's version agree, what
    identifies its bytes (the RECORD's digest) does not, and the replay names it."""
    site = tmp_path / "site-packages"
    first = _install(site, "-O2")
    second = _install(site, "-O3", "-ffast-math")
    assert first["native"]["libraries"][0]["distribution"] == "fastblas"
    assert first["native"]["libraries"][0]["path"] == second["native"]["libraries"][0]["path"]
    a, b = make_lock(**first), make_lock(**second)
    found = _changes(a, b)
    key = "native.content.libopenblas.so.0"
    assert set(found) == {key}, sorted(found)  # not the path, not packages.fastblas
    was, now = a.packages[0].record_sha256, b.packages[0].record_sha256
    assert was and now and was != now
    assert found[key].original == f"distribution fastblas 1.0, RECORD sha256 {was}"
    assert found[key].replay == f"distribution fastblas 1.0, RECORD sha256 {now}"
    assert _changes(a, make_lock(**first)) == {}


def _system_libgomp() -> tuple[str, dict[str, Any], Any] | None:
    """This host's libgomp.so.1, its package database's section and the database, or None."""
    paths = sorted(glob.glob("/usr/lib/*-linux-gnu/libgomp.so.1")) + sorted(glob.glob("/usr/lib64/libgomp.so.1"))
    found: list[Any] = []
    section = collect_os_packages([], {}, found=found) if paths else None
    return (paths[0], section, found[0]) if section and found else None


def test_an_os_upgrade_of_a_library_at_one_path_is_named_with_the_package_version() -> None:
    """libgomp as this host's package manager installed it: its owner is read from the real
    database, its version from the real ``[os_packages]``; the same file under the next
    release of that package (what ``apt upgrade`` leaves: one path, one package name) is named."""
    system = _system_libgomp()
    if system is None:
        pytest.skip("no libgomp.so.1 from a package manager on this host")
    path, section, db = system
    libraries = describe_libraries([path], {}, {}, db.file_owners, NoHashes())
    owner = libraries[0].get("os_package")
    assert owner, libraries
    pins = [p for p in section["packages"] if p.split(":", 1)[0] == owner]
    version = pins[0].split("=", 1)[1]
    upgraded = {**section, "packages": [p + "+1" if p in pins else p for p in section["packages"]]}
    native = {"libraries": libraries, "runtimes": []}
    a = make_lock(os_packages=section, native=native)
    b = make_lock(os_packages=upgraded, native=native)
    found = _changes(a, b)
    change = found["native.content.libgomp.so.1"]
    assert (change.original, change.replay) == (f"OS package {owner} {version}", f"OS package {owner} {version}+1")
    assert "native.libraries.libgomp.so.1" not in found


def test_a_record_kept_before_library_content_compares_none_of_it(tmp_path: Path) -> None:
    """A record written before ``native.content`` is not a process whose libraries nobody
    vouched for: the family is compared only when both records have it."""
    lock = make_lock(native={"libraries": [{"name": "libgomp.so.1", "path": "/usr/lib/libgomp.so.1",
                                            "os_package": "libgomp1"}], "runtimes": []},
                     os_packages={"manager": "dpkg", "packages": ["libgomp1:amd64=12.2.0-14"]})
    new = _record(lock)
    assert new.context["native.content.libgomp.so.1"] == "OS package libgomp1 12.2.0-14"
    old = new.model_copy(update={"context": {k: v for k, v in new.context.items()
                                             if not k.startswith("native.content.")}})
    assert compare_records(old, new).context == ()


def test_a_conda_rebuild_at_one_version_is_named_by_its_build() -> None:
    """conda-forge rebuilds a package at one version under another build string: the library's
    path and the package's version agree, the build does not."""
    native = {"libraries": [{"name": "libomp.so", "path": "/opt/conda/lib/libomp.so",
                             "conda_package": "llvm-openmp"}], "runtimes": []}
    a = make_lock(native=native, conda={"packages": [{"name": "llvm-openmp", "version": "17.0.6", "build": "h4bd325d_0"}]})
    b = make_lock(native=native, conda={"packages": [{"name": "llvm-openmp", "version": "17.0.6", "build": "h4bd325d_1"}]})
    change = _changes(a, b)["native.content.libomp.so"]
    assert (change.original, change.replay) == ("conda package llvm-openmp 17.0.6 h4bd325d_0",
                                                "conda package llvm-openmp 17.0.6 h4bd325d_1")


# -- two runtimes of one kind ------------------------------------------------------------------------

SITE = "/venv/lib/python3.11/site-packages"
# threadpoolctl.threadpool_info() as it answers in a process that loaded torch's libgomp and
# an Intel OpenMP runtime, and numpy's and scipy's OpenBLAS.
INFO = [
    {"user_api": "openmp", "internal_api": "openmp", "num_threads": 8, "prefix": "libgomp",
     "filepath": f"{SITE}/torch/lib/libgomp.so.1", "version": None},
    {"user_api": "openmp", "internal_api": "openmp", "num_threads": 8, "prefix": "libiomp",
     "filepath": f"{SITE}/../../libiomp5.so", "version": None},
    {"user_api": "blas", "internal_api": "openblas", "num_threads": 8, "prefix": "libscipy_openblas",
     "filepath": f"{SITE}/numpy.libs/libscipy_openblas64_-32a4b2a6.so", "version": "0.3.31.188.0",
     "threading_layer": "pthreads", "architecture": "Haswell"},
    {"user_api": "blas", "internal_api": "openblas", "num_threads": 8, "prefix": "libscipy_openblas",
     "filepath": f"{SITE}/scipy.libs/libscipy_openblas-68440149.so", "version": "0.3.28.dev",
     "threading_layer": "pthreads", "architecture": "Haswell"},
]


def _runtimes_lock(info: list[dict[str, Any]]) -> Lock:
    return make_lock(native={"libraries": [], "runtimes": [_from_threadpoolctl(i) for i in info],
                             "runtimes_source": "threadpoolctl"})


def test_two_runtimes_of_one_kind_both_survive_in_a_record() -> None:
    context = context_of(canonical_form(_runtimes_lock(INFO)))
    runtimes = {k: v for k, v in context.items() if k.startswith("native.runtimes.")}
    assert runtimes["native.runtimes.openmp.openmp.libgomp.so.1.library"] == "libgomp.so.1"
    assert runtimes["native.runtimes.openmp.openmp.libiomp5.so.library"] == "libiomp5.so"
    assert runtimes["native.runtimes.blas.openblas.libscipy_openblas64_-32a4b2a6.so.version"] == "0.3.31.188.0"
    assert runtimes["native.runtimes.blas.openblas.libscipy_openblas-68440149.so.version"] == "0.3.28.dev"
    assert len([k for k in runtimes if k.endswith(".library")]) == 4
    # One of a kind keeps its kind's name, so numpy's OpenBLAS under another file name (every
    # numpy release renames it) still meets its counterpart.
    one = context_of(canonical_form(_runtimes_lock(INFO[2:3])))
    assert one["native.runtimes.blas.openblas.version"] == "0.3.31.188.0"


def test_a_change_to_the_second_runtime_of_a_kind_is_named() -> None:
    """scipy's OpenBLAS pinned to one thread while numpy's keeps eight: with both under one key
    the second overwrote the first and whichever came last decided what was compared."""
    changed = [dict(i) for i in INFO]
    changed[3]["num_threads"] = 1
    found = _changes(_runtimes_lock(INFO), _runtimes_lock(changed))
    key = "native.runtimes.blas.openblas.libscipy_openblas-68440149.so.num_threads"
    assert set(found) == {key} and (found[key].original, found[key].replay) == (8, 1)


def test_two_files_of_one_name_are_told_apart_by_their_directory() -> None:
    same = [{"api": "blas", "implementation": "openblas", "library": "libopenblas.so.0", "path": f"/x/{d}/libopenblas.so.0"}
            for d in ("numpy.libs", "scipy.libs")]
    assert runtime_keys(same) == ["blas.openblas.libopenblas.so.0.numpy.libs", "blas.openblas.libopenblas.so.0.scipy.libs"]


def test_a_process_that_loaded_two_openmp_runtimes_keeps_both(tmp_path: Path) -> None:
    """A real process: torch's libgomp and this host's own, both loaded (a package built against
    the system's), described by the probe with threadpoolctl where it is installed."""
    pytest.importorskip("threadpoolctl")
    import importlib.util

    spec = importlib.util.find_spec("torch")
    torch_gomp = [p for loc in (spec.submodule_search_locations or []) if spec
                  for p in glob.glob(f"{loc}/lib/libgomp*.so*")] if spec else []
    system = sorted(glob.glob("/usr/lib/*-linux-gnu/libgomp.so.1"))
    if not torch_gomp or not system:
        pytest.skip("needs torch's libgomp and the system's")
    script = textwrap.dedent(f"""
        import ctypes, json
        for path in {[torch_gomp[0], system[0]]!r}:
            ctypes.CDLL(path)
        from envlock.probe.native import collect_runtimes, loaded_libraries
        print(json.dumps(collect_runtimes(loaded_libraries())))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    runtimes, source = json.loads(done.stdout)
    assert source == "threadpoolctl"
    openmp = [r for r in runtimes if r["api"] == "openmp"]
    assert len(openmp) == 2, runtimes
    form = context_form({"native": {"libraries": [], "runtimes": runtimes}})
    kept = [k for k in form["native"]["runtimes"] if k.startswith("openmp.openmp")]
    assert len(kept) == 2 and all(k != "openmp.openmp" for k in kept)


# -- a field one process could not learn -------------------------------------------------------------

def test_a_runtime_field_one_process_could_not_learn_is_no_cause() -> None:
    """The original ran without threadpoolctl (its runtimes named from their files); threadpoolctl
    was installed before the replay, which learnt the version, threading layer and threads.
    Verify says nothing of it, and neither does the replay; a thread count both learnt and that
    differs is still named by both."""
    by_file = make_lock(native={"libraries": [], "runtimes": [
        {"api": "blas", "implementation": "openblas", "library": "libscipy_openblas64_-32a4b2a6.so",
         "path": f"{SITE}/numpy.libs/libscipy_openblas64_-32a4b2a6.so"}], "runtimes_source": "maps"})
    asked = _runtimes_lock(INFO[2:3])
    assert [d.path for d in compare(by_file, asked).differences] == []
    assert _changes(by_file, asked) == {}
    assert _changes(asked, by_file) == {}
    fewer = [{**INFO[2], "num_threads": 1}]
    assert [d.path for d in compare(asked, _runtimes_lock(fewer)).differences] == ["native.runtimes.blas.openblas.num_threads"]
    assert set(_changes(asked, _runtimes_lock(fewer))) == {"native.runtimes.blas.openblas.num_threads"}
