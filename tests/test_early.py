"""``envlock verify`` starts its probe from the raw arguments, before argparse and the lock
(``envlock.early``); the full path adopts that probe only when it is the one it would start.

These run the real CLI in-process against a real probe; a wrapper around ``ProbeProcess``
counts the processes started and checks that none is left running.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock import lockfile, probeproc
from envlock.cli import build_parser, main
from envlock.early import start_verify_probe, verify_options
from envlock.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from envlock.lockscan import table_names
from envlock.probe.procs import pid_alive


@pytest.fixture()
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[probeproc.ProbeProcess]]:
    """Every ProbeProcess started while the test runs (real ones, only recorded)."""
    started: list[probeproc.ProbeProcess] = []
    real_init = probeproc.ProbeProcess.__init__

    def init(self: probeproc.ProbeProcess, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]  # passed through as given
        started.append(self)

    monkeypatch.setattr(probeproc.ProbeProcess, "__init__", init)
    yield started
    for proc in started:
        proc.cancel()


def _gone(proc: probeproc.ProbeProcess) -> bool:
    return proc.proc.returncode is not None and not pid_alive(proc.proc.pid)


@pytest.fixture(scope="module")
def lock_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lock of this interpreter without torch: verify then never imports it."""
    path = tmp_path_factory.mktemp("early") / "env.lock"
    assert main(["capture", "--no-torch", "--python", sys.executable, "-o", str(path)]) == EXIT_OK
    return path


