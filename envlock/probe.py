"""The envlock probe: everything envlock knows about an environment comes from here.

Stdlib only, Python >= 3.8, and runnable by path (``python probe.py``), so the very same code
runs in-process inside a training script, in another interpreter (``--python``), and inside a
restored container that has nothing of envlock installed. It prints one JSON document; all
validation, TOML and diffing happen in envlock's own process on that document.

Rules every collector follows: a subprocess is an argv list with no shell and a timeout; a
missing tool or library leaves the field out and records the reason in ``probe.errors``; a
collector that raises never takes the whole probe down. Torch is imported only when it is
installed and asked for; if the calling process already imported it, its *live* flags are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

PROBE_VERSION = 1
REDACTED = "<redacted>"
DEFAULT_GIT_TIMEOUT = 5.0
DEFAULT_NVML_TIMEOUT = 10.0

# Environment variables worth recording: they select libraries, devices, threads or indexes.
ENV_PREFIXES = (
    "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "OMP_", "MKL_",
    "KMP_", "OPENBLAS_", "NVIDIA_", "NVTE_", "TRITON_", "XLA_", "JAX_", "HF_", "TRANSFORMERS_",
    "ACCELERATE_", "ENVLOCK_", "GOMP_", "ONEDNN_", "DNNL_", "ATEN_",
)
ENV_NAMES = (
    "PYTHONHASHSEED", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
    "CONDA_DEFAULT_ENV", "TOKENIZERS_PARALLELISM", "CC", "CXX", "MAX_JOBS",
)
# The variables that change numerics on their own; they are sealed in the fingerprint.
NUMERICS_ENV = (
    "CUBLAS_WORKSPACE_CONFIG", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
    "TORCH_CUDNN_V8_API_DISABLED", "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT",
    "CUBLASLT_WORKSPACE_SIZE", "NCCL_ALGO", "NCCL_PROTO", "PYTHONHASHSEED",
    "TORCH_DETERMINISTIC", "XLA_FLAGS", "ENVLOCK_SEED", "ATEN_CPU_CAPABILITY",
)
# ---------------------------------------------------------------------------------------------
# Secrets: which variables hold one, and what of a value may be kept.
# ---------------------------------------------------------------------------------------------

# A name is split into words (on "_", ".", "-" and camelCase), and it is a secret when one of
# its words says so. Whole words, not substrings: TOKENIZERS_PARALLELISM, DESKTOP_SESSION,
# KMP_AFFINITY and XAUTHORITY hold settings, not credentials.
_SECRET_WORDS = frozenset((
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "PWD", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "APIKEY", "KEY", "KEYS",
    "PRIVATE", "PRIVKEY", "COOKIE", "COOKIES", "PAT", "JWT", "BEARER", "WEBHOOK", "DSN",
    "SAS", "OTP", "SIGNATURE", "CONNSTR",
))
# Words glued to a secret noun in one segment (DBPASSWORD, AUTHTOKEN, CLIENTSECRET).
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "SECRETKEY",
                    "PRIVATEKEY", "ACCESSKEY")
# A switch about a secret holds a flag, wherever the word stands (HF_HUB_DISABLE_IMPLICIT_TOKEN=1).
_SWITCH_WORDS = frozenset(("DISABLE", "DISABLED", "ENABLE", "ENABLED", "NO", "SKIP", "IMPLICIT",
                           "REQUIRE", "REQUIRED", "PROMPT"))
# A property of a secret when it comes after the secret's noun (TOKEN_URL, AUTH_TIMEOUT,
# KEY_TYPE, CREDENTIAL_HELPER); before it, the noun is the secret (DATABASE_URL_PASSWORD).
_PROPERTY_WORDS = frozenset((
    "TIMEOUT", "TTL", "EXPIRY", "EXPIRES", "LENGTH", "LEN", "TYPE", "MODE", "METHOD", "BACKEND",
    "PROVIDER", "HELPER", "URL", "URI", "ENDPOINT", "HOST", "PORT", "SERVER", "REGION", "NAME",
    "USER", "USERNAME", "VERSION", "FORMAT", "SCOPE", "SCOPES",
))
# Not a property: _ID (AWS_ACCESS_KEY_ID names half of a key pair and is treated as a secret).
# Variables that hold a location, never a credential: the shell's and the desktop's own, and
# any name ending in one of these words (TOKEN_PATH points at a file, SSH_AUTH_SOCK at a socket).
_PATH_NAMES = frozenset(("PWD", "OLDPWD", "HOME", "XAUTHORITY", "SSH_AUTH_SOCK", "GNUPGHOME",
                         "KUBECONFIG", "KRB5CCNAME", "PATH"))
_PATH_WORDS = frozenset(("PATH", "PATHS", "DIR", "DIRS", "FILE", "FILES", "SOCK", "SOCKET",
                         "HOME", "ROOT", "PREFIX", "CACHE", "LOCATION", "FOLDER"))
_NAME_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# The shortest value the last-line scrub replaces wherever it appears. Credentials issued by
# services are far longer (hf_ 37, ghp_ 40, AWS 40, W&B 40 characters) and password policies
# start at 8 (NIST SP 800-63B); a shorter value ("1", "true", "gpu0", a user name) is far more
# likely to be part of a version, a path or a flag than a credential, and replacing it there
# would corrupt the lock. The variable's own [env] entry is redacted whatever its length.
MIN_SECRET_LEN = 8


def _name_words(name: str) -> List[str]:
    return [w.upper() for w in _NAME_SPLIT_RE.split(name) if w]


def is_path_variable(name: str) -> bool:
    """True for variables that hold a filesystem location (PWD, HOME, *_PATH, *_DIR, ...)."""
    words = _name_words(name)
    return name.upper() in _PATH_NAMES or bool(words and words[-1] in _PATH_WORDS)


def looks_secret(name: str) -> bool:
    """True for environment variable names whose values must never reach a lock."""
    if is_path_variable(name):
        return False
    words = _name_words(name)
    nouns = [i for i, w in enumerate(words) if w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES)]
    if not nouns or any(w in _SWITCH_WORDS for w in words):
        return False
    return not any(w in _PROPERTY_WORDS for w in words[nouns[-1] + 1:])


def canonicalize_name(name: str) -> str:
    """PEP 503 normalisation, so ``Foo_Bar`` and ``foo-bar`` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------
# URL hygiene: applied to every URL that reaches the document, wherever it came from.
# A URL keeps its scheme, host, path and harmless query parameters; it loses its userinfo
# (except the service user of an ssh remote, "git@"), secret-looking query values, every
# fragment other than pip's own (#egg=, #subdirectory=, #sha256=...), and the token segment of
# index hosts known to carry one in the path. The functions only ever remove: a string that
# needs nothing removed comes back unchanged, which is how the model tells a clean value.
# ---------------------------------------------------------------------------------------------

# Starts only where a run of scheme characters starts: otherwise every position of a long run
# without "://" would be tried, quadratic in its length.
_URL_RE = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")
# scp-style remotes (user[:password]@host:path) in free text: a word (between blanks and
# quotes) holding "@host:" after a userinfo without "/", the userinfo running from the word's
# start, or from after a leading "key=" / "(", to the *last* such "@", so a password holding
# "@", ";" or "=" goes with it. Found by hand, in time linear in the text (a regex with a greedy
# userinfo backtracks quadratically on "=a@=a@...").
_SCP_HINT_RE = re.compile(r"@[A-Za-z0-9][A-Za-z0-9.-]*:\S")
_SCP_WORD_RE = re.compile(r"(?<![^\s\"'<>`])[^\s\"'<>`]*@[^\s\"'<>`]*")
_SCP_KEEP_RE = re.compile(r"[^:@/=(,;]*[=(,;]")
_SCP_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*:(?=\S)")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# Query keys whose value is a credential (GitLab private_token, S3 X-Amz-Signature, SAS sig).
_SECRET_QUERY_RE = re.compile(
    r"(token|secret|passw|pass$|pwd|key|sig|auth|credential|session|cookie|jwt|otp|ticket|code$)",
    re.IGNORECASE,
)
# Fragments pip gives meaning to; every other fragment is dropped (#token=..., #access_token=).
_SAFE_FRAGMENT_KEYS = ("egg", "subdirectory", "sha1", "sha224", "sha256", "sha384", "sha512", "md5")
# Users that name a service account, not a person or a token (git@github.com:org/repo.git).
_SERVICE_USERS = ("git", "hg")
# Index hosts that carry a token as a path segment: (host pattern, path pattern); the group is
# the token. Gemfury, anaconda.org and conda's own rule for
# any channel (/t/TOKEN/), packagecloud /priv/TOKEN/, Cloudsmith entitlement tokens
# (dl.cloudsmith.io/TOKEN/...; "public" and "basic" are not tokens), Slack and Discord
# webhooks, Telegram bots.
_PATH_TOKENS = (
    # Gemfury: /TOKEN/ACCOUNT/ or /ACCOUNT/file; a segment before another directory, or one
    # with capitals (tokens are mixed case, account names are lowercase), is the token.
    (re.compile(r"(^|\.)fury\.io$", re.I),
     re.compile(r"^/((?=[^/]*[A-Z])[^/]+(?=/)|[^/]+(?=/[^/]+/))")),
    (re.compile(r"."), re.compile(r"(?:^|/)t/([^/]+)")),
    (re.compile(r"(^|\.)packagecloud\.io$", re.I), re.compile(r"^/priv/([^/]+)")),
    (re.compile(r"^dl\.cloudsmith\.io$", re.I), re.compile(r"^/(?!public/|basic/)([^/]+)/")),
    (re.compile(r"^hooks\.slack\.com$", re.I), re.compile(r"^/services/(.+)")),
    (re.compile(r"(^|\.)discord(app)?\.com$", re.I), re.compile(r"^/api/webhooks/(.+)")),
    (re.compile(r"^api\.telegram\.org$", re.I), re.compile(r"^/(?:file/)?bot([^/]+)")),
)
# Credentials recognisable by their own shape, wherever they appear in text.
_TOKEN_SHAPES_RE = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|hf_[A-Za-z0-9]{30,}|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|sk-(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{32,}|pypi-[A-Za-z0-9_-]{40,}|npm_[A-Za-z0-9]{36})"
)


