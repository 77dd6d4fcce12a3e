"""A fresh adversarial secret corpus, run through the real commands: leaks and over-redactions.

Kept apart from the test suite on purpose: the tests check a fixed corpus (``tests/secret_corpus.py``
and ``tests/test_secrets_shapes.py``) that the rules were written against; this script draws a
new one on every run (``--seed`` repeats one) and counts what the rules miss or break. Usage:

    python benchmarks/adversarial_secrets.py [--seed N] [--per-shape K] [--json FILE] [--checkout DIR] [-v]

What is drawn, each time with random lengths and characters within the real format:

* **token shapes** of every provider the scrub knows (GitHub, GitLab, Hugging Face, Slack, AWS,
  OpenAI in its four forms, Anthropic, OpenRouter, PyPI, npm, JWT, Google API keys and OAuth
  tokens, Stripe, Docker Hub, SendGrid, DigitalOcean, Databricks, Replicate, Groq, Grafana,
  Shopify, Linear, Postman), each put in a ``--note`` (several textual contexts), in the value
  of an allow-listed variable (plain, ``Bearer``, in a URL's path, in a URL's query under a
  harmless key), in a git remote's path and in a distribution's ``direct_url.json``;
* **credentials by position**: random passwords as URL userinfo, values of secret query keys and
  path parameters (``?token=``, ``X-Amz-Signature``, ``X-Goog-Signature``, SAS ``sig``,
  ``;token=``), an opaque token under a query key that names no secret (``?private=``, in a git
  remote too), a percent-encoded ``Policy`` of a presigned URL, fragments, token-in-path index hosts (Gemfury, conda ``/t/``, Cloudsmith,
  packagecloud) and token-shaped path segments of index variables on any host;
* **secret-named variables** (random compositions of a recorded prefix, a qualifier and a
  secret noun, in upper, snake or camel case) whose value is also pasted into the note and
  into another variable (the last-line scrub);
* **near-miss twins** that must come out verbatim: slugs and run directories that start like a
  token (``sk-learn-…``, ``dckr_pat_rotation-…``), public keys (``pk_live_…``), harmless query
  keys that contain a secret word (``?author=``, ``?keyword=``), ordinary query values (a commit,
  a UUID, a version, ``?policy=strict``, a file name), forum topics (``/t/<slug>/<id>``),
  index paths with GUIDs and project ids, settings named after a secret (``*_TOKEN_PATH``,
  ``*_AUTH_TIMEOUT``, ``PRIVATE_REGISTRY``), and an ``--image`` reference naming the registry
  that ``PRIVATE_REGISTRY`` holds.

Every input goes through a real ``envlock capture`` subprocess (``--no-torch``, a bare venv, a
git repository whose remote is the case under test); a leak is the secret's text anywhere in the
lock file, the ``--json`` output or stderr; an over-redaction is a twin that is not found
verbatim where it entered (its ``[env]`` value, the note, ``git.remote``, ``image.reference``,
the package's ``url``). Index URLs also go through ``envlock export --to requirements|pylock``
against a local index served on 127.0.0.1 with the token in its path, and through an
unreachable index (the error message). Prints counts per shape; exits 1 on any leak or
over-redaction.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import random
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "_-"
HEX = "0123456789abcdef"
LOWER_DIGITS = string.ascii_lowercase + string.digits


@dataclass
class Case:
    shape: str  # what is being tried (a provider, a URL position, a twin kind)
    where: str  # env | note | git | direct-url | image | export | error
    value: str  # what enters
    name: str = ""  # variable name (env), package name (direct-url)
    secret: str = ""  # leak cases: must appear nowhere; "" for twins
    echo: bool = False  # env leak: the value is also pasted into the note and another variable

    @property
    def twin(self) -> bool:
        return not self.secret


@dataclass
class Tally:
    tried: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    examples: list[str] = field(default_factory=list)

    def add(self, shape: str, ok: bool, what: str) -> None:
        self.tried[shape] += 1
        if not ok:
            self.failed[shape] += 1
            self.examples.append(what)


# -- token shapes: (provider, generator); each draws a fresh token in the provider's format ------


def _s(rng: random.Random, alphabet: str, lo: int, hi: int | None = None) -> str:
    return "".join(rng.choices(alphabet, k=rng.randint(lo, hi if hi is not None else lo)))


def _jwt(rng: random.Random) -> str:
    import base64

    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")

    header = b64({"alg": rng.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    payload = b64({"sub": _s(rng, ALNUM, 6, 20), "exp": rng.randint(1_700_000_000, 1_900_000_000),
                   "scope": rng.choice(["read", "hub write", "repo:pull"])})
    return f"{header}.{payload}.{_s(rng, B64URL, 43, 86)}"


TOKENS: dict[str, Callable[[random.Random], str]] = {
    "github-classic": lambda r: r.choice(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]) + _s(r, ALNUM, 36),
    "github-fine-grained": lambda r: "github_pat_11" + _s(r, ALNUM + "_", 80, 82),
    "gitlab": lambda r: r.choice(["glpat-", "gldt-", "glrt-", "glptt-"]) + _s(r, B64URL, 20, 26),
    "huggingface": lambda r: "hf_" + _s(r, ALNUM, 34, 37),
    "slack": lambda r: r.choice(["xoxb-", "xoxp-"]) + _s(r, string.digits, 10, 13) + "-"
    + _s(r, string.digits, 10, 13) + "-" + _s(r, ALNUM, 24),
    "aws-key-id": lambda r: r.choice(["AKIA", "ASIA"]) + _s(r, string.ascii_uppercase + string.digits, 16),
    "openai-legacy": lambda r: "sk-" + _s(r, ALNUM, 47) + r.choice(string.digits),
    "openai-project": lambda r: r.choice(["sk-proj-", "sk-svcacct-", "sk-admin-"]) + _s(r, B64URL, 100, 160),
    "anthropic": lambda r: "sk-ant-api03-" + _s(r, B64URL, 93) + "AA",
    "openrouter": lambda r: "sk-or-v1-" + _s(r, HEX, 64),
    "pypi": lambda r: "pypi-AgEIcHlwaS5vcmc" + _s(r, B64URL, 60, 160),
    "npm": lambda r: "npm_" + _s(r, ALNUM, 36),
    "jwt": _jwt,
    "google-api-key": lambda r: "AIza" + _s(r, B64URL, 35),
    "google-oauth": lambda r: "ya29." + _s(r, B64URL, 60, 200),
    "stripe": lambda r: r.choice(["sk_live_", "sk_test_", "rk_live_"]) + _s(r, ALNUM, 24, 99),
    "docker-hub": lambda r: r.choice(["dckr_pat_", "dckr_oat_"]) + _s(r, B64URL, 27),
    "sendgrid": lambda r: "SG." + _s(r, B64URL, 22) + "." + _s(r, B64URL, 43),
    "digitalocean": lambda r: r.choice(["dop_v1_", "doo_v1_"]) + _s(r, HEX, 64),
    "databricks": lambda r: "dapi" + _s(r, HEX, 32),
    "replicate": lambda r: "r8_" + _s(r, ALNUM, 37),
    "groq": lambda r: "gsk_" + _s(r, ALNUM, 52),
    "grafana": lambda r: "glsa_" + _s(r, ALNUM, 32) + "_" + _s(r, HEX, 8),
    "shopify": lambda r: r.choice(["shpat_", "shpss_"]) + _s(r, HEX, 32),
    "linear": lambda r: "lin_api_" + _s(r, ALNUM, 40),
    "postman": lambda r: "PMAK-" + _s(r, HEX, 24) + "-" + _s(r, HEX, 34),
}

NOTE_CONTEXTS = ["{t}", "logged in with {t} today", "--token={t}", 'token="{t}"', "({t})", "key: {t}.",
                 "export X={t}; run", "Authorization: Bearer {t}"]
VALUE_CONTEXTS = ["{t}", "Bearer {t}", "https://h-{w}.example/{t}/api", "https://h-{w}.example/x?t={t}&v=1",
                  "--auth={t} --retries=3"]
WORDS = ["alpha", "loss", "amp", "nan", "bert", "seed", "run", "eval", "cuda", "lr", "warmup", "baseline",
         "resnet", "fp16", "ablation", "final", "test", "notes", "rotation", "policy", "mirror", "cache"]


def _words(rng: random.Random, lo: int = 2, hi: int = 6) -> list[str]:
    return [rng.choice(WORDS) if rng.random() < 0.75 else str(rng.randint(0, 99999))
            for _ in range(rng.randint(lo, hi))]


# -- the corpus ---------------------------------------------------------------------------------


def _secret_name(rng: random.Random) -> str:
    prefix = rng.choice(["HF_", "TORCH_", "NCCL_", "CUDA_", "WANDB_", "MY_", "OPENAI_", "TRITON_", "ACCELERATE_"])
    qual = rng.choice(["", "", "HUB_", "DB_", "API_", "CLIENT_", "SERVICE_", "UPLOAD_"])
    noun = rng.choice(["TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "PASSCODE", "PW",
                       "API_KEY", "KEY", "CREDENTIALS", "AUTH", "AUTHORIZATION", "AUTH_TOKEN", "ACCESS_TOKEN",
                       "COOKIE", "HMAC", "JWT", "BEARER", "SAS", "OTP", "DSN", "WEBHOOK", "SIGNATURE",
                       "PRIVATE_KEY", "CLIENTSECRET", "APIKEY", "SECRET_ACCESS_KEY"])
    name = prefix + qual + noun
    if rng.random() < 0.15:  # camelCase, as some tools spell their settings
        parts = name.lower().split("_")
        name = parts[0] + "".join(p.capitalize() for p in parts[1:])
    return name


def _credential(rng: random.Random) -> str:
    """A credential with no provider shape: a password or an opaque token."""
    return _s(rng, ALNUM, 4) + rng.choice(string.digits) + _s(rng, ALNUM + "-_.~", 8, 32) + rng.choice("XQZ")


def _index_token(rng: random.Random) -> str:
    """A token in an index path: mixed case, or hex (packagecloud, Cloudsmith, Gemfury style)."""
    if rng.random() < 0.5:
        return _s(rng, ALNUM, 18, 40) + "aZ5"
    return _s(rng, HEX, 32, 48) + "9f"


SECRET_QUERY_KEYS = ["token", "access_token", "private_token", "X-Amz-Signature", "X-Goog-Signature", "sig",
                     "api_key", "apikey", "auth", "key", "password", "client_secret", "X-Amz-Security-Token",
                     "authorization", "jwt", "Signature", "accessToken"]
SAFE_QUERY_KEYS = ["author", "keyword", "signal", "design", "page", "format", "country_code", "token_type",
                   "monkey", "bypass", "passenger", "sort", "v"]


def leaks(rng: random.Random, k: int) -> list[Case]:
    out: list[Case] = []
    for shape, make in TOKENS.items():
        for _ in range(k):
            t = make(rng)
            ctx = rng.choice(NOTE_CONTEXTS)
            out.append(Case(shape, "note", ctx.format(t=t), secret=t))
            t = make(rng)
            name = rng.choice(["TORCH_", "HF_", "NCCL_", "CUDA_"]) + "ADV_" + _s(rng, string.ascii_uppercase, 6)
            out.append(Case(shape, "env", rng.choice(VALUE_CONTEXTS).format(t=t, w=_s(rng, LOWER_DIGITS, 4)),
                            name=name, secret=t))
        t = make(rng)
        out.append(Case(shape, "git", f"https://git-{_s(rng, LOWER_DIGITS, 5)}.example/{t}/lab/paper.git", secret=t))
        t = make(rng)
        out.append(Case(shape, "direct-url", f"https://dl-{_s(rng, LOWER_DIGITS, 5)}.example/w/{t}/x-1.0-py3-none-any.whl",
                        secret=t))
    positions = ["userinfo", "query", "path-param", "fragment", "fury", "conda", "cloudsmith", "packagecloud",
                 "scp-remote", "index-path", "query-shape", "presigned-policy"]
    for pos in [p for p in positions for _ in range(k)]:
        host = f"h-{_s(rng, LOWER_DIGITS, 6)}.example"
        c = _credential(rng)
        if pos == "userinfo":
            value = f"{rng.choice(['https', 'http', 'git+https', 'socks5h'])}://{_s(rng, string.ascii_lowercase, 3, 8)}:{c}@{host}/simple"
        elif pos == "query":
            value = f"https://{host}/w.whl?page=2&{rng.choice(SECRET_QUERY_KEYS)}={c}&v=1"
        elif pos == "path-param":
            value = f"https://{host}/simple;{rng.choice(['token', 'sig', 'auth', 'jsessionid'])}={c}/x"
        elif pos == "fragment":
            value = f"https://{host}/x-1.0.whl#{rng.choice(['token=', 'access_token=', ''])}{c}"
        elif pos == "fury":
            c = _s(rng, ALNUM, 20) + "Q1"
            value = f"https://pypi.fury.io/{c}/{rng.choice(WORDS)}/"
        elif pos == "conda":
            value = f"https://conda.{host}/t/{c}/{rng.choice(WORDS)}"
        elif pos == "cloudsmith":
            c = _s(rng, ALNUM, 16) + "7q"
            value = f"https://dl.cloudsmith.io/{c}/org/repo/python/simple/"
        elif pos == "packagecloud":
            value = f"https://packagecloud.io/priv/{c}/org/repo/pypi/simple"
        elif pos == "query-shape":  # an opaque token under a key that names no secret
            c = _s(rng, ALNUM, 24, 40) + rng.choice(string.digits) + rng.choice(string.ascii_uppercase)
            value = f"https://{host}/lab/paper.git?{rng.choice([*SAFE_QUERY_KEYS, 'private', 't', 'state'])}={c}&ref=main"
        elif pos == "presigned-policy":  # a percent-encoded policy beside a SigV4 credential
            c = f"%7B%22Resource%22%3A%22https%3A%2F%2F{host}%2F{_s(rng, LOWER_DIGITS, 10)}%22%7D"
            value = (f"https://{host}/w.whl?X-Amz-Credential=AKIA{_s(rng, HEX.upper(), 16)}%2F20260101"
                     f"&Policy={c}&X-Amz-Signature={_s(rng, HEX, 64)}")
        elif pos == "scp-remote":
            value = f"deploy:{c}@{host}:lab/p.git"
        else:
            c = _index_token(rng)
            value = f"http://127.0.0.1:{rng.randint(1024, 65535)}/{c}/{rng.choice(WORDS)}/simple"
        where = rng.choice(["env", "note", "git"]) if pos not in ("index-path",) else "env"
        name = "PIP_EXTRA_INDEX_URL" if pos == "index-path" else "TORCH_ADV_URL_" + _s(rng, string.ascii_uppercase, 6)
        if where == "git" and pos in ("query", "fragment", "path-param", "presigned-policy"):
            where = "note"
        out.append(Case(f"url-{pos}", where, value if where != "note" else f"see {value} for it", name=name, secret=c))
    for _ in range(k * 3):
        c = _credential(rng)
        out.append(Case("secret-name", "env", c, name=_secret_name(rng), secret=c, echo=True))
    return out


def _slug(rng: random.Random, prefix: str) -> str:
    return prefix + "-".join(_words(rng))


def twins(rng: random.Random, k: int, tmp: Path) -> list[Case]:
    out: list[Case] = []
    prefixes = ["sk-", "sk_live_", "AIza", "dckr_pat_", "eyJ", "pypi-", "hf_", "ghp_", "glpat-", "ya29.", "SG.",
                "github_pat_", "sk-proj-", "sk-ant-", "dapi", "r8_", "gsk_", "xoxb-"]
    for _ in range(k * 4):
        p = rng.choice(prefixes)
        slug = _slug(rng, p)
        out.append(Case("slug-like-token", "note", rng.choice([f"run {slug} done", f"runs/{slug}/ckpt.pt"]), ))
        out.append(Case("run-dir-like-token", "env", f"{tmp}/runs/{_slug(rng, p)}/ckpt",
                        name="TORCH_ADV_RUN_" + _s(rng, string.ascii_uppercase, 6)))
    for _ in range(k):
        out.append(Case("public-key", "note", "pk_live_" + _s(rng, ALNUM, 24, 99)))
        out.append(Case("short-prefix", "note", rng.choice(["sk_live_demo", "AIzawesome", "dckr_pat_x", "sk-learn",
                                                            "ya29.short", "eyJhbGciOiJIUzI1NiJ9"])))
        key = rng.choice(SAFE_QUERY_KEYS)
        out.append(Case("safe-query-key", "env", f"https://h-{_s(rng, LOWER_DIGITS, 5)}.example/search?{key}={rng.choice(WORDS)}&page={rng.randint(1, 99)}",
                        name="TORCH_ADV_Q_" + _s(rng, string.ascii_uppercase, 6)))
        sha, uuid = _s(rng, HEX, 40), "-".join(_s(rng, HEX, n) for n in (8, 4, 4, 4, 12))
        out.append(Case("query-value-twin", rng.choice(["env", "git"]),
                        f"https://h-{_s(rng, LOWER_DIGITS, 5)}.example/lab/paper.git?rev={sha}&private={uuid}"
                        f"&v={rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 9)}&policy=strict"
                        f"&ckpt={'_'.join(_words(rng))}.pt",
                        name="TORCH_ADV_Q_" + _s(rng, string.ascii_uppercase, 6)))
        slug = "-".join(_words(rng))
        out.append(Case("forum-topic", "note",
                        f"https://discuss.{rng.choice(['pytorch', 'huggingface', 'jax'])}.org/t/{slug}/{rng.randint(1, 999999)}"))
        guid = "-".join(_s(rng, HEX, n) for n in (8, 4, 4, 4, 12))
        out.append(Case("index-path-twin", "env", rng.choice([
            f"https://pkgs.dev.azure.com/{rng.choice(WORDS)}/{guid}/_packaging/{'-'.join(_words(rng, 1, 3))}/pypi/simple/",
            f"https://gitlab.{_s(rng, LOWER_DIGITS, 4)}.example/api/v4/projects/{rng.randint(1, 10**12)}/packages/pypi/simple",
            f"https://art.example/api/pypi/pypi-{rng.choice(WORDS)}-{rng.randint(2000, 2030)}/simple",
            f"https://torch-index.example/whl/cu{rng.randint(100, 130)}"]),
            name=rng.choice(["PIP_INDEX_URL", "UV_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL"])))
        out.append(Case("hash-path", "direct-url",
                        f"https://files.example/packages/{_s(rng, HEX, 2)}/{_s(rng, HEX, 2)}/{_s(rng, HEX, 60)}/x-1.0-py3-none-any.whl"))
        out.append(Case("git-remote-twin", "git", rng.choice([
            f"https://github.com/{rng.choice(WORDS)}/{'-'.join(_words(rng, 1, 3))}.git",
            f"git@github.com:{rng.choice(WORDS)}/{rng.choice(WORDS)}.git",
            f"ssh://git@host-{_s(rng, LOWER_DIGITS, 4)}.example:22/o/r.git"])))
        noun = rng.choice(["TOKEN", "AUTH", "KEY", "PASSWORD", "SECRET", "HMAC", "PASSCODE"])
        prop = rng.choice(["PATH", "DIR", "FILE", "TIMEOUT", "TYPE", "MODE", "ALGORITHM", "URL"])
        value = {"PATH": f"{tmp}/{rng.choice(WORDS)}/token", "DIR": f"{tmp}/{rng.choice(WORDS)}",
                 "FILE": f"{tmp}/{rng.choice(WORDS)}.json", "TIMEOUT": str(rng.randint(1, 600)),
                 "TYPE": rng.choice(["bearer", "basic"]), "MODE": rng.choice(["strict", "lazy"]),
                 "ALGORITHM": rng.choice(["sha256", "hmac-sha512"]),
                 "URL": f"https://auth-{_s(rng, LOWER_DIGITS, 4)}.example/oauth/token"}[prop]
        out.append(Case("setting-named-like-secret", "env", value, name=f"HF_{noun}_{prop}"))
        registry = f"registry.{rng.choice(WORDS)}-{_s(rng, LOWER_DIGITS, 4)}.example"
        out.append(Case("private-registry-image", "image",
                        f"{registry}/{rng.choice(WORDS)}/{rng.choice(WORDS)}:{rng.randint(1, 9)}.{rng.randint(0, 9)}"
                        f"@sha256:{_s(rng, HEX, 64)}", name=registry))
    return out


# -- running ------------------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd.parent / "home"),
            "PYTHONPATH": str(ROOT), "ENVLOCK_CACHE_DIR": str(cwd.parent / "cache"), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "envlock", *argv], cwd=cwd, env={**base, **env},
                          capture_output=True, text=True, timeout=300, check=False)


def _git(repo: Path, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo), "GIT_AUTHOR_NAME": "a",
           "GIT_AUTHOR_EMAIL": "a@example.org", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.org"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def _dist(site: Path, name: str, url: str) -> None:
    d = site / f"{name}-1.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (d / "INSTALLER").write_text("pip\n")
    (d / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))
    (d / "RECORD").write_text(f"{d.name}/METADATA,,\n{d.name}/RECORD,,\n")


def _batches(cases: list[Case], note_budget: int = 3500) -> Iterator[list[Case]]:
    """Groups of cases for one capture each: one git remote per capture, notes within the
    --note limit, variable names unique; an --image case alone (a capture it fails must not
    count every other case of its batch as altered)."""
    for c in cases:
        if c.where == "image":
            yield [c]
    pending = [c for c in cases if c.where != "image"]
    while pending:
        batch: list[Case] = []
        note, names, git = 0, set(), False
        rest = []
        for c in pending:
            size = len(c.value) + 1 if c.where == "note" or c.echo else 0
            if (c.where == "git" and git) or note + size > note_budget \
                    or (c.where == "env" and c.name in names):
                rest.append(c)
                continue
            batch.append(c)
            note += size
            names.add(c.name)
            git |= c.where == "git"
        yield batch
        pending = rest


def capture_batch(batch: list[Case], work: Path, n: int) -> tuple[str, dict[str, object], str]:
    """Run one capture with every case of ``batch`` in place: (all output text, lock, stderr)."""
    project = work / f"p{n}"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "train.py").write_text("pass\n")
    _git(project, "add", ".")
    _git(project, "commit", "-qm", "x")
    remote = next((c.value for c in batch if c.where == "git"), "https://example.org/x.git")
    _git(project, "remote", "add", "origin", remote)
    site = work / f"site{n}"
    site.mkdir()
    env: dict[str, str] = {}
    notes = []
    args = ["capture", "--no-torch", "--python", str(work / "venv" / "bin" / "python"), "-o", "env.lock", "--json"]
    for i, c in enumerate(batch):
        if c.where == "env":
            env[c.name] = c.value
            if c.echo:
                notes.append(f"ran with {c.value}")
                env[f"TORCH_ADV_ECHO_{i:04d}"] = f"x {c.value} y"
        elif c.where == "note":
            notes.append(c.value)
        elif c.where == "direct-url":
            c.name = f"adv-{n}-{i}"
            _dist(site, c.name.replace("-", "_"), c.value)
        elif c.where == "image":
            env["PRIVATE_REGISTRY"] = c.name
            args += ["--image", c.value]
    env["PYTHONPATH"] = os.pathsep.join((str(site), str(ROOT)))  # the checkout's envlock, not an installed one
    if notes:
        args += ["--note", "\n".join(notes)]
    res = _run(args, project, env)
    lock_path = project / "env.lock"
    text = lock_path.read_text() if lock_path.exists() else ""
    lock = tomllib.loads(text) if text else {}
    if res.returncode != 0:
        lock = {"_failed": res.stderr.strip()}
    return text + res.stdout + res.stderr, lock, res.stderr


def _kept(c: Case, lock: dict[str, object]) -> bool:
    if "_failed" in lock:
        return False
    def get(table: str) -> dict[str, Any]:
        value = lock.get(table)
        return value if isinstance(value, dict) else {}

    if c.where == "env":
        return bool(get("env").get(c.name) == c.value)
    if c.where == "note":
        return c.value in str(get("envlock").get("note", ""))
    if c.where == "git":
        return bool(get("git").get("remote") == c.value)
    if c.where == "image":
        ref, _, digest = c.value.partition("@")
        image = get("image")
        return bool(image.get("reference") == ref and image.get("digest") == digest)
    if c.where == "direct-url":
        rows = lock.get("packages")
        return isinstance(rows, list) and any(isinstance(p, dict) and p.get("url") == c.value for p in rows)
    raise AssertionError(c.where)


# -- export: a local index with the token in its path, and an unreachable one ----------------------


@contextmanager
def _serve(root: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                             str(root), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # bounded wait for the server to listen
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def export_cases(rng: random.Random, k: int, work: Path, tally: Tally, verbose: bool) -> None:
    """``export --index-url`` with a token in the index path (served) or the query, and presigned
    file links, through requirements and pylock; and the error of an unreachable index."""
    venv_py = work / "venv" / "bin" / "python"
    site = work / "export-site"
    (site / "demo-1.0.dist-info").mkdir(parents=True)
    (site / "demo-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    (site / "demo-1.0.dist-info" / "INSTALLER").write_text("pip\n")
    (site / "demo-1.0.dist-info" / "RECORD").write_text("")
    proj = work / "export"
    proj.mkdir()
    res = _run(["capture", "--no-torch", "--python", str(venv_py), "-o", "env.lock"], proj, {"PYTHONPATH": os.pathsep.join((str(site), str(ROOT)))})
    if res.returncode != 0:
        tally.add("export-setup", False, res.stderr)
        return
    data = b"demo wheel " + os.urandom(8)
    sha = hashlib.sha256(data).hexdigest()
    for _ in range(k):
        token = _index_token(rng)
        sig = _credential(rng)
        root = work / f"idx-{token[:6]}-{rng.randint(0, 10**6)}"
        simple = root / token / "acme" / "simple" / "demo"
        simple.mkdir(parents=True)
        (root / "files").mkdir()
        wheel = "demo-1.0-py3-none-any.whl"
        (root / "files" / wheel).write_bytes(data)
        key = rng.choice(["X-Amz-Signature", "X-Goog-Signature", "sig"])
        href = html.escape(f"../../../../files/{wheel}?X-Amz-Expires=600&{key}={sig}#sha256={sha}")
        (simple / "index.html").write_text(f'<a href="{href}">{wheel}</a>\n')
        with _serve(root) as url:
            for fmt in ("requirements", "pylock"):
                r = _run(["export", "env.lock", "--to", fmt, "--no-cache", "--index-url", f"{url}/{token}/acme/simple"],
                         proj, {})
                text = r.stdout + r.stderr
                tally.add(f"export-{fmt}-path-token", r.returncode == 0 and token not in text,
                          f"export {fmt}: rc {r.returncode} token {'kept' if token in text else 'gone'}: {r.stderr[:200]}")
                if fmt == "pylock":
                    tally.add("export-pylock-presigned", r.returncode == 0 and sig not in text,
                              f"pylock kept {key}")
                # twin: the index and the file are still named
                tally.add(f"export-{fmt}-names-index", f"{url}/" in r.stdout and "/acme/simple" in r.stdout
                          and sha in r.stdout, f"export {fmt} lost the index name or hash")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        bad = rng.choice([f"http://127.0.0.1:{port}/simple?token={sig}", f"http://127.0.0.1:{port}/{token}/acme/simple",
                          f"http://127.0.0.1:{port}/simple;token={sig}", f"http://[::1/simple?token={sig}"])
        r = _run(["export", "env.lock", "--to", rng.choice(["requirements", "pylock"]), "--no-cache", "--index-url", bad],
                 proj, {})
        text = r.stdout + r.stderr
        tally.add("error-message", token not in text and sig not in text and "internal error" not in text
                  and r.returncode in (2, 3), f"error for {bad!r}: {r.stderr.strip()[:200]}")
    if verbose:
        print(f"export: {sum(v for k, v in tally.tried.items() if k.startswith(('export', 'error')))} checks")


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="repeat a corpus (default: a fresh one)")
    ap.add_argument("--per-shape", type=int, default=4, help="cases per token shape and context (default 4)")
    ap.add_argument("--json", type=Path, default=None, help="write the counts here")
    ap.add_argument("--checkout", type=Path, default=None,
                    help="the envlock checkout to run (default: this one), to compare two revisions")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.checkout is not None:
        global ROOT
        ROOT = args.checkout.resolve()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    leak_tally, twin_tally = Tally(), Tally()
    with tempfile.TemporaryDirectory(prefix="envlock-adv-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
        leak_cases = leaks(rng, args.per_shape)
        twin_cases = twins(rng, args.per_shape, work)
        n = 0
        for label, cases in (("leak", leak_cases), ("twin", twin_cases)):
            for batch in _batches(cases):
                n += 1
                text, lock, stderr = capture_batch(batch, work, n)
                if "_failed" in lock:
                    print(f"capture {n} ({label}) failed: {stderr.strip()[:300]}")
                for c in batch:
                    if c.twin:
                        twin_tally.add(c.shape, _kept(c, lock), f"{c.shape} [{c.where}] altered: {c.value!r}")
                    else:
                        ok = "_failed" not in lock and c.secret not in text
                        leak_tally.add(c.shape, ok, f"{c.shape} [{c.where}] leaked: {c.value!r}")
        export_cases(rng, max(1, args.per_shape // 2), work, leak_tally, args.verbose)
    leaks_n = sum(leak_tally.failed.values())
    over_n = sum(twin_tally.failed.values())
    print(f"adversarial secret corpus, seed {seed}: {n} captures, {sum(leak_tally.tried.values())} leak inputs, "
          f"{sum(twin_tally.tried.values())} near-miss twins")
    print(f"\n{'shape':34} {'caught':>10}")
    for shape in sorted(leak_tally.tried):
        t, f = leak_tally.tried[shape], leak_tally.failed[shape]
        print(f"{shape:34} {t - f:>4}/{t:<5}")
    print(f"\n{'near miss':34} {'kept':>10}")
    for shape in sorted(twin_tally.tried):
        t, f = twin_tally.tried[shape], twin_tally.failed[shape]
        print(f"{shape:34} {t - f:>4}/{t:<5}")
    print(f"\nleaks: {leaks_n}   over-redactions: {over_n}")
    for line in (leak_tally.examples + twin_tally.examples)[:40]:
        print("  " + line)
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "leaks": leaks_n, "over_redactions": over_n,
                                         "caught": {k: [v - leak_tally.failed[k], v] for k, v in leak_tally.tried.items()},
                                         "kept": {k: [v - twin_tally.failed[k], v] for k, v in twin_tally.tried.items()}},
                                        indent=2))
    return 1 if leaks_n or over_n else 0


if __name__ == "__main__":
    sys.exit(main())