def test_verify_starts_one_probe_and_adopts_it(lock_path: Path, spawned: list[probeproc.ProbeProcess],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--python", sys.executable, str(lock_path)]) == EXIT_OK
    assert "OK: the environment matches the lock" in capsys.readouterr().out
    assert len(spawned) == 1, [p.argv for p in spawned]
    assert "--no-torch" in spawned[0].argv  # the lock has no [torch]: decided from its tables
    assert _gone(spawned[0])


def test_a_probe_that_is_not_the_wanted_one_is_stopped_and_replaced(
        lock_path: Path, spawned: list[probeproc.ProbeProcess]) -> None:
    from envlock.capturing import check

    other = probeproc.ProbeProcess(sys.executable, ["--no-torch", "--no-cache"])
    result = check(lock_path, python=sys.executable, in_process=False, early=True, cache=True,
                   prestarted=other)
    assert result.comparison.ok
    assert [p.argv[2:] for p in spawned] == [["--no-torch", "--no-cache"],
                                             ["--git-exclude", str(lock_path), "--no-torch"]]
    assert all(_gone(p) for p in spawned)


def test_a_lock_that_fails_to_load_leaves_no_probe_running(
        tmp_path: Path, lock_path: Path, spawned: list[probeproc.ProbeProcess],
        capsys: pytest.CaptureFixture[str]) -> None:
    tampered = tmp_path / "env.lock"
    tampered.write_text(lock_path.read_text().replace("[python]", "[python]\nextra = 1", 1))
    assert main(["verify", "--python", sys.executable, str(tampered)]) == EXIT_USAGE
    assert "envlock: error:" in capsys.readouterr().err
    assert spawned and all(_gone(p) for p in spawned)


def test_ctrl_c_after_the_early_start_stops_the_probe(
        lock_path: Path, spawned: list[probeproc.ProbeProcess], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import envlock.cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt  # Ctrl-C while the command imports, the probe already running

    monkeypatch.setattr(envlock.cli, "cmd_verify", interrupted)
    assert main(["verify", "--python", sys.executable, str(lock_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "envlock: interrupted\n"
    assert len(spawned) == 1 and _gone(spawned[0])


def test_a_usage_error_is_argparse_s_and_starts_nothing(
        lock_path: Path, spawned: list[probeproc.ProbeProcess], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(lock_path), "--strickt"]) == EXIT_USAGE
    assert "unrecognized arguments: --strickt" in capsys.readouterr().err
    assert spawned == []


def test_no_early_start_for_what_the_reading_does_not_know(lock_path: Path) -> None:
    for argv in (["verify", "--deep", str(lock_path)], ["verify", "-h"], ["verify", "--no-t"],
                 ["verify", "a.lock", "b.lock"], ["verify", "--python"], ["verify", "--python="],
                 ["capture"], [], ["verify", "--python", "/nonexistent/python", str(lock_path)],
                 ["verify", str(lock_path.with_name("missing.lock"))]):
        options = verify_options(argv)
        assert options is None or start_verify_probe(options) is None, argv


# -- the reading of the arguments agrees with argparse --------------------------------------

_TOKENS = ["--no-torch", "--no-cache", "--strict", "--all", "--json", "--deep", "--python",
           "--python=py", "py", "-", "--", "env.lock", "other.lock", "-h", "--no-t", "--pyth",
           "--python=", "-x", "lock with space"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=6))
def test_the_early_reading_is_argparse_s(tokens: list[str]) -> None:
    argv = ["verify", *tokens]
    options = verify_options(argv)
    if options is None:
        return
    parser = build_parser("verify")
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        return  # argparse refuses it: main reports that, and stops the probe started early
    # Every option the command reads: a verify this reading is sure of never meets argparse.
    parsed = {k: v for k, v in vars(args).items() if k != "func"}
    assert parsed == {k: getattr(options, k) for k in parsed}, argv
    assert args.func.__name__ == "cmd_verify"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.lists(st.sampled_from(
    [b"[", b"[[", b"]", b" ", b"\t", b"\n", b"\r", b"torch", b"a-b_9", b"=", b'"', b"#"]),
    max_size=20).map(b"".join))
def test_the_table_scan_is_the_regular_expression(data: bytes) -> None:
    pattern = re.compile(rb"^[ \t]*\[{1,2}[ \t]*([A-Za-z0-9_-]+)", re.M)
    assert table_names(data) == {m.group(1).decode("ascii") for m in pattern.finditer(data)}


def test_the_table_scan_of_a_real_lock(lock_path: Path) -> None:
    names = table_names(lock_path.read_bytes())
    written = {k for k, v in lockfile.load(lock_path).model_dump(exclude_none=True).items() if v != []}
    assert written <= names
    assert "torch" not in names and "packages" in names


# -- the process itself -----------------------------------------------------------------------

def test_the_probe_runs_in_its_own_session_with_stdin_from_dev_null(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nprintf '{\"sid\": %s, \"stdin\": \"%s\", \"pipe\": \"%s\"}' "
                      "\"$(ps -o sid= -p $$)\" \"$(readlink /proc/self/fd/0)\" "
                      "\"$(grep SigIgn /proc/self/status | tr -d '\\t ')\"\n")
    script.chmod(0o755)
    proc = probeproc.ProbeProcess(str(script), [])
    doc = proc.result()
    assert doc["sid"] == proc.proc.pid and doc["sid"] != os.getsid(0)
    assert doc["stdin"] == os.devnull
    ignored = int(doc["pipe"].partition(":")[2], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE must be back at its default"


def test_without_posix_spawn_subprocess_starts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   lock_path: Path) -> None:
    def unsupported(*args: object, **kwargs: object) -> int:
        raise NotImplementedError("setsid")

    monkeypatch.setattr(os, "posix_spawn", unsupported)
    proc = probeproc.ProbeProcess(sys.executable, ["--no-torch"])
    assert "packages" in proc.result()
    assert type(proc.proc).__name__ == "Popen"


def test_nothing_heavy_is_imported_before_the_probe_starts(lock_path: Path) -> None:
    """The head start is only worth having if it comes first: a structural check of what the
    start imports (the figures are in benchmarks/, never asserted)."""
    import subprocess

    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "from envlock.cli import main\n"
            "from envlock.early import start_verify_probe, verify_options\n"
            f"options = verify_options(['verify', '--python', sys.executable, {str(lock_path)!r}])\n"
            "probe = start_verify_probe(options)\n"
            "assert probe is not None\n"
            "print(' '.join(sorted(set(sys.modules) - before)))\n"
            "probe.cancel()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = set(out.stdout.split())
    heavy = {"argparse", "dataclasses", "json", "pathlib", "pydantic", "re", "selectors", "shutil",
             "subprocess", "tomllib", "typing"}
    assert not imported & heavy, sorted(imported & heavy)
    assert {"envlock.early", "envlock.probeproc", "envlock.target", "envlock.lockscan"} <= imported


def test_a_whole_verify_imports_only_what_it_needs(lock_path: Path) -> None:
    """The light path of ``envlock verify`` (a sealed lock, compared without the models): none of
    these is needed, and each costs milliseconds at every run. ``-S``: site's own imports (an
    editable install's finder imports pathlib) do not hide envlock's."""
    import subprocess

    from helpers import REPO

    code = ("import sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from envlock.cli import main\n"
            f"rc = main(['verify', '--python', {sys.executable!r}, {str(lock_path)!r}])\n"
            "sys.stderr.write(' '.join(sorted(sys.modules)))\n"
            "sys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "OK: the environment matches the lock" in out.stdout
    imported = set(out.stderr.split())
    unneeded = {"argparse", "pydantic", "dataclasses", "inspect", "pathlib", "shutil", "bz2",
                "lzma", "subprocess", "tomlkit", "envlock.model", "envlock.lockfile"}
    assert not imported & unneeded, sorted(imported & unneeded)


def test_the_lock_being_verified_is_not_an_untracked_file_of_the_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """capture leaves the lock it writes out of [git]; verify leaves out the lock it reads, or
    a lock not committed yet would show as a new untracked file on every verify."""
    import subprocess

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "--no-torch", "--python", sys.executable]) == EXIT_OK
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "sub")
    assert main(["verify", "--all", "--python", sys.executable, "../env.lock"]) == EXIT_OK
    assert "git." not in capsys.readouterr().out
    # Its twin: any other new file still counts.
    (tmp_path / "notes.txt").write_text("x")
    assert main(["verify", "--all", "--python", sys.executable, "../env.lock"]) == EXIT_OK
    assert re.search(r"info +git\.untracked +0 -> 1\n", capsys.readouterr().out)
