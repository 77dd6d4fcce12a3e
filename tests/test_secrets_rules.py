"""The secret rules themselves: which names hold a secret, which values the last-line scrub may
replace, and what of a URL survives, with a property test that reaches strip_url/scrub_text."""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import make_dist, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import rules, scrub

SECRET_NAMES = [
    "HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "TORCH_DB_PASS", "HF_HUB_PASSPHRASE", "MYSQL_PWD", "PGPASSWORD", "DB_PASSWD", "GITLAB_PAT",
    "NCCL_IB_SECRET_SAUCE", "SENTRY_DSN", "HF_COOKIE", "TORCH_AUTH", "MLFLOW_TRACKING_PASSWORD",
    "apiKey", "hubAuthToken", "ACCELERATE_CLIENTSECRET", "KAGGLE_KEY", "SSH_PRIVATE_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "SLACK_WEBHOOK", "hf_token", "DATABASE_URL_PASSWORD",
    "SMTP_HOST_PASSWORD", "AWS_ACCESS_KEY_ID", "TRANSFORMERS_USE_AUTH_TOKEN",
]
SETTING_NAMES = [
    "TOKENIZERS_PARALLELISM", "DESKTOP_SESSION", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "KMP_AFFINITY",
    "PWD", "OLDPWD", "HOME", "XAUTHORITY", "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "GIT_ASKPASS_DIR",
    "SSL_KEY_FILE", "XDG_SESSION_TYPE", "SESSION_MANAGER", "GIT_AUTHOR_NAME", "KEYRING_BACKEND",
    "PASSWORD_STORE_DIR", "CUDA_VISIBLE_DEVICES", "PIP_INDEX_URL", "HF_HOME", "BYPASS_CACHE",
    "MONKEY_PATCH", "AUTH_TIMEOUT", "TOKEN_URL", "GNUPGHOME", "GIT_CREDENTIAL_HELPER", "KEY_TYPE",
    "GIT_ASKPASS", "HF_HUB_USER_AGENT",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_names_that_hold_a_secret(name: str) -> None:
    assert rules.looks_secret(name)


@pytest.mark.parametrize("name", SETTING_NAMES)
def test_names_that_hold_a_setting_or_a_path(name: str) -> None:
    assert not rules.looks_secret(name)


def test_secret_values_only_credentials(tmp_path: Path) -> None:
    environ = {
        "HF_TOKEN": "hf_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "MY_PASSWORD": "1234567",  # shorter than MIN_SECRET_LEN: more likely a flag than a credential
        "DB_PASS": "x86_64",
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path),  # an existing path, not a credential
        "PWD": str(tmp_path),
        "DESKTOP_SESSION": "gnome-classic",
        "TOKENIZERS_PARALLELISM": "false-ish-long",
    }
    assert scrub.secret_values(environ) == ["hf_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]


def test_secret_values_include_a_url_password_in_any_variable() -> None:
    # The URL is stripped wherever it goes; its password pasted into --note was kept verbatim.
    environ = {"PIP_INDEX_URL": "https://alice:s3cr3t%2Fpassw0rd@pypi.example.org/simple",
               "PIP_EXTRA_INDEX_URL": "https://bob:short@h/x https://deploybot@h/y"}
    assert scrub.secret_values(environ) == ["s3cr3t%2Fpassw0rd", "s3cr3t/passw0rd"]
    note = scrub.scrub_string("pw s3cr3t/passw0rd for alice", scrub.secret_values(environ))
    assert note == f"pw {rules.REDACTED} for alice"


def test_url_passwords_leave_user_names_and_plain_urls(tmp_path: Path) -> None:
    # Over-redaction twin: user names and short passwords are not scrubbed from other text.
    environ = {"PIP_INDEX_URL": f"https://{tmp_path.name}:pw@h/simple", "HTTP_PROXY": "http://proxy:3128",
               "DATABASE_URL": "postgresql://postgres:postgres@localhost:5432/postgres"}
    assert scrub.secret_values(environ) == []
    doc = {"python": {"prefix": f"{tmp_path}/.venv"}, "note": "/srv/postgres-tools"}
    assert scrub.scrub_document(doc, scrub.secret_values(environ)) == doc


def test_a_secret_that_is_a_package_name_does_not_rename_installed_packages() -> None:
    # POSTGRES_PASSWORD=requests made the capture fail: packages.13.name was '<redacted>'. A
    # plain word is no longer scrubbed from elsewhere at all (see the next test); a value that
    # could be a credential and is also a package's name still leaves the package alone.
    name = "nvidia-cublas-cu12"
    secrets = scrub.secret_values({"POSTGRES_PASSWORD": name})
    assert secrets == [name]
    doc = {"packages": [{"name": name, "version": "12.4.5.8", "source": "url",
                         "url": f"https://files.example.org/{name}/{name}-12.4.5.8.whl"}],
           "duplicates": [{"name": name, "version": "2.0", "active_version": "12.4.5.8", "path_index": 1}],
           "os_packages": {"manager": "dpkg", "packages": [f"{name}:all=2.28.1"]},
           "envlock": {"note": f"db password {name}"}}
    out = scrub.scrub_lock_document(doc, secrets)
    assert out["packages"][0]["name"] == name and out["duplicates"][0]["name"] == name
    assert out["os_packages"]["packages"] == [f"{name}:all=2.28.1"]
    # Everywhere else the value is still a secret (leak twin): the URL and the note lose it.
    assert name not in out["packages"][0]["url"] and name not in out["envlock"]["note"]


def test_a_secret_that_is_a_plain_word_is_not_scrubbed_from_elsewhere() -> None:
    # Over-redaction twin: POSTGRES_PASSWORD=requests names a package, a directory, a word of
    # the note far more often than it is a credential; only its own variable is redacted.
    assert scrub.secret_values({"POSTGRES_PASSWORD": "requests", "MY_API_KEY": "experiments",
                                "DB_PASSWORD": "run-2024-01-15"}) == []
    assert scrub.env_value("POSTGRES_PASSWORD", "requests") == rules.REDACTED


def test_package_rows_still_lose_url_credentials() -> None:
    doc = {"packages": [{"name": "x", "version": "1.0", "url": "https://u:pw123456789@h/x.whl"}]}
    assert scrub.scrub_lock_document(doc, [])["packages"][0]["url"] == "https://h/x.whl"


def test_scrub_document_keeps_the_working_directory(tmp_path: Path) -> None:
    doc = {"python": {"executable": f"{tmp_path}/.venv/bin/python"}, "url": f"file://{tmp_path}/x"}
    environ = {"PWD": str(tmp_path), "OLDPWD": str(tmp_path), "HOME": str(tmp_path), "HF_TOKEN": "1"}
    assert scrub.scrub_document(doc, scrub.secret_values(environ)) == doc


# -- URL hygiene: a secret put in any position of any URL never survives ------------------------

_MARK = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=24).map(lambda s: "Sx9" + s)
# Characters a password may hold unencoded, the ones that cut a URL parser's authority short
# ("#", "?", "@", ":") included. An unencoded "/" is excluded: no parser can tell where such a
# password ends (only the "user:pass/word@host" shape is recognised, see _split_authority).
_PW = st.text(alphabet=string.ascii_letters + string.digits + "-._~!$&()*+,;=%#?@:", max_size=8)
_HOST = st.from_regex(r"host-[a-z]{1,8}(\.[a-z]{2,5}){0,2}", fullmatch=True)
_PORT = st.sampled_from(["", ":8080", ":443"])
_SEG = st.from_regex(r"[a-z][a-z0-9._-]{1,10}", fullmatch=True)
_PATH = st.lists(_SEG, max_size=4).map(lambda parts: "".join("/" + p for p in parts))
_SAFE_QUERY = st.sampled_from(["", "?page=2", "?format=json&v=1", "?plain=1"])
_SAFE_FRAGMENT = st.sampled_from(["", "#egg=pkg", "#subdirectory=sub", "#sha256=" + "a" * 64])
_SCHEME = st.sampled_from(["https", "http", "git+https", "HTTPS", "ssh", "git+ssh", "socks5h"])
_SECRET_KEY = st.sampled_from(["token", "access_token", "private_token", "sig", "X-Amz-Signature",
                               "api_key", "password", "auth", "apikey", "Signature"])


