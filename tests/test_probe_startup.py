"""What the probe does at start-up instead of the general tools: its own argument reading, the
platform facts without ``platform``/``sysconfig``, NVML's absence without ``ctypes``. Each is
checked against the tool it stands in for."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import collect

_TOKENS = st.sampled_from([
    "--no-torch", "--canary", "--deep", "--progress", "--no-cache", "--image", "--cwd", "--indent",
    "--git-exclude", "--image=ref:1", "--indent=2", "--indent=x", "--cwd=", "--no-t", "--help", "-h",
    "--", "-", "-1", "2", " 3", "x", "", "a=b", "--git-exclude=env.lock", "--deep=1", "--imag",
])


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            parsed: dict[str, Any] = vars(collect.parser().parse_args(argv))
            return parsed
        except SystemExit:
            return None


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(st.lists(_TOKENS, max_size=6))
def test_own_argument_reading_agrees_with_argparse(argv: list[str]) -> None:
    fast = collect.parse_args(argv)
    if fast is not None:
        assert fast == _argparse(argv)


@pytest.mark.parametrize("argv", [
    [], ["--no-torch"], ["--no-cache", "--cwd", "/x", "--git-exclude", "a.lock", "--git-exclude=b"],
    ["--image", "reg/x:1@sha256:" + "a" * 64, "--indent", "2", "--deep", "--progress", "--canary"],
])
def test_what_envlock_passes_is_read_without_argparse(argv: list[str]) -> None:
    fast = collect.parse_args(argv)
    assert fast is not None and fast == _argparse(argv)


@pytest.mark.parametrize("argv", [["--help"], ["--no-t"], ["--indent", "x"], ["--indent", "-1"], ["stray"]])
def test_anything_else_goes_to_argparse(argv: list[str]) -> None:
    assert collect.parse_args(argv) is None
    assert isinstance(collect.parser(), argparse.ArgumentParser)


def test_the_probe_program_reads_its_arguments(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    assert collect.main(["--no-torch", "--no-cache", "--cwd", str(tmp_path), "--indent", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("{\n ") and '"torch": "skipped (--no-torch)"' in out
    assert not (tmp_path / "cache").exists()
    with pytest.raises(SystemExit):
        collect.main(["--no-such-flag"])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert sys.modules.get("envlock.probe.collect") is collect


@pytest.mark.parametrize("name", ["libenvlock-absent.so.1", "/nonexistent/lib.so"])
def test_a_missing_library_fails_as_ctypes_says(name: str) -> None:
    import ctypes

    from envlock.probe import gpu

    with pytest.raises(OSError) as by_ctypes:
        ctypes.CDLL(name)
    with pytest.raises(OSError) as by_probe:
        gpu._loadable(name)
    assert (type(by_probe.value), str(by_probe.value)) == (type(by_ctypes.value), str(by_ctypes.value))


def test_a_present_library_passes_the_check() -> None:
    from envlock.probe import gpu

    gpu._loadable("libc.so.6")


# -- platform facts: the probe's reading against platform and sysconfig themselves ------------


def test_platform_facts_equal_platform_and_sysconfig_here() -> None:
    import platform
    import sysconfig

    from envlock.probe import system

    assert system.uname() == (platform.system(), platform.release(), platform.machine())
    assert system.python_version() == platform.python_version()
    assert system.soabi_and_platform_tag() == (sysconfig.get_config_var("SOABI"), sysconfig.get_platform())


def test_a_cross_build_platform_is_asked_of_sysconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    from envlock.probe import system

    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", "linux-riscv64")
    assert system.soabi_and_platform_tag()[1] == "linux-riscv64"


_VERSIONS = [
    "3.11.7 (main, Dec 13 2023, 10:00:00) [GCC 12.2.0]",
    "3.8.10 (default, Nov 22 2023, 10:22:35) \n[GCC 9.4.0]",
    "3.13.0 experimental free-threading build (main, Oct  7 2024, 05:02:14) [Clang 16.0.0]",
    "3.12.0rc1+ (heads/3.12:abc, Aug  1 2023, 12:00:00) [GCC 13.1.0]",
    "3.10 (default) [GCC]", "3.9.18 |Anaconda, Inc.| (main, Sep 11 2023, 13:41:44) [GCC 11.2.0]",
]


def _same_as_platform(text: str) -> None:
    """``system.python_version`` answers (or refuses) ``text`` as ``platform`` does."""
    import platform

    from envlock.probe import system

    platform._sys_version_cache.clear()  # type: ignore[attr-defined]
    try:
        expected = platform._sys_version(text)[1]  # type: ignore[attr-defined]
    except ValueError:
        with pytest.raises(ValueError):
            system.python_version(text)
        return
    assert system.python_version(text) == expected


@pytest.mark.parametrize("text", _VERSIONS)
def test_python_version_reads_sys_version_as_platform_does(text: str) -> None:
    _same_as_platform(text)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["3", ".", "11", "7", "+", "rc1", " ", "(", ")", "#", ",", "main",
                                 "[", "]", "GCC", "|", "\n", ":", "Dec 13 2023", "a"]), max_size=14).map("".join))
def test_python_version_fuzz_against_platform(text: str) -> None:
    _same_as_platform(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(min_value=0, max_value=5000))
def test_the_probes_sha256_is_hashlibs(data: bytes, cut: int) -> None:
    import hashlib

    from envlock.probe.files import sha256

    h = sha256(data[:cut])
    h.update(data[cut:])
    assert h.hexdigest() == hashlib.sha256(data).hexdigest() == sha256(data).hexdigest()


def test_the_probe_program_imports_none_of_the_modules_it_stands_in_for(tmp_path: Any) -> None:
    """What the stand-ins above are for: a probe run without torch on Linux CPython loads none
    of these (``-X importtime`` lists every module a run imports; ``-S`` keeps out what the
    site-packages' own start-up files import, such as an editable install's finder)."""
    import subprocess

    from helpers import REPO

    env = {"PATH": "/usr/bin:/bin", "ENVLOCK_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-S", "-X", "importtime", str(REPO / "envlock" / "probe"), "--no-torch"]
    # The second run: the first fills the cache, and writing it takes tempfile (and shutil).
    for _ in range(2):
        out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
                             check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert {"_envlock_probe.cache", "_envlock_probe.git", "json"} <= loaded
    avoided = {"typing", "hashlib", "platform", "sysconfig", "argparse", "shutil"}
    if not _nvml_present():
        avoided.add("ctypes")  # on a GPU machine NVML is read through it
    assert not loaded & avoided


def _nvml_present() -> bool:
    import importlib.util

    from envlock.probe import gpu

    try:
        gpu._loadable("libnvidia-ml.so.1")
    except OSError:
        return importlib.util.find_spec("pynvml") is not None
    return True
