"""The comparator's sections beneath the packages (``envlock/drift/native.py``): a library
loaded from another file, a BLAS/OpenMP runtime that changed, torch.compile's settings and
caches, CUDA libraries loaded against those torch was built with, a GPU without kernels; a
lock written before these tables existed; and a replay's "lock differences that can explain it".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import make_lock

from envlock.drift.compare import compare
from envlock.drift.native import MAX_CONTEXT_UNOWNED, mismatch, where
from envlock.lock import Library, Lock, load
from envlock.lock._seal import canonical_form
from envlock.replay.compare import compare_records, context_of
from envlock.replay.record import Meta, Record, Step
from envlock.replay.report import replay_text

SITE = "/venv/lib/python3.11/site-packages"
RICH = Path(__file__).parent / "fixtures" / "sealed" / "rich.lock"
TORCH = {"version": "2.13.0+cu130", "cuda": "13.0", "cudnn": "9.20.0",
         "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "cpu_capability": "AVX2"}


def _gomp(path: str = f"{SITE}/torch/lib/libgomp.so.1", **owner: Any) -> dict[str, Any]:
    return {"name": "libgomp.so.1", "path": path,
            **(owner or {"distribution": "torch", "file": "torch/lib/libgomp.so.1"})}


def _native(*libraries: dict[str, Any], runtimes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"libraries": [
        {"name": "libc.so.6", "path": "/usr/lib/x86_64-linux-gnu/libc.so.6", "os_package": "libc6"},
        {"name": "_ssl.cpython-311-x86_64-linux-gnu.so", "path": "/py/lib-dynload/_ssl.so", "sha256": "1" * 64},
        *libraries], "runtimes": runtimes or [], "runtimes_source": "threadpoolctl"}


def _openblas(**fields: Any) -> dict[str, Any]:
    return {"api": "blas", "implementation": "openblas", "library": "libscipy_openblas64_-32a4b2a6.so",
            "path": f"{SITE}/numpy.libs/libscipy_openblas64_-32a4b2a6.so", "version": "0.3.31",
            "threading_layer": "pthreads", "architecture": "Haswell", "num_threads": 8, **fields}


def _paths(cmp: Any) -> dict[str, Any]:
    return {d.path: d for d in cmp.differences}


def test_a_numerics_library_from_another_file_is_breaking_and_names_both_paths() -> None:
    lock = make_lock(native=_native(_gomp()))
    swapped = make_lock(native=_native(_gomp("/opt/cluster/gcc-12/lib64/libgomp.so.1", sha256="a" * 64)))
    d = _paths(compare(lock, swapped))["native.libraries.libgomp.so.1"]
    assert d.severity == "breaking"
    message = d.describe()
    assert f"{SITE}/torch/lib/libgomp.so.1 (distribution torch) in the lock" in message
    assert "/opt/cluster/gcc-12/lib64/libgomp.so.1 (no package vouches for it; sha256 aaaaaaaaaaaa) now" in message


def test_the_same_file_in_another_venv_is_no_difference() -> None:
    """A distribution's file is the one its RECORD lists, wherever the venv is."""
    a = make_lock(native=_native(_gomp()))
    b = make_lock(native=_native(_gomp("/home/b/.venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1")))
    assert compare(a, b).differences == ()


def test_a_library_only_one_process_loaded_is_information_not_drift() -> None:
    a = make_lock(native=_native(_gomp()))
    b = make_lock(native=_native())
    cmp = compare(a, b)
    assert cmp.ok and _paths(cmp)["native.libraries.libgomp.so.1"].severity == "info"
    # Other libraries (an extension module, libc) that one side lacks are not listed at all.
    c = make_lock(native={**_native(), "libraries": _native()["libraries"][:1]})
    assert compare(b, c).differences == ()