@st.composite
def _secret_urls(draw: st.DrawFn) -> tuple[str, str]:
    mark = draw(_MARK)
    scheme, host, port, path = draw(_SCHEME), draw(_HOST), draw(_PORT), draw(_PATH)
    query, frag = draw(_SAFE_QUERY), draw(_SAFE_FRAGMENT)
    where = draw(st.integers(0, 9))
    base = f"{scheme}://"
    if where == 0:  # password
        url = f"{base}{draw(_SEG)}:{draw(_PW)}{mark}{draw(_PW)}@{host}{port}{path}{query}{frag}"
    elif where == 1:  # a token as the user, with or without an empty password
        url = f"{base}{mark}{draw(st.sampled_from(['', ':']))}@{host}{port}{path}{query}{frag}"
    elif where == 2:  # a secret query parameter among others
        sep = "&" if query else "?"
        url = f"{base}{host}{port}{path}{query}{sep}{draw(_SECRET_KEY)}={mark}{frag}"
    elif where == 3:  # a bare query item
        url = f"{base}{host}{port}{path}?{mark}{frag}"
    elif where == 4:  # a fragment that is not pip's own
        url = f"{base}{host}{port}{path}{query}#{draw(st.sampled_from(['', 'token=', 'access_token=', 'x=']))}{mark}"
    elif where == 5:  # token-in-path index hosts
        url = draw(st.sampled_from([
            "https://pypi.fury.io/{m}/acme/", "https://conda.example/t/{m}/lab/noarch",
            "https://dl.cloudsmith.io/{m}/org/repo/python/simple/",
            "https://packagecloud.io/priv/{m}/org/repo/pypi/simple",
            "https://{h}/t/{m}/channel", "https://hooks.slack.com/services/T0/B0/{m}",
        ])).format(m=mark, h=host)
    elif where == 6:  # scp-style remote
        url = f"{draw(_SEG)}:{draw(_PW)}{mark}{draw(_PW)}@{host}:{draw(_SEG)}/{draw(_SEG)}.git"
    elif where == 7:  # password with a "/" after a user:
        url = f"{base}{draw(_SEG)}:p/{mark}@{host}{port}{path}"
    elif where == 8:  # a secret query parameter with a fragment after it
        url = f"{base}{host}{path}?{draw(_SECRET_KEY)}={mark}#egg=pkg"
    else:  # the user of an ssh remote with a password
        url = f"ssh://git:{mark}@{host}{port}{path}"
    return url, mark


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_secret_urls(), st.sampled_from(["{u}", "see {u} now", "--index-url={u}", "a\n{u}\nb", "({u})"]))
def test_a_secret_in_any_url_position_never_survives(case: tuple[str, str], context: str) -> None:
    url, mark = case
    text = context.format(u=url)
    cleaned = scrub.scrub_text(text)
    assert mark not in cleaned
    assert scrub.scrub_text(cleaned) == cleaned  # what capture keeps, the model accepts
    if context == "{u}":
        stripped = scrub.strip_url(url)
        assert mark not in stripped
        assert scrub.strip_url(stripped) == stripped


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_SCHEME, _HOST, _PORT, _PATH, _SAFE_QUERY, _SAFE_FRAGMENT)
def test_a_url_without_credentials_is_kept_verbatim(scheme: str, host: str, port: str, path: str,
                                                    query: str, frag: str) -> None:
    url = f"{scheme}://{host}{port}{path}{query}{frag}"
    assert scrub.strip_url(url) == url
    assert scrub.scrub_text(f"see {url} now") == f"see {url} now"
    assert scrub.strip_url(f"ssh://git@{host}{path}") == f"ssh://git@{host}{path}"
    assert scrub.strip_url(f"git@{host}:org{path}.git") == f"git@{host}:org{path}.git"