def _strip_query(query: str) -> str:
    out = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if not eq:
            # A bare item (?TOKEN) has no name to judge it by: it goes unless empty.
            out.append(REDACTED if key and key != REDACTED else key)
        elif value and value != REDACTED and _SECRET_QUERY_RE.search(_unquote(key)):
            out.append(key + "=" + REDACTED)
        else:
            out.append(item)
    return "&".join(out)


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _strip_fragment(fragment: str) -> str:
    keep = []
    for item in fragment.split("&"):
        key, eq, value = item.partition("=")
        if eq and key.lower() in _SAFE_FRAGMENT_KEYS and re.match(r"^[A-Za-z0-9._+/\[\],-]*\Z", value):
            keep.append(item)
    return "&".join(keep)


def _split_authority(rest: str) -> Tuple[str, str]:
    """(userinfo, remainder) of what follows ``scheme://``; userinfo is "" when there is none.

    The authority ends at the first "/", so a password with an unencoded "#", "?" or "@"
    (alice:p#SECRET@host) is still userinfo; a password with an unencoded "/" is recognised by
    a ":" before it that is not a port (alice:p/SECRET@host).
    """
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    at = authority.rfind("@")
    if at >= 0:
        return rest[:at], rest[at + 1:]
    colon = authority.find(":")
    at = rest.find("@", slash) if slash >= 0 else -1
    if colon >= 0 and at >= 0 and not authority[colon + 1:].isdigit() and not re.search(r"\s", rest[:at]):
        return rest[:at], rest[at + 1:]
    return "", rest


def _path_tokens(host: str, path: str) -> str:
    host = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    for host_re, path_re in _PATH_TOKENS:
        if not host_re.search(host):
            continue
        m = path_re.search(path)
        if m and m.group(1) != REDACTED:
            path = path[:m.start(1)] + REDACTED + path[m.end(1):]
    return path


def strip_url(url: str) -> str:
    """``url`` without credentials (see the rules above); unchanged when it has none."""
    m = _SCHEME_RE.match(url)
    if not m:
        return _strip_scp(url)
    scheme = m.group(1).lower()
    userinfo, rest = _split_authority(url[m.end():])
    keep_user = ""
    if userinfo and "ssh" in scheme and userinfo in _SERVICE_USERS:
        keep_user = userinfo + "@"
    rest, hash_, fragment = rest.partition("#")
    rest, qmark, query = rest.partition("?")
    slash = rest.find("/")
    host, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    path = _path_tokens(host, path)
    out = url[:m.end()] + keep_user + host + path
    if qmark:
        out += "?" + _strip_query(query)
    if hash_:
        fragment = _strip_fragment(fragment)
        if fragment:
            out += "#" + fragment
    return _TOKEN_SHAPES_RE.sub(REDACTED, out)


def _scp_word(word: str) -> str:
    keep = _SCP_KEEP_RE.match(word)
    start = keep.end() if keep else 0
    slash = word.find("/", start)
    at = word.rfind("@", start, slash if slash >= 0 else len(word))
    while at > start:
        if _SCP_HOST_RE.match(word, at + 1) is not None:
            return word if word[start:at] in _SERVICE_USERS else word[:start] + word[at + 1:]
        at = word.rfind("@", start, at)
    return word


def _strip_scp(text: str) -> str:
    if "@" not in text or _SCP_HINT_RE.search(text) is None:
        return text
    return _SCP_WORD_RE.sub(lambda m: _scp_word(m.group(0)), text)


def scrub_text(text: str) -> str:
    """``text`` with every embedded URL and scp remote stripped and token-shaped words removed."""
    if "://" in text:
        text = _URL_RE.sub(lambda m: strip_url(m.group(0)), text)
    if "@" in text:
        text = _strip_scp(text)
    return _TOKEN_SHAPES_RE.sub(REDACTED, text)


# ---------------------------------------------------------------------------------------------
# Subprocesses: argv only, no shell, always a timeout, started early so they overlap.
# ---------------------------------------------------------------------------------------------


class _Proc:
    """A subprocess started now and collected later, so slow tools overlap with torch import."""

    def __init__(self, argv: List[str], timeout: float, cwd: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.argv = argv
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.error: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        try:
            # Own process group: a hung tool's children (a credential helper, a pager) are
            # killed with it and cannot keep our pipes open past the timeout.
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=os.name == "posix",
            )
        except FileNotFoundError:
            self.error = "%s not found" % argv[0]
        except OSError as exc:
            self.error = "%s could not start: %s" % (argv[0], exc)

    def _kill(self) -> None:
        assert self.proc is not None
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, 9)
            else:
                self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.communicate(timeout=1)
        except Exception:
            pass

    def result(self) -> Tuple[Optional[int], bytes, str]:
        """Return (returncode, stdout, error); returncode None means it did not finish."""
        if self.proc is None:
            return None, b"", self.error or "not started"
        remaining = max(0.05, self.deadline - time.monotonic())
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            self._kill()
            return None, b"", "%s timed out after %gs" % (" ".join(self.argv[:2]), self.timeout)
        msg = err.decode("utf-8", "replace").strip().splitlines()
        return self.proc.returncode, out, (msg[-1] if msg else "")


def _git_env() -> Dict[str, str]:
    env = dict(os.environ)
    # No pager, no prompt for credentials, no index.lock taken by a read-only status.
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C",
                "GIT_PAGER": "cat", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"})
    return env