def test_another_file_of_a_library_that_does_not_decide_numbers_is_info() -> None:
    a = make_lock(native=_native())
    libs = _native()["libraries"]
    libs[1] = {**libs[1], "sha256": "2" * 64}
    b = make_lock(native={**_native(), "libraries": libs})
    d = _paths(compare(a, b))["native.libraries._ssl.cpython-311-x86_64-linux-gnu.so"]
    assert d.severity == "info"


def test_runtime_changes_are_named_field_by_field() -> None:
    a = make_lock(native=_native(runtimes=[_openblas()]))
    b = make_lock(native=_native(runtimes=[_openblas(library="libscipy_openblas64_-ffff.so",
                                                     architecture="SkylakeX", num_threads=2)]))
    found = _paths(compare(a, b))
    assert found["native.runtimes.blas.openblas.architecture"].describe() == "openblas (blas) architecture: Haswell -> SkylakeX"
    assert found["native.runtimes.blas.openblas.num_threads"].severity == "warning"
    assert "native.runtimes.blas.openblas.version" not in found


def test_a_runtime_known_only_by_its_file_is_not_compared_field_by_field() -> None:
    a = make_lock(native=_native(runtimes=[_openblas()]))
    bare = {k: v for k, v in _openblas().items() if k in ("api", "implementation", "library", "path")}
    b = make_lock(native={**_native(runtimes=[bare]), "runtimes_source": "maps"})
    assert compare(a, b).differences == ()


def test_a_changed_compile_setting_is_named_and_is_process_state_for_a_fresh_process() -> None:
    caches = [{"kind": "inductor", "path": "/tmp/torchinductor_u", "files": 0, "bytes": 0}]
    a = make_lock(compile={"settings": {"inductor.max_autotune": False, "inductor.cpp.simdlen": 512},
                           "caches": caches})
    b = make_lock(compile={"settings": {"inductor.max_autotune": True, "inductor.cpp.simdlen": 512},
                           "caches": caches})
    d = _paths(compare(a, b))["compile.settings.inductor.max_autotune"]
    assert d.severity == "breaking" and d.describe() == "torch.compile setting inductor.max_autotune: False -> True"
    reported = compare(a, b, process_state="report")
    assert reported.ok and [p.path for p in reported.process] == ["compile.settings.inductor.max_autotune"]


def test_settings_a_fresh_process_could_not_read_are_not_compared() -> None:
    a = make_lock(compile={"settings": {"inductor.max_autotune": True}})
    b = make_lock(compile={})
    assert compare(a, b).differences == ()


def test_a_cold_compile_cache_is_told() -> None:
    warm = {"kind": "inductor", "path": "/tmp/torchinductor_u", "files": 132, "bytes": 10, "sha256": "3" * 64}
    cold = {"kind": "inductor", "path": "/tmp/torchinductor_u", "files": 0, "bytes": 0}
    d = _paths(compare(make_lock(compile={"caches": [warm]}), make_lock(compile={"caches": [cold]})))[
        "compile.caches.inductor"]
    assert d.severity == "info" and "132 files -> 0 (cold (empty)" in d.describe()


def test_compile_variables_are_warnings_and_cache_paths_info() -> None:
    a = make_lock(env={"TORCHINDUCTOR_CACHE_DIR": "/a"})
    b = make_lock(env={"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_CACHE_DIR": "/b"})
    found = _paths(compare(a, b))
    assert found["env.TORCHINDUCTOR_MAX_AUTOTUNE"].severity == "warning"
    assert found["env.TORCHINDUCTOR_CACHE_DIR"].severity == "info"


def _cuda(**libs: dict[str, str]) -> dict[str, Any]:
    return {**TORCH, "cuda_libraries": libs}


