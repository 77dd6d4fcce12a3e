"""The probe subprocess is bounded: its interpreter is the one named, its time and output capped."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from envlock.errors import ProbeFailed, UsageError
from envlock.probing.process import (
    DEFAULT_PROBE_TIMEOUT,
    ProbeProcess,
    probe_timeout,
    resolve_python,
)

# What the probe prints before its JSON document (see DOCUMENT_MARKER), for the fakes below.
MARK = "printf '\\n\\036envlock-probe-document\\n'\n"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_relative_path_is_that_file_not_a_path_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script(tmp_path / "python3", MARK + "echo '{\"ran\": \"the local file\"}'\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_python("./python3") == str(tmp_path / "python3")
    assert ProbeProcess("./python3", []).result() == {"ran": "the local file"}


def test_a_bare_name_is_looked_up_on_path_even_if_a_file_of_that_name_is_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script(tmp_path / "python3", "exit 1\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_python("python3") == shutil.which("python3")


def test_a_venv_directory_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    script(tmp_path / ".venv" / "bin" / "python", "exit 0\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_python(".venv") == str(tmp_path / ".venv" / "bin" / "python")


@pytest.mark.timeout(60)
def test_timeout_kills_the_whole_group_and_does_not_wait_for_the_pipes(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    wrapper = script(tmp_path / "python", f"sleep 1000 &\necho $! > {pidfile}\nwait\n")
    proc = ProbeProcess(str(wrapper), [], timeout=1.0)
    start = time.monotonic()
    with pytest.raises(ProbeFailed, match="did not finish within 1s"):
        proc.result()
    assert time.monotonic() - start < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.05)
    assert not _running(child), "the interpreter's child outlived the timeout"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_probe_that_exits_but_leaves_a_child_with_the_pipes_is_not_waited_for(tmp_path: Path) -> None:
    wrapper = script(tmp_path / "python", "sleep 1000 &\n" + MARK + "echo '{\"ok\": true}'\n")
    start = time.monotonic()
    assert ProbeProcess(str(wrapper), [], timeout=60).result() == {"ok": True}
    assert time.monotonic() - start < 10


def test_output_is_capped_with_a_clear_error(tmp_path: Path) -> None:
    wrapper = script(tmp_path / "python", "head -c 50000000 /dev/zero\n")
    with pytest.raises(ProbeFailed, match="printed more than 1 MiB"):
        ProbeProcess(str(wrapper), [], max_output=1 << 20).result()


def test_stderr_tail_is_kept_for_the_error(tmp_path: Path) -> None:
    # A Python (it answers envlock's version question) whose probe fails: its own last line.
    wrapper = script(tmp_path / "python", f"if [ \"$1\" = -c ]; then exec {sys.executable} \"$@\"; fi\n"
                     "head -c 5000000 /dev/zero >&2\necho 'the real reason' >&2\nexit 1\n")
    with pytest.raises(ProbeFailed, match="the real reason"):
        ProbeProcess(str(wrapper), []).result()


def test_default_timeout_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVLOCK_PROBE_TIMEOUT", raising=False)
    assert probe_timeout() == DEFAULT_PROBE_TIMEOUT <= 120
    monkeypatch.setenv("ENVLOCK_PROBE_TIMEOUT", "900")
    assert probe_timeout() == 900
    for bad in ("soon", "-1", "0", "nan", "inf"):
        monkeypatch.setenv("ENVLOCK_PROBE_TIMEOUT", bad)
        with pytest.raises(UsageError, match="ENVLOCK_PROBE_TIMEOUT"):
            probe_timeout()


def test_the_real_probe_still_runs() -> None:
    import sys

    doc = ProbeProcess(sys.executable, ["--no-torch"]).result()
    assert doc["python"]["version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}")


def test_the_probe_runs_in_its_own_session_with_stdin_from_dev_null(tmp_path: Path) -> None:
    """Its own session: the terminal's Ctrl-C reaches envlock, which stops the group; stdin
    closed to it, and SIGPIPE at its default (a probe writing to a closed pipe just ends)."""
    wrapper = script(tmp_path / "python", MARK +
                     "printf '{\"sid\": %s, \"stdin\": \"%s\", \"pipe\": \"%s\"}' "
                     "\"$(ps -o sid= -p $$)\" \"$(readlink /proc/self/fd/0)\" "
                     "\"$(grep SigIgn /proc/self/status | tr -d '\\t ')\"\n")
    proc = ProbeProcess(str(wrapper), [])
    doc = proc.result()
    assert doc["sid"] == proc.proc.pid and doc["sid"] != os.getsid(0)
    assert doc["stdin"] == os.devnull
    ignored = int(doc["pipe"].partition(":")[2], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE must be back at its default"
