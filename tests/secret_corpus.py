"""The leak corpus and its over-redaction twin, as data.

``LEAKS``: inputs that carry a credential, each with the part that must never appear in any
output (``secret``). ``ORDINARY``: inputs that carry none and must come out verbatim. Each
entry says where it enters a capture:

* ``env-name``   a variable whose *name* says it holds a secret (value = the secret);
* ``env-encoded`` a secret-named variable (value) whose value reappears encoded (``secret``:
  percent-encoded, base64, base64 of "user:value") in an allow-listed variable and the note;
* ``env-value``  an allow-listed variable whose *value* carries one (a URL, a token);
* ``det-env``    a numerics variable recorded in ``[determinism.env]``;
* ``direct-url`` the ``url`` of a distribution's PEP 610 ``direct_url.json``;
* ``conda``      the ``channel`` of a package in ``conda-meta``;
* ``git``        the ``origin`` remote of the working directory's repository;
* ``note``       text given to ``capture --note``.

Secrets are unique per entry so that a leak names its input.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import quote, quote_plus


class Case(NamedTuple):
    where: str
    name: str  # variable name; "" where the entry point has none
    value: str
    secret: str  # must not survive (LEAKS); "" for ORDINARY


def _s(i: int) -> str:
    """A unique credential-looking string, 14 characters."""
    return f"Zq7x{i:03d}LEAKv9W"


def _ghp(i: int) -> str:
    return "ghp_" + f"LEAK{i:03d}".ljust(36, "k")


_NAME_SECRETS = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "GITLAB_PAT", "WANDB_API_KEY",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "OPENAI_API_KEY",
    "TORCH_DB_PASS", "HF_HUB_PASSPHRASE", "NCCL_IB_SECRET_SAUCE", "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN", "COMET_API_KEY", "NEPTUNE_API_TOKEN", "DB_PASSWD", "MYSQL_PWD",
    "PGPASSWORD", "TWINE_PASSWORD", "CUDA_PRIVATE_KEY", "TORCH_AUTH", "HF_COOKIE", "SENTRY_DSN",
    "NVIDIA_API_KEY", "TRITON_CREDENTIALS", "HF_hubAuthToken", "ACCELERATE_CLIENTSECRET",
    "KAGGLE_KEY", "HF_HUB_AUTHORIZATION", "HF_PASSCODE", "TORCH_HMAC", "HF_PW",
]


def _jwt(s: str) -> str:
    """A JSON Web Token holding the marker ``s`` in its payload and its signature."""
    return f"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ{s}In0.{s}-_Sig0"


# Shapes recognised wherever they appear (a note, a URL's path, any variable): (template, where).
# {s} is the unique marker; each value is a credential of the provider's real format.
_SHAPED = [
    ("note", "", "logged in with {jwt} for the run"),
    ("note", "", "maps key AIzaSy{s}abcdefghij0123456789 in the config"),
    ("note", "", "billing via sk_live_{s}0123456789AB"),
    ("note", "", "pushed with dckr_pat_{s}-_abc0123456"),
    ("note", "", "openai sk-proj-{s}_-abcDEF0123456789xyz"),
    ("env-value", "HF_ENDPOINT", "https://hf-mirror.lab.example/?jwt_hint=1&t={jwt}"),
    ("env-value", "HF_MIRROR_ENDPOINT", "https://hf-mirror.lab.example/{jwt}/api"),
    ("env-value", "ENVLOCK_TORCH_INDEX_URL", "http://127.0.0.1:8080/{s}Ab12/acme/simple"),
    ("git", "", "https://git.lab.example/{jwt}/lab/paper.git"),
    ("direct-url", "", "https://storage.googleapis.com/b/x-1.0-py3-none-any.whl?X-Goog-Algorithm=GOOG4-RSA-SHA256"
                       "&X-Goog-Expires=600&X-Goog-Signature={s}"),
    ("direct-url", "", "https://h.example/wheels;token={s}/x-1.0-py3-none-any.whl"),
]

_ENV_VALUES = [
    # userinfo, also with characters a URL parser would cut the password at
    "https://alice:{s}@pypi.lab.example/simple",
    "https://alice:p#{s}@host.example/simple",
    "https://alice:p@{s}@host.example/simple",
    "https://alice:p?{s}@host.example/simple",
    "https://alice:p/{s}@host.example/simple",
    "https://alice:p%40{s}@host.example/simple",
    "https://{s}@github.com/org/repo.git",
    "https://{s}:@packagecloud.io/org/repo/pypi/simple",
    "https://__token__:{s}@upload.pypi.example/legacy/",
    "https://aws:{s}@dom-1234.d.codeartifact.us-east-1.amazonaws.com/pypi/repo/simple/",
    "https://oauth2accesstoken:{s}@us-python.pkg.dev/proj/repo/simple/",
    "HTTPS://u:{s}@HOST.example/x",
    "https://u:{s}@[::1]:8080/simple",
    "https://u:{s}@proxy.example:3128",
    "socks5h://u:{s}@proxy.example:1080",
    "u:{s}@proxy.example:3128",
    "git+https://u:{s}@github.com/o/r.git@v1#egg=r",
    # several URLs in one value (pip accepts a space-separated list)
    "https://pypi.example/simple https://u:{s}@b.example/simple",
    "--index-url https://u:{s}@h.example/simple --trusted-host h.example",
    # tokens in the path of known index hosts
    "https://pypi.fury.io/{s}/acme/",
    "https://dl.cloudsmith.io/{s}/org/repo/python/simple/",
    "https://packagecloud.io/priv/{s}/org/repo/pypi/simple",
    "https://conda.example/t/{s}/lab",
    "https://hooks.slack.com/services/T000/B000/{s}",
    # query parameters and fragments
    "https://torch-index.example/whl/cu121?token={s}",
    "https://h.example/simple?private_token={s}&x=1",
    "https://bucket.s3.amazonaws.com/w.whl?X-Amz-Signature={s}",
    "https://acct.blob.core.windows.net/c/w.whl?sv=2020-01-01&sig={s}",
    "https://h.example/simple?{s}",
    "https://h.example/simple#token={s}",
    "https://h.example/w.whl#{s}",
]

_TOKEN_SHAPES = [
    "--token {ghp}",
    "--hub-token=hf_{s}abcdefghijklmnopqrst",
    "xoxb-{s}-1234567890",
    "AKIA{s_upper}",
    "glpat-{s}abcdefghij",
]

_DET_ENV = [
    ("XLA_FLAGS", "--xla_dump_to=https://u:{s}@h.example/x"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:8 https://h.example/x?token={s}"),
    ("NCCL_ALGO", "Ring deploy:{s}@host.example:lab/p.git"),
]

_DIRECT_URLS = [
    "https://deploy:{s}@git.example.org/lab/x.git",
    "ssh://deploy:{s}@git.example.org/lab/x.git",
    "https://{s}@github.com/o/r.git",
    "https://oauth2:{s}@gitlab.example.org/o/r.git",
    "https://h.example/x-1.0-py3-none-any.whl#token={s}",
    "https://h.example/x-1.0-py3-none-any.whl?sig={s}",
    "https://alice:p#{s}@h.example/x-1.0-py3-none-any.whl",
    "https://pypi.fury.io/{s}/acme/x-1.0-py3-none-any.whl",
    "https://h.example/x-1.0-py3-none-any.whl#sha256=abc&token={s}",
    "https://u:{s}@h.example/x-1.0-py3-none-any.whl",
]

_CONDA = [
    "https://conda.example/t/{s}/lab",
    "https://repo.conda.example/t/{s}/main",
    "https://u:{s}@conda.lab.example/channel",
    "https://conda.lab.example/channel?token={s}",
    "https://conda.lab.example/t/{s}/channel",
    "https://conda.lab.example/channel#{s}",
]

_GIT = [
    "https://oauth2:{s}@gitlab.example.org/lab/paper.git",
    "https://{s}@github.com/org/repo.git",
    "https://x-access-token:{s}@github.com/org/repo.git",
    "deploy:{s}@host.example:lab/p.git",
    "deploy:ab@{s}@host.example:lab/p.git",
    "ssh://deploy:{s}@host.example/lab/p.git",
    "https://alice:p#{s}@host.example/lab/p.git",
    "https://host.example/lab/p.git?access_token={s}",
]

_NOTES = [
    "index https://bob:{s}@host.example/x",
    "pushed to deploy:{s}@host.example:lab/p.git",
    "weights at https://h.example/w.pt?sig={s}",
    "see https://h.example/run#access_token={s}",
    "conda https://conda.example/t/{s}/lab",
    "fury (https://pypi.fury.io/{s}/acme/)",
    "token {ghp} in a note",
    "slack xoxp-{s}-99",
]


def _key_block(kind: str, body: str, end: bool = True) -> str:
    """A PEM private key (``kind`` "RSA ", "OPENSSH ", "" ...) around ``body``."""
    head = f"-----BEGIN {kind}PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC{body}\nKx9vQ0==\n"
    return head + (f"-----END {kind}PRIVATE KEY-----" if end else "")


# A key block is a secret wherever it appears, whatever the name of what holds it: (where,
# name, template); {s} is in the key's body.
_KEY_BLOCKS = [
    ("env-value", "CUDA_MPS_CLIENT_CERT", _key_block("", "{s}")),
    ("env-value", "NCCL_IB_TLS_MATERIAL", _key_block("RSA ", "{s}")),
    ("env-value", "TORCH_CORPUS_PEM_CUT", _key_block("EC ", "{s}", end=False)),
    ("env-value", "HF_ENDPOINT_CLIENT",
     "https://h.example/x?cert=" + quote(_key_block("OPENSSH ", "{s}"), safe="").replace("%7Bs%7D", "{s}")),
    ("note", "", "deploy key: " + _key_block("OPENSSH ", "{s}") + " (rotate monthly)"),
    ("note", "", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF{s}\n-----END PGP PRIVATE KEY BLOCK-----"),
]


def _lower_escapes(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), text)


def _b64(text: str, urlsafe: bool = False) -> str:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(text.encode()).decode()


# A secret variable's value with characters a URL must escape, and the forms it is pasted in.
_ENCODINGS: list[Callable[[str], str]] = [
    lambda v: quote(v, safe=""),
    lambda v: _lower_escapes(quote(v, safe="")),
    lambda v: quote_plus(v + " tail"),
    lambda v: _b64(v),
    lambda v: "Authorization: Basic " + _b64("alice:" + v),
    lambda v: _b64("bo:" + v, urlsafe=True).rstrip("="),
    lambda v: "x" + _b64("deploy:" + v)[1:],  # a base64 word the value sits inside of
]


def _build_leaks() -> list[Case]:
    out: list[Case] = []
    i = 0

    def add(where: str, name: str, template: str) -> None:
        nonlocal i
        i += 1
        s = _s(i)
        upper = f"{i:03d}LEAKQWERTYUIOP"[:16]  # an AWS access key id is AKIA + 16
        value = template.format(s=s, ghp=_ghp(i), s_upper=upper)
        secret = _ghp(i) if "{ghp}" in template else (upper if "{s_upper}" in template else s)
        out.append(Case(where, name, value, secret))

    for name in _NAME_SECRETS:
        add("env-name", name, "{s}")
    for n, template in enumerate(_ENV_VALUES + _TOKEN_SHAPES):
        names = ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "PIP_FIND_LINKS"]
        add("env-value", names[n] if n < len(names) else f"TORCH_CORPUS_VALUE_{n:02d}", template)
    for name, template in _DET_ENV:
        add("det-env", name, template)
    for template in _DIRECT_URLS:
        add("direct-url", "", template)
    for template in _CONDA:
        add("conda", "", template)
    for template in _GIT:
        add("git", "", template)
    for template in _NOTES:
        add("note", "", template)
    for where, name, template in _SHAPED:
        i += 1
        s = _s(i)
        out.append(Case(where, name, template.format(s=s, jwt=_jwt(s)), s))
    for where, name, template in _KEY_BLOCKS:
        i += 1
        s = _s(i)
        out.append(Case(where, name, template.replace("{s}", s), s))
    for n, encode in enumerate(_ENCODINGS):
        i += 1
        value = f"{_s(i)}+/=@:!"
        out.append(Case("env-encoded", f"TORCH_CORPUS_ENC_{n:02d}_PASSWORD", value, encode(value)))
    return out


LEAKS = _build_leaks()

# {tmp} is replaced by a scratch directory of the test, {project} by the project directory.
ORDINARY = [
    # allow-listed variables that must be kept exactly
    Case("env-value", "TOKENIZERS_PARALLELISM", "false", ""),
    Case("env-value", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "1", ""),
    Case("env-value", "KMP_AFFINITY", "granularity=fine,compact,1,0", ""),
    Case("env-value", "CUDA_VISIBLE_DEVICES", "0,1", ""),
    Case("env-value", "OMP_NUM_THREADS", "4", ""),
    Case("env-value", "HF_HUB_OFFLINE", "1", ""),
    Case("env-value", "HF_HOME", "{tmp}/hf-home", ""),
    Case("env-value", "HF_TOKEN_PATH", "{tmp}/hf-home/token", ""),
    Case("env-value", "TORCH_HOME", "{project}/.cache/torch", ""),
    Case("env-value", "PIP_INDEX_URL", "https://pypi.example/simple", ""),
    Case("env-value", "PIP_EXTRA_INDEX_URL", "https://torch-index.example/whl/cu121", ""),
    Case("env-value", "UV_INDEX_URL", "https://pypi.fury.io/acme/", ""),
    Case("env-value", "PIP_FIND_LINKS", "file://{tmp}/wheels", ""),
    Case("env-value", "HF_ENDPOINT", "https://huggingface.co", ""),
    Case("env-value", "NCCL_SOCKET_IFNAME", "eth0", ""),
    Case("env-value", "NCCL_IB_HCA", "mlx5_0:1", ""),
    Case("env-value", "TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX", ""),
    Case("env-value", "TORCH_CORPUS_OK_01", "https://host.example:8080/pkg@1.0", ""),
    Case("env-value", "TORCH_CORPUS_OK_02", "git+https://github.com/o/r.git@v1.0#egg=r", ""),
    Case("env-value", "TORCH_CORPUS_OK_03", "https://h.example/x-1.0-py3-none-any.whl#sha256=" + "ab" * 32, ""),
    Case("env-value", "TORCH_CORPUS_OK_04", "ssh://git@github.com/org/repo.git", ""),
    Case("env-value", "TORCH_CORPUS_OK_05", "git@github.com:org/repo.git", ""),
    Case("env-value", "TORCH_CORPUS_OK_06", "https://h.example/simple?page=2&format=json", ""),
    Case("env-value", "TORCH_CORPUS_OK_07", "alice@example.org", ""),
    Case("env-value", "TORCH_CORPUS_OK_08", "file://{project}/dist/pkg-1.0.tar.gz#subdirectory=sub", ""),
    Case("det-env", "XLA_FLAGS", "--xla_gpu_deterministic_ops=true --xla_dump_to={tmp}/dump", ""),
    Case("det-env", "CUBLAS_WORKSPACE_CONFIG", ":4096:8", ""),
    Case("det-env", "PYTHONHASHSEED", "0", ""),
    # variables outside the allow-list: never secrets, so their values must not be scrubbed
    # from anywhere else (checked through an allow-listed echo holding the same value)
    Case("env-echo", "PWD", "{project}", ""),
    Case("env-echo", "OLDPWD", "{tmp}", ""),
    Case("env-echo", "HOME", "{tmp}/home", ""),
    Case("env-echo", "DESKTOP_SESSION", "gnome-classic", ""),
    Case("env-echo", "XAUTHORITY", "{tmp}/home/.Xauthority", ""),
    Case("env-echo", "SSH_AUTH_SOCK", "{tmp}/agent.sock", ""),
    Case("env-echo", "XDG_SESSION_TYPE", "wayland", ""),
    Case("env-echo", "SESSION_MANAGER", "local/host:@/tmp/.ICE-unix/1234", ""),
    Case("env-echo", "KEYRING_BACKEND", "keyring.backends.null.Keyring", ""),
    # secret-named variables whose values are too short to be credentials, or a path: the
    # variable is redacted, but the same text elsewhere in the lock stays
    Case("env-echo", "SOME_PASSWORD", "1", ""),
    Case("env-echo", "DB_PASS", "x86_64", ""),
    Case("env-echo", "MY_TOKEN", "true", ""),
    Case("env-echo", "GOOGLE_APPLICATION_CREDENTIALS", "{project}", ""),
    # the other entry points
    Case("direct-url", "", "https://github.com/org/repo.git", ""),
    Case("direct-url", "", "ssh://git@github.com/org/repo.git", ""),
    Case("direct-url", "", "https://h.example/x-1.0-py3-none-any.whl#sha256=" + "cd" * 32, ""),
    Case("direct-url", "", "https://pypi.fury.io/acme/x-1.0-py3-none-any.whl", ""),
    Case("direct-url", "", "file://{project}/vendor/x-1.0-py3-none-any.whl", ""),
    Case("conda", "", "https://conda.example/pytorch", ""),
    Case("conda", "", "https://repo.conda.example/pkgs/main", ""),
    Case("conda", "", "conda-forge", ""),
    Case("git", "", "git@github.com:org/repo.git", ""),
    Case("git", "", "https://github.com/org/repo.git", ""),
    Case("git", "", "ssh://git@host.example:22/o/r.git", ""),
    Case("note", "", "lr=0.1, batch 64: https://wandb.ai/lab/proj/runs/abc123", ""),
    Case("note", "", "mail alice@example.org; code at git@github.com:org/repo.git", ""),
    # near misses of the shapes above: each must come out verbatim
    Case("env-echo", "PRIVATE_REGISTRY", "registry.lab.example", ""),
    Case("env-value", "HF_HUB_AUTHORIZATION_MODE", "bearer", ""),
    Case("env-value", "TORCH_HMAC_ALGORITHM", "sha256-hmac", ""),
    Case("env-value", "HF_PASSCODE_PROMPT", "1", ""),
    Case("env-value", "HF_PWR_PROFILE", "balanced", ""),
    Case("env-value", "UV_EXTRA_INDEX_URL",
         "https://pkgs.example/org/0f3c2d1e-aaaa-bbbb-cccc-123456789abc/_packaging/feed-2024-v2/pypi/simple/"
         " https://gitlab.example/api/v4/projects/123456789012345678/packages/pypi/simple", ""),
    Case("env-value", "TORCH_CORPUS_OK_09", "https://h.example/search?author=alice&keyword=amp&signal=on", ""),
    Case("env-value", "TORCH_CORPUS_OK_10", "{project}/runs/sk-learn-baseline-2024-01-15-seed0-0123456789abcdef01234567", ""),
    Case("env-value", "HF_INFERENCE_ENDPOINT", "https://hf-mirror.lab.example/eyJhbGciOiJIUzI1NiJ9/api", ""),
    Case("note", "", "see https://discuss.pytorch.org/t/nan-loss-with-amp/123456 and /t/cuda-12-1-fails/98765", ""),
    Case("note", "", "demo keys sk_live_demo pk_live_0123456789abcdefghijABCD AIzawesome dckr_pat_x", ""),
    Case("note", "", "pypi-mirror-snapshot-2024-01-15-for-the-whole-cluster and sk-learn-0123456789abcdefABCDEF0123456789-x", ""),
]

def _public(where: str, name: str, template: str, kind: str) -> Case:
    """The twin of a key block: the same block as a certificate or a public key, which are no
    secret (a note on one line: show prints a line break in a value escaped, and markdown
    collapses spaces)."""
    value = template.replace("{s}", "MIIBszCCAVmgAwIBAg").replace("PRIVATE KEY", kind).replace("PRIVATE%20KEY", quote(kind))
    return Case(where, name, " ".join(value.split()) if where == "note" else value, "")


ORDINARY += [_public(*block, "PUBLIC KEY" if n % 2 else "CERTIFICATE") for n, block in enumerate(_KEY_BLOCKS)]
# Twins of the encoded forms: the same encodings of a value no variable holds ("Basic" with a
# user:password is a credential whoever wrote it, so that one has no twin), and "Basic" before
# what is no user:password.
ORDINARY += [Case("env-value", f"TORCH_CORPUS_OK_ENC_{n:02d}", encode("Qa2w+/=@:!other"), "")
             for n, encode in enumerate(_ENCODINGS) if "Basic" not in encode("x")]
ORDINARY.append(Case("note", "", "Basic training run; basic dGVzdA== is 'test'; Basic auth is off", ""))
# Secret-named variables whose value could not be a credential (a plain word, a slug): redacted
# as a variable, kept wherever else the same text appears.
ORDINARY += [Case("env-echo", "MY_API_KEY", "experiments", ""), Case("env-echo", "WANDB_API_KEY", "run-2024-01-15-baseline", "")]
