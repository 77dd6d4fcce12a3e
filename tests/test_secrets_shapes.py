"""Credential shapes, query keys, index path tokens and presigned URLs: each leak case with its
over-redaction twin, the near miss that must come out verbatim.

The capture-wide corpus (every entry point, every output) is ``secret_corpus.py``; this file
checks the rules one by one, through the capture and export commands where the defect was seen.
"""

from __future__ import annotations

import hashlib
import html
import random
import re
import socket
import string
from pathlib import Path

import pytest
import tomllib
from export_index import layout, serve
from helpers import LockFactory, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import rules, scrub

R = rules.REDACTED
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkphbmUifQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")

# (leak, its near miss). The leak loses the token; the twin is kept as it is.
SHAPES = {
    "jwt": (f"Bearer {JWT} here", "header eyJhbGciOiJIUzI1NiJ9 alone, eyJ.config.v2"),
    "google-api-key": ("key AIzaSyA1b2C3d4E5f6G7h8I9j0K_lMnOpQrStUv", "AIzawesome config, AIza-short"),
    "stripe": ("sk_live_51HqLyjWDarjtT1zdp7dcXYZ0123 and rk_test_4eC39HqLyjWDarjtT1zdp7dc",
               "sk_live_demo, pk_live_51HqLyjWDarjtT1zdp7dcXYZ0123 (publishable)"),
    "docker-pat": ("dckr_pat_2b3e36beeb386dfdaacb9b46004", "dckr_pat_ and dckr_pat_short"),
    "openai-project": ("sk-proj-Ab3_dE5-Gh7iJ9kL1mN3oP5qR7sT9uV1wX3yZ5",
                       "sk-project-notes, sk-proj-readme"),
    "openai-legacy": ("sk-Ab3dE5fGh7iJ9kL1mN3oP5qR7sT9uV1wX3yZ5aB7cD9eF1", "runs/sk-learn-baseline-2024-01-15-seed0"),
    "anthropic": ("sk-ant-api03-Ab3dE5fGh7iJ9kL1mN3oP5qR7sT9uV1wX3yZ5_-AA", "sk-ant-notes-v2"),
    "pypi": ("pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAACKlsz",
             "pypi-mirror-snapshot-2024-01-15-for-the-whole-cluster"),
    "google-oauth": ("ya29.a0AfB_byC1234567890abcdefghijklmnop", "ya29.short"),
    "sendgrid": ("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",
                 "SG.config.value"),
    "databricks": ("dapi0123456789abcdef0123456789abcdef", "dapi-docs"),
    "gitlab-deploy": ("gldt-Ab3dE5fGh7iJ9kL1mN3o", "gldt-notes"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_token_shape_is_removed_and_its_near_miss_kept(shape: str) -> None:
    leak, twin = SHAPES[shape]
    cleaned = scrub.scrub_text(leak)
    assert R in cleaned and scrub.scrub_text(cleaned) == cleaned
    for word in re.findall(r"[A-Za-z0-9_.-]{20,}", leak):
        assert word not in cleaned, (shape, word)
    assert scrub.scrub_text(twin) == twin


def test_run_directories_are_not_openai_keys() -> None:
    for path in ("runs/sk-learn-baseline-2024-01-15-seed0/ckpt.pt",
                 "runs/sk-learn-0123456789abcdefABCDEF0123456789-x/metrics.json",
                 "/data/sk-" + "ab" * 20 + "-v2/part-0"):
        assert scrub.scrub_text(path) == path


@pytest.mark.parametrize("name", ["HF_HUB_AUTHORIZATION", "HF_PASSCODE", "TORCH_HMAC", "HF_PW", "DB_PW",
                                  "hubAuthorization", "PRIVATE_KEY", "SSH_PRIVKEY"])
def test_new_secret_names(name: str) -> None:
    assert rules.looks_secret(name)


@pytest.mark.parametrize("name", ["PRIVATE_REGISTRY", "PRIVATE_INDEX", "HF_HUB_AUTHORIZATION_MODE",
                                  "TORCH_HMAC_ALGORITHM", "HF_PASSCODE_PROMPT", "HF_PWR_PROFILE",
                                  "HF_HUB_AUTHOR"])
def test_their_near_misses_hold_settings(name: str) -> None:
    assert not rules.looks_secret(name)


@pytest.mark.parametrize("key", ["token", "auth", "key", "api_key", "access_token", "sig", "X-Amz-Signature",
                                 "X-Goog-Signature", "X-Amz-Security-Token", "apikey", "accessToken", "pwd",
                                 "password", "code", "client_secret", "jwt", "session", "authorization"])
def test_secret_query_keys(key: str) -> None:
    url = f"https://h.example/simple?page=2&{key}=Val0123456789"
    assert scrub.strip_url(url) == f"https://h.example/simple?page=2&{key}={R}"


@pytest.mark.parametrize("key", ["author", "keyword", "signal", "design", "monkey", "passenger", "country_code",
                                 "token_type", "bypass", "format"])
def test_query_keys_that_merely_contain_a_secret_word_are_kept(key: str) -> None:
    url = f"https://h.example/search?{key}=Val0123456789&page=2"
    assert scrub.strip_url(url) == url


def test_path_parameters_are_judged_like_query_items() -> None:
    assert scrub.strip_url("https://h/simple;token=Tok0123456789/x") == f"https://h/simple;token={R}/x"
    assert scrub.strip_url("https://h/a;v=1.0;author=me/x") == "https://h/a;v=1.0;author=me/x"


def test_forum_topics_keep_their_path_and_conda_tokens_go() -> None:
    kept = ["https://discuss.pytorch.org/t/nan-loss-with-amp/123456",
            "https://discuss.pytorch.org/t/cuda-12-1-install-fails/98765/3",
            "https://forum.example/t/123456", "https://shop.example/t/2024/report"]
    for url in kept:
        assert scrub.strip_url(url) == url
    gone = {"https://conda.lab.example/t/ab-12345678-1234/lab": f"https://conda.lab.example/t/{R}/lab",
            "https://repo.conda.example/t/mytoken/main": f"https://repo.conda.example/t/{R}/main",
            "https://artifacts.lab.example/t/ab-1234abcd-ef56/main/noarch":
                f"https://artifacts.lab.example/t/{R}/main/noarch"}
    for url, want in gone.items():
        assert scrub.strip_url(url) == want


INDEX_TOKEN = "Ab3dE5fGh7iJ9kL1mN3o"


def test_an_index_path_token_goes_on_any_host() -> None:
    for url in (f"http://127.0.0.1:8080/{INDEX_TOKEN}/acme/simple", f"https://idx.lab.example/{INDEX_TOKEN}/acme/",
                "https://idx.lab.example/0123456789abcdef0123/acme/"):
        cleaned = scrub.strip_index_url(url)
        assert R in cleaned and "/acme/" in cleaned and cleaned.startswith(url[:20])
    # twins: the paths of real indexes, GUIDs, project ids and versions
    for url in ("https://pkgs.dev.azure.com/org/0f3c2d1e-aaaa-bbbb-cccc-123456789abc/_packaging/feed-2024-v2/pypi/simple/",
                "https://gitlab.example/api/v4/projects/123456789012345678/packages/pypi/simple",
                "https://art.example/api/pypi/pypi-remote-2024/simple", "https://torch-index.example/whl/cu121",
                "https://dom-1234.d.codeartifact.us-east-1.amazonaws.com/pypi/MyRepo/simple/",
                "file:///srv/Wheels0123456789abcdefXYZ/simple"):
        assert scrub.strip_index_url(url) == url
    # a file URL keeps its content-hash directories (only index URLs have the path rule)
    file_url = "https://files.example/packages/3f/a1/" + "0123456789abcdef" * 4 + "/x-1.0-py3-none-any.whl"
    assert scrub.strip_url(file_url) == file_url


def test_url_tokens_become_secret_values_but_plain_words_do_not() -> None:
    environ = {"PIP_INDEX_URL": f"http://127.0.0.1:8080/{INDEX_TOKEN}/acme/simple",
               "HF_ENDPOINT": "https://h.example/?token=Tok0123456789&download#installation"}
    values = scrub.secret_values(environ)
    assert INDEX_TOKEN in values and "Tok0123456789" in values
    assert not {"download", "installation", "acme", "simple"} & set(values)
    note = scrub.scrub_string(f"index token {INDEX_TOKEN}; read the installation notes", values)
    assert note == f"index token {R}; read the installation notes"


# -- capture: redaction never breaks it, and an image reference is never corrupted --------------

DIGEST = "sha256:" + "ab" * 32


def test_a_private_registry_variable_keeps_the_image_reference(tmp_path: Path) -> None:
    ref = "registry.lab.example/team/train:1.0"
    res = run_cli("capture", "--no-torch", "-o", "env.lock", "--image", f"{ref}@{DIGEST}",
                  "--note", "pushed to registry.lab.example", cwd=tmp_path,
                  env={"PRIVATE_REGISTRY": "registry.lab.example"})
    assert res.returncode == 0, res.stderr
    lock = tomllib.loads((tmp_path / "env.lock").read_text())
    assert lock["image"]["reference"] == ref and lock["image"]["digest"] == DIGEST
    assert lock["envlock"]["note"] == "pushed to registry.lab.example"
    assert lock["env"].get("PRIVATE_REGISTRY") is None or lock["env"]["PRIVATE_REGISTRY"] == "registry.lab.example"


def test_a_secret_inside_an_image_reference_drops_it_whole(tmp_path: Path) -> None:
    """Leak twin: a secret variable's value inside the reference is not kept, and the reference
    is not recorded half-redacted (it would name another image, or fail the capture)."""
    res = run_cli("capture", "--no-torch", "-o", "env.lock", "--image", f"registry.lab.example/tok3nvalue99/x:1@{DIGEST}",
                  cwd=tmp_path, env={"REGISTRY_TOKEN": "tok3nvalue99"})
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "env.lock").read_text()
    assert "tok3nvalue99" not in text
    lock = tomllib.loads(text)
    assert "reference" not in lock["image"] and lock["image"]["digest"] == DIGEST
    assert "image.reference" in lock["probe"]["errors"]


# -- the property: every provider shape, any length within its format, in any context -----------

_ALNUM = string.ascii_letters + string.digits
_B64URL = _ALNUM + "_-"


def _token(kind: int, rng: random.Random) -> str:
    """A token of one provider's format: a random body (as issued: random characters of its
    alphabet, never a pattern hypothesis shrinks to) of a random length within the format."""
    def body(alphabet: str, lo: int, hi: int) -> str:
        return "".join(rng.choices(alphabet, k=rng.randint(lo, hi)))

    if kind == 0:
        return f"eyJ{body(_B64URL, 10, 60)}.eyJ{body(_B64URL, 10, 200)}.{body(_B64URL, 0, 86)}"
    if kind == 1:
        return "AIza" + body(_B64URL, 35, 35)
    if kind == 2:
        return rng.choice(["sk", "rk"]) + rng.choice(["_live_", "_test_"]) + body(_ALNUM, 24, 99)
    if kind == 3:
        return "dckr_pat_" + body(_B64URL, 27, 27)
    if kind == 4:
        return "sk-proj-" + body(_B64URL, 40, 160)
    if kind == 5:  # the older OpenAI shape: one run of letters and digits
        return "sk-" + body(_ALNUM, 31, 60) + rng.choice(string.digits)
    if kind == 6:
        return "hf_" + body(_ALNUM, 34, 34)
    return "ghp_" + body(_ALNUM, 36, 36)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 7), st.randoms(use_true_random=False), st.sampled_from(["{t}", "see {t} now", "--token={t}", "https://h.example/{t}/x",
                                   "https://h.example/x?t={t}", "a\n{t}\nb", "({t})", "'{t}'"]))