def test_a_cudnn_of_another_major_version_than_torch_was_built_with_is_breaking() -> None:
    lock = make_lock(torch=_cuda(cudnn={"built": "9.20.0", "loaded": "9.20.0"}))
    now = make_lock(torch=_cuda(cudnn={"built": "9.20.0", "loaded": "8.9.7"}))
    d = _paths(compare(lock, now))["torch.cuda_libraries.cudnn"]
    assert d.severity == "breaking"
    assert d.describe().startswith("torch was built against cuDNN 9.20.0; the process loaded 8.9.7")
    older = make_lock(torch=_cuda(cudnn={"built": "9.20.0", "loaded": "9.1.0"}))
    assert _paths(compare(lock, older))["torch.cuda_libraries.cudnn"].severity == "warning"


def test_a_mismatch_is_reported_by_verify_every_time_and_by_diff_when_it_is_new() -> None:
    both = make_lock(torch=_cuda(cudnn={"built": "9.20.0", "loaded": "8.9.7"}))
    assert "torch.cuda_libraries.cudnn" in _paths(compare(both, both))
    assert compare(both, both, names=("a.lock", "b.lock")).differences == ()


def test_a_loaded_cuda_runtime_or_cublas_that_changed_is_breaking() -> None:
    a = make_lock(torch=_cuda(cublas={"loaded": "13.1.1"}, cudart={"built": "13.0", "loaded": "13.0"}))
    b = make_lock(torch=_cuda(cublas={"loaded": "13.0.2"}, cudart={"built": "13.0", "loaded": "13.0"}))
    d = _paths(compare(a, b))["torch.cuda_libraries.cublas.loaded"]
    assert d.severity == "breaking" and d.describe() == "cuBLAS loaded: 13.1.1 -> 13.0.2"


def test_an_nccl_loaded_from_another_file_than_torch_was_compiled_with_is_named() -> None:
    """torch.cuda.nccl.version() is the nccl.h of torch's build: the NCCL a process loaded is
    compared apart from it, between locks and against the build."""
    a = make_lock(torch=_cuda(nccl={"built": "2.29.7", "loaded": "2.29.7"}))
    b = make_lock(torch=_cuda(nccl={"built": "2.29.7", "loaded": "2.29.3"}))
    d = _paths(compare(a, b))["torch.cuda_libraries.nccl"]
    assert d.severity == "warning"
    assert d.describe().startswith("torch was built against NCCL 2.29.7; the process loaded 2.29.3")
    c = make_lock(torch=_cuda(nccl={"loaded": "2.29.7"}))
    d = _paths(compare(c, make_lock(torch=_cuda(nccl={"loaded": "2.28.9"}))))["torch.cuda_libraries.nccl.loaded"]
    assert d.severity == "breaking" and d.describe() == "NCCL loaded: 2.29.7 -> 2.28.9"


def test_a_math_library_is_judged_against_the_version_torch_s_wheel_pins() -> None:
    """cuFFT's "built" is the pin of torch's wheel (4 parts), its "loaded" what cufftGetProperty
    says (3): they agree on the parts both name; a cuFFT 11 under a build pinned to 12 is breaking."""
    lock = make_lock(torch=_cuda(cufft={"built": "12.0.0.61", "loaded": "12.0.0"}))
    assert compare(lock, lock).differences == ()
    now = make_lock(torch=_cuda(cufft={"built": "12.0.0.61", "loaded": "11.3.3"}))
    d = _paths(compare(lock, now))["torch.cuda_libraries.cufft"]
    assert d.severity == "breaking" and "torch was built against cuFFT 12.0.0.61" in d.describe()


def test_versions_agree_on_the_parts_both_name() -> None:
    assert mismatch("13.0", "13.0") is None and mismatch("2.29.7", "2.29.7.1") is None
    assert mismatch("13.0", "12.9") == "major" and mismatch("9.20.0", "9.1.0") == "older"
    assert mismatch("9.1.0", "9.20.0") == "newer"


def _gpu(*capabilities: str, kernels: list[str]) -> dict[str, Any]:
    return {"source": "nvml", "driver": "580.82.07", "cuda_driver": "13.0", "devices": [
        {"index": i, "name": f"GPU{i}", "compute_capability": cc, "torch_kernels": k}
        for i, (cc, k) in enumerate(zip(capabilities, kernels, strict=True))]}


