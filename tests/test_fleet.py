"""verify --fleet without a cluster: gathering srun's labelled output, grouping, the node side's
protocol, usage errors, and the Slurm --venv job script run by bash with srun and envlock stubbed.

The same paths on a real four-node Slurm are in test_fleet_slurm.py.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import make_lock, needs_tool, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.check import protocol, srun
from envlock.check.fleetreport import fleet_text
from envlock.check.hostlist import compress_names
from envlock.check.protocol import MARKER, gather
from envlock.check.srun import launcher_argv
from envlock.check.verdicts import FleetResult, NodeVerdict
from envlock.export import slurm


def _line(task: int, kind: str, node: str, **payload: object) -> str:
    return f"{task}: " + json.dumps({MARKER: kind, "node": node, **payload}, separators=(",", ":"))


def _verdict(task: int, node: str, *diffs: tuple[str, str, str, str]) -> str:
    result = {"ok": not any(d[3] == "breaking" for d in diffs), "differences": [
        {"category": "packages", "path": p, "old": o, "new": n, "severity": s, "message": ""}
        for p, o, n, s in diffs]}
    return _line(task, "verdict", node, result=result)


SIX = ("packages.six.version", "1.17.0", "1.16.0", "breaking")


def test_gather_groups_nodes_with_the_same_difference() -> None:
    lines = [_line(i, "hello", f"n{i + 1}") for i in range(4)]
    lines += [_verdict(0, "n1"), _verdict(1, "n2", SIX), _verdict(2, "n3"), _verdict(3, "n4", SIX)]
    verdicts, _ = gather(lines, 4, timed_out=False, timeout=30)
    assert [v.status for v in verdicts] == ["ok", "drift", "ok", "drift"]
    result = FleetResult("env.lock", "abc", verdicts, 30)
    assert result.exit_code == 1 and not result.ok
    text = fleet_text(result)
    assert "2 differ from the lock" in text
    drift_row = next(line for line in text.splitlines() if "drift" in line and "six" in line)
    assert drift_row.split()[0] == "n[2,4]" and "1.17.0 -> 1.16.0" in drift_row
    assert any(line.split()[:2] == ["n[1,3]", "ok"] for line in text.splitlines())
    doc = result.to_dict()
    assert doc["groups"][0]["nodes"] == ["n2", "n4"] and doc["groups"][0]["status"] == "drift"


def test_a_group_shows_its_first_differences_and_the_nodes_note() -> None:
    diffs = [{"category": "packages", "path": f"packages.p{i:02d}", "old": None, "new": "1",
              "severity": "breaking", "message": ""} for i in range(25)]
    line = _line(0, "verdict", "n1", result={"ok": False, "differences": diffs,
                                            "warning": "VIRTUAL_ENV=/gone has no python; ignored"})
    verdicts, _ = gather([line], 1, timed_out=False, timeout=1)
    text = fleet_text(FleetResult("env.lock", "abc", verdicts, 1)).splitlines()
    assert text[2].split()[:3] == ["n1", "drift", "note:"] and "VIRTUAL_ENV=/gone" in text[2]
    assert "packages.p09" in text[12] and "... and 15 more (--json lists every one)" in text[13]
    assert len(text) == 14


def test_gather_rejoins_a_line_srun_cut_in_pieces() -> None:
    whole = _verdict(0, "n3", SIX)[len("0: "):]
    pieces = [whole[i:i + 37] for i in range(0, len(whole), 37)]
    lines = [_line(0, "hello", "n3"), "0: some log line"] + [f"0: {p}" for p in pieces]
    (verdict,), _ = gather(lines, 1, timed_out=False, timeout=30)
    assert verdict.node == "n3" and verdict.status == "drift"
    assert verdict.differences[0].path == "packages.six.version"


def test_gather_names_a_silent_node_after_the_timeout() -> None:
    lines = [_line(0, "hello", "n1"), _verdict(0, "n1"), _line(1, "hello", "n2"), "1: importing torch",
             "srun: forcing job termination"]
    verdicts, own = gather(lines, 3, timed_out=True, timeout=7, task_nodes=["n1", "n2", "n3"])
    assert [(v.node, v.status) for v in verdicts] == [("n1", "ok"), ("n2", "timeout"), ("n3", "timeout")]
    assert "no verdict within 7 s" in verdicts[1].message and "importing torch" in verdicts[1].message
    assert "did not start envlock within 7 s" in verdicts[2].message
    assert own == ("srun: forcing job termination",)
    result = FleetResult("env.lock", "abc", verdicts, 7)
    assert result.exit_code == 3  # no drift, but not every node answered
    assert "2 gave no verdict" in fleet_text(result)


def test_gather_without_allocation_names_a_silent_task_by_number() -> None:
    verdicts, _ = gather([], 2, timed_out=False, timeout=5)
    assert [(v.node, v.status) for v in verdicts] == [("task 0", "error"), ("task 1", "error")]
    assert verdicts[0].message == "did not run"


def test_node_error_and_probe_timeout_are_told_apart() -> None:
    lines = [_line(0, "error", "n1", message="interpreter not found: /v/bin/python", exit_code=3),
             _line(1, "error", "n2", message="the probe did not finish within 5s", exit_code=3,
                   timeout=True)]
    verdicts, _ = gather(lines, 2, timed_out=False, timeout=5)
    assert [(v.node, v.status) for v in verdicts] == [("n1", "error"), ("n2", "timeout")]
    assert verdicts[0].message == "interpreter not found: /v/bin/python"


def test_what_nodes_send_reaches_the_terminal_literally() -> None:
    evil = "x\x1b]0;owned\x07\nn9        ok"
    lines = [_line(0, "error", evil, message=f"failed: {evil}"), "1: \x1b[2Jlog",
             _line(1, "hello", "n2")]
    verdicts, _ = gather(lines, 2, timed_out=True, timeout=1)
    text = fleet_text(FleetResult("env.lock", "abc", verdicts, 1))
    assert "\x1b" not in text and "\x07" not in text
    assert len(text.splitlines()) == 4  # head, column names, one row per node: no forged row
    assert "\\x1b]0;owned\\x07\\n" in text


def test_plain_text_from_nodes_is_not_escaped() -> None:
    lines = [_line(0, "error", "nœud-ñ1", message="interpréteur absent: /opt/vénv/bin/python")]
    verdicts, _ = gather(lines, 1, timed_out=False, timeout=1)
    text = fleet_text(FleetResult("env.lock", "abc", verdicts, 1))
    assert "nœud-ñ1" in text and "interpréteur absent: /opt/vénv/bin/python" in text


def test_a_verdict_that_is_not_verifys_is_an_error_not_a_crash() -> None:
    bad = {"ok": False, "differences": [{"category": "x", "path": "p", "severity": 5}]}
    (verdict,), _ = gather([_line(0, "verdict", "n1", result=bad)], 1, timed_out=False, timeout=1)
    assert verdict.status == "error" and "not a verify --json document" in verdict.message
    fleet_text(FleetResult("env.lock", "abc", (verdict,), 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=80),
    st.builds(lambda t, s: f"{t}: {s}", st.integers(0, 5), st.text(max_size=80)),
    st.builds(lambda t, s: f"{t}: {{\"{MARKER}\"{s}", st.integers(0, 5), st.text(max_size=80)),
    st.builds(lambda t, k, n, r: _line(t, k, n, result=r), st.integers(0, 5),
              st.sampled_from(["hello", "verdict", "error", "other"]), st.text(max_size=10),
              st.one_of(st.none(), st.integers(), st.dictionaries(st.text(max_size=5), st.integers()))),
    # verdicts whose differences are malformed in every way a JSON value can be
    st.builds(lambda t, ok, diffs: _line(t, "verdict", "n", result={"ok": ok, "differences": diffs}),
              st.integers(0, 5), st.one_of(st.booleans(), st.none(), st.text(max_size=3)),
              st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.one_of(
                  st.none(), st.integers(), st.text(max_size=5),
                  st.dictionaries(st.sampled_from(["category", "path", "old", "new", "severity",
                                                   "message"]),
                                  st.one_of(st.none(), st.integers(), st.text(max_size=8),
                                            st.sampled_from(["breaking", "warning", "info"]))),
              ), max_size=3))),
), max_size=30), st.booleans())
def test_fuzz_gather_never_raises(lines: list[str], timed_out: bool) -> None:
    verdicts, _ = gather(lines, 3, timed_out=timed_out, timeout=1)
    assert len(verdicts) == 3
    assert all(isinstance(v, NodeVerdict) for v in verdicts)
    fleet_text(FleetResult("env.lock", "abc", verdicts, 1))


@pytest.mark.parametrize(("names", "want"), [
    (["n1"], "n1"),
    (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
    (["gpu007", "gpu008", "login"], "gpu[007-008],login"),
    (["a1", "b1", "a2"], "a[1-2],b1"),
    ([f"n{i}" for i in range(1, 1001)], "n[1-1000]"),
])
def test_compress_names(names: list[str], want: str) -> None:
    assert compress_names(names) == want


def test_launcher_runs_one_task_per_node_and_keeps_every_verdict() -> None:
    argv = launcher_argv("/usr/bin/srun", "/shared/env.lock", nodes=4, timeout=30,
                         node_args=["--no-torch"], python="/opt/py")
    assert argv[:1] == ["/usr/bin/srun"]
    assert {"--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--label"} <= set(argv)
    assert "--export=ALL,ENVLOCK_PROBE_TIMEOUT=30" in argv
    assert argv[-6:] == ["-m", "envlock", "verify", "/shared/env.lock", "--fleet-node", "--no-torch"]


def test_fleet_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = tmp_path / "env.lock"
    make_lock().save(lock)
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    r = run_cli("verify", str(lock), "--nodes", "2")
    assert r.returncode == 2 and "--fleet" in r.stderr
    r = run_cli("verify", str(lock), "--fleet")
    assert r.returncode == 2 and "needs --nodes N" in r.stderr
    r = run_cli("verify", str(lock), "--fleet", "--nodes", "0")
    assert r.returncode == 2
    r = run_cli("verify", str(lock), "--fleet", "--nodes", "2", "--timeout", "0")
    assert r.returncode == 2 and "--timeout" in r.stderr


def test_fleet_without_srun_is_an_environment_problem(tmp_path: Path) -> None:
    lock = tmp_path / "env.lock"
    make_lock().save(lock)
    r = run_cli("verify", str(lock), "--fleet", "--nodes", "2", env={"PATH": str(tmp_path)})
    assert r.returncode == 3 and "srun not found" in r.stderr


def test_fleet_result_without_nodes_is_not_ok() -> None:
    result = FleetResult("env.lock", "abc", (), 5, ("srun: error: Unable to allocate resources",))
    assert not result.ok and result.exit_code == 3
    assert "no node answered" in fleet_text(result) and "Unable to allocate" in fleet_text(result)


# -- the Slurm job for a restored venv -----------------------------------------------------------


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_job(tmp_path: Path, script: str, *, preflight_rc: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the job script with bash, srun and envlock stubbed: srun runs its command once as
    node n1, envlock records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _stub(bin_dir / "envlock", f'printf "%s\\n" "$@" > {calls}/envlock\nexit {preflight_rc}\n')
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done\n'
                            f'printf "%s\\n" "$@" > {calls}/srun\nSLURMD_NODENAME=n1 "$@"\n')
    calls.mkdir()
    job = tmp_path / "job.sbatch"
    job.write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "ENVLOCK_WORKSPACE": str(tmp_path),
           "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(job)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False), calls


def _venv_job() -> str:
    return slurm.render(make_lock(), argv=["sh", "-c", 'echo "ran in $VIRTUAL_ENV"; exit 4'],
                        venv="/shared/venvs/train", lock_path="/shared/env.lock", nodes=3)


def test_venv_job_passes_shellcheck(tmp_path: Path) -> None:
    (tmp_path / "lint.sh").write_text(_venv_job())
    sc = subprocess.run([needs_tool("shellcheck"), "-s", "bash", str(tmp_path / "lint.sh")],
                        capture_output=True, text=True, check=False)
    assert sc.returncode == 0, sc.stdout


def test_venv_job_runs_preflight_then_records_each_node(tmp_path: Path) -> None:
    script = _venv_job()
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    (tmp_path / "lint.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "lint.sh")], check=False).returncode == 0
    r, calls = _run_job(tmp_path, script, preflight_rc=0)
    assert (calls / "envlock").read_text().splitlines()[:3] == ["verify", "/shared/env.lock", "--fleet"]
    assert "ran in /shared/venvs/train" in r.stdout
    assert "envlock: node n1: exit 4" in r.stdout
    assert (tmp_path / "envlock-status-7" / "n1.rc").read_text() == "4\n"
    assert r.returncode == 4


def test_venv_job_stops_before_training_when_the_preflight_fails(tmp_path: Path) -> None:
    script = slurm.render(make_lock(), argv=["touch", "trained"], venv="/v", lock_path="/l", nodes=2)
    r, calls = _run_job(tmp_path, script, preflight_rc=1)
    assert r.returncode == 1
    assert not (calls / "srun").exists() and not (tmp_path / "trained").exists()
    assert not (tmp_path / "envlock-status-7").exists()


NASTY = ["it's", "$(touch pwned)", "`touch pwned`", "a;b", "x\ny", "--flag=a,b", "*", "$HOME"]


@pytest.mark.parametrize("value", NASTY)
def test_venv_job_passes_paths_and_command_verbatim(tmp_path: Path, value: str) -> None:
    venv = f"/shared/{value}"
    script = slurm.render(make_lock(), argv=["printf", "[%s]\\n", value], venv=venv,
                          lock_path=f"/locks/{value}", nodes=1)
    r, calls = _run_job(tmp_path, script, preflight_rc=0)
    assert r.returncode == 0, r.stderr
    assert (calls / "envlock").read_text().split("\n")[1:1 + value.count("\n") + 1] == \
        f"/locks/{value}".split("\n")
    assert f"[{value}]" in r.stdout
    assert not (tmp_path / "pwned").exists()


def test_export_venv_options_are_checked(tmp_path: Path) -> None:
    lock = tmp_path / "env.lock"
    make_lock().save(lock)
    r = run_cli("export", str(lock), "--to", "k8s", "--command", "true", "--venv", "/v")
    assert r.returncode == 2 and "--to slurm" in r.stderr
    r = run_cli("export", str(lock), "--to", "slurm", "--command", "true", "--venv", "rel/v")
    assert r.returncode == 2 and "absolute" in r.stderr
    r = run_cli("export", str(lock), "--to", "slurm", "--command", "true", "--nodes", "2")
    assert r.returncode == 2
    r = run_cli("export", str(lock), "--to", "slurm", "--command", "python train.py",
                "--venv", "/shared/v", "--nodes", "2")
    assert r.returncode == 0, r.stderr
    assert "envlock verify \"$LOCK\" --fleet" in r.stdout
    assert f"LOCK={lock.resolve()}" in r.stdout or f"LOCK='{lock.resolve()}'" in r.stdout


def test_node_name_prefers_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert json.loads(protocol.node_line("hello")) == {MARKER: "hello", "node": "n7"}


# -- the srun pipe is closed on every way out ----------------------------------------------------

_VERDICT = _verdict(0, "n1")


@pytest.mark.parametrize(("body", "timeout", "raises"), [
    (f"echo '0: {{\"{MARKER}\":\"hello\",\"node\":\"n1\"}}'\necho '{_VERDICT}'\n", 30.0, False),
    ("echo 'srun: error: Unable to allocate resources' >&2\nexit 1\n", 30.0, True),
    ("exec sleep 60\n", 0.5, False),  # no verdict in time: the step is cancelled
], ids=["verdict", "srun-fails", "timeout"])
def test_the_srun_pipe_is_closed_however_the_preflight_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, timeout: float, raises: bool) -> None:
    import gc
    import warnings

    from envlock.errors import EnvlockError

    _stub(tmp_path / "srun", body)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = srun.run(str(tmp_path / "env.lock"), "abc", nodes=1, timeout=timeout, node_args=())
        except EnvlockError as exc:
            assert raises and "Unable to allocate resources" in exc.message
        else:
            assert not raises
            assert result.nodes[0].status == ("ok" if timeout > 1 else "timeout")
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


# -- verify --fleet --record: every node reads the record's inputs --------------------------------


def test_fleet_passes_the_record_to_every_node_and_a_changed_input_fails_it(tmp_path: Path) -> None:
    import sys

    from envlock.replay.make import make_record

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.csv").write_text("1,2\n")
    r = run_cli("capture", "--no-torch", "--python", sys.executable, "-o", "env.lock", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    make_record(tmp_path / "none.jsonl", command=["x"], exit_code=0, where="host", base=tmp_path,
                inputs=["data"]).save(tmp_path / "run.record")
    # srun stand-in: one task (node n1), run here, its lines labelled as `srun --label` does.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done\n'
                            'SLURMD_NODENAME=n1 "$@" 2>&1 | sed "s/^/0: /"\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    fleet = ("verify", "env.lock", "--fleet", "--nodes", "1", "--no-torch", "--python", sys.executable,
             "--record", "run.record")
    r = run_cli(*fleet, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all match" in r.stdout
    (tmp_path / "data" / "d.csv").write_text("changed\n")
    r = run_cli(*fleet, cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "n1" in r.stdout and "breaking inputs.data: content changed" in r.stdout
    # A record that is not one is said once, here, before any node runs.
    (tmp_path / "bad.record").write_text("[record]\n")
    r = run_cli(*fleet[:-1], "bad.record", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "bad.record" in r.stderr and "n1" not in r.stdout