def test_url_examples_from_the_issues() -> None:
    cases = {
        "https://alice:p#SECRET@host/simple": "https://host/simple",
        "https://pypi.fury.io/SECRET/acme/": "https://pypi.fury.io/<redacted>/acme/",
        "https://pypi.fury.io/acme/x-1.0.whl": "https://pypi.fury.io/acme/x-1.0.whl",
        "https://conda.example/t/SECRET/lab": "https://conda.example/t/<redacted>/lab",
        "https://h/x-1.0.whl#token=SECRET": "https://h/x-1.0.whl",
        "https://h/x-1.0.whl#sha256=abc": "https://h/x-1.0.whl#sha256=abc",
        "git+https://github.com/o/r.git@v1.0#egg=r": "git+https://github.com/o/r.git@v1.0#egg=r",
        "deploy:SECRET@host:lab/p.git": "host:lab/p.git",
        "git@github.com:org/repo.git": "git@github.com:org/repo.git",
        "https://TOKEN:@packagecloud.io/org/repo": "https://packagecloud.io/org/repo",
        "https://host:8080/pkg@1.0": "https://host:8080/pkg@1.0",
        "file:///home/u/t/proj/x.whl": "file:///home/u/t/proj/x.whl",
    }
    for url, expected in cases.items():
        assert scrub.strip_url(url) == expected, url
    texts = {
        "--xla_dump_to=https://u:SECRET@h/x": "--xla_dump_to=https://h/x",
        "--remote=deploy:SE;CRET@h:p.git": "--remote=h:p.git",
        "pushed (deploy:ab@SECRET@host:lab/p.git)": "pushed (host:lab/p.git)",
        "see /pkg@host:x and bob@lab.org: thanks": "see /pkg@host:x and bob@lab.org: thanks",
        "u:SECRET@proxy.example:3128": "proxy.example:3128",
    }
    for text, expected in texts.items():
        assert scrub.scrub_text(text) == expected, text


