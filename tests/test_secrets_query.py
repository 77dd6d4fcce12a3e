"""Query values: a presigned URL loses every signing parameter, and a value shaped like a token
goes whatever key holds it; each with its over-redaction twin, the ordinary value that stays.

Checked on the rule (``probe.scrub.strip_url``) and through the real writers: a git remote and a
recorded variable captured by ``envlock capture``, then the lock file, ``capture --json``,
``show --format json`` and the in-toto export.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli

from envlock.probe import rules, scrub

R = rules.REDACTED
# Random-looking, with no provider's prefix: only its shape says it is a token.
TOKEN = "Zq09xK7pLm2Nb8Vc4Rt6Yw1Ue3Io5PaSd"
SHA = "0123456789abcdef0123456789abcdef01234567"
UUID = "123e4567-e89b-12d3-a456-426614174000"
# An ordinary query: each value must come out verbatim.
ORDINARY = (f"rev={SHA}&id={UUID}&version=1.2.3&ref=main&path=/data/imagenet/train2017"
            "&b=aGVsbG8gd29ybGQ=&ckpt=resnet50_imagenet_epoch90.ckpt&run=ModelV2Epoch10Seed42Final"
            "&when=20260101T000000Z&page=2&policy=strict&expires=never&sp=1")
# A CloudFront custom policy is base64 of JSON, but may also travel percent-encoded: not a token
# by its shape, a signing parameter by its place.
POLICY = "%7B%22Statement%22%3A%5B%7B%22Resource%22%3A%22https%3A%2F%2Fd.example%2F*%22%7D%5D%7D"

PRESIGNED = {
    "s3-v4": ("https://b.s3.amazonaws.com/w.whl?X-Amz-Algorithm=AWS4-HMAC-SHA256"
              "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
              f"&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&Policy={POLICY}"
              "&X-Amz-Signature=ab12cd34&page=2"),
    "s3-v2": "https://b.s3.amazonaws.com/w.whl?AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Expires=1767225600"
             "&Signature=vjbyPxybdZaNmGa%2ByT272YEAiv4%3D&page=2",
    "gcs-v4": ("https://storage.googleapis.com/b/w.whl?X-Goog-Algorithm=GOOG4-RSA-SHA256"
               "&X-Goog-Credential=sa%40p.iam.gserviceaccount.com%2F20260101%2Fauto%2Fstorage%2Fgoog4_request"
               "&X-Goog-Date=20260101T000000Z&X-Goog-Expires=600&X-Goog-SignedHeaders=host"
               "&X-Goog-Signature=00ff11ee&page=2"),
    "azure-sas": ("https://acct.blob.core.windows.net/c/w.whl?sv=2022-11-02&ss=b&srt=o&sp=r"
                  "&se=2026-01-01T00%3A00%3A00Z&st=2025-01-01T00%3A00%3A00Z&spr=https&sig=AzSig%2B01%3D&page=2"),
    "cloudfront": (f"https://d111.cloudfront.net/w.whl?Policy={POLICY}&Signature=Nql641NHEUkUaXQHZINK1FZ"
                   "~SYeUSoBJ&Key-Pair-Id=K2JCJMDEHXQW5F&page=2"),
}


def _values(url: str) -> list[str]:
    query = url.partition("?")[2]
    return [item.partition("=")[2] for item in query.split("&")]


@pytest.mark.parametrize("scheme", sorted(PRESIGNED))
def test_a_presigned_url_loses_every_signing_parameter(scheme: str) -> None:
    url = PRESIGNED[scheme]
    kept = scrub.strip_url(url)
    # Every parameter but the ordinary one goes, whatever its own name or shape.
    assert _values(kept) == [R] * (len(_values(url)) - 1) + ["2"], kept
    assert kept.endswith("&page=2") and scrub.strip_url(kept) == kept


def test_signing_words_on_a_plain_url_are_ordinary() -> None:
    url = f"https://h.example/x.whl?{ORDINARY}"
    assert scrub.strip_url(url) == url
    assert scrub.scrub_text(f"see {url} here") == f"see {url} here"


@pytest.mark.parametrize("key", ["private", "t", "x", "data", "state", "p"])
def test_a_token_shaped_value_goes_under_any_key(key: str) -> None:
    url = f"https://git.example/lab/paper.git?{key}={TOKEN}&ref=main"
    assert scrub.strip_url(url) == f"https://git.example/lab/paper.git?{key}={R}&ref=main"
    # percent-encoded, and as a path parameter, alike
    assert TOKEN[:12] not in scrub.strip_url(url.replace("Zq09", "Zq%30%39"))
    assert TOKEN not in scrub.strip_url(f"https://h.example/simple;private={TOKEN}/x")


@pytest.mark.parametrize("value", [SHA, SHA.upper(), UUID, "1.2.3", "2.13.0+cu130", "/data/imagenet/train2017",
                                   "aGVsbG8gd29ybGQ=", "dGVzdA==", "resnet50_imagenet_epoch90.ckpt",
                                   "ModelV2Epoch10Seed42Final", "run-2024-01-15-seed0-final", "main",
                                   "20260101T000000Z", "feature/ABC-1234-add-thing"])
def test_an_ordinary_value_is_no_token(value: str) -> None:
    assert not rules.token_shaped(value)
    url = f"https://h.example/x?private={value}"
    assert scrub.strip_url(url) == url


def test_an_identifier_keys_value_is_kept_however_random() -> None:
    # A Drive file id names the file fetched; under ?id= it stays, under ?private= it goes.
    drive = "1BxiMVs0XRA5nFMdKvBdBZjgmUUqptlbs74OgvE2upms"
    assert scrub.strip_url(f"https://drive.example/uc?id={drive}") == f"https://drive.example/uc?id={drive}"
    assert scrub.strip_url(f"https://drive.example/uc?private={drive}") == f"https://drive.example/uc?private={R}"


# -- through the real writers ------------------------------------------------------------------

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org"}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={**GIT_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo)})


def test_no_output_of_a_capture_holds_the_token_or_a_signing_value(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _git(project, "init", "-q")
    (project / "train.py").write_text("pass\n")
    _git(project, "add", ".")
    _git(project, "commit", "-qm", "x")
    remote = f"https://git.example/lab/paper.git?private={TOKEN}&rev={SHA}&ref=main"
    _git(project, "remote", "add", "origin", remote)
    lock = tmp_path / "env.lock"
    env = {"TORCH_WHEEL_URL": PRESIGNED["s3-v4"], "TORCH_PLAIN_URL": f"https://h.example/x.whl?{ORDINARY}"}
    cap = run_cli("capture", "--no-torch", "--python", str(venv / "bin" / "python"), "-o", str(lock), "--json",
                  cwd=project, env=env)
    assert cap.returncode == 0, cap.stderr
    show = run_cli("show", str(lock), "--format", "json")
    intoto = run_cli("export", str(lock), "--to", "intoto")
    assert show.returncode == 0 and intoto.returncode == 0, show.stderr + intoto.stderr
    outputs = {"lock": lock.read_text(), "capture --json": cap.stdout, "show json": show.stdout,
               "intoto": intoto.stdout}
    gone = [TOKEN, "AKIAIOSFODNN7EXAMPLE", "AWS4-HMAC-SHA256", POLICY[:30], "ab12cd34"]
    for name, text in outputs.items():
        for secret in gone:
            assert secret not in text, (name, secret)
    # twins: the remote keeps its ordinary parameters, the plain URL all of them
    import tomllib

    data = tomllib.loads(outputs["lock"])
    assert data["git"]["remote"] == f"https://git.example/lab/paper.git?private={R}&rev={SHA}&ref=main"
    assert data["env"]["TORCH_PLAIN_URL"] == f"https://h.example/x.whl?{ORDINARY}"
    assert data["env"]["TORCH_WHEEL_URL"].endswith("&page=2")