def test_a_gpu_the_build_has_no_kernels_for_is_breaking_and_ptx_a_warning() -> None:
    lock = make_lock(torch=TORCH, gpu=_gpu("8.0", "9.0", kernels=["native", "native"]))
    now = make_lock(torch=TORCH, gpu=_gpu("7.0", "9.0", kernels=["none", "native"]))
    d = _paths(compare(lock, now))["gpu.devices[0].torch_kernels"]
    assert d.severity == "breaking"
    assert "GPU 0 (GPU0, compute capability 7.0): torch 2.13.0+cu130 has no kernels for it" in d.describe()
    ptx = make_lock(torch={**TORCH, "arch_list": ["sm_80", "compute_80"]},
                    gpu=_gpu("8.0", "9.0", kernels=["native", "ptx"]))
    assert _paths(compare(lock, ptx))["gpu.devices[1].torch_kernels"].severity == "warning"


def test_a_lock_written_before_these_tables_reads_verifies_and_compares() -> None:
    """rich.lock was sealed by an earlier envlock: no [native], [compile], [requires] or
    cuda_libraries; against a capture that has them, none of them is a difference."""
    old = load(RICH)
    assert old.native is None and old.compile is None and old.requires is None
    assert old.torch is not None and old.torch.cuda_libraries is None
    new_tables = {
        "native": make_lock(native=_native(_gomp())).native,
        "compile": make_lock(compile={"settings": {"inductor.max_autotune": True}}).compile,
        "requires": make_lock(requires={"glibc": "2.28"}).requires,
        "torch": old.torch.model_copy(update={"cuda_libraries": make_lock(
            torch=_cuda(cudnn={"built": "9.5.1", "loaded": "9.5.1"})).torch.cuda_libraries}),  # type: ignore[union-attr]
    }
    now = old.model_copy(update=new_tables)
    assert compare(old, now).differences == ()
    assert compare(now, old).differences == ()


def _record(lock: Lock, loss: float) -> Record:
    from datetime import datetime, timezone

    meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                where="host", command=["python", "train.py"], exit_code=0)
    return Record(record=meta, context=context_of(canonical_form(lock)),
                  steps=[Step(step=0, metrics={"loss": loss})])


def test_a_replay_names_a_changed_compile_setting_and_a_swapped_library() -> None:
    original = make_lock(native=_native(_gomp()),
                         compile={"settings": {"inductor.max_autotune": False}, "caches": [
                             {"kind": "inductor", "path": "/tmp/i", "files": 3, "bytes": 9, "sha256": "4" * 64}]})
    replay = make_lock(native=_native(_gomp("/opt/x/libgomp.so.1", sha256="5" * 64)),
                       compile={"settings": {"inductor.max_autotune": True}, "caches": [
                           {"kind": "inductor", "path": "/tmp/i", "files": 0, "bytes": 0}]})
    cmp = compare_records(_record(original, 0.5), _record(replay, 0.25))
    keys = {c.key for c in cmp.context}
    assert {"compile.settings.inductor.max_autotune", "native.libraries.libgomp.so.1",
            "compile.caches.inductor.files"} <= keys
    text = replay_text(cmp, "run.record")
    assert "lock differences that can explain it" in text
    assert "compile.settings.inductor.max_autotune: False -> True" in text
    assert "/opt/x/libgomp.so.1" in text and "torch/lib/libgomp.so.1" in text
    # A library that decides nothing numeric and that a package vouches for stays out of the
    # record's context (its package's version is there); one no package vouches for is kept.
    context = context_of(canonical_form(original))
    assert not any("libc.so" in k for k in context)
    assert [k for k in context if "_ssl" in k] == ["native.unowned._ssl.cpython-311-x86_64-linux-gnu.so"]
    assert context["native.unowned_count"] == 1


def _libfoo(path: str, **owner: Any) -> dict[str, Any]:
    return {"name": "libfoo.so", "path": path, **(owner or {"sha256": "6" * 64})}


