"""The stdlib probe: packages, git, env, container identity, torch flags, old interpreters."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, make_dist

from envlock.probe import git, image, packages, rules, scrub, system
from envlock.probe.collect import collect
from envlock.probe.env import collect_env
from envlock.probing.capture import build_lock
from envlock.probing.process import PROBE_PATH, parse_document

# `site` (conftest.py): an isolated sys.path holding only the fake distributions a test writes.


def test_packages_exact_versions_installer_requested(site: Path) -> None:
    make_dist(site, "Torch", "2.4.1+cu121", requested=True)
    make_dist(site, "typing_extensions", "4.12.2", installer="uv", requested=False)
    pkgs, dups = packages.collect_packages()
    by = {p["name"]: p for p in pkgs}
    assert by["torch"]["version"] == "2.4.1+cu121"
    assert by["torch"]["requested"] is True and by["torch"]["installer"] == "pip"
    assert by["typing-extensions"]["installer"] == "uv"
    assert by["typing-extensions"]["requested"] is False
    assert [p["name"] for p in pkgs] == sorted(by)
    assert dups == []


def test_direct_url_sources_and_credentials(site: Path) -> None:
    make_dist(site, "fromgit", "0.1", direct_url={
        "url": "https://user:ghp_SECRETTOKEN@github.com/org/fromgit.git",
        "vcs_info": {"vcs": "git", "commit_id": "a" * 40, "requested_revision": "main"}})
    make_dist(site, "fromurl", "1.0", direct_url={
        "url": "https://files.example.org/fromurl-1.0-py3-none-any.whl?token=abc123secret",
        "archive_info": {"hashes": {"sha256": "b" * 64}}})
    make_dist(site, "mine", "0.0.1", direct_url={"url": "file:///home/u/src/mine", "dir_info": {"editable": True}})
    make_dist(site, "local", "2.0", direct_url={"url": "file:///tmp/local-2.0.tar.gz", "archive_info": {}})
    pkgs, _ = packages.collect_packages()
    by = {p["name"]: p for p in pkgs}
    assert by["fromgit"]["source"] == "vcs"
    assert by["fromgit"]["commit"] == "a" * 40
    assert by["fromgit"]["url"] == "https://github.com/org/fromgit.git"
    assert by["fromurl"]["source"] == "url"
    assert by["fromurl"]["archive_hash"] == "sha256=" + "b" * 64
    assert "abc123secret" not in by["fromurl"]["url"]
    assert by["mine"]["source"] == "editable"
    assert by["local"]["source"] == "local"
    assert "SECRETTOKEN" not in json.dumps(pkgs)


def test_record_hash_ignores_venv_specific_lines(tmp_path: Path) -> None:
    a = make_dist(tmp_path / "a", "tool", "1.0", script="shebang-of-venv-a", installer="pip")
    b = make_dist(tmp_path / "b", "tool", "1.0", script="shebang-of-venv-b", installer="uv", requested=False)
    c = make_dist(tmp_path / "c", "tool", "1.0", files=4)
    ha = packages.record_sha256(str(a / "RECORD"))
    assert ha == packages.record_sha256(str(b / "RECORD"))
    assert ha != packages.record_sha256(str(c / "RECORD"))


def test_record_hash_is_the_same_for_pip_and_uv_installs_of_one_wheel() -> None:
    # RECORDs as pip and `uv pip install --find-links DIR` wrote them for six 1.16.0: uv lists
    # its own uv_cache.json, which gave "same version, different build" for the same wheel.
    shipped = (b"six-1.16.0.dist-info/LICENSE,sha256=i7hQxWWqOJ_cFvOkaWWtI9gq3_YPI5P8J2K2MYXo5sk,1066\n"
               b"six-1.16.0.dist-info/METADATA,sha256=VQcGIFCAEmfZcl77E5riPCN4v2TIsc_qtacnjxKHJoI,1795\n"
               b"six-1.16.0.dist-info/RECORD,,\n"
               b"six.py,sha256=TOOfQi7nFGfMrIvtdr6wX4wyHH8M7aknmuLfo2cBBrM,34549\n")
    pip = shipped + (b"six-1.16.0.dist-info/INSTALLER,sha256=zuuue4knoyJ-UwPPXg8fezS7VCrXJQrAP7zeNuwvFQg,4\n"
                     b"six-1.16.0.dist-info/REQUESTED,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")
    uv = shipped + (b"six-1.16.0.dist-info/INSTALLER,sha256=5hhM4Q4mYTT9z6QB6PGpUAW81PGNFrYrdXMj4oM_6ak,2\n"
                    b"six-1.16.0.dist-info/uv_cache.json,sha256=adB5bRkFScnr9kBuvo3x_wuHR-DDZJL3SNB2c6a_Gbk,127\n")
    assert packages.record_digest(pip) == packages.record_digest(uv) == packages.record_digest(shipped)
    # A shipped file that differs is still another build.
    assert packages.record_digest(uv.replace(b"TOOfQi7n", b"XXXXXXXX")) != packages.record_digest(pip)


def test_shadowed_duplicates_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    make_dist(first, "six", "1.17.0")
    make_dist(second, "six", "1.16.0")
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    pkgs, dups = packages.collect_packages()
    assert [(p["name"], p["version"]) for p in pkgs] == [("six", "1.17.0")]
    assert dups == [{"name": "six", "version": "1.16.0", "active_version": "1.17.0", "path_index": 1}]


def test_broken_metadata_is_skipped_not_fatal(site: Path) -> None:
    broken = site / "broken-1.0.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_bytes(b"\xff\xfe garbage without headers")
    make_dist(site, "fine", "1.0")
    pkgs, _ = packages.collect_packages()
    assert [p["name"] for p in pkgs] == ["fine"]


# -- env, secrets, URLs ---------------------------------------------------------------------------


def test_env_allowlist_redaction_and_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PIP_INDEX_URL", "https://alice:s3cretpass@pypi.corp.example/simple")
    monkeypatch.setenv("HOME_SECRET_THING", "not-allowlisted")
    env = collect_env()
    assert env["HF_TOKEN"] == rules.REDACTED
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PIP_INDEX_URL"] == "https://pypi.corp.example/simple"
    assert "HOME_SECRET_THING" not in env


def test_strip_url_variants() -> None:
    assert scrub.strip_url("https://tok@github.com/o/r.git") == "https://github.com/o/r.git"
    # git@ names the service account of an ssh remote, not a person or a token: kept.
    assert scrub.strip_url("ssh://git@host:22/o/r") == "ssh://git@host:22/o/r"
    assert scrub.strip_url("ssh://deploy:pw@host:22/o/r") == "ssh://host:22/o/r"
    assert scrub.strip_url("ssh://git:pw@host:22/o/r") == "ssh://host:22/o/r"
    assert scrub.strip_url("git@github.com:o/r.git") == "git@github.com:o/r.git"
    cleaned = scrub.strip_url("https://h/x?sig=abc&plain=1&api_key=zz")
    assert "abc" not in cleaned and "zz" not in cleaned and "plain=1" in cleaned


def test_secret_values_scrubbed_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-0123456789abcdef")
    doc = scrub.scrub_document({"a": ["x wandb-0123456789abcdef y"], "b": {"c": "wandb-0123456789abcdef"}},
                               scrub.secret_values())
    assert "wandb-0123456789abcdef" not in json.dumps(doc)


# -- git ------------------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "train.py").write_text("print(1)\n")
    _git(r, "add", "train.py")
    _git(r, "commit", "-qm", "init")
    _git(r, "remote", "add", "origin", "https://x-access-token:ghp_0123456789abcdefSECRET@github.com/lab/paper.git")
    return r


def test_git_state_and_remote_without_credentials(repo: Path) -> None:
    info, err = git.GitJob(str(repo), 10).collect()
    assert err is None and info is not None
    assert len(info["commit"]) == 40 and info["branch"] == "main"
    assert info["dirty"] is False and info["untracked"] == 0
    assert info["remote"] == "https://github.com/lab/paper.git"
    clean_hash = info["diff_sha256"]
    (repo / "train.py").write_text("print(2)\n")
    (repo / "notes.txt").write_text("x")
    info2, _ = git.GitJob(str(repo), 10).collect()
    assert info2 is not None
    assert info2["dirty"] is True and info2["untracked"] == 1
    assert info2["diff_sha256"] != clean_hash


def test_the_lock_being_written_is_left_out_of_the_git_state(repo: Path, tmp_path: Path) -> None:
    lock = repo / "env.lock"
    lock.write_text("# an earlier lock\n")
    (repo / "sub").mkdir()
    clean, _ = git.GitJob(str(repo / "sub"), 10, [str(lock)]).collect()
    assert clean is not None and clean["untracked"] == 0 and clean["dirty"] is False
    _git(repo, "add", "env.lock")
    _git(repo, "commit", "-qm", "lock")
    lock.write_text("# rewritten by the last capture\n")
    again, _ = git.GitJob(str(repo / "sub"), 10, [str(lock)]).collect()
    assert again is not None and again == {**clean, "commit": again["commit"]}
    # Its twin: anything else still counts, and so does the lock when it is not the output.
    (repo / "notes.txt").write_text("x")
    other, _ = git.GitJob(str(repo), 10, [str(lock)]).collect()
    assert other is not None and other["untracked"] == 1
    plain, _ = git.GitJob(str(repo), 10).collect()
    assert plain is not None and plain["dirty"] is True
    # A lock written outside the repository names no pathspec git would refuse.
    outside, err = git.GitJob(str(repo), 10, [str(tmp_path / "elsewhere" / "env.lock")]).collect()
    assert err is None and outside is not None and outside["untracked"] == 1


def test_outside_git(tmp_path: Path) -> None:
    info, err = git.GitJob(str(tmp_path), 10).collect()
    assert info is None and err == "not a git repository"


def test_missing_git_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_GIT", str(tmp_path / "no-such-git"))
    info, err = git.GitJob(str(tmp_path), 5).collect()
    assert info is None and err is not None and "not found" in err


def test_hanging_git_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    # The child sleep keeps the pipe open: killing only the shell would not end the wait.
    fake.write_text("#!/bin/sh\nsleep 120 &\nsleep 120\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    doc = collect(torch="no", cwd=str(tmp_path), git_timeout=1.0)
    elapsed = time.monotonic() - started
    assert "timed out" in doc["probe"]["errors"]["git"]
    assert "git" not in doc
    assert elapsed < 20, f"a hung git held the capture for {elapsed:.1f}s"


# -- container identity -------------------------------------------------------------------------


def test_image_from_env_and_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    digest = "sha256:" + "c" * 64
    monkeypatch.setenv("ENVLOCK_IMAGE", "lab/train:1.0")
    monkeypatch.setenv("ENVLOCK_IMAGE_DIGEST", digest)
    info = image.collect_image(None)
    assert info["source"] == "env" and info["reference"] == "lab/train:1.0" and info["digest"] == digest
    cli = image.collect_image("nvcr.io/nvidia/pytorch:24.05-py3@sha256:" + "d" * 64)
    assert cli["source"] == "cli" and cli["digest"] == "sha256:" + "d" * 64
    assert cli["reference"] == "nvcr.io/nvidia/pytorch:24.05-py3"


# -- whole documents ------------------------------------------------------------------------------


def test_collect_without_torch_validates_as_lock(tmp_path: Path) -> None:
    doc = collect(torch="no", cwd=str(tmp_path))
    assert "torch" not in doc and doc["determinism"]["torch_loaded"] is False
    assert doc["probe"]["errors"]["torch"].startswith("skipped")
    lock = build_lock(doc)
    assert lock.python.version == ".".join(map(str, sys.version_info[:3]))
    assert lock.package("pydantic") is not None


def test_collect_with_live_torch_flags(tmp_path: Path) -> None:
    import torch

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        doc = collect(torch="auto", cwd=str(tmp_path))
    finally:
        torch.backends.cudnn.benchmark = before
    assert doc["torch"]["version"] == torch.__version__
    assert doc["determinism"]["cudnn_benchmark"] is True
    assert doc["determinism"]["deterministic_algorithms"] is False
    assert len(doc["torch"]["config_sha256"]) == 64
    lock = build_lock(doc)
    assert lock.torch is not None and lock.torch.version == torch.__version__


def test_every_probe_file_is_python38_syntax_and_stdlib_only() -> None:
    """Every file of the package, as shipped: 3.8 syntax, stdlib or relative imports only."""
    files = sorted(PROBE_PATH.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "__main__.py", "rules.py", "collect.py",
                                       "kernels.py", "ospkgs.py", "deep.py"}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    own = {f.stem for f in files}
    third_party: set[str] = set()
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f), feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                third_party |= {a.name.split(".")[0] for a in node.names} - stdlib
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module is not None
                third_party |= {node.module.split(".")[0]} - stdlib
            elif isinstance(node, ast.ImportFrom):
                # Relative, one level: a module of this package, whatever the package is called.
                assert node.level == 1, f"{f.name}: {ast.unparse(node)}"
                names = [node.module] if node.module else [a.name for a in node.names]
                assert set(names) <= own, f"{f.name}: {ast.unparse(node)}"
    # All optional, imported only when present.
    assert third_party == {"torch", "pynvml", "threadpoolctl"}


def test_importing_the_rules_imports_no_collector() -> None:
    """The model and the runtime import rules (and scrub) on hot paths."""
    code = ("import sys, envlock.probe.rules, envlock.probe.scrub; "
            "print(sorted(m for m in sys.modules if m.startswith('envlock')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["['envlock',", "'envlock._version',", "'envlock.probe',", "'envlock.probe.rules',",
                                  "'envlock.probe.scrub']"]


def test_the_probe_runs_as_a_directory_under_any_name(tmp_path: Path) -> None:
    """What restore ships: the package's files alone, in a directory of another name."""
    from envlock.restore.verify import probe_files

    shipped = tmp_path / "elsewhere"
    shipped.mkdir()
    for path, data in probe_files().items():
        (shipped / Path(path).name).write_bytes(data)
    assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in PROBE_PATH.glob("*.py"))
    out = subprocess.run([sys.executable, "-I", str(shipped), "--no-torch"], capture_output=True,
                         cwd=tmp_path, timeout=120, check=True)
    doc = parse_document(out.stdout, "")
    assert doc["probe"]["errors"].get("packages") is None and doc["packages"]
    assert build_lock(doc).python.version.startswith("3.")


