"""``--python`` naming something that is no usable Python says so, instead of the last line of
whatever that program printed ("Try '/bin/ls --help'", pyenv's "Note: See 'pyenv help global'")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envlock.errors import InterpreterNotFound, ProbeFailed
from envlock.probing.process import ProbeProcess, probe_args, python_version

ARGS = probe_args(torch=False, cache=False)


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_program_that_is_no_python() -> None:
    with pytest.raises(InterpreterNotFound, match=r"^/bin/ls is not a Python interpreter \(it said: "):
        ProbeProcess("/bin/ls", ARGS).result()


def test_a_pyenv_shim_of_a_version_not_installed(tmp_path: Path) -> None:
    shim = _script(tmp_path / "python2.7", (
        "echo \"pyenv: python2.7: command not found\" >&2\necho >&2\n"
        "echo \"The \\`python2.7' command exists in these Python versions:\" >&2\n"
        "echo '  2.7.18' >&2\necho >&2\n"
        "echo \"Note: See 'pyenv help global' for tips on allowing both\" >&2\nexit 127\n"))
    with pytest.raises(InterpreterNotFound) as info:
        ProbeProcess(str(shim), ARGS).result()
    assert "is not a Python interpreter (it said: pyenv: python2.7: command not found)" in info.value.message


def test_a_python_too_old(tmp_path: Path) -> None:
    old = _script(tmp_path / "python2.7", (
        "if [ \"$1\" = -c ]; then printf 'envlock-python 2.7'; exit 0; fi\n"
        "echo '  File \"probe\", line 3' >&2; echo 'SyntaxError: invalid syntax' >&2; exit 1\n"))
    with pytest.raises(InterpreterNotFound, match=r"is Python 2\.7, too old for the probe"):
        ProbeProcess(str(old), ARGS).result()


def test_twin_a_real_python_keeps_its_own_error(tmp_path: Path) -> None:
    """Over-reach check: a working Python whose probe fails is not called "no Python"."""
    wrapper = _script(tmp_path / "python", (
        f"if [ \"$1\" = -c ]; then exec {sys.executable} \"$@\"; fi\n"
        "echo 'ImportError: the real reason' >&2; exit 1\n"))
    assert python_version(str(wrapper)) == sys.version_info[:2]
    with pytest.raises(ProbeFailed, match="the real reason") as info:
        ProbeProcess(str(wrapper), ARGS).result()
    assert not isinstance(info.value, InterpreterNotFound)