def _repo_root(path: str) -> Optional[str]:
    """The nearest directory holding ``.git`` (a directory, or a file for worktrees)."""
    path = os.path.abspath(path)
    while True:
        if os.path.exists(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _git_pathspec(cwd: str, exclude: Sequence[str]) -> List[str]:
    """Pathspecs that leave the lock being written out of the git state.

    Without them a lock committed to the repository makes the next capture see itself as
    untracked or modified, and every lock of an unchanged environment differs in [git]. A path
    outside the repository would make git fail, so only paths in the same one are named.
    """
    root = _repo_root(cwd)
    if root is None:
        return []
    spec = [":(exclude,literal)" + os.path.abspath(p) for p in exclude
            if _repo_root(os.path.dirname(os.path.abspath(p))) == root]
    return ["--", ":/", *spec] if spec else []


class _GitJob:
    """All git commands for the capture, started together."""

    def __init__(self, cwd: str, timeout: float, exclude: Sequence[str] = ()) -> None:
        env = _git_env()
        git = os.environ.get("ENVLOCK_GIT", "git")
        spec = _git_pathspec(cwd, exclude)
        self.rev = _Proc([git, "rev-parse", "HEAD", "--abbrev-ref", "HEAD"], timeout, cwd, env)
        self.status = _Proc([git, "status", "--porcelain=v1", "-z", "--untracked-files=all", *spec],
                            timeout, cwd, env)
        self.diff = _Proc([git, "diff", "HEAD", "--no-color", "--no-ext-diff", "--binary", *spec],
                          timeout, cwd, env)
        self.remote = _Proc([git, "config", "--get", "remote.origin.url"], timeout, cwd, env)

    def collect(self) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
        rc, out, err = self.rev.result()
        if rc != 0:
            # Make sure the siblings do not outlive a failed or hung git.
            for job in (self.status, self.diff, self.remote):
                job.result()
            if rc is None:
                return None, err
            if "not a git repository" in err.lower():
                return None, "not a git repository"
            return None, "git rev-parse failed: %s" % (err or "exit %s" % rc)
        lines = out.decode("utf-8", "replace").split()
        info: Dict[str, Any] = {"commit": lines[0] if lines else None}
        if len(lines) > 1 and lines[1] != "HEAD":
            info["branch"] = lines[1]
        rc, out, err = self.status.result()
        untracked: List[str] = []
        if rc == 0:
            dirty = False
            for entry in out.decode("utf-8", "surrogateescape").split("\0"):
                if not entry:
                    continue
                if entry.startswith("??"):
                    untracked.append(entry[3:])
                else:
                    dirty = True
            info["dirty"] = dirty
            info["untracked"] = len(untracked)
        rc, out, err = self.diff.result()
        if rc == 0:
            h = hashlib.sha256(out)
            for path in sorted(untracked):
                h.update(b"\0untracked\0" + path.encode("utf-8", "surrogateescape"))
            info["diff_sha256"] = h.hexdigest()
        rc, out, err = self.remote.result()
        if rc == 0 and out.strip():
            info["remote"] = strip_url(out.decode("utf-8", "replace").strip())
        return info, None


# ---------------------------------------------------------------------------------------------
# Collectors
# ---------------------------------------------------------------------------------------------


def _read_text(path: str, limit: int = 1 << 20) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _read_bytes(path: str, limit: int = 4 << 20) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def collect_platform() -> Dict[str, Any]:
    import platform

    info: Dict[str, Any] = {"os": platform.system() or sys.platform, "machine": platform.machine()}
    text = _read_text("/etc/os-release") or _read_text("/usr/lib/os-release")
    if text:
        fields = {}
        for line in text.splitlines():
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                fields[key.strip()] = value.strip().strip('"').strip("'")
        info["os_id"] = fields.get("ID")
        info["os_version_id"] = fields.get("VERSION_ID")
        info["os_pretty_name"] = fields.get("PRETTY_NAME")
    info["kernel"] = platform.release()
    libc = None
    try:
        # confstr is a syscall-free lookup; platform.libc_ver() scans the interpreter binary.
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        pass
    if libc:
        name, _, version = libc.partition(" ")
        info["libc"], info["libc_version"] = name, version
    elif sys.platform.startswith("linux"):
        import glob

        musl = glob.glob("/lib/ld-musl-*.so.1")
        if musl:
            info["libc"] = "musl"
    cpuinfo = _read_text("/proc/cpuinfo", 1 << 16)
    if cpuinfo:
        for line in cpuinfo.splitlines():
            if line.startswith(("model name", "Model", "cpu model", "Processor")):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    elif sys.platform == "darwin":
        info["cpu_model"] = platform.processor() or None
    try:
        info["cpu_count"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cpu_count"] = os.cpu_count()
    return {k: v for k, v in info.items() if v is not None}


def prefix_kind() -> str:
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):
        return "conda"
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return "venv"
    return "system"


def collect_python() -> Dict[str, Any]:
    import platform
    import sysconfig

    return {
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform_tag": sysconfig.get_platform(),
        "prefix_kind": prefix_kind(),
        "executable": sys.executable or None,
        "prefix": sys.prefix,
    }


def _metadata_fields(text: str) -> Tuple[Optional[str], Optional[str]]:
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if name is None and line[:5].lower() == "name:":
            name = line[5:].strip()
        elif version is None and line[:8].lower() == "version:":
            version = line[8:].strip()
        if name is not None and version is not None:
            break
    return name, version


def _read_headers(path: str) -> Tuple[Optional[str], Optional[str]]:
    """Name and Version from a METADATA/PKG-INFO file, reading only the header block."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
            name, version = _metadata_fields(head.decode("utf-8", "replace"))
            if (name is None or version is None) and b"\n\n" not in head:
                head += fh.read()
                name, version = _metadata_fields(head.decode("utf-8", "replace"))
    except OSError:
        return None, None
    return name, version


# Files an installer writes into the dist-info, not the wheel's: uv adds uv_cache.json (with a
# hash) when it installs from a local file, so a uv-made venv and its pip-restored image would
# otherwise name two builds of one wheel.
_NO_HASH_IN_RECORD = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json")


def record_sha256(path: str) -> Optional[str]:
    """sha256 over the hashed, in-site-packages lines of RECORD, sorted.

    The raw RECORD differs between two venvs installing the same wheel: console scripts land
    in ``../../../bin`` with the venv's own interpreter in their shebang, and the installer adds
    INSTALLER/REQUESTED/direct_url.json (uv also uv_cache.json). Dropping those lines keeps a hash that names the exact
    build (every shipped file's hash) and is the same wherever that build is installed.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return record_digest(data)


def record_digest(data: bytes) -> str:
    """``record_sha256`` of a RECORD's bytes (also used on a wheel's own RECORD, unpacked)."""
    keep = []
    for raw in data.splitlines():
        if not raw or raw.startswith(b"../") or raw.startswith(b'"../'):
            continue
        head, sep, _size = raw.rpartition(b",")
        path_part, sep2, digest = head.rpartition(b",")
        if not sep or not sep2 or not digest:
            continue
        leaf = path_part.rstrip(b'"').rsplit(b"/", 1)[-1].decode("utf-8", "replace")
        if leaf in _NO_HASH_IN_RECORD:
            continue
        keep.append(raw)
    keep.sort()
    return hashlib.sha256(b"\n".join(keep)).hexdigest()


def _direct_url(path: str) -> Dict[str, Any]:
    """Source of a distribution from PEP 610 ``direct_url.json``."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return {"source": "unknown"}
    url = strip_url(str(data.get("url", "")))
    out: Dict[str, Any] = {"url": url or None}
    if "vcs_info" in data:
        vcs = data["vcs_info"] or {}
        out.update({"source": "vcs", "vcs": vcs.get("vcs"), "commit": vcs.get("commit_id"),
                    "requested_revision": vcs.get("requested_revision")})
    elif "dir_info" in data:
        out["source"] = "editable" if (data["dir_info"] or {}).get("editable") else "local"
    elif "archive_info" in data:
        archive = data["archive_info"] or {}
        hashes = archive.get("hashes") or {}
        if "sha256" in hashes:
            out["archive_hash"] = "sha256=%s" % hashes["sha256"]
        elif archive.get("hash"):
            out["archive_hash"] = str(archive["hash"])
        out["source"] = "local" if url.startswith("file:") else "url"
    else:
        out["source"] = "unknown"
    return out


def _path_entries(skip: Optional[str]) -> List[str]:
    seen = set()
    entries = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry in seen or (skip and entry == skip):
            continue
        seen.add(entry)
        entries.append(entry)
    return entries


def collect_packages(skip_dir: Optional[str] = None, locations: Optional[Dict[str, str]] = None,
                     deep_locations: Optional[List[Tuple[str, str, str]]] = None,
                     record_digest: Callable[[str], Optional[str]] = record_sha256,
                     ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Every distribution visible on sys.path, first one wins, later ones reported as shadowed.

    Scanning ``*.dist-info`` directories ourselves is what importlib.metadata does, minus the
    full parse of METADATA (often megabytes of README) that dominates ``pip freeze``.
    ``locations``, when given, receives name -> metadata path of each active distribution (the
    OS packages block uses it to find the distributions an OS package owns).
    ``deep_locations`` collects ``(name, path entry, dist-info dir)`` of the active ones with a
    RECORD, for the deep check.
    """
    packages: List[Dict[str, Any]] = []
    duplicates: List[Dict[str, Any]] = []
    active: Dict[str, str] = {}
    # name -> (position in packages, metadata path), to recognise an editable project's own
    # build metadata when it shows up a second time on the path.
    seen: Dict[str, Tuple[int, str]] = {}
    for index, entry in enumerate(_path_entries(skip_dir)):
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for fname in names:
            if fname.endswith(".dist-info"):
                kind = "dist-info"
            elif fname.endswith(".egg-info"):
                kind = "egg-info"
            else:
                continue
            full = os.path.join(entry, fname)
            files: Tuple[str, ...] = ()
            if os.path.isdir(full):
                try:
                    files = tuple(os.listdir(full))
                except OSError:
                    continue
                meta = "METADATA" if kind == "dist-info" else "PKG-INFO"
                name, version = _read_headers(os.path.join(full, meta))
            else:
                name, version = _read_headers(full)
            if not name or not version:
                continue
            cname = canonicalize_name(name)
            if cname in active and kind == "egg-info":
                pos, _ = seen[cname]
                if _inside_editable(packages[pos], full):
                    continue  # the editable project's own src/NAME.egg-info, not a second copy
            pkg: Dict[str, Any] = {"name": cname, "version": version, "source": "index"}
            if "INSTALLER" in files:
                installer = (_read_text(os.path.join(full, "INSTALLER"), 256) or "").strip()
                if installer:
                    pkg["installer"] = installer
            if kind == "dist-info":
                pkg["requested"] = "REQUESTED" in files
            if "direct_url.json" in files:
                pkg.update(_direct_url(os.path.join(full, "direct_url.json")))
            if pkg.get("installer") == "conda" and pkg["source"] in ("local", "unknown", "index"):
                # conda-built wheels point at the build machine's file:// path; the package
                # really came from a conda channel (see [conda]).
                pkg["source"] = "conda"
                pkg.pop("url", None)
            if "RECORD" in files:
                pkg["record_sha256"] = record_digest(os.path.join(full, "RECORD"))
            if kind == "egg-info" and pkg["source"] == "index":
                pkg["source"] = "unknown"
            pkg = {k: v for k, v in pkg.items() if v is not None}
            if cname in active:
                pos, first = seen[cname]
                if first.endswith(".egg-info") and _inside_editable(pkg, first):
                    # The project's egg-info came first (src/ on PYTHONPATH): the editable
                    # install is the real entry, the egg-info its build metadata.
                    packages[pos], seen[cname], active[cname] = pkg, (pos, full), version
                    if locations is not None:
                        locations[cname] = full
                    _note_deep(deep_locations, cname, entry, fname, kind, files)
                else:
                    duplicates.append({"name": cname, "version": version,
                                       "active_version": active[cname], "path_index": index})
                continue
            active[cname] = version
            if locations is not None:
                locations[cname] = full
            _note_deep(deep_locations, cname, entry, fname, kind, files)
            seen[cname] = (len(packages), full)
            packages.append(pkg)
    packages.sort(key=lambda p: p["name"])
    return packages, duplicates


def _note_deep(deep_locations: Optional[List[Tuple[str, str, str]]], name: str, entry: str,
               fname: str, kind: str, files: Tuple[str, ...]) -> None:
    """An active distribution with a RECORD is one the deep check re-hashes."""
    if deep_locations is not None and kind == "dist-info" and "RECORD" in files:
        deep_locations.append((name, entry, fname))


def _inside_editable(pkg: Dict[str, Any], metadata_path: str) -> bool:
    """True when ``metadata_path`` lies in the project directory of editable ``pkg``.

    setuptools leaves ``src/NAME.egg-info`` in a project whenever it builds it (a wheel, an
    sdist, an older editable install); with the project's src/ on sys.path that directory looks
    like a second, shadowed installation of the same distribution.
    """
    url = pkg.get("url") or ""
    if pkg.get("source") != "editable" or not url.startswith("file:"):
        return False
    from urllib.parse import unquote, urlsplit

    project = os.path.realpath(unquote(urlsplit(url).path))
    where = os.path.realpath(metadata_path)
    return where == project or where.startswith(project.rstrip(os.sep) + os.sep)


def collect_conda() -> Optional[Dict[str, Any]]:
    meta = os.path.join(sys.prefix, "conda-meta")
    if not os.path.isdir(meta):
        return None
    pkgs = []
    for fname in sorted(os.listdir(meta)):
        if not fname.endswith(".json"):
            continue
        try:
            with open(os.path.join(meta, fname), "rb") as fh:
                data = json.loads(fh.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
        channel = data.get("channel") or data.get("schannel")
        pkgs.append({k: v for k, v in {
            "name": data.get("name"), "version": data.get("version"), "build": data.get("build"),
            "channel": strip_url(str(channel)) if channel else None}.items() if v is not None})
    return {"packages": pkgs}


def _cudnn_str(v: Optional[int]) -> Optional[str]:
    if not v:
        return None
    if v >= 90000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return "%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100)


def quiet(fn: Callable[[], Any]) -> Any:
    """Read one torch attribute; deprecation warnings and missing APIs become None.

    A knob this torch lacks, or one that raises on a mixed legacy/new TF32 state (torch >= 2.9),
    reads as None rather than aborting the capture.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn()
        except Exception:
            return None


def collect_torch(torch: Any) -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "version": str(torch.__version__),
        "git_version": quiet(lambda: torch.version.git_version),
        "cuda": quiet(lambda: torch.version.cuda),
        "hip": quiet(lambda: torch.version.hip),
        "debug": quiet(lambda: bool(torch.version.debug)),
        "cxx11_abi": quiet(lambda: bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "mkl": quiet(lambda: bool(torch.backends.mkl.is_available())),
        "mkldnn": quiet(lambda: bool(torch.backends.mkldnn.is_available())),
        "openmp": quiet(lambda: bool(torch.backends.openmp.is_available())),
    }
    info["cudnn"] = quiet(lambda: _cudnn_str(torch.backends.cudnn.version()))
    if info["cuda"]:
        info["nccl"] = quiet(lambda: ".".join(str(x) for x in torch.cuda.nccl.version()))
    info["cuda_available"] = quiet(lambda: bool(torch.cuda.is_available()))
    info["device_count"] = quiet(lambda: int(torch.cuda.device_count())) if info["cuda_available"] else 0
    info["arch_list"] = quiet(lambda: list(torch.cuda.get_arch_list())) or []
    config = quiet(lambda: torch.__config__.show())
    parallel = quiet(lambda: torch.__config__.parallel_info())
    build = parse_torch_config(config if isinstance(config, str) else "",
                               parallel if isinstance(parallel, str) else "")
    capability = quiet(lambda: str(torch.backends.cpu.get_cpu_capability())) or build.pop("cpu_capability", None)
    build.pop("cpu_capability", None)
    info["cpu_capability"] = capability
    if build:
        info["build"] = build
    if isinstance(config, str) and config:
        info["config_sha256"] = hashlib.sha256(config_identity(config).encode("utf-8")).hexdigest()
    return {k: v for k, v in info.items() if v is not None}


# torch.__config__.show() mixes how torch was built with what it found on this host: the "CPU
# capability usage" line is the ISA the dispatcher picked here (AVX2 on one machine, AVX512 on
# the next). Host facts stay out of the build's identity, or one stack gets two fingerprints.
_HOST_LINE_RE = re.compile(r"^\s*-?\s*CPU capability usage\s*:", re.IGNORECASE)
_CONFIG_LINES = (
    # (field, pattern on one "  - ..." line); the first group is the value.
    ("compiler", re.compile(r"^((?:GCC|gcc|clang|Clang|Apple clang|MSVC|Intel|icx|icpx)\s+\S+)$")),
    ("cxx_standard", re.compile(r"^C\+\+ Version:\s*(\S+)$")),
    ("mkl_version", re.compile(r"Math Kernel Library Version\s+([0-9][0-9.]*)")),
    ("onednn_version", re.compile(r"^Intel\(R\) (?:MKL-DNN|oneDNN)\s+v?([0-9][0-9A-Za-z.]*)")),
    ("openmp_version", re.compile(r"^OpenMP\s+(\d+)")),
    ("cpu_capability", re.compile(r"^CPU capability usage:\s*(.+)$")),
    ("cuda_runtime", re.compile(r"^(?:Built with )?CUDA Runtime\s+(\S+)$")),
    ("cudnn_version", re.compile(r"^CuDNN\s+(\S+)")),
    ("magma_version", re.compile(r"^Magma\s+(\S+)$")),
    ("hip_runtime", re.compile(r"^HIP Runtime\s+(\S+)$")),
    ("miopen_version", re.compile(r"^MIOpen\s+(\S+)$")),
)
# "Build settings: K=V, K=V, ..." where a value (CXX_FLAGS) may itself hold commas.
_SETTING_SPLIT_RE = re.compile(r",\s*(?=[A-Z][A-Z0-9_]*=)")
_SETTING_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_SETTING_FIELDS = {"BLAS_INFO": "blas", "LAPACK_INFO": "lapack", "BUILD_TYPE": "build_type"}
# Already recorded as torch.version / torch.git_version.
_SETTING_SKIP = ("TORCH_VERSION", "COMMIT_SHA")
_MAX_VALUE = 4096


def config_identity(config: str) -> str:
    """torch.__config__.show() without the lines that describe the host rather than the build."""
    return "".join(line for line in config.splitlines(True) if not _HOST_LINE_RE.match(line))


def parse_torch_config(config: str, parallel: str = "") -> Dict[str, Any]:
    """Readable build facts from ``torch.__config__.show()`` and ``.parallel_info()``.

    Both are free text whose wording changes between torch versions, so every line is matched
    on its own and anything unrecognised is ignored rather than guessed at.
    """
    build: Dict[str, Any] = {}
    options: Dict[str, str] = {}
    for raw in config.splitlines():
        line = raw.strip()
        if line.startswith("- "):
            line = line[2:].strip()
        if line.startswith("NVCC architecture flags:"):
            flags = [f.strip() for f in line.split(":", 1)[1].split(";")]
            arch = [f for f in flags if f and f != "-gencode" and len(f) <= 128]
            if arch:
                build["cuda_arch_flags"] = arch
            continue
        if line.startswith("Build settings:"):
            for item in _SETTING_SPLIT_RE.split(line.split(":", 1)[1].strip().rstrip(",")):
                key, sep, value = item.partition("=")
                key, value = key.strip(), value.strip().rstrip(",").strip()
                if not sep or not _SETTING_KEY_RE.match(key) or key in _SETTING_SKIP:
                    continue
                value = value[:_MAX_VALUE]
                if key in _SETTING_FIELDS:
                    if value:
                        build[_SETTING_FIELDS[key]] = value
                else:
                    options[key] = value
            continue
        for field, pattern in _CONFIG_LINES:
            match = pattern.search(line)
            if match and field not in build:
                value = match.group(1).strip()[:_MAX_VALUE]
                if value:
                    build[field] = value
                break
    for raw in parallel.splitlines():
        key, sep, value = raw.strip().partition(":")
        if sep and key.strip() == "ATen parallel backend" and value.strip():
            build["parallel_backend"] = value.strip()[:_MAX_VALUE]
    if options:
        build["options"] = dict(sorted(options.items()))
    return build


def collect_determinism(torch: Any) -> Dict[str, Any]:
    det: Dict[str, Any] = {"torch_loaded": torch is not None}
    if torch is not None:
        b = torch.backends
        readers: Dict[str, Callable[[], Any]] = {
            "deterministic_algorithms": lambda: torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": lambda: torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_enabled": lambda: b.cudnn.enabled,
            "cudnn_deterministic": lambda: b.cudnn.deterministic,
            "cudnn_benchmark": lambda: b.cudnn.benchmark,
            "cuda_matmul_allow_tf32": lambda: b.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": lambda: b.cudnn.allow_tf32,
            "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
            # PyTorch >= 2.9: the fp32_precision API that supersedes allow_tf32.
            "fp32_precision": lambda: b.fp32_precision,
            "cuda_matmul_fp32_precision": lambda: b.cuda.matmul.fp32_precision,
            "cudnn_conv_fp32_precision": lambda: b.cudnn.conv.fp32_precision,
            "cudnn_rnn_fp32_precision": lambda: b.cudnn.rnn.fp32_precision,
            "mkldnn_fp32_precision": lambda: b.mkldnn.fp32_precision,
            # The per-backend nodes; oneDNN's matmul/conv nodes change CPU bytes (bf16 on AMX).
            "cuda_fp32_precision": lambda: torch._C._get_fp32_precision_getter("cuda", "all"),
            "mkldnn_matmul_fp32_precision":
                lambda: torch._C._get_fp32_precision_getter("mkldnn", "matmul"),
            "mkldnn_conv_fp32_precision":
                lambda: torch._C._get_fp32_precision_getter("mkldnn", "conv"),
            "mkldnn_rnn_fp32_precision":
                lambda: torch._C._get_fp32_precision_getter("mkldnn", "rnn"),
            "mkldnn_enabled": lambda: b.mkldnn.enabled,
            "cuda_matmul_allow_fp16_reduced_precision_reduction":
                lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "cuda_matmul_allow_bf16_reduced_precision_reduction":
                lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "sdpa_flash": lambda: b.cuda.flash_sdp_enabled(),
            "sdpa_mem_efficient": lambda: b.cuda.mem_efficient_sdp_enabled(),
            "sdpa_math": lambda: b.cuda.math_sdp_enabled(),
            "sdpa_cudnn": lambda: b.cuda.cudnn_sdp_enabled(),
            "fill_uninitialized_memory": lambda: torch.utils.deterministic.fill_uninitialized_memory,
            "num_threads": lambda: torch.get_num_threads(),
            "num_interop_threads": lambda: torch.get_num_interop_threads(),
        }
        for key, read in readers.items():
            value = quiet(read)
            if isinstance(value, (bool, int, str)):
                det[key] = value
    det["env"] = {k: env_value(k, os.environ[k]) for k in NUMERICS_ENV if k in os.environ}
    # Knobs that envlock.runtime set in *this* process after they could take effect. It writes
    # _ENVLOCK_LATE=<pid>:NAME,NAME: an environment variable, so the probe needs nothing of
    # envlock to read it, tagged with the pid because children inherit the environment but not
    # the lateness (a child that starts with CUBLAS_WORKSPACE_CONFIG set has it in effect). The
    # leading underscore keeps it out of the [env] allow-list.
    pid, _, names = os.environ.get("_ENVLOCK_LATE", "").partition(":")
    if pid == str(os.getpid()):
        late = sorted(set(n for n in names.split(",") if re.fullmatch(r"^[A-Za-z0-9_.]{1,128}$", n)))
        if late:
            det["late"] = late
    changed = process_set_env()
    if changed:
        det["process_env"] = changed
    return det


def _recorded_name(name: str) -> bool:
    return name in NUMERICS_ENV or name.startswith(ENV_PREFIXES) or name in ENV_NAMES


def process_set_env() -> List[str]:
    """Recorded variables this process set, changed or removed after it started.

    They are process state (``seed_everything`` exports ENVLOCK_SEED, ``deterministic()`` sets
    CUBLAS_WORKSPACE_CONFIG, training code sets variables itself), not the environment a fresh
    process inherits, so a shell ``verify`` reports rather than compares them. Linux keeps the
    environment a process was started with in /proc/self/environ (setenv never writes there);
    elsewhere nothing is known and every variable counts as environment.
    """
    raw = _read_bytes("/proc/self/environ")
    if raw is None:
        return []
    initial: Dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            initial[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    names = set(initial) | set(os.environ)
    return sorted(n for n in names if _recorded_name(n) and initial.get(n) != os.environ.get(n)
                  and re.fullmatch(r"[A-Za-z0-9_.]{1,128}", n))


def collect_seeds(torch: Any) -> Dict[str, Any]:
    seeds: Dict[str, Any] = {"hash_randomization": bool(sys.flags.hash_randomization)}
    if "PYTHONHASHSEED" in os.environ:
        seeds["python_hash_seed"] = os.environ["PYTHONHASHSEED"]
    raw = os.environ.get("ENVLOCK_SEED")
    if raw is not None:
        try:
            seeds["seed"] = int(raw)
            seeds["seed_source"] = "envlock" if os.environ.get("ENVLOCK_SEED_SOURCE") != "env" else "env"
        except ValueError:
            pass
        if torch is not None and "seed" in seeds:
            value = quiet(lambda: int(torch.initial_seed()))
            if value is not None:
                seeds["torch_initial_seed"] = value
    return seeds


def env_value(name: str, value: str) -> str:
    """What a lock may keep of one variable: nothing of a secret, a URL without credentials."""
    return REDACTED if looks_secret(name) else scrub_text(value)


def collect_env() -> Dict[str, str]:
    out = {}
    for name, value in os.environ.items():
        if not (name.startswith(ENV_PREFIXES) or name in ENV_NAMES):
            continue
        out[name] = env_value(name, value)
    return dict(sorted(out.items()))


def secret_values(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """Values of the variables that hold a secret, to scrub from the whole document.

    Only values that can be a credential: at least MIN_SECRET_LEN long, and not the location
    of something on this machine (a secret-named variable may hold a path to a key file; its
    directory must not vanish from every path in the lock).
    """
    values = set()
    for name, value in (os.environ if environ is None else environ).items():
        values.update(_url_passwords(value))
        if not looks_secret(name) or len(value.strip()) < MIN_SECRET_LEN or value == REDACTED:
            continue
        if os.path.isabs(value) and os.path.exists(value):
            continue
        values.add(value)
    return sorted(values, key=len, reverse=True)


def _url_passwords(value: str) -> List[str]:
    """Passwords of the URLs in any variable (``PIP_INDEX_URL=https://alice:PW@host``): the
    URL itself is stripped wherever it goes, but the password alone, pasted into ``--note``,
    is a secret too. The user name is not (it is often part of a home directory's path), nor a
    short plain word (``postgres://postgres:postgres@localhost``, a development default that
    also names directories and packages: replacing it everywhere would corrupt the lock)."""
    if "://" not in value or "@" not in value:
        return []
    out = []
    for m in _URL_RE.finditer(value):
        scheme = _SCHEME_RE.match(m.group(0))
        if scheme is None:
            continue
        userinfo = _split_authority(m.group(0)[scheme.end():])[0]
        password = userinfo.partition(":")[2]
        for candidate in (password, _unquote(password)):
            if len(candidate.strip()) >= MIN_SECRET_LEN and not (candidate.isalpha() and len(candidate) < 16):
                out.append(candidate)
    return out


def scrub_string(text: str, secrets: List[str]) -> str:
    """One string as it may enter a lock: URLs stripped, secret values replaced.

    Repeated until nothing changes, so that what it returns passes the model's own check
    (``scrub_text(x) == x``) even when a replacement makes a new pattern appear."""
    for _ in range(4):
        before = text
        text = scrub_text(text)
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        if text == before:
            break
    return text


def scrub_document(doc: Any, secrets: List[str]) -> Any:
    """Last line of defence: no credential-bearing URL and no secret value survives anywhere
    in the document, keys included."""
    if isinstance(doc, dict):
        return {scrub_string(k, secrets) if isinstance(k, str) else k: scrub_document(v, secrets)
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [scrub_document(v, secrets) for v in doc]
    if isinstance(doc, str):
        return scrub_string(doc, secrets)
    return doc


# What is installed is named by package metadata, never by the environment: a secret value that
# happens to be a word (POSTGRES_PASSWORD=requests, a DATABASE_URL password "postgres") must not
# rename a package, which made the whole capture fail as an invalid lock.
_IDENTITY_KEYS = ("name", "version", "active_version")


def scrub_lock_document(doc: Dict[str, Any], secrets: List[str]) -> Dict[str, Any]:
    """``scrub_document`` for a probe's whole output, package names and versions exempt from
    the secret values (URLs and token shapes are still stripped from them)."""
    out: Dict[str, Any] = scrub_document(doc, secrets)
    for table in ("packages", "duplicates"):
        for i, row in enumerate(doc.get(table) or []):
            for k in _IDENTITY_KEYS:
                if isinstance(row, dict) and isinstance(row.get(k), str):
                    out[table][i][k] = scrub_string(row[k], [])
    os_pkgs = doc.get("os_packages")
    if isinstance(os_pkgs, dict) and isinstance(os_pkgs.get("packages"), list):
        out["os_packages"]["packages"] = scrub_document(os_pkgs["packages"], [])
    return out


# -- containers ---------------------------------------------------------------------------------

_CID_RE = re.compile(r"(?:docker|libpod|containers|crio|cri-containerd)[-/]([0-9a-f]{64})")


def _container_id() -> Tuple[Optional[str], Optional[str]]:
    text = _read_text("/proc/self/mountinfo", 1 << 20) or ""
    match = _CID_RE.search(text)
    if match:
        return match.group(1), "mountinfo"
    text = _read_text("/proc/self/cgroup", 1 << 16) or ""
    match = _CID_RE.search(text)
    if match:
        return match.group(1), "cgroup"
    return None, None


def _split_ref(ref: str) -> Tuple[str, Optional[str]]:
    if "@sha256:" in ref:
        name, _, digest = ref.partition("@")
        return name, digest
    return ref, None


def collect_image(cli_ref: Optional[str]) -> Dict[str, Any]:
    info: Dict[str, Any] = {"in_container": False, "source": "none"}
    containerenv = _read_text("/run/.containerenv")
    if containerenv is not None:
        info.update({"in_container": True, "engine": "podman", "source": "containerenv"})
        fields = dict(
            (k.strip(), v.strip().strip('"'))
            for k, _, v in (line.partition("=") for line in containerenv.splitlines()) if v
        )
        # Podman fills these only for --privileged containers.
        if fields.get("image"):
            info["reference"], digest = _split_ref(fields["image"])
            if digest:
                info["digest"] = digest
        if fields.get("imageid"):
            iid = fields["imageid"]
            info["id"] = iid if iid.startswith("sha256:") else "sha256:" + iid
        if fields.get("id"):
            info["container_id"] = fields["id"]
    elif os.path.exists("/.dockerenv"):
        info.update({"in_container": True, "engine": "docker", "source": "dockerenv"})
    cid, cid_source = _container_id()
    if cid:
        info["in_container"] = True
        info.setdefault("container_id", cid)
        if info["source"] == "none":
            info["source"] = cid_source
    # Values injected by `envlock restore/run` (or by a CI job) win: inside a container there
    # is no reliable way to learn one's own image otherwise.
    env_ref = os.environ.get("ENVLOCK_IMAGE")
    env_digest = os.environ.get("ENVLOCK_IMAGE_DIGEST")
    env_id = os.environ.get("ENVLOCK_IMAGE_ID")
    if env_ref or env_digest or env_id:
        info["source"] = "env"
        if env_ref:
            info["reference"], digest = _split_ref(env_ref)
            if digest:
                info["digest"] = digest
        if env_digest:
            info["digest"] = env_digest
        if env_id:
            info["id"] = env_id
    if cli_ref:
        info["source"] = "cli"
        info["reference"], digest = _split_ref(cli_ref)
        if digest:
            info["digest"] = digest
    return info


# -- GPU ----------------------------------------------------------------------------------------


class NvmlError(RuntimeError):
    """An NVML call failed; the message is NVML's own error string."""


class _CtypesNvml:
    """The handful of NVML calls envlock needs, straight from libnvidia-ml through ctypes.

    Used when nvidia-ml-py is not importable, which is the normal case inside a restored
    container: envlock installs nothing there, but the driver library is mounted by the runtime.
    """

    def __init__(self) -> None:
        import ctypes

        self.ct = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            # NVML's own words ("Driver Not Loaded"), which users can search for; the bare
            # code is kept for the rare build whose table lacks it.
            text = self.lib.nvmlErrorString(rc)
            words = text.decode("utf-8", "replace") if text else "Unknown Error"
            raise NvmlError("%s: %s (NVML error %d)" % (what, words, rc))

    def _string(self, fn: Any, *args: Any) -> str:
        buf = self.ct.create_string_buffer(96)
        self._check(fn(*args, buf, self.ct.c_uint(96)), getattr(fn, "__name__", "nvml"))
        return buf.value.decode("utf-8", "replace")

    def driver(self) -> str:
        return self._string(self.lib.nvmlSystemGetDriverVersion)

    def cuda_driver(self) -> int:
        v = self.ct.c_int()
        self._check(self.lib.nvmlSystemGetCudaDriverVersion_v2(self.ct.byref(v)), "nvmlSystemGetCudaDriverVersion_v2")
        return v.value

    def count(self) -> int:
        n = self.ct.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(self.ct.byref(n)), "nvmlDeviceGetCount_v2")
        return n.value

    def device(self, i: int) -> Dict[str, Any]:
        ct = self.ct
        h = ct.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ct.c_uint(i), ct.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
        dev: Dict[str, Any] = {"index": i, "name": self._string(self.lib.nvmlDeviceGetName, h)}
        try:
            dev["uuid"] = self._string(self.lib.nvmlDeviceGetUUID, h)
        except RuntimeError:
            pass
        major, minor = ct.c_int(), ct.c_int()
        if self.lib.nvmlDeviceGetCudaComputeCapability(h, ct.byref(major), ct.byref(minor)) == 0:
            dev["compute_capability"] = "%d.%d" % (major.value, minor.value)

        class Memory(ct.Structure):  # type: ignore[name-defined,misc]
            _fields_ = [("total", ct.c_ulonglong), ("free", ct.c_ulonglong),  # noqa: RUF012
                        ("used", ct.c_ulonglong)]

        mem = Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(h, ct.byref(mem)) == 0:
            dev["memory_total_mib"] = int(mem.total // (1 << 20))
        cur, pend = ct.c_uint(), ct.c_uint()
        if self.lib.nvmlDeviceGetMigMode(h, ct.byref(cur), ct.byref(pend)) == 0:
            dev["mig_mode"] = bool(cur.value)
        return dev

    def close(self) -> None:
        self.lib.nvmlShutdown()


class _PyNvml:
    def __init__(self, mod: Any) -> None:
        self.m = mod
        mod.nvmlInit()

    @staticmethod
    def _s(value: Any) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def driver(self) -> str:
        return self._s(self.m.nvmlSystemGetDriverVersion())

    def cuda_driver(self) -> int:
        return int(self.m.nvmlSystemGetCudaDriverVersion_v2())

    def count(self) -> int:
        return int(self.m.nvmlDeviceGetCount())

    def device(self, i: int) -> Dict[str, Any]:
        m = self.m
        h = m.nvmlDeviceGetHandleByIndex(i)
        dev: Dict[str, Any] = {"index": i, "name": self._s(m.nvmlDeviceGetName(h))}
        for key, fn in (("uuid", lambda: self._s(m.nvmlDeviceGetUUID(h))),
                        ("compute_capability",
                         lambda: "%d.%d" % tuple(m.nvmlDeviceGetCudaComputeCapability(h))),
                        ("memory_total_mib", lambda: int(m.nvmlDeviceGetMemoryInfo(h).total // (1 << 20))),
                        ("mig_mode", lambda: bool(m.nvmlDeviceGetMigMode(h)[0]))):
            try:
                dev[key] = fn()
            except Exception:
                pass
        return dev

    def close(self) -> None:
        self.m.nvmlShutdown()


def _nvml_query() -> Dict[str, Any]:
    try:
        import pynvml  # nvidia-ml-py

        nvml: Any = _PyNvml(pynvml)
    except ImportError:
        nvml = _CtypesNvml()
    try:
        info: Dict[str, Any] = {"source": "nvml", "driver": nvml.driver()}
        try:
            v = nvml.cuda_driver()
            info["cuda_driver"] = "%d.%d" % (v // 1000, (v % 1000) // 10)
        except Exception:
            pass
        info["devices"] = [nvml.device(i) for i in range(nvml.count())]
        return info
    finally:
        try:
            nvml.close()
        except Exception:
            pass


def _hash_uuids(info: Dict[str, Any]) -> Dict[str, Any]:
    for dev in info.get("devices", []):
        uuid = dev.pop("uuid", None)
        if uuid:
            dev["uuid_sha256"] = hashlib.sha256(uuid.encode("utf-8")).hexdigest()
    return info


def _nvml_words(exc: BaseException) -> str:
    """What went wrong, in NVML's words when NVML answered (ctypes or nvidia-ml-py)."""
    if isinstance(exc, NvmlError):
        return str(exc)
    if type(exc).__name__.startswith("NVMLError"):  # nvidia-ml-py: str() is nvmlErrorString
        return "%s (NVML error %s)" % (exc, getattr(exc, "value", "?"))
    return "%s: %s" % (type(exc).__name__, exc)


def nvml_timeout_from_env() -> float:
    """Seconds the NVML watchdog waits: ``$ENVLOCK_NVML_TIMEOUT``, else the default."""
    return float(os.environ.get("ENVLOCK_NVML_TIMEOUT", DEFAULT_NVML_TIMEOUT))


def collect_gpu(torch: Any, timeout: float) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """NVML in a watchdog thread (a wedged driver must not hang capture), then torch.cuda."""
    box: Dict[str, Any] = {}

    def work() -> None:
        try:
            box["info"] = _nvml_query()
        except Exception as exc:
            box["error"] = _nvml_words(exc)

    thread = threading.Thread(target=work, name="envlock-nvml", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        nvml_error = "NVML did not answer within %gs" % timeout
    elif "info" in box:
        return _hash_uuids(box["info"]), None
    else:
        nvml_error = "NVML unavailable: %s" % box.get("error", "unknown")
    if torch is not None and quiet(lambda: torch.cuda.is_available()):
        devices = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            dev = {"index": i, "name": props.name,
                   "compute_capability": "%d.%d" % (props.major, props.minor),
                   "memory_total_mib": int(props.total_memory // (1 << 20))}
            uuid = quiet(lambda p=props: str(p.uuid))  # type: ignore[misc]
            if uuid:
                dev["uuid"] = uuid
            devices.append(dev)
        return _hash_uuids({"source": "torch", "devices": devices}), None
    return None, nvml_error


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Torch facts cache: what ``import torch`` would tell, reused while nothing it depends on moved.
#
# Importing torch is most of a capture (seconds on a GPU box) and its answers - version, CUDA,
# cuDNN, NCCL, build flags, and the flags a *fresh* interpreter starts with - change only when
# torch's or its CUDA libraries' files change, or a variable, the CPU or the driver does. Those
# inputs are hashed into a key; a hit skips the import. Used only by the probe run as a program
# (CLI capture/verify), whose torch state is a fresh interpreter's by construction; a training
# process (``envlock.capture()``) reads its own live flags and never uses it. Seeds are never
# cached: a seed set through envlock makes the run live.
# ---------------------------------------------------------------------------------------------

CACHE_FORMAT = 1
CACHE_MAX_ENTRIES = 64
# Everything torch, its BLAS/OpenMP runtimes, CUDA or the dynamic loader read at import.
_KEY_ENV_PREFIXES = (
    "CUDA_", "TORCH_", "PYTORCH_", "ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "CUBLAS", "CUDNN_",
    "NCCL_", "NVIDIA_", "ONEDNN_", "DNNL_", "OPENBLAS_", "TRITON_", "LD_", "HIP_", "ROCM_",
    "ROCR_", "HSA_", "XLA_", "USE_", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONUSERBASE",
)
_KEY_LIB_RE = re.compile(
    r"^lib(cuda|cudart|cudnn|cublas|nccl|nvrtc|nvrtc-builtins|nvJitLink|cufft|curand|cusolver|"
    r"cusparse|cupti|nvToolsExt|amdhip64|MIOpen|rccl|rocblas|hipblas|gomp|iomp5|mkl)[^/]*\.so")
_KEY_DIST_RE = re.compile(r"^(torch|triton|pytorch_triton[^-]*|nvidia_[^-]+)-[^-]+\.dist-info$",
                          re.IGNORECASE)


def cache_dir() -> str:
    """``$ENVLOCK_CACHE_DIR``, else ``$XDG_CACHE_HOME/envlock``, else ``~/.cache/envlock``."""
    override = os.environ.get("ENVLOCK_CACHE_DIR")
    if override:
        return override
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "envlock")


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "%s:absent" % path
    return "%s:%d:%d:%d" % (path, st.st_size, st.st_mtime_ns, st.st_ino)


def _torch_dists() -> List[Tuple[str, str]]:
    """``(path entry, dist-info dir)`` of torch, triton and every nvidia-* distribution."""
    seen = set()
    found = []
    for entry in _path_entries(None):
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for fname in names:
            if _KEY_DIST_RE.match(fname):
                cname = canonicalize_name(fname.split("-", 1)[0])
                if cname not in seen:
                    seen.add(cname)
                    found.append((entry, fname))
    return found


def _own_digest() -> str:
    """sha256 of this file: a probe that reads torch differently (a new field) must not be
    served the facts an older probe cached; PROBE_VERSION alone is not bumped for that."""
    try:
        with open(os.path.abspath(__file__), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return "unknown:%s" % time.time()  # unreadable: never reuse


def torch_cache_key() -> Optional[str]:
    """sha256 of every input the torch facts depend on, or None when they cannot be pinned
    down (no torch distribution with a RECORD: a source checkout, an egg)."""
    import importlib.util

    dists = _torch_dists()
    if not any(d[1].lower().startswith("torch-") for d in dists):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape") + b"\0")

    put("format", str(CACHE_FORMAT), str(PROBE_VERSION), sys.version, sys.prefix,
        os.path.realpath(sys.executable or ""), _stat_line(os.path.realpath(sys.executable or "")),
        _stat_line(spec.origin), _own_digest())
    for entry, info in dists:
        record = os.path.join(entry, info, "RECORD")
        try:
            with open(record, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        put(info, hashlib.sha256(data).hexdigest())
        for line in data.splitlines():
            rel = line.split(b",", 1)[0].decode("utf-8", "surrogateescape")
            leaf = rel.rsplit("/", 1)[-1]
            if ".so" in leaf and not rel.startswith("../"):
                put(_stat_line(os.path.join(entry, rel)))
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if not directory:
            continue
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            put("%s:unreadable" % directory)
            continue
        for name in names:
            if _KEY_LIB_RE.match(name):
                put(_stat_line(os.path.join(directory, name)))
    for lib in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")):
        if lib:
            put(_stat_line(lib))
    put(_stat_line("/etc/ld.so.cache"))
    for name in sorted(os.environ):
        if name.startswith(_KEY_ENV_PREFIXES):
            put(name, os.environ[name])
    cpuinfo = _read_text("/proc/cpuinfo", 1 << 16) or ""
    flags = [line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))][:1]
    put("cpu", *flags)
    try:
        put("affinity", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        put("cpus", str(os.cpu_count()))
    put("driver", _read_text("/proc/driver/nvidia/version", 4096) or "none")
    return h.hexdigest()


def _cache_path(key: str) -> str:
    return os.path.join(cache_dir(), "torch-facts-%s.json" % key[:32])


def cache_read(key: str) -> Optional[Dict[str, Any]]:
    """The facts stored under ``key``; None for a miss, a corrupt or a foreign entry."""
    try:
        with open(_cache_path(key), "rb") as fh:
            entry = json.loads(fh.read(1 << 22).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT
            or entry.get("key") != key or not isinstance(entry.get("facts"), dict)):
        return None
    facts: Dict[str, Any] = entry["facts"]
    if not isinstance(facts.get("torch"), dict) or not isinstance(facts.get("determinism"), dict):
        return None
    return facts


def cache_write(key: str, facts: Dict[str, Any]) -> None:
    """Concurrent writers of one key write the same bytes, so whichever rename lands last is
    right. The oldest entries beyond CACHE_MAX_ENTRIES go. Never raises."""
    if not _atomic_json(_cache_path(key), {"format": CACHE_FORMAT, "key": key, "facts": facts}):
        return
    directory = cache_dir()
    try:
        entries = [n for n in os.listdir(directory) if n.startswith("torch-facts-")]
        if len(entries) > CACHE_MAX_ENTRIES:
            paths = sorted((os.path.join(directory, n) for n in entries),
                           key=lambda p: os.stat(p).st_mtime)
            for old in paths[:len(entries) - CACHE_MAX_ENTRIES]:
                os.unlink(old)
    except OSError:
        pass  # another run pruned the same entry first


class RecordDigests:
    """``record_sha256`` of big RECORD files, remembered by their stat.

    torch's RECORD alone is ~15,000 lines (~60 ms to digest); an installer rewrites RECORD
    whenever it touches a distribution, which changes its inode, size or mtime. Small RECORDs
    are cheaper to digest than to look up and are not kept.
    """

    MIN_SIZE = 32 << 10

    def __init__(self) -> None:
        h = hashlib.sha256(("%s\0%s" % (sys.prefix, sys.executable)).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(cache_dir(), "records-%s.json" % h.hexdigest()[:32])
        self.entries: Dict[str, List[Any]] = {}
        self.dirty = False
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read(1 << 24).decode("utf-8"))
            if isinstance(data, dict) and data.get("format") == CACHE_FORMAT \
                    and isinstance(data.get("entries"), dict):
                self.entries = data["entries"]
        except (OSError, ValueError):
            pass

    def __call__(self, path: str) -> Optional[str]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if st.st_size < self.MIN_SIZE:
            return record_sha256(path)
        sig = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = self.entries.get(path)
        if isinstance(entry, list) and len(entry) == 4 and entry[:3] == sig \
                and isinstance(entry[3], str):
            return entry[3]
        digest = record_sha256(path)
        if digest is not None:
            self.entries[path] = [*sig, digest]
            self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            _atomic_json(self.path, {"format": CACHE_FORMAT, "entries": self.entries})


def _atomic_json(path: str, data: Any) -> bool:
    """Write JSON through a private temp file and a rename: a reader sees the old file or the
    new one, never half of one. Never raises (a cache that cannot be written is no cache)."""
    import tempfile

    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(data, sort_keys=True).encode("utf-8"))
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _cacheable(torch: str, canary: bool) -> bool:
    # Seeds are process state, and the canary runs kernels: both need the real torch.
    return torch == "auto" and not canary and "torch" not in sys.modules \
        and "ENVLOCK_SEED" not in os.environ


def _want_torch(mode: str) -> Tuple[Any, Optional[str]]:
    if mode == "no":
        return None, "skipped (--no-torch)"
    if "torch" in sys.modules:
        return sys.modules["torch"], None
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        import torch

        return torch, None
    except Exception as exc:
        return None, "import torch failed: %s: %s" % (type(exc).__name__, exc)


def collect(torch: str = "auto", canary: bool = False, image: Optional[str] = None,
            cwd: Optional[str] = None, git_timeout: Optional[float] = None,
            nvml_timeout: Optional[float] = None, skip_dir: Optional[str] = None,
            deep: bool = False, cache: bool = False, progress: bool = False,
            processes: bool = False, git_exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """Probe this interpreter and process; return a JSON-ready document (never raises).

    ``git_exclude``: files left out of the git state (the lock about to be written).

    ``cache``: reuse the torch facts of an earlier run when nothing they depend on changed
    (see the torch facts cache above); only for a fresh interpreter, never a training process.
    """
    start = time.perf_counter()
    errors: Dict[str, str] = {}
    doc: Dict[str, Any] = {}
    git_timeout = git_timeout if git_timeout is not None else float(
        os.environ.get("ENVLOCK_GIT_TIMEOUT", DEFAULT_GIT_TIMEOUT))
    nvml_timeout = nvml_timeout if nvml_timeout is not None else nvml_timeout_from_env()
    git_job = _GitJob(cwd or os.getcwd(), git_timeout, git_exclude)

    def guard(section: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # one broken collector must not lose the others
            errors[section] = "%s: %s" % (type(exc).__name__, exc)
            return None

    doc["image"] = guard("image", lambda: collect_image(image)) or {"source": "none"}
    doc["platform"] = guard("platform", collect_platform)
    doc["python"] = guard("python", collect_python)
    locations: Dict[str, str] = {}
    deep_locations: List[Tuple[str, str, str]] = []
    records = guard("cache", RecordDigests) if cache else None
    pkgs = guard("packages", lambda: collect_packages(skip_dir, locations, deep_locations,
                                                      records or record_sha256))
    if records is not None:
        records.save()
    doc["packages"], doc["duplicates"] = pkgs if pkgs else ([], [])
    os_packages = guard("os_packages", lambda: collect_os_packages(doc["packages"], locations))
    if os_packages:
        doc["os_packages"] = os_packages
    if deep:
        guard("deep", lambda: _deep_check(doc, deep_locations, progress, processes))
    conda = guard("conda", collect_conda)
    if conda is not None:
        doc["conda"] = conda
    key = guard("cache", torch_cache_key) if cache and _cacheable(torch, canary) else None
    facts = cache_read(key) if key else None
    gpu = None
    if facts is not None:
        gpu = guard("gpu", lambda: collect_gpu(None, nvml_timeout))
        if (gpu is None or gpu[0] is None) and facts["torch"].get("cuda_available"):
            facts = None  # NVML failed: only a live torch.cuda can describe the GPUs
    if facts is not None:
        torch_mod = None
        doc["torch"] = facts["torch"]
        det = dict(facts["determinism"])
        det.update(guard("determinism", lambda: collect_determinism(None)) or {})
        det["torch_loaded"] = True
        doc["determinism"] = det
    else:
        torch_mod, why = _want_torch(torch)
        if torch_mod is not None:
            info = guard("torch", lambda: collect_torch(torch_mod))
            if info:
                doc["torch"] = info
        elif why:
            errors["torch"] = why
        gpu = guard("gpu", lambda: collect_gpu(torch_mod, nvml_timeout))
        doc["determinism"] = guard("determinism", lambda: collect_determinism(torch_mod)) or {}
        if key and "torch" in doc and "torch" not in errors and "determinism" not in errors:
            # The flags of this fresh interpreter, minus what is read live on every run.
            flags = {k: v for k, v in doc["determinism"].items() if k not in ("env", "late")}
            cache_write(key, {"torch": doc["torch"], "determinism": flags})
    if gpu:
        if gpu[0] is not None:
            doc["gpu"] = gpu[0]
        else:
            errors["gpu"] = gpu[1]
    doc["seeds"] = guard("seeds", lambda: collect_seeds(torch_mod)) or {}
    doc["env"] = guard("env", collect_env) or {}
    if canary:
        result = guard("canary", lambda: _run_canary(torch_mod))
        if result:
            doc["canary"] = result
    git, git_error = git_job.collect()
    if git is not None:
        doc["git"] = {k: v for k, v in git.items() if v is not None}
    elif git_error:
        errors["git"] = git_error
    doc["probe"] = {"version": PROBE_VERSION, "errors": errors,
                    "duration_ms": round((time.perf_counter() - start) * 1000, 1)}
    if "torch" in doc:
        doc["probe"]["torch_facts"] = "cached" if facts is not None else "live"
    return scrub_lock_document(doc, secret_values())


def _load_sibling(fname: str, module_name: str) -> Any:
    """A stdlib module from beside this file, loaded by path: it travels with the probe into
    containers, where no envlock package exists to import it from."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), fname)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise RuntimeError("%s not found beside the probe" % fname)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernels() -> Any:
    return _load_sibling("kernels.py", "_envlock_canary")


# ---------------------------------------------------------------------------------------------
# OS packages: the dpkg/apk/rpm database of this root (parsers in ospkgs.py beside this file)
# ---------------------------------------------------------------------------------------------

_OSPKGS: List[Any] = []


def load_ospkgs() -> Any:
    if not _OSPKGS:
        _OSPKGS.append(_load_sibling("ospkgs.py", "_envlock_ospkgs"))
    return _OSPKGS[0]


def _run_tool(argv: List[str], timeout: float) -> Tuple[Optional[int], bytes, str]:
    env = dict(os.environ, LC_ALL="C")
    return _Proc(argv, timeout, env=env).result()


def collect_os_packages(packages: List[Dict[str, Any]], locations: Dict[str, str],
                        root: str = "/") -> Optional[Dict[str, Any]]:
    """``[os_packages]`` of ``root``; distributions an OS package owns become source "system"."""
    ospkgs = load_ospkgs()
    db = ospkgs.load(root, _run_tool)
    if db is None:
        return None
    ospkgs.mark_system(packages, locations, db)
    doc: Dict[str, Any] = db.document()
    return doc


def _deep_check(doc: Dict[str, Any], locations: List[Tuple[str, str, str]], progress: bool,
                processes: bool) -> None:
    """``--deep``: every file of every active distribution against its RECORD (deep.py).

    Findings go to ``doc["deep"]`` (the verify report, not part of a lock); each package gets
    ``files_sha256`` (its files as they are on disk) and ``files_changed`` when any differ.
    """
    deep = _load_sibling("deep.py", "_envlock_deep")
    cb = None
    if progress:
        def cb(files: int, total_files: int, nbytes: int, total_bytes: int) -> None:
            # One line per tick on stderr, which the CLI reads and draws; never on stdout.
            sys.stderr.write("\x1eenvlock-progress %d %d %d %d\n"
                             % (files, total_files, nbytes, total_bytes))
            sys.stderr.flush()
    report = deep.check(locations, progress=cb, processes=processes)
    by_name = {p["name"]: p for p in doc.get("packages", [])}
    for name, digest in report.pop("digests").items():
        pkg = by_name.get(name)
        if pkg is None:
            continue
        pkg["files_sha256"] = digest
        found = report["dists"].get(name)
        if found:
            pkg["files_changed"] = deep.changes(found)
    doc["deep"] = report


def _run_canary(torch_mod: Any) -> Optional[Dict[str, Any]]:
    if torch_mod is None:
        raise RuntimeError("the canary needs torch")
    result: Optional[Dict[str, Any]] = load_kernels().run(torch_mod)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--canary", action="store_true")
    parser.add_argument("--image")
    parser.add_argument("--cwd")
    parser.add_argument("--indent", type=int)
    parser.add_argument("--deep", action="store_true", help="hash every installed file")
    parser.add_argument("--progress", action="store_true", help="deep progress on stderr")
    parser.add_argument("--no-cache", action="store_true", help="always import torch")
    parser.add_argument("--git-exclude", action="append", default=[],
                        help="a file to leave out of the git state (the lock being written)")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    # Run as a program, this is a fresh interpreter of our own: its torch state is a fresh
    # import's (cacheable) and it may fork hashing workers.
    doc = collect(torch="no" if args.no_torch else "auto", canary=args.canary,
                  image=args.image, cwd=args.cwd, skip_dir=here, deep=args.deep,
                  cache=not args.no_cache and not os.environ.get("ENVLOCK_NO_CACHE"),
                  progress=args.progress, processes=True, git_exclude=args.git_exclude)
    sys.stdout.write(json.dumps(doc, indent=args.indent, sort_keys=True))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # Run by path, the probe's own directory is sys.path[0]; drop it so none of its sibling
    # modules can shadow what the probed environment would import.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    _code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The document is out; skip the interpreter's teardown, which takes ~0.4 s once torch is
    # loaded and sits on the critical path of every capture. Only when run as a script.
    os._exit(_code)