def test_a_token_of_any_provider_shape_never_survives(kind: int, rng: random.Random, context: str) -> None:
    token = _token(kind, rng)
    text = context.format(t=token)
    cleaned = scrub.scrub_text(text)
    assert token not in cleaned
    assert scrub.scrub_text(cleaned) == cleaned


@settings(max_examples=300, deadline=None)
@given(st.lists(st.from_regex(r"[a-z]{2,9}|[0-9]{1,6}", fullmatch=True), min_size=2, max_size=8),
       st.sampled_from(["sk-", "sk_live_", "AIza", "dckr_pat_", "eyJ", "pypi-", "hf_", "ya29."]))
def test_a_slug_that_starts_like_a_token_is_kept(words: list[str], prefix: str) -> None:
    """Over-redaction twin of the property above: run names, directories and slugs built of
    words and numbers joined by "-" are not tokens, whatever they start with."""
    slug = prefix + "-".join(words)
    for text in (slug, f"runs/{slug}/ckpt.pt", f"https://discuss.example/t/{slug}/123"):
        assert scrub.scrub_text(text) == text


# -- export: index path tokens, presigned file URLs, error messages -----------------------------

WHEEL = "demo-1.0-py3-none-any.whl"


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    for var in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _demo_lock(tmp: Path, restore_lock: LockFactory) -> Path:
    from envlock.lock import save

    return save(restore_lock(packages=[("demo", "1.0")]), tmp / "env.lock")


