"""The command line as a user meets it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tomllib
from helpers import make_lock, run_cli

from envlock import lock as lockio


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real capture (with torch, outside git) shared by the read-only tests below."""
    work = tmp_path_factory.mktemp("cli")
    res = run_cli("capture", cwd=work)
    assert res.returncode == 0, res.stderr
    assert "wrote env.lock" in res.stdout and "packages" in res.stdout
    return work / "env.lock"


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    stderr = res.stderr
    assert "Traceback" not in stderr
    first = stderr.strip().splitlines()[0]
    assert first.startswith("envlock: error:")
    return stderr


def test_capture_records_torch_and_defaults(captured: Path) -> None:
    import torch

    lock = lockio.load(captured)
    assert lock.torch is not None and lock.torch.version == torch.__version__
    assert lock.determinism.torch_loaded and lock.determinism.deterministic_algorithms is False
    assert lock.determinism.float32_matmul_precision == "highest"
    assert lock.git is None and lock.probe.errors["git"] == "not a git repository"


def test_verify_same_environment_exits_0(captured: Path) -> None:
    res = run_cli("verify", str(captured))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in res.stdout


def test_verify_json(captured: Path) -> None:
    res = run_cli("verify", str(captured), "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout)["ok"] is True


def test_show_formats(captured: Path) -> None:
    text = run_cli("show", str(captured))
    assert text.returncode == 0 and "torch" in text.stdout
    md = run_cli("show", str(captured), "--format", "markdown")
    assert md.stdout.startswith("#### Environment `envlock:") and "| python |" in md.stdout
    js = run_cli("show", str(captured), "--format", "json")
    assert json.loads(js.stdout)["python"]["version"]


def test_capture_to_stdout_and_no_torch(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", "-o", "-", cwd=tmp_path)
    assert res.returncode == 0
    data = tomllib.loads(res.stdout)
    assert "torch" not in data and data["determinism"]["torch_loaded"] is False
    assert not (tmp_path / "env.lock").exists()


def test_tamper_then_fmt(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", cwd=tmp_path)
    assert res.returncode == 0
    path = tmp_path / "env.lock"
    text = path.read_text()
    pkg = lockio.load(path).package("pydantic")
    assert pkg is not None
    edited = text.replace(f'name = "pydantic"\nversion = "{pkg.version}"', 'name = "pydantic"\nversion = "1.0.0"')
    assert edited != text
    path.write_text(edited)
    res = run_cli("verify", "env.lock", "--no-torch", cwd=tmp_path)
    assert res.returncode == 2
    assert "edited after capture" in _one_line_error(res)
    res = run_cli("fmt", "env.lock", cwd=tmp_path)
    assert res.returncode == 0 and "re-sealed" in res.stdout
    res = run_cli("verify", "env.lock", "--no-torch", cwd=tmp_path)
    assert res.returncode == 1
    assert f"pydantic 1.0.0 -> {pkg.version}" in res.stdout
    assert run_cli("fmt", "env.lock", "--check", cwd=tmp_path).returncode == 0


def test_diff_formats_and_exit_codes(tmp_path: Path) -> None:
    a = lockio.save(make_lock(), tmp_path / "a.lock")
    b = lockio.save(make_lock(packages=[{"name": "numpy", "version": "2.2.0"}]), tmp_path / "b.lock")
    same = run_cli("diff", str(a), str(a))
    assert same.returncode == 0 and "same environment" in same.stdout
    res = run_cli("diff", str(a), str(b))
    assert res.returncode == 1 and "numpy 2.1.0 -> 2.2.0" in res.stdout and "six" in res.stdout
    md = run_cli("diff", str(a), str(b), "--format", "markdown")
    assert "| breaking | `packages.numpy.version` | 2.1.0 | 2.2.0 |" in md.stdout
    js = json.loads(run_cli("diff", str(a), str(b), "--format", "json").stdout)
    assert js["counts"]["breaking"] == 2


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (None, "not found"),
        (b"[envlock\n", "not valid TOML"),
        (b"\x7fELF\x00\x00\x01garbage", "binary file"),
        (b'[envlock]\nschema_version = 1\ntool_version = "0.1.0"\ncreated_at = 2026-01-01T00:00:00Z\n'
         b'[python]\nversion = "3.11.7"\nimplementation = "cpython"\n[platform]\nos = "Linux"\nmachine = 1\n',
         "platform.machine"),
    ],
)
def test_invalid_locks_exit_2_with_one_line(tmp_path: Path, content: bytes | None, expect: str) -> None:
    path = tmp_path / "env.lock"
    if content is not None:
        path.write_bytes(content)
    for command in (["verify", str(path)], ["show", str(path)], ["diff", str(path), str(path)]):
        res = run_cli(*command)
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        assert expect in _one_line_error(res)


def test_huge_lock(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    with open(path, "wb") as fh:
        fh.truncate(50 * 1024 * 1024)
    res = run_cli("show", str(path))
    assert res.returncode == 2 and "MiB" in _one_line_error(res)


def test_capture_never_clobbers_a_foreign_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    res = run_cli("capture", "--no-torch", "-o", str(script), cwd=tmp_path)
    assert res.returncode == 2 and "refusing to overwrite" in _one_line_error(res)
    assert script.read_text() == "import torch\n"


def test_missing_interpreter_exits_3(tmp_path: Path) -> None:
    res = run_cli("capture", "--python", str(tmp_path / "nope" / "python"), cwd=tmp_path)
    assert res.returncode == 3 and "interpreter not found" in _one_line_error(res)


def test_usage_error_exits_2() -> None:
    res = run_cli("diff", "only-one")
    assert res.returncode == 2


def test_schema_command_matches_committed_schema() -> None:
    res = run_cli("schema")
    assert res.returncode == 0
    committed = (Path(__file__).resolve().parent.parent / "schemas" / "env.lock.schema.json").read_text()
    assert res.stdout == committed, "schemas/ is stale: run `python -m envlock.lock`"


def test_unwritable_destinations(tmp_path: Path) -> None:
    res = run_cli("capture", "--no-torch", "-o", str(tmp_path / "missing" / "env.lock"), cwd=tmp_path)
    assert res.returncode == 2 and "does not exist" in _one_line_error(res)
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        res = run_cli("capture", "--no-torch", "-o", str(locked / "env.lock"), cwd=tmp_path)
        if os.geteuid() == 0:  # root writes anywhere
            assert res.returncode == 0 and (locked / "env.lock").is_file(), res.stderr
        else:
            assert res.returncode == 3 and "cannot write" in _one_line_error(res)
    finally:
        locked.chmod(0o700)
    # Where no one may create a file, root included: /proc takes no new files.
    res = run_cli("capture", "--no-torch", "-o", "/proc/envlock-test.lock", cwd=tmp_path)
    assert res.returncode == 3 and "cannot write /proc/envlock-test.lock" in _one_line_error(res)