def test_a_replay_names_a_library_of_any_name_that_no_package_vouches_for() -> None:
    """A custom op rebuilt in place, a libfoo.so preloaded or found on LD_LIBRARY_PATH in front
    of the one a package ships: none is a numerics library's name, all can change the numbers."""
    ours = _libfoo(f"{SITE}/ops/libfoo.so", distribution="ops", file="ops/libfoo.so")
    cases = {
        "rebuilt in place": (_libfoo("/opt/ops/libfoo.so"), _libfoo("/opt/ops/libfoo.so", sha256="7" * 64)),
        "preloaded": (None, _libfoo("/opt/pre/libfoo.so")),
        "found first on LD_LIBRARY_PATH": (ours, _libfoo("/cluster/lib/libfoo.so")),
    }
    for why, (before, after) in cases.items():
        original = make_lock(native=_native(_gomp(), *([before] if before else [])))
        replay = make_lock(native=_native(_gomp(), after))
        cmp = compare_records(_record(original, 0.5), _record(replay, 0.25))
        found = {c.key: c for c in cmp.context}
        change = found.get("native.unowned.libfoo.so")
        assert change is not None, (why, sorted(found))
        assert change.replay == where(Library.model_validate(after))
        assert (change.original is None) == (before is None or before is ours), why
        assert "native.unowned.libfoo.so" in replay_text(cmp, "run.record"), why


def test_kernels_torch_compile_loaded_from_its_cache_are_the_cache_s_not_unowned_libraries() -> None:
    """Inductor's kernels are files named by their contents in the cache directory, a new one at
    every cold start: ``compile.caches.*`` describes them, not one context key per kernel."""
    kernel = {"name": "cel5wkgiie4j.main.so", "path": "/home/me/.cache/inductor/el/cel5wkgiie4j.main.so",
              "sha256": "8" * 64}
    lock = make_lock(native=_native(_gomp(), kernel, _libfoo("/opt/ops/libfoo.so")), compile={"caches": [
        {"kind": "inductor", "path": "/home/me/.cache/inductor", "files": 1, "bytes": 9, "sha256": "4" * 64}]})
    context = context_of(canonical_form(lock))
    assert sorted(k for k in context if k.startswith("native.unowned")) == [
        "native.unowned._ssl.cpython-311-x86_64-linux-gnu.so", "native.unowned.libfoo.so",
        "native.unowned_count"]
    assert context["native.unowned_count"] == 2


def test_a_record_kept_before_unowned_libraries_compares_none_of_them() -> None:
    """A record written before ``native.unowned`` existed is not a process without such
    libraries: the family is compared only when both records have it."""
    lock = make_lock(native=_native(_gomp(), _libfoo("/opt/ops/libfoo.so")))
    old = _record(lock, 0.5)
    old = old.model_copy(update={"context": {k: v for k, v in old.context.items()
                                             if not k.startswith("native.unowned")}})
    cmp = compare_records(old, _record(lock, 0.25))
    assert not [c for c in cmp.context if c.key.startswith("native.unowned")]


def test_a_record_keeps_a_bounded_number_of_unowned_libraries() -> None:
    many = [_libfoo(f"/opt/ops/libop{i:03}.so") | {"name": f"libop{i:03}.so"} for i in range(MAX_CONTEXT_UNOWNED + 8)]
    context = context_of(canonical_form(make_lock(native=_native(*many))))
    kept = sorted(k.removeprefix("native.unowned.") for k in context if k.startswith("native.unowned."))
    # The first by name (_native()'s _ssl module sorts first), and every one of them counted.
    assert kept == sorted([f"libop{i:03}.so" for i in range(MAX_CONTEXT_UNOWNED - 1)]
                          + ["_ssl.cpython-311-x86_64-linux-gnu.so"])
    assert context["native.unowned_count"] == MAX_CONTEXT_UNOWNED + 9