def _wheelhouse(tmp: Path) -> Path:
    wh = tmp / "wh"
    wh.mkdir(parents=True)
    (wh / WHEEL).write_bytes(b"a demo wheel's bytes")
    return wh


def test_an_index_path_token_never_reaches_requirements_or_pylock(isolated: Path, restore_lock: LockFactory) -> None:
    """``export --index-url http://HOST/<TOKEN>/acme/simple``: the token reads the index and is
    written nowhere; the index is still named (host, port, /acme/simple)."""
    root = layout(_wheelhouse(isolated), isolated / "root", simple=f"{INDEX_TOKEN}/acme/simple")
    path = _demo_lock(isolated, restore_lock)
    with serve(root) as url:
        for fmt in ("requirements", "pylock"):
            r = run_cli("export", str(path), "--to", fmt, "--index-url", f"{url}/{INDEX_TOKEN}/acme/simple")
            assert r.returncode == 0, r.stderr
            assert INDEX_TOKEN not in r.stdout + r.stderr
            assert f"{url}/{R}/acme/simple" in r.stdout  # twin: the index is still named
            assert "demo" in r.stdout and hashlib.sha256(b"a demo wheel's bytes").hexdigest() in r.stdout
            assert f"# {R}: a credential" in r.stdout  # and the reader is told why
        plain = layout(_wheelhouse(isolated / "p"), isolated / "plain")
    with serve(plain) as url:
        r = run_cli("export", str(path), "--to", "requirements", "--index-url", f"{url}/simple")
        assert r.returncode == 0, r.stderr
        assert f"--index-url {url}/simple" in r.stdout and R not in r.stdout  # nothing to redact