# -- issue: the working directory was treated as a secret ------------------------------------


@pytest.mark.slow
def test_project_venv_lock_keeps_real_paths_same_fingerprint_and_restores(tmp_path: Path) -> None:
    project = tmp_path / "paper"
    sub = project / "src" / "model"
    sub.mkdir(parents=True)
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    make_dist(site, "numpy", "2.1.0")
    (tmp_path / "home").mkdir()
    runs = [(project, ".venv/bin/python"), (sub, "../../.venv/bin/python"), (Path("/"), f"{venv}/bin/python")]
    fingerprints = set()
    for n, (cwd, python) in enumerate(runs):
        lock_path = tmp_path / f"run{n}.lock"
        # PWD/OLDPWD as a shell sets them; HF_TOKEN is there so the last-line scrub runs.
        env = {"PWD": str(cwd), "OLDPWD": str(project), "HOME": str(tmp_path / "home"),
               "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"}
        res = run_cli("capture", "--no-torch", "--python", python, "-o", str(lock_path), cwd=cwd, env=env)
        assert res.returncode == 0, res.stderr
        text = lock_path.read_text()
        lock = tomllib.loads(text)
        # (normalising "src/model/../../.venv" is the interpreter selection's business)
        assert os.path.normpath(lock["python"]["executable"]) == f"{venv}/bin/python"
        assert lock["python"]["prefix"] == str(venv)
        assert text.count("<redacted>") == 1  # HF_TOKEN's own entry, nothing else
        fingerprints.add(lock["envlock"]["fingerprint"])
    assert len(fingerprints) == 1
    out = tmp_path / "restore"
    res = run_cli("restore", str(tmp_path / "run0.lock"), "--dockerfile-only", str(out),
                  "--allow-unpinned-base", cwd=project)
    assert res.returncode == 0, res.stderr
    assert (out / "Dockerfile").is_file()
    assert "<redacted>" not in (out / "Dockerfile").read_text()


def test_restore_applies_the_same_url_rule() -> None:
    from envlock.errors import UnsafeValue
    from envlock.restore import values

    ssh = frozenset({"ssh"})
    assert values.url("ssh://git@github.com/o/r.git", schemes=ssh) == "ssh://git@github.com/o/r.git"
    assert values.url("https://h.example/x-1.0.whl#sha256=" + "a" * 64)
    for bad in ("https://u:pw@h.example/x.whl", "https://h.example/x.whl#token=abc",
                "https://h.example/x.whl?sig=abc", "https://pypi.fury.io/Tok3nTok3n/acme/x.whl"):
        with pytest.raises(UnsafeValue):
            values.url(bad)
    with pytest.raises(UnsafeValue):
        values.url("ssh://deploy:pw@github.com/o/r.git", schemes=ssh)


def test_in_process_canary_settings_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail

    import envlock.runtime

    # CPU kernels never read it; a hostile value must still not reach the lock
    monkeypatch.setenv("MKL_CBWR", "AUTO https://u:CanarySecret99@h.example/x")
    settings = envlock.runtime.canary(["cpu"]).settings
    assert settings["env.MKL_CBWR"] == "AUTO https://h.example/x"


