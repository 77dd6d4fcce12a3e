"""No secret set in the environment, a URL or a git remote ever reaches a lock file."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import make_dist, run_cli

SECRETS = {
    "HF_TOKEN": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "NCCL_IB_SECRET_SAUCE": "nccl-secret-value-xyz",
}
INDEX_PASSWORD = "pa55w0rd-in-index-url"
REMOTE_TOKEN = "ghp_REMOTEtokenREMOTEtokenREMOTEtoken12"
DIRECT_URL_TOKEN = "glpat-directurltoken123456"


def test_capture_never_writes_secrets(tmp_path: Path) -> None:
    repo = tmp_path / "paper"
    repo.mkdir()
    git_env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for cmd in (["init", "-q"], ["remote", "add", "origin",
                                 f"https://oauth2:{REMOTE_TOKEN}@gitlab.example.org/lab/paper.git"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env={**git_env, "PATH": "/usr/bin:/bin"})
    (repo / "train.py").write_text("pass\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=repo, check=True, env={**git_env, "PATH": "/usr/bin:/bin"})

    site = tmp_path / "extra-site"
    make_dist(site, "private-lib", "1.0", direct_url={
        "url": f"https://deploy:{DIRECT_URL_TOKEN}@git.example.org/lab/private-lib.git",
        "vcs_info": {"vcs": "git", "commit_id": "c" * 40}})

    env = {**SECRETS,
           "PIP_INDEX_URL": f"https://alice:{INDEX_PASSWORD}@pypi.lab.example/simple",
           "PIP_EXTRA_INDEX_URL": f"https://download.pytorch.org/whl/cu121?token={INDEX_PASSWORD}",
           "PYTHONPATH": str(site)}
    res = run_cli("capture", "--no-torch", "-o", "env.lock", cwd=repo, env=env)
    assert res.returncode == 0, res.stderr
    text = (repo / "env.lock").read_text()
    for value in [*SECRETS.values(), INDEX_PASSWORD, REMOTE_TOKEN, DIRECT_URL_TOKEN]:
        assert value not in text, f"secret leaked into env.lock: {value[:6]}..."
    # What is kept is still useful: hosts, the redaction marker, the remote without userinfo.
    assert 'HF_TOKEN = "<redacted>"' in text
    assert "https://pypi.lab.example/simple" in text
    assert 'remote = "https://gitlab.example.org/lab/paper.git"' in text
    assert "https://git.example.org/lab/private-lib.git" in text
    # and the JSON rendering of the same lock is just as clean
    shown = run_cli("show", "env.lock", "--format", "json", cwd=repo).stdout
    assert not any(v in shown for v in SECRETS.values())