PRESIGNED = {
    "s3": ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1"
           "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
           "&X-Amz-Signature=S3SigS3Sig0123456789abcdef", "S3SigS3Sig0123456789abcdef"),
    "gcs": ("X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Expires=600&X-Goog-Signature=GcsSigGcsSig0123456789",
            "GcsSigGcsSig0123456789"),
    "azure-sas": ("sv=2022-11-02&se=2026-01-01T00%3A00%3A00Z&sr=b&sp=r&sig=AzSig%2BAzSig0123456789%3D",
                  "AzSig%2BAzSig0123456789"),
}


@pytest.mark.parametrize("store", sorted(PRESIGNED))
def test_presigned_file_urls_lose_their_signature_in_pylock(store: str, isolated: Path,
                                                            restore_lock: LockFactory) -> None:
    query, signature = PRESIGNED[store]
    data = b"a demo wheel's bytes"
    root = isolated / "root"
    (root / "files").mkdir(parents=True)
    (root / "files" / WHEEL).write_bytes(data)
    (root / "simple" / "demo").mkdir(parents=True)
    href = html.escape(f"../../files/{WHEEL}?{query}&build=7#sha256={hashlib.sha256(data).hexdigest()}")
    (root / "simple" / "demo" / "index.html").write_text(f'<a href="{href}">{WHEEL}</a>\n')
    path = _demo_lock(isolated, restore_lock)
    with serve(root) as url:
        r = run_cli("export", str(path), "--to", "pylock", "--index-url", f"{url}/simple")
    assert r.returncode == 0, r.stderr
    assert signature not in r.stdout and signature.split("%")[0] not in r.stdout
    wheel = tomllib.loads(r.stdout)["packages"][0]["wheels"][0]
    # Every signing parameter goes, not only the signature (the algorithm, the date, the key).
    first_key, first_value = query.split("&")[0].split("=")
    assert f"{first_key}={R}" in wheel["url"] and first_value not in wheel["url"]
    # twin: the file, its ordinary parameters and its hash stay
    assert wheel["url"].startswith(f"{url}/files/{WHEEL}?") and wheel["url"].endswith("&build=7")
    assert wheel["hashes"]["sha256"] == hashlib.sha256(data).hexdigest()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("shape", ["query", "path", "path-parameter", "invalid-ipv6"])