def test_conda_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = tmp_path / "conda-meta"
    meta.mkdir()
    (meta / "cudatoolkit-11.8.0-h6a678d5_0.json").write_text(json.dumps({
        "name": "cudatoolkit", "version": "11.8.0", "build": "h6a678d5_0",
        "channel": "https://user:pw@conda.example/nvidia", "files": ["lib/libcudart.so"]}))
    (meta / "history").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert system.prefix_kind() == "conda"
    conda = packages.collect_conda()
    assert conda == {"packages": [{"name": "cudatoolkit", "version": "11.8.0", "build": "h6a678d5_0",
                                   "channel": "https://conda.example/nvidia"}]}


def test_conda_built_wheel_is_not_a_local_file(site: Path) -> None:
    make_dist(site, "numpy", "1.26.4", installer="conda", direct_url={
        "url": "file:///croot/numpy_1700000000/work", "dir_info": {}})
    pkgs, _ = packages.collect_packages()
    assert pkgs[0]["source"] == "conda" and "url" not in pkgs[0]


def test_record_sha256_ignores_the_files_installers_add() -> None:
    # The same wheel installed by pip and by uv (which lists uv_cache.json when it installs a
    # local file) is one build; a file of the wheel that differs is another.
    wheel = (b"six.py,sha256=AAAA,100\n"
             b"six-1.17.0.dist-info/METADATA,sha256=BBBB,50\n"
             b"six-1.17.0.dist-info/RECORD,,\n")
    by_pip = wheel + b"six-1.17.0.dist-info/INSTALLER,sha256=CCCC,4\n"
    by_uv = wheel + (b"six-1.17.0.dist-info/INSTALLER,sha256=DDDD,3\n"
                     b"six-1.17.0.dist-info/uv_cache.json,sha256=EEEE,60\n")
    assert packages.record_digest(by_pip) == packages.record_digest(by_uv)
    assert packages.record_digest(by_pip) != packages.record_digest(by_pip.replace(b"AAAA", b"AAAB"))