# -- the whole-document pre-check never lets through what the per-string scrub removes ----------


def _one_by_one(doc: object, secrets: list[str]) -> object:
    """``scrub_document`` as it was before the pre-check: every string through scrub_string."""
    if isinstance(doc, dict):
        return {scrub.scrub_string(k, secrets) if isinstance(k, str) else k: _one_by_one(v, secrets)
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [_one_by_one(v, secrets) for v in doc]
    return scrub.scrub_string(doc, secrets) if isinstance(doc, str) else doc


def _lock_one_by_one(doc: dict[str, Any], secrets: list[str]) -> object:
    out: dict[str, Any] = _one_by_one(doc, secrets)  # type: ignore[assignment]
    for table in ("packages", "duplicates"):
        for i, row in enumerate(doc.get(table) or []):
            for k in ("name", "version", "active_version"):
                if isinstance(row, dict) and isinstance(row.get(k), str):
                    out[table][i][k] = scrub.scrub_string(row[k], [])
    os_pkgs = doc.get("os_packages")
    if isinstance(os_pkgs, dict) and isinstance(os_pkgs.get("packages"), list):
        out["os_packages"]["packages"] = _one_by_one(os_pkgs["packages"], [])
    scrub._say_which_paths_changed(doc, out)  # not the pre-check's concern: the same note
    return out


_PIECES = st.sampled_from([
    "plain", "/srv/data", "torch", "2.4.1+cu121", "ghp_" + "a" * 36, "hf_" + "B" * 34,
    "AKIA" + "ABCDEFGHIJKLMNOP", "sk-" + "x1" * 20, "https://u:pw123456789@h/x", "git@github.com:o/r",
    "a@b", "://", "\n", " ", "-", "_", "Sx9secretvalue", "Sx9secret\nvalue", "requests", "é",
    # the secret's encoded forms, and the other shapes scrub_text removes, whole and in parts
    "Sx9secret%76alue", "%53x9secretvalu%65", "%", "+", "%2B", "U3g5c2VjcmV0dmFsdWU=", "dTpTeDlzZWNyZXR2YWx1ZQ==",
    "Basic ", "dGVzdDpwdw==", "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----",
])
_TEXT = st.lists(_PIECES, max_size=4).map("".join)
_DOC = st.recursive(_TEXT | st.integers() | st.booleans() | st.none(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                    max_leaves=25)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(_DOC, st.lists(_TEXT.filter(lambda s: len(s) >= 8), max_size=3))
def test_precheck_equals_the_per_string_scrub(doc: object, secrets: list[str]) -> None:
    assert scrub.scrub_document(doc, secrets) == _one_by_one(doc, secrets)
    lock = {"packages": [{"name": "requests", "version": "1", "url": doc}],
            "duplicates": [{"name": "x", "version": "1", "active_version": "2"}],
            "os_packages": {"manager": "dpkg", "packages": ["python3-requests:all=2.28.1", "a:all=1"]},
            "env": doc, "note": {"requests": ["Sx9secretvalue"]}}
    assert scrub.scrub_lock_document(lock, secrets) == _lock_one_by_one(lock, secrets)


def test_precheck_sees_a_token_or_secret_in_any_one_string() -> None:
    # Leak twin: one token or secret among many clean strings is still removed.
    token = "ghp_" + "Q" * 36
    doc = {"a": ["clean"] * 50 + [f"x {token} y"], "b": {"k": "Sx9secretvalue!"}, token: 1}
    out = scrub.scrub_document(doc, ["Sx9secretvalue"])
    assert token not in str(out) and "Sx9secretvalue" not in str(out)
    assert out["a"][:50] == ["clean"] * 50


def test_precheck_keeps_every_ordinary_string_verbatim() -> None:
    # Over-redaction twin: a secret that only appears across two strings (joined by the
    # pre-check's newline) removes nothing, and neither do near-token shapes.
    doc = {"a": ["Sx9secret", "value"], "b": "ghp_short", "c": "AKIA123", "d": "sk-nodigits" * 4}
    assert scrub.scrub_document(doc, ["Sx9secret\nvalue"]) == doc
    assert scrub.scrub_lock_document(doc, ["Sx9secret\nvalue"]) == doc