def test_an_unreachable_index_is_one_line_without_its_token(shape: str, isolated: Path,
                                                            restore_lock: LockFactory) -> None:
    port = _closed_port()
    url = {"query": f"http://127.0.0.1:{port}/simple?token=QueryTok0123456789",
           "path": f"http://127.0.0.1:{port}/{INDEX_TOKEN}/acme/simple",
           "path-parameter": f"http://127.0.0.1:{port}/simple;token=ParamTok0123456789",
           "invalid-ipv6": "http://[::1/simple?token=QueryTok0123456789"}[shape]
    path = _demo_lock(isolated, restore_lock)
    for fmt in ("requirements", "pylock"):
        r = run_cli("export", str(path), "--to", fmt, "--index-url", url)
        assert r.returncode in (2, 3), r.stderr
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr
        for token in ("QueryTok0123456789", INDEX_TOKEN, "ParamTok0123456789"):
            assert token not in r.stderr + r.stdout
        if shape != "invalid-ipv6":
            assert f"127.0.0.1:{port}" in r.stderr  # twin: the message still names the index


# -- restore: a refused index URL is named without its credential, and a path token is refused --


@pytest.mark.parametrize(("url", "secret"), [
    (f"https://idx.lab.example/{INDEX_TOKEN}/acme/simple", INDEX_TOKEN),
    ("http://alice:Hunter2Secret99@idx.lab.example/simple", "Hunter2Secret99"),
    ("https://alice:Hunter2Secret99@idx.lab.example/simple", "Hunter2Secret99"),
    ("https://idx.lab.example/simple?token=Hunter2Secret99", "Hunter2Secret99"),
])
def test_restore_refuses_index_credentials_without_printing_them(url: str, secret: str, tmp_path: Path,
                                                                 restore_lock: LockFactory) -> None:
    from envlock.lock import save

    path = save(restore_lock(packages=[("six", "1.17.0")]), tmp_path / "env.lock")
    r = run_cli("restore", str(path), "--dockerfile-only", str(tmp_path / "out"), "--allow-unpinned-base",
                "--index-url", url)
    assert r.returncode == 2, r.stderr
    assert secret not in r.stdout + r.stderr and "idx.lab.example" in r.stderr
    assert not (tmp_path / "out" / "Dockerfile").exists()
    # twin: the same index without the credential is written as it is
    clean = "https://idx.lab.example/acme/simple"
    r = run_cli("restore", str(path), "--dockerfile-only", str(tmp_path / "ok"), "--allow-unpinned-base",
                "--index-url", clean)
    assert r.returncode == 0, r.stderr
    assert clean in (tmp_path / "ok" / "Dockerfile").read_text() + "".join(
        p.read_text() for p in (tmp_path / "ok").rglob("*.txt"))
