"""Declared host requirements (``[requires]``): derived at capture, set with ``--require`` or by
hand (checked by ``fmt``), and ``verify --requirements`` judging a host by them alone, saying
what it cannot check instead of failing it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import make_lock

from envlock.commands import main
from envlock.drift.requirements import Host, check, judge, requirement_updates, requirements_of
from envlock.errors import EXIT_DRIFT, EXIT_OK, EXIT_USAGE, UsageError
from envlock.lock import Requires, load
from envlock.probe.requires import derive, glibc_of_tag, wheel_glibc
from envlock.probe.rules import kernels_for

RICH = Path(__file__).parent / "fixtures" / "sealed" / "rich.lock"
AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
CPU_HOST = Host("glibc", "2.36", None, None, (), AVX2, "x86_64")


def _host(**fields: object) -> Host:
    return CPU_HOST._replace(**fields)  # type: ignore[arg-type]


def test_kernels_for_a_gpu_follow_cuda_binary_compatibility() -> None:
    archs = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert kernels_for("8.9", archs) == "native"  # sm_86 cubins run on 8.9
    assert kernels_for("12.1", archs) == "native"
    assert kernels_for("7.0", archs) == "none"  # Volta: the cu130 build dropped it
    assert kernels_for("11.0", archs) == "none"  # no sm_11x, no PTX
    assert kernels_for("9.0", ["sm_90a"]) == "native" and kernels_for("9.1", ["sm_90a"]) == "none"
    assert kernels_for("10.0", ["sm_80", "compute_90"]) == "ptx"
    assert kernels_for("8.6", ["sm_80", "compute_90"]) == "native"
    assert kernels_for("8.0", ["gfx90a"]) is None and kernels_for("", archs) is None


def test_glibc_of_wheel_tags() -> None:
    assert glibc_of_tag("manylinux_2_28_x86_64") == (2, 28)
    assert glibc_of_tag("manylinux2014_x86_64") == (2, 17)
    assert glibc_of_tag("manylinux1_x86_64") == (2, 5)
    assert glibc_of_tag("musllinux_1_2_x86_64") is None and glibc_of_tag("linux_x86_64") is None


def test_the_glibc_requirement_is_the_newest_any_native_wheel_needs(tmp_path: Path) -> None:
    site = tmp_path / "site"

    def wheel(name: str, tags: list[str], native: bool) -> tuple[str, str, str]:
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "WHEEL").write_text("Wheel-Version: 1.0\n" + "".join(f"Tag: {t}\n" for t in tags))
        (info / "RECORD").write_text(f"{name}/x.so,sha256=a,1\n" if native else f"{name}/x.py,sha256=a,1\n")
        return name, str(site), info.name

    dists = [wheel("torch", ["cp311-cp311-manylinux_2_28_x86_64"], True),
             # either tag will do: the older one is the requirement
             wheel("numpy", ["cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"], True),
             wheel("pure", ["py3-none-manylinux_2_39_x86_64"], False)]  # never read: no .so

    def libraries_of(record: str) -> list[str]:
        return [line.split(",")[0] for line in Path(record).read_text().splitlines() if ".so" in line]

    assert wheel_glibc(dists, libraries_of) == "2.28"
    assert wheel_glibc(dists[1:], libraries_of) == "2.17"


def test_requirements_derived_from_a_cuda_build() -> None:
    """What the build needs, each key named as derived; the CPU capability torch dispatched to
    on the capturing host is not one (the wheel carries its AVX2 and DEFAULT kernels too)."""
    torch = {"cuda": "12.6", "arch_list": ["sm_80", "sm_90", "gfx90a"], "cpu_capability": "AVX512"}
    assert derive(torch, "2.28") == {"cuda_driver": "12.6", "gpu_archs": ["sm_80", "sm_90"],
                                     "glibc": "2.28", "derived": ["cuda_driver", "glibc", "gpu_archs"]}
    assert derive({"arch_list": [], "cpu_capability": "DEFAULT"}, None) == {}
    assert derive({"arch_list": [], "cpu_capability": "SVE256"}, "2.17") == {"glibc": "2.17", "derived": ["glibc"]}


def test_a_torch_capture_on_an_avx512_host_verifies_on_a_host_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A real in-process capture of this process's torch, with its dispatcher answering AVX512
    as on the capturing box: the host's capability stays a fact of the lock, but no AVX-512
    feature becomes a requirement, so ``verify --requirements`` passes on a laptop's AVX2 CPU
    (it used to fail there: "this x86_64 CPU lacks avx512f, ...")."""
    import torch

    import envlock
    from envlock.probe import system

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    lock = envlock.capture()
    assert lock.torch is not None and lock.torch.cpu_capability == "AVX512"
    assert lock.requires is not None and lock.requires.cpu_features == []
    assert lock.requires.glibc and lock.requires.derived and "glibc" in lock.requires.derived
    path = tmp_path / "env.lock"
    lock.save(path)
    monkeypatch.setattr(system, "cpu_flags", lambda: AVX2)
    capsys.readouterr()
    assert main(["verify", str(path), "--requirements", "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and not any(c["requirement"].startswith("CPU features") for c in doc["checks"])
    assert main(["fmt", str(path), "--require", "cpu_features=avx512f", "--require", "glibc=2.17"]) == EXIT_OK
    declared = load(path).requires
    assert declared is not None and declared.cpu_features == ["avx512f"] and declared.glibc == "2.17"
    assert "glibc" not in (declared.derived or ())  # set by hand now, so declared
    assert main(["verify", str(path), "--requirements"]) == EXIT_DRIFT  # declared: judged
    assert "lacks avx512f" in capsys.readouterr().out


def test_derived_names_only_keys_of_requires() -> None:
    from pydantic import ValidationError

    assert Requires(glibc="2.28", derived=["glibc"]).derived == ["glibc"]
    with pytest.raises(ValidationError, match="not a key of"):
        Requires(derived=["derived"])


def test_a_cpu_only_host_passes_what_it_can_check_and_names_the_rest() -> None:
    req = Requires(cuda_driver="13.0", glibc="2.28", gpu_archs=["sm_80", "sm_90"], cpu_features=["avx2", "fma"])
    checks = judge(req, CPU_HOST)
    assert [(c.requirement, c.verdict) for c in checks] == [
        ("NVIDIA driver supporting CUDA >= 13.0", "unchecked"), ("glibc >= 2.28", "ok"),
        ("GPU architecture among sm_80, sm_90", "unchecked"), ("CPU features avx2, fma", "ok")]
    assert checks[0].message == "no NVIDIA driver on this host"
    lock = make_lock(requires=req.model_dump())
    assert check(lock, CPU_HOST).ok and not check(lock, CPU_HOST, strict=True).ok


def test_a_host_that_fails_a_requirement_is_told_why() -> None:
    req = Requires(cuda_driver="13.0", glibc="2.28", gpu_archs=["sm_80", "sm_90"], cpu_features=["avx512f"])
    host = _host(libc_version="2.27", cuda_driver="12.4", gpus=((0, "V100", "7.0"), (1, "H100", "9.0")),
                 cpu_flags=AVX2)
    verdicts = {(c.requirement, c.verdict): c.message for c in judge(req, host)}
    assert verdicts[("NVIDIA driver supporting CUDA >= 13.0", "fail")].startswith("the driver supports CUDA 12.4")
    assert "glibc 2.27" in verdicts[("glibc >= 2.28", "fail")]
    assert verdicts[("GPU architecture among sm_80, sm_90", "fail")] == \
        "GPU 0 (V100, compute capability 7.0): the build has no kernels for it"
    assert verdicts[("GPU architecture among sm_80, sm_90", "ok")].startswith("GPU 1 (H100")
    assert "lacks avx512f" in verdicts[("CPU features avx512f", "fail")]
    musl = judge(Requires(glibc="2.28"), _host(libc="musl", libc_version=None))
    assert musl[0].verdict == "fail" and "musl" in musl[0].message


def test_a_lock_older_than_requires_is_judged_by_what_its_torch_implies() -> None:
    old = load(RICH)
    req, derived = requirements_of(old)
    assert derived and req.cuda_driver == "12.6" and req.gpu_archs == ["sm_80", "sm_90"]
    assert req.cpu_features == [] and req.glibc is None  # its AVX2 was the host's, not the build's


def test_require_options_are_checked_before_anything_runs() -> None:
    assert requirement_updates(["glibc=2.31", "gpu_archs=sm_80, sm_90", "cuda_driver="]) == {
        "glibc": "2.31", "gpu_archs": ["sm_80", "sm_90"], "cuda_driver": None}
    for bad in ("glibc", "driver=1.0", "glibc=two", "gpu_archs=ampere", "cpu_features=AVX2"):
        with pytest.raises(UsageError):
            requirement_updates([bad])


def test_verify_requirements_on_this_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real command: a lock needing a GPU and a driver, on this (CPU-only) test host."""
    lock = tmp_path / "env.lock"
    shutil.copy(RICH, lock)
    assert main(["fmt", str(lock), "--require", "cuda_driver=12.6", "--require", "glibc=2.17",
                 "--require", "gpu_archs=sm_80,sm_90", "--require", "cpu_features="]) == EXIT_OK
    assert load(lock).requires == Requires(cuda_driver="12.6", glibc="2.17", gpu_archs=["sm_80", "sm_90"])
    capsys.readouterr()
    code = main(["verify", str(lock), "--requirements", "--json"])
    doc = json.loads(capsys.readouterr().out)
    verdicts = {c["requirement"]: c["verdict"] for c in doc["checks"]}
    assert verdicts["glibc >= 2.17"] == "ok"
    if not os.path.exists("/proc/driver/nvidia/version"):  # the CPU-only runner this is for
        assert verdicts["NVIDIA driver supporting CUDA >= 12.6"] == "unchecked"
        assert verdicts["GPU architecture among sm_80, sm_90"] == "unchecked"
        assert code == EXIT_OK and doc["ok"] and not doc["derived"]
        assert main(["verify", str(lock), "--requirements", "--strict"]) == EXIT_DRIFT
        text = capsys.readouterr().out
        assert "cannot check  NVIDIA driver supporting CUDA >= 12.6: no NVIDIA driver on this host" in text


def test_a_hand_edit_of_requires_is_checked_by_fmt(tmp_path: Path) -> None:
    lock = tmp_path / "env.lock"
    shutil.copy(RICH, lock)
    assert main(["fmt", str(lock), "--require", "glibc=2.17"]) == EXIT_OK
    text = lock.read_text()
    assert 'glibc = "2.17"' in text
    lock.write_text(text.replace('glibc = "2.17"', 'glibc = "2.31"'))
    assert main(["verify", str(lock), "--requirements"]) == EXIT_USAGE  # an edit breaks the seal
    assert main(["fmt", str(lock)]) == EXIT_OK and load(lock).requires == Requires(glibc="2.31")
    lock.write_text(lock.read_text().replace('glibc = "2.31"', 'glibc = "new"'))
    assert main(["fmt", str(lock)]) == EXIT_USAGE  # not a version: refused, the file kept
    assert 'glibc = "new"' in lock.read_text()


def test_verify_requirements_does_not_mix_with_a_full_verify(tmp_path: Path) -> None:
    lock = tmp_path / "env.lock"
    shutil.copy(RICH, lock)
    assert main(["verify", str(lock), "--requirements", "--deep"]) == EXIT_USAGE


def test_capture_writes_requirements_and_require_overrides_one(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "env.lock"
    assert main(["capture", "--no-torch", "-o", str(lock)]) == EXIT_OK
    derived = load(lock).requires
    assert derived is not None and derived.glibc  # pydantic-core and friends are manylinux wheels
    assert main(["capture", "--no-torch", "-o", str(lock), "--require", "glibc=2.5",
                 "--require", "cpu_features=avx2"]) == EXIT_OK
    assert load(lock).requires == Requires(glibc="2.5", cpu_features=["avx2"])
    assert main(["capture", "--no-torch", "-o", str(tmp_path / "x.lock"), "--require", "glibc=x"]) == EXIT_USAGE
    assert not (tmp_path / "x.lock").exists()
