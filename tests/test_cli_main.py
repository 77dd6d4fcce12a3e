"""``envlock.commands.main`` called in-process, as tests and other programs call it: it returns the
exit code (argparse's exits included) and leaves the interpreter running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
from helpers import REPO, make_lock, reap

from envlock import __version__
from envlock import lock as lockio
from envlock.commands import main
from envlock.errors import EXIT_DRIFT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from envlock.probe.procs import pid_alive


def test_capture_to_a_file_returns_0_and_prints_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "env.lock"
    assert main(["capture", "--no-torch", "-o", str(path)]) == EXIT_OK
    out, err = capsys.readouterr()
    lock = lockio.load(path)
    lines = out.splitlines()
    assert lines[0] == f"wrote {path}  id {lock.short_id}"
    assert lines[1].startswith("  locked ")
    assert lines[2] == (f"  python {lock.python.version} ({lock.python.prefix_kind}), torch not "
                        f"captured, no GPU, {len(lock.packages)} packages")
    assert len(lines) == 3
    # torch was skipped on purpose: not worth a note without -v.
    assert "torch not captured" not in err


def test_capture_verbose_notes_every_missing_section(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "env.lock"
    assert main(["capture", "--no-torch", "-v", "-o", str(path)]) == EXIT_OK
    err = capsys.readouterr().err
    assert "  note: torch not captured: skipped (--no-torch)\n" in err
    assert lockio.load(path).probe.errors["torch"] == "skipped (--no-torch)"


def test_capture_to_stdout_writes_the_lock_and_no_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "--no-torch", "-o", "-"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert tomllib.loads(out)["determinism"]["torch_loaded"] is False
    assert err.startswith("envlock: locked ")
    assert list(tmp_path.iterdir()) == []


def test_show_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = lockio.save(make_lock(), tmp_path / "a.lock")
    b = lockio.save(make_lock(packages=[{"name": "numpy", "version": "2.2.0"}]), tmp_path / "b.lock")
    assert main(["show", str(a)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(a) and "  python " in out and "  packages " in out
    assert main(["diff", str(a), str(a)]) == EXIT_OK
    assert "describe the same environment" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == EXIT_DRIFT
    assert "numpy 2.1.0 -> 2.2.0" in capsys.readouterr().out


def test_fmt_check_then_reseal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    assert main(["fmt", str(path)]) == EXIT_OK
    assert "already normalised and sealed" in capsys.readouterr().out
    text = path.read_text()
    edited = text.replace('version = "2.1.0"', 'version = "2.1.1"')
    assert edited != text
    path.write_text(edited)
    assert main(["show", str(path)]) == EXIT_USAGE
    assert "edited after capture" in capsys.readouterr().err
    assert main(["fmt", "--check", str(path)]) == EXIT_DRIFT
    assert "would be re-sealed" in capsys.readouterr().out
    assert path.read_text() == edited
    assert main(["fmt", str(path)]) == EXIT_OK
    assert capsys.readouterr().out == f"re-sealed {path}  id {lockio.load(path).short_id}\n"
    assert lockio.load(path).package("numpy").version == "2.1.1"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("content", "expect"),
    [(None, "not found"), (b"hello = \n", "not valid TOML"), (b"\x7fELF\x00\x01", "binary file")],
)
def test_bad_input_returns_2_with_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, expect: str) -> None:
    path = tmp_path / "env.lock"
    if content is not None:
        path.write_bytes(content)
    assert main(["show", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("envlock: error: ") and expect in err.splitlines()[0]
    assert "Traceback" not in err


def test_argparse_exits_become_return_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff"]) == EXIT_USAGE  # `diff B` alone compares the nearest env.lock with B
    assert "the following arguments are required: a" in capsys.readouterr().err
    assert main(["no-such-command"]) == EXIT_USAGE
    assert "invalid choice" in capsys.readouterr().err
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"envlock {__version__}\n"
    assert main(["show", "--help"]) == EXIT_OK
    assert capsys.readouterr().out.startswith("usage: envlock show")


def test_a_mistyped_word_is_answered_with_the_right_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verfy"]) == EXIT_USAGE
    assert "invalid choice: 'verfy'; did you mean 'verify'? (choose from 'capture', " in capsys.readouterr().err
    assert main(["diff", "a", "b", "--format", "jsn"]) == EXIT_USAGE
    assert "invalid choice: 'jsn'; did you mean 'json'?" in capsys.readouterr().err
    # an option the subcommand does not know: its usage, not the program's, and the option meant
    assert main(["verify", "--deeep"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: envlock verify ") and "[--deep]" in err, err
    assert err.endswith("envlock verify: error: unrecognized arguments: --deeep (did you mean --deep?)\n")
    assert main(["verify", "--deeep=1", "--jsn"]) == EXIT_USAGE
    assert "(--deeep=1: did you mean --deep?; --jsn: did you mean --json?)" in capsys.readouterr().err
    # the options run parses after the lock, and record's
    assert main(["run", str(tmp_path / "env.lock"), "--gpuss", "all", "--", "true"]) == EXIT_USAGE
    assert "envlock run: error: unrecognized arguments: --gpuss all (did you mean --gpus?)" in capsys.readouterr().err
    assert main(["record", str(tmp_path / "r.rec"), "--outptu", "x", "--", "true"]) == EXIT_USAGE
    assert "(did you mean --output?)" in capsys.readouterr().err
    # an unknown option before the command is named, not "COMMAND is required"
    assert main(["--verison"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "unrecognized arguments: --verison (did you mean --version?)" in err
    assert "required" not in err
    assert main(["--verison", "verify"]) == EXIT_USAGE
    assert "(did you mean --version?)" in capsys.readouterr().err
    assert main([]) == EXIT_USAGE  # nothing at all still asks for the command
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


def test_twin_no_suggestion_where_nothing_is_close(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zzzz"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid choice: 'zzzz' (choose from" in err and "did you mean" not in err
    assert main(["verify", "a.lock", "b.lock"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: envlock verify ") and err.endswith("unrecognized arguments: b.lock\n"), err
    assert main(["run", "--deeep", "x"]) == EXIT_USAGE  # run has no --deep; --help is not close
    err = capsys.readouterr().err
    assert "unrecognized arguments: --deeep" in err and "did you mean" not in err


def test_the_program_is_console_main() -> None:
    """The console script and ``python -m envlock`` run the same wrapper."""
    with open(REPO / "pyproject.toml", "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert scripts == {"envlock": "envlock.commands:console_main"}
    assert "console_main()" in (REPO / "envlock" / "__main__.py").read_text()


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    """A real SIGINT while the probe runs: one line on stderr, exit 130, no lock written."""
    started = tmp_path / "started"
    fake = tmp_path / "python"
    # An "interpreter" that records its pid and then hangs, as a probe stuck importing torch.
    fake.write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 60\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "envlock", "capture", "--python", str(fake),
                             "-o", str(tmp_path / "env.lock")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while not (started.exists() and started.read_text().strip()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the probe never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        # Whenever the interrupt lands (models still importing, or waiting on the probe),
        # envlock stops the probe's process group before it exits.
        left_running = pid_alive(int(started.read_text()))
    finally:
        reap(proc)
        if started.exists() and started.read_text().strip():
            # The fake probe runs in its own session: a SIGINT that lands before envlock waits
            # on it leaves it running, so it is stopped here whatever the outcome.
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(started.read_text()), signal.SIGKILL)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err == "envlock: interrupted\n" and out == ""
    assert not (tmp_path / "env.lock").exists()
    assert not left_running
