"""The rules envlock applies everywhere, in one place: which variables are recorded, which
hold a secret, how distribution names normalise, the determinism knobs, and what a replay
record's metric may be called.

The probe applies them while collecting, the model enforces them on every value it accepts,
and the runtime sets the knobs the probe reads; a rule written twice drifts apart, so each
lives here once. Stdlib only and Python >= 3.8 like the rest of the probe; the model and the
runtime import it too, so it imports no collector.
"""

from __future__ import annotations

import os
import re
from functools import partial
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

# What a redacted value reads as, in the probe's document and in a lock.
REDACTED = "<redacted>"

# A metric's name in a replay record: the record's model holds it to this, and
# ``envlock.record`` refuses any other at the call that passes it, in the training process,
# where pydantic may not be installed.
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,127}")

# Environment variables worth recording: they select libraries, devices, threads or indexes.
ENV_PREFIXES = (
    "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "OMP_", "MKL_",
    "KMP_", "OPENBLAS_", "NVIDIA_", "NVTE_", "TRITON_", "XLA_", "JAX_", "HF_", "TRANSFORMERS_",
    "ACCELERATE_", "ENVLOCK_", "GOMP_", "ONEDNN_", "DNNL_", "ATEN_", "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
)
ENV_NAMES = (
    "PYTHONHASHSEED", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
    "CONDA_DEFAULT_ENV", "TOKENIZERS_PARALLELISM", "CC", "CXX", "MAX_JOBS",
)
# The variables that name a package index: their URLs also lose any path segment shaped like a
# token (an index path is a few words, ``/acme/simple``; a token there is the credential).
INDEX_VARIABLES = (
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX", "UV_INDEX", "UV_FIND_LINKS", "ENVLOCK_TORCH_INDEX_URL",
)
# The variables that change numerics on their own (``numerics_variable``): each selects a
# kernel, an ISA, a thread count, a reduction or an algorithm, and none shows in any version.
# A lock seals them in ``[determinism].env`` (a changed one is breaking drift), ``restore`` and
# ``apply`` set them, the canary records them beside its hashes, and the torch-facts cache keys
# on them. By name, because most families mix settings with diagnostics and paths
# (MKL_VERBOSE, OMP_DISPLAY_ENV, NCCL_SOCKET_IFNAME); a family whose variables all choose
# kernels is a prefix.
NUMERICS_ENV = (
    "CUBLAS_WORKSPACE_CONFIG", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
    "TORCH_CUDNN_V8_API_DISABLED", "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT",
    "CUBLASLT_WORKSPACE_SIZE", "NCCL_ALGO", "NCCL_PROTO", "PYTHONHASHSEED",
    "TORCH_DETERMINISTIC", "XLA_FLAGS", "ENVLOCK_SEED", "ATEN_CPU_CAPABILITY",
    # Thread counts and CPU kernels chosen at run time: MKL's and OpenMP's dynamic adjustment,
    # MKL's threading layer, the CPU type MKL and OpenBLAS pick kernels for, Intel OpenMP's
    # deterministic reductions, oneDNN's implicit down-conversion of fp32 math.
    "OMP_DYNAMIC", "OMP_THREAD_LIMIT", "MKL_DYNAMIC", "MKL_THREADING_LAYER", "MKL_DEBUG_CPU_TYPE",
    "OPENBLAS_CORETYPE", "KMP_DETERMINISTIC_REDUCTION", "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
)
# Transformer Engine's variables choose its attention and fusion kernels (NVTE_FUSED_ATTN,
# NVTE_FLASH_ATTN, NVTE_ALLOW_NONDETERMINISTIC_ALGO, ...).
NUMERICS_ENV_PREFIXES = ("NVTE_",)
# Words of a variable of such a family that make it a diagnostic, not a setting (NVTE_DEBUG).
_DIAGNOSTIC_WORDS = frozenset(("DEBUG", "VERBOSE", "LOG", "TRACE", "PRINT", "DISPLAY", "WARNINGS"))


def numerics_variable(name: str) -> bool:
    """True for a variable that changes numerics on its own (NUMERICS_ENV, or a setting of a
    NUMERICS_ENV_PREFIXES family that is neither a location nor a diagnostic).

    The one rule of what a lock seals in ``[determinism].env``, what a replay record's context
    and the canary keep beside the bytes they explain, and what the torch-facts cache keys on;
    a second list drifted from the first (the record dropped what the lock sealed).
    """
    if name in NUMERICS_ENV:
        return True
    if not name.startswith(NUMERICS_ENV_PREFIXES) or is_path_variable(name) \
            or not re.fullmatch(r"[A-Z][A-Z0-9_]{0,127}", name):
        return False
    return not any(w in _DIAGNOSTIC_WORDS for w in _name_words(name))


# The variables that configure torch.compile (Inductor, Dynamo, Triton): they choose kernels, so
# a changed one can explain a divergence; their paths name caches (``[compile].caches``).
COMPILE_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCHDYNAMO_", "TRITON_", "TORCH_COMPILE_")
# ---------------------------------------------------------------------------------------------
# Secrets: which variables hold one, and what of a value may be kept.
# ---------------------------------------------------------------------------------------------

# A name is split into words (on "_", ".", "-" and camelCase), and it is a secret when one of
# its words says so. Whole words, not substrings: TOKENIZERS_PARALLELISM, DESKTOP_SESSION,
# KMP_AFFINITY and XAUTHORITY hold settings, not credentials.
# "PRIVATE" alone is not one: PRIVATE_REGISTRY and PRIVATE_INDEX name a place, and scrubbing
# their value from the whole document cut the registry out of an image reference (a private
# key is still caught by KEY or PRIVKEY).
_SECRET_WORDS = frozenset((
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "PASSCODE", "PWD", "PW", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH",
    "AUTHORIZATION", "APIKEY", "KEY", "KEYS", "PRIVKEY", "COOKIE", "COOKIES", "PAT", "JWT",
    "BEARER", "WEBHOOK", "DSN", "SAS", "OTP", "SIGNATURE", "HMAC", "CONNSTR",
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
    "USER", "USERNAME", "VERSION", "FORMAT", "SCOPE", "SCOPES", "ALGORITHM",
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
# The separators of names and paths: the words between them are what a directory, a run or a
# package is called ("my-experiments", "run_2024.01", "/home/alice/data").
_NAME_SEPARATORS = "-_./"
# One word of a name this long is no name (a directory or run is called a few short words);
# it is a generated token or a passphrase written as one word.
LONG_WORD = 16


def could_be_credential(value: str) -> bool:
    """True when ``value`` may be a credential, so the last-line scrub replaces it wherever it
    appears; False when it is shaped like a name, so replacing it elsewhere would rewrite the
    names of directories, runs and packages that merely share it.

    By length and character mix: MIN_SECRET_LEN characters or more, and one of

    * a character that names do not hold: anything but letters, digits and ``- _ . /`` (a
      symbol, a space, a ":" or "@", ``hunter2!``, ``p@ss word``);
    * a word (a run between ``- _ . /``) that mixes letters and digits (``tok3nvalue99``,
      hex, ``Summer2024``): names keep their numbers apart (``run-2024``, ``cuda-12.1``);
    * a word of LONG_WORD characters or more (``correcthorsebatterystaple``).

    So a plain word or a slug of words and numbers (``experiments``, ``my-experiments``,
    ``run-2024-01-15``) is not scrubbed from elsewhere: the variable's own value is still
    redacted whatever it holds, and a credential of such a shape is only as safe as its name.
    Case does not count: a directory may well be called ``MyExperiments``.
    """
    value = value.strip()
    if len(value) < MIN_SECRET_LEN:
        return False
    if any(not (c.isalnum() or c in _NAME_SEPARATORS) for c in value):
        return True
    words = re.split("[" + re.escape(_NAME_SEPARATORS) + "]+", value)
    return any(len(w) >= LONG_WORD or (any(c.isalpha() for c in w) and any(c.isdigit() for c in w))
               for w in words)


def _name_words(name: str) -> List[str]:
    return [w.upper() for w in _NAME_SPLIT_RE.split(name) if w]


def is_path_variable(name: str) -> bool:
    """True for variables that hold a filesystem location (PWD, HOME, *_PATH, *_DIR, ...)."""
    words = _name_words(name)
    return name.upper() in _PATH_NAMES or bool(words and words[-1] in _PATH_WORDS)


def _names_a_secret(words: List[str]) -> bool:
    nouns = [i for i, w in enumerate(words) if w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES)]
    if not nouns or any(w in _SWITCH_WORDS for w in words):
        return False
    return not any(w in _PROPERTY_WORDS for w in words[nouns[-1] + 1:])


def looks_secret(name: str) -> bool:
    """True for environment variable names whose values must never reach a lock."""
    if is_path_variable(name):
        return False
    return _names_a_secret(_name_words(name))


# Query keys that carry a credential beyond the names above: an Azure SAS signature ("sig"),
# session ids and tickets. Whole words again: ?author=, ?keyword=, ?design= are not credentials.
_QUERY_SECRET_WORDS = frozenset(("SIG", "SESSION", "SESSIONID", "JSESSIONID", "TICKET"))


def secret_query_key(key: str) -> bool:
    """True for a URL query (or path parameter) key whose value is a credential: ``token``,
    ``access_token``, ``X-Amz-Signature``, ``sig``, ``api_key``, ``pwd``, OAuth's bare ``code``.

    The rule of variable names, on the key's words, without the path exemption (``?pwd=`` is a
    password, not a directory)."""
    words = _name_words(key)
    if words == ["CODE"]:
        return True
    return _names_a_secret(words) or any(w in _QUERY_SECRET_WORDS for w in words)


# Presigned URLs: a URL signed by a cloud store carries its access key, the signed policy and
# the signature in its query. Once one family's marker key is present, the URL is presigned and
# every signing parameter of every family goes, whatever its own name and shape (a ``Policy``
# beside an ``X-Amz-Credential``, a SigV4 ``X-Amz-Date``): together they are a grant, the key
# names the account, and a URL mixing two schemes is no less signed. On a URL without a marker
# the same names are ordinary words (``?policy=strict``, ``?expires=never``, ``?sp=1``) and stay:
# alone they grant nothing, and a query value shaped like a token goes by its shape anyway.
# (markers, keys, key prefixes), all lower case; a key is compared after percent-decoding.
_AZURE_SAS = ("sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "si", "sr", "sdd", "sig", "skoid",
              "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid", "ses", "rscc", "rscd",
              "rsce", "rscl", "rsct")
PRESIGNED_QUERY = (
    # AWS Signature Version 4 and Google Cloud Storage V4: every X-Amz-* / X-Goog-* parameter.
    (("x-amz-signature", "x-amz-credential"), (), ("x-amz-",)),
    (("x-goog-signature", "x-goog-credential"), (), ("x-goog-",)),
    # AWS Signature Version 2 and Google Cloud Storage V2.
    (("awsaccesskeyid",), ("awsaccesskeyid", "signature", "expires", "x-amz-security-token"), ()),
    (("googleaccessid",), ("googleaccessid", "signature", "expires"), ()),
    # CloudFront signed URLs (canned or custom policy).
    (("key-pair-id",), ("key-pair-id", "policy", "signature", "expires"), ()),
    # Azure shared access signatures.
    (("sig",), _AZURE_SAS, ()),
)


_SIGNING_NAMES = frozenset(n for _, names, _ in PRESIGNED_QUERY for n in names)
_SIGNING_PREFIXES = tuple(p for _, _, prefixes in PRESIGNED_QUERY for p in prefixes)


def signing_query_keys(keys: List[str]) -> Set[str]:
    """Which of a URL's query ``keys`` (percent-decoded) are the parameters of a presigned URL's
    signature (``PRESIGNED_QUERY``), as given; empty for a URL that is not presigned."""
    lower = [k.lower() for k in keys]
    if not any(low in markers for low in lower for markers, _, _ in PRESIGNED_QUERY):
        return set()
    return {k for k, low in zip(keys, lower)  # noqa: B905 (3.8)
            if low in _SIGNING_NAMES or low.startswith(_SIGNING_PREFIXES)}


# A credential by its shape alone, under a query key that names no secret (``?private=``,
# ``?t=``): one word of the bearer-token alphabet (RFC 6750: letters, digits, ``-._~+/``, then
# "=" padding), TOKEN_MIN_LEN characters or more, that ``could_be_credential`` and whose runs of
# one kind (capitalised or lower-case letters, digits) are short, as in a random string: a run
# name joins words ("ModelV2Epoch10Seed42", "resnet50_imagenet_epoch90.ckpt": runs of 4 or more
# on average), a random token of base64 changes kind about every other character. Kept: hex,
# with or without dashes (a commit, a digest, a UUID: what was fetched, not who may fetch it),
# versions, paths and short values (the base64 of a short word). Measured on random tokens of
# 20-48 characters: about 1% of base62/base64 ones and 17% of lower-case base36 ones read as
# names, and about 1% of run names joined without separators from short words and numbers
# ("vLr442Data1620Run481") read as tokens; under a secret-named key (``secret_query_key``)
# every value goes whatever its shape.
TOKEN_MIN_LEN = 20
_MAX_MEAN_RUN = 3
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
_HEX_ID = re.compile(r"[0-9a-fA-F-]+")
# A run: a word in lower case or capitalised, a run of capitals (an acronym; its last capital
# starts the next word when a lower-case letter follows: "HTTPServer"), a number.
_RUNS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# Keys whose value names what was fetched (?rev=, ?id=, ?sha=, ?version=): a value there is an
# identifier, however random it looks (a Drive file id), and is not judged by its shape.
_QUERY_ID_WORDS = frozenset(("ID", "IDS", "UUID", "REV", "REVISION", "REF", "SHA", "HASH", "DIGEST",
                             "COMMIT", "VERSION", "ETAG", "CHECKSUM"))


def token_shaped(value: str) -> bool:
    """True when ``value`` is shaped like a generated token (see the rule above)."""
    if len(value) < TOKEN_MIN_LEN or not _B64TOKEN.fullmatch(value) or _HEX_ID.fullmatch(value):
        return False
    if not could_be_credential(value):
        return False
    body = re.sub(r"[^A-Za-z0-9]", "", value)
    runs = _RUNS.findall(body)
    return any(c.isdigit() for c in body) and any(c.isalpha() for c in body) \
        and len(body) <= _MAX_MEAN_RUN * len(runs)


def query_value_secret(key: str, value: str) -> bool:
    """True when a query item (key and value percent-decoded) of a URL that is not presigned
    holds a credential: its key names one (``secret_query_key``), or its value is shaped like a
    token under a key that does not name an identifier."""
    if secret_query_key(key):
        return True
    words = _name_words(key)
    return not (words and words[-1] in _QUERY_ID_WORDS) and token_shaped(value)


def canonicalize_name(name: str) -> str:
    """PEP 503 normalisation, so ``Foo_Bar`` and ``foo-bar`` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------
# What could not be read: the lock's [[unreadable]] entries. Their item names something found in
# the environment (a dist-info directory, a name as a METADATA spells it: any bytes at all), so
# it is cut down to characters inert in every output before it is stored; their error is words
# of envlock's own (an OS error's text, a rule that was broken), never the content read.
UNREADABLE_ITEM = r"^[A-Za-z0-9._+-]{1,200}$"
UNREADABLE_ERROR_MAX = 300
_NOT_ITEM = re.compile(r"[^A-Za-z0-9._+-]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def unreadable(section: str, error: str, item: Optional[str] = None) -> Dict[str, str]:
    """One [[unreadable]] entry: ``section`` could not be captured (``item`` of it, if given)."""
    entry = {"section": section,
             "error": _CONTROL.sub(" ", error).strip()[:UNREADABLE_ERROR_MAX] or "unknown error"}
    if item:
        entry["item"] = _NOT_ITEM.sub("_", item)[:200]
    return entry


# envlock's mark on the processes of one probe run (``probing/process.leftovers``): not environment.
PROBE_RUN_VAR = "ENVLOCK_PROBE_RUN"


# Set by envlock for one run, never part of an environment: the replay journal's path (a fresh
# temporary path every run) would give a capture inside a recorded run another lock, and the
# workspace it runs in is where, not what. The compile cache's three (``compilecache.SAVE_ENV``,
# ``LOADED_ENV`` and ``OWN_DIR_ENV``: a temporary path; what was loaded is ``[compile].loaded``)
# likewise, and so is the ``TORCHINDUCTOR_CACHE_DIR`` envlock set to that directory
# (``compilecache.set_by_envlock``, judged by its value in ``env.collect_env``).
ENV_NOT_RECORDED = ("ENVLOCK_RECORD", "ENVLOCK_WORKSPACE", PROBE_RUN_VAR, "ENVLOCK_COMPILE_CACHE_OUT",
                    "ENVLOCK_COMPILE_CACHE_LOADED", "ENVLOCK_COMPILE_CACHE_DIR", "ENVLOCK_TRACE",
                    "ENVLOCK_TRACE_HOOK")


# Set by a launcher for each run (torchrun, Slurm): where and which rank, a free port, a job's
# id. A run reads them, and they differ between any two runs without changing a number (the
# rank and world size are compared as ``process.rank``/``process.world_size``): a trace of
# what a run read leaves them out (``replay.reads``).
LAUNCHER_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                  "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE")
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_")


def launcher_variable(name: str) -> bool:
    """Whether a launcher sets ``name`` anew for each run (``LAUNCHER_NAMES``)."""
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES)


def without_trace_hook(value: str, hook: Optional[str] = None) -> str:
    """``PYTHONPATH`` as the user set it: without the directory of envlock's start-up hook
    (``probe/startup``, named by ``ENVLOCK_TRACE_HOOK``) that a recorded run prepends, which
    would otherwise be a difference between a traced run and any other."""
    hook = os.environ.get("ENVLOCK_TRACE_HOOK") if hook is None else hook
    if not hook:
        return value
    return os.pathsep.join(p for p in value.split(os.pathsep) if p != hook)


def rank_journal(path: str, rank: int) -> str:
    """Where rank ``rank`` (not 0) of a recorded run writes its capture: beside the journal
    ``path`` that rank 0 writes (``envlock.record``), read back when the record is made."""
    return "%s.rank%d" % (path, rank)


def env_allowed(name: str) -> bool:
    """True for the variables ``[env]`` records (see ENV_PREFIXES and ENV_NAMES)."""
    return (name.startswith(ENV_PREFIXES) or name in ENV_NAMES) and name not in ENV_NOT_RECORDED


def recorded_name(name: str) -> bool:
    """True for every variable a lock records, in ``[env]`` or in ``[determinism].env``."""
    return numerics_variable(name) or env_allowed(name)


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


# ---------------------------------------------------------------------------------------------
# Determinism knobs: every torch setting that changes numerics, by its [determinism] field name.
# ---------------------------------------------------------------------------------------------


class Knob(NamedTuple):
    """One torch setting that changes numerics.

    ``read(torch)`` and ``write(torch, value)`` may raise (a knob this torch lacks, a legacy
    TF32 getter while the two TF32 APIs disagree); callers go through ``quiet`` or catch.
    ``strict`` is what ``deterministic()`` sets it to, None for a knob it leaves alone (only
    ``apply(lock)`` writes those). ``fp32_api`` marks the knobs of the ``fp32_precision`` tree,
    which exist only where torch has it (torch >= 2.9).
    """

    name: str
    kind: type  # bool, int or str: its value's type in a lock
    read: Callable[[Any], Any]
    write: Callable[[Any, Any], None]
    strict: Any = None
    fp32_api: bool = False


def _set(path: str, attr: str) -> Callable[[Any, Any], None]:
    """A writer for ``torch.<path>.<attr> = value``."""
    def write(torch: Any, value: Any) -> None:
        obj = torch
        for part in path.split("."):
            obj = getattr(obj, part)
        setattr(obj, attr, value)
    return write


def _fp32_get(backend: str, op: str) -> Callable[[Any], Any]:
    return lambda t: t._C._get_fp32_precision_getter(backend, op)


def _fp32_set(backend: str, op: str) -> Callable[[Any, Any], None]:
    return lambda t, v: t._C._set_fp32_precision_setter(backend, op, v)


def _deterministic_utils(torch: Any) -> Any:
    import torch.utils.deterministic  # a lazily loaded submodule in some versions

    return torch.utils.deterministic


def _set_fill_uninitialized(torch: Any, value: Any) -> None:
    _deterministic_utils(torch).fill_uninitialized_memory = value


# In the order writes must happen. The algorithms switch first (one torch call sets both of
# its halves; each writer keeps the other half as it is). Then the legacy TF32 flags, because
# each legacy setter also rewrites new-API leaves (``set_float32_matmul_precision`` sets
# cuda.matmul *and* mkldnn.matmul); then the fp32_precision tree from the root down, because a
# node that reads "none" resolves to its parent. ``torch.backends.mkldnn.fp32_precision``'s
# setter writes the *generic* root in torch 2.9-2.13, so that node is written through the C
# setter; the readers are the attributes the probe has always read (the same values as the C
# getters where both exist). "ieee" rather than "none" in strict mode, because "none" defers to
# the parent node, which a library may have set to tf32 or bf16 (oneDNN uses bf16 for fp32
# matmuls on AMX CPUs when allowed).
KNOBS: Tuple[Knob, ...] = (
    Knob("deterministic_algorithms", bool, lambda t: t.are_deterministic_algorithms_enabled(),
         lambda t, v: t.use_deterministic_algorithms(
             v, warn_only=t.is_deterministic_algorithms_warn_only_enabled()), strict=True),
    Knob("deterministic_warn_only", bool, lambda t: t.is_deterministic_algorithms_warn_only_enabled(),
         lambda t, v: t.use_deterministic_algorithms(t.are_deterministic_algorithms_enabled(),
                                                     warn_only=v),
         strict=False),  # deterministic(mode="warn") sets it True
    Knob("fill_uninitialized_memory", bool,
         lambda t: _deterministic_utils(t).fill_uninitialized_memory, _set_fill_uninitialized,
         strict=True),
    Knob("cudnn_enabled", bool, lambda t: t.backends.cudnn.enabled, _set("backends.cudnn", "enabled")),
    Knob("mkldnn_enabled", bool, lambda t: t.backends.mkldnn.enabled, _set("backends.mkldnn", "enabled")),
    Knob("cudnn_deterministic", bool, lambda t: t.backends.cudnn.deterministic,
         _set("backends.cudnn", "deterministic"), strict=True),
    Knob("cudnn_benchmark", bool, lambda t: t.backends.cudnn.benchmark,
         _set("backends.cudnn", "benchmark"), strict=False),
    Knob("cuda_matmul_allow_tf32", bool, lambda t: t.backends.cuda.matmul.allow_tf32,
         _set("backends.cuda.matmul", "allow_tf32"), strict=False),
    Knob("float32_matmul_precision", str, lambda t: t.get_float32_matmul_precision(),
         lambda t, v: t.set_float32_matmul_precision(v), strict="highest"),
    Knob("cudnn_allow_tf32", bool, lambda t: t.backends.cudnn.allow_tf32,
         _set("backends.cudnn", "allow_tf32"), strict=False),
    Knob("fp32_precision", str, lambda t: t.backends.fp32_precision, _fp32_set("generic", "all"),
         strict="ieee", fp32_api=True),
    Knob("cuda_fp32_precision", str, _fp32_get("cuda", "all"), _fp32_set("cuda", "all"),
         strict="ieee", fp32_api=True),
    Knob("mkldnn_fp32_precision", str, lambda t: t.backends.mkldnn.fp32_precision,
         _fp32_set("mkldnn", "all"), strict="ieee", fp32_api=True),
    Knob("cuda_matmul_fp32_precision", str, lambda t: t.backends.cuda.matmul.fp32_precision,
         _fp32_set("cuda", "matmul"), strict="ieee", fp32_api=True),
    Knob("cudnn_conv_fp32_precision", str, lambda t: t.backends.cudnn.conv.fp32_precision,
         _fp32_set("cuda", "conv"), strict="ieee", fp32_api=True),
    Knob("cudnn_rnn_fp32_precision", str, lambda t: t.backends.cudnn.rnn.fp32_precision,
         _fp32_set("cuda", "rnn"), strict="ieee", fp32_api=True),
    # The per-backend nodes; oneDNN's matmul/conv nodes change CPU bytes (bf16 on AMX).
    Knob("mkldnn_matmul_fp32_precision", str, _fp32_get("mkldnn", "matmul"),
         _fp32_set("mkldnn", "matmul"), strict="ieee", fp32_api=True),
    Knob("mkldnn_conv_fp32_precision", str, _fp32_get("mkldnn", "conv"),
         _fp32_set("mkldnn", "conv"), strict="ieee", fp32_api=True),
    Knob("mkldnn_rnn_fp32_precision", str, _fp32_get("mkldnn", "rnn"),
         _fp32_set("mkldnn", "rnn"), strict="ieee", fp32_api=True),
    Knob("cuda_matmul_allow_fp16_reduced_precision_reduction", bool,
         lambda t: t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
         _set("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction")),
    Knob("cuda_matmul_allow_bf16_reduced_precision_reduction", bool,
         lambda t: t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
         _set("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction")),
    Knob("sdpa_flash", bool, lambda t: t.backends.cuda.flash_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_flash_sdp(v)),
    Knob("sdpa_mem_efficient", bool, lambda t: t.backends.cuda.mem_efficient_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_mem_efficient_sdp(v)),
    Knob("sdpa_math", bool, lambda t: t.backends.cuda.math_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_math_sdp(v)),
    Knob("sdpa_cudnn", bool, lambda t: t.backends.cuda.cudnn_sdp_enabled(),
         lambda t, v: t.backends.cuda.enable_cudnn_sdp(v)),
    Knob("num_threads", int, lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
    Knob("num_interop_threads", int, lambda t: t.get_num_interop_threads(),
         lambda t, v: t.set_num_interop_threads(v)),
)
KNOB_NAMES: Tuple[str, ...] = tuple(k.name for k in KNOBS)
# The two halves of torch.use_deterministic_algorithms(mode, warn_only=...).
ALGORITHMS = ("deterministic_algorithms", "deterministic_warn_only")


def knobs_in(torch: Any) -> List[Knob]:
    """The knobs this torch has, in write order: the fp32_precision tree only from torch 2.9.

    Keyed on which knobs *exist*, not which read back: a legacy TF32 getter raises while the
    two TF32 APIs disagree, and that is exactly the state whose legacy flag must be written.
    """
    tree = hasattr(getattr(torch, "_C", None), "_get_fp32_precision_getter")
    return [k for k in KNOBS if tree or not k.fp32_api]


def read_knobs(torch: Any, names: Optional[List[str]] = None) -> Dict[str, Any]:
    """The live value of every knob (or of ``names``) that reads back as a plain value."""
    out: Dict[str, Any] = {}
    for knob in KNOBS:
        if names is not None and knob.name not in names:
            continue
        value = quiet(partial(knob.read, torch))
        if isinstance(value, (bool, int, str)):
            out[knob.name] = value
    return out


# ---------------------------------------------------------------------------------------------
# Native code: which loaded libraries change numbers, and which GPUs a torch build has kernels for.
# ---------------------------------------------------------------------------------------------

# Libraries whose file decides kernels or reductions: CUDA's math libraries and runtime, NCCL,
# ROCm's counterparts, the OpenMP runtimes, MKL, OpenBLAS, BLIS and the reference BLAS/LAPACK.
# One of them loaded from another file than the lock's is drift: a cluster's module system
# putting its cuDNN on LD_LIBRARY_PATH in front of the nvidia-* wheel's is the classic divergence
# nothing else sees. The one list of them: the comparator, the probe's cache key and the naming
# of BLAS/OpenMP runtimes without threadpoolctl all read it.
# Each is the name after "lib" (a regular expression), and the (api, implementation) that
# threadpoolctl gives the library when it is a BLAS or OpenMP runtime it can ask. A name matches
# up to a character that cannot continue the word (anything but a lower-case letter):
# libcublasLt, libcudnn_ops.so.9, libgomp-a34b3233.so.1, libscipy_openblas64_-xx.so,
# libopenblas64_p-r0-xx.so; so librocksdb is no ROCm library and libompl no OpenMP runtime.
# Where one name begins another, the longer comes first (mkl_rt, then the rest of MKL); a name
# holds no group of its own (``numerics_runtime`` tells the entry by the group that matched).
_BLAS = ("blas", "openblas")
_OPENMP = ("openmp", "openmp")
NUMERICS_LIBRARIES: Tuple[Tuple[str, Optional[Tuple[str, str]]], ...] = (
    ("cudart", None), ("cudnn", None), ("cublas", None), ("cufft", None), ("curand", None),
    ("cusolver", None), ("cusparse", None), ("nccl", None), ("nvrtc", None), ("nvJitLink", None),
    ("amdhip64", None), ("MIOpen", None), ("rccl", None), ("rocblas", None), ("hipblas", None),
    ("hipblaslt", None), ("rocfft", None), ("rocrand", None), ("rocsolver", None),
    ("rocsparse", None), ("hipfft", None), ("hiprand", None), ("hipsolver", None),
    ("hipsparse", None),
    ("gomp", _OPENMP), ("iomp5", _OPENMP), ("omp", _OPENMP),
    ("mkl_rt", ("blas", "mkl")), ("mkl", None),
    # OpenBLAS's own builds add a letter for their threading: libopenblasp-r0-<hash>.<ver>.so
    # (pthreads, older numpy and scipy wheels), libopenblaso (OpenMP, Fedora).
    ("openblas[op]?", _BLAS), ("scipy_openblas", _BLAS),
    ("blis", ("blas", "blis")), ("flexiblas", ("blas", "flexiblas")),
    ("blas", None), ("cblas", None), ("lapack", None),
)
_NUMERICS_LIBRARY = "^lib(?:%s)(?![a-z])" % "|".join("(%s)" % name for name, _ in NUMERICS_LIBRARIES)


def numerics_library(name: str) -> bool:
    """True for a library (by soname or file name) whose file can change a run's numbers."""
    return re.match(_NUMERICS_LIBRARY, name) is not None


# What threadpoolctl asks of each BLAS or OpenMP runtime beyond its file: the probe records these
# fields, the comparator and a replay record's context compare them. A runtime named from its
# file alone (no threadpoolctl where the probe ran) has none of them.
RUNTIME_FIELDS = ("version", "threading_layer", "architecture", "num_threads")


def numerics_runtime(name: str) -> Optional[Tuple[str, str]]:
    """(api, implementation) as threadpoolctl names them of a BLAS or OpenMP runtime's soname or
    file name (``libmkl_rt.so.2``: ("blas", "mkl")), else None."""
    m = re.match(_NUMERICS_LIBRARY, name)
    return NUMERICS_LIBRARIES[m.lastindex - 1][1] if m is not None and m.lastindex else None


# What a GPU gets from a CUDA build of torch (``torch.cuda.get_arch_list()``): "native" when a
# cubin for its architecture is there (sm_XY runs on compute capability X.Z for Z >= Y; an
# architecture-specific sm_XYa only on X.Y itself), "ptx" when only PTX for an older or equal
# architecture is (compute_XY: the driver JIT-compiles it at first use, with its own compiler:
# other code, possibly other bits, and minutes of start-up), "none" when neither is: torch's
# kernels cannot run there at all.
KERNELS = ("native", "ptx", "none")
_ARCH_RE = r"(sm|compute)_(\d+?)(\d)([af]?)"


def parse_arch(arch: str) -> Optional[Tuple[str, int, int, str]]:
    """("sm" or "compute", major, minor, suffix) of ``sm_86``, ``compute_90``, ``sm_90a``."""
    m = re.fullmatch(_ARCH_RE, arch)
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


def kernels_for(capability: str, arch_list: List[str]) -> Optional[str]:
    """"native", "ptx" or "none" for a GPU of ``capability`` ("8.6") and a build's arch list;
    None when either is not CUDA's (a ROCm build's gfx names, an unreadable capability)."""
    m = re.fullmatch(r"(\d+)\.(\d+)", capability or "")
    archs = [a for a in (parse_arch(x) for x in arch_list) if a is not None]
    if not m or not archs:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    for kind, a_major, a_minor, suffix in archs:
        if kind == "sm" and a_major == major and (a_minor == minor if suffix == "a" else a_minor <= minor):
            return "native"
    for kind, a_major, a_minor, _ in archs:
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return "ptx"
    return "none"


# ---------------------------------------------------------------------------------------------
# torch.compile: the settings that change numerics or kernel choice, as (config, attribute path).
# Read only from a config module the process already imported: importing torch._inductor takes
# seconds, more than a capture may cost, and a fresh interpreter's values follow from torch's
# version and the TORCHINDUCTOR_*/TORCHDYNAMO_* variables, which are recorded anyway.
# ---------------------------------------------------------------------------------------------

COMPILE_MODULES = {"inductor": "torch._inductor.config", "dynamo": "torch._dynamo.config"}
COMPILE_SETTINGS = (
    ("inductor", "max_autotune"), ("inductor", "max_autotune_pointwise"),
    ("inductor", "max_autotune_gemm"), ("inductor", "max_autotune_gemm_backends"),
    ("inductor", "max_autotune_gemm_search_space"), ("inductor", "autotune_fallback_to_aten"),
    ("inductor", "coordinate_descent_tuning"), ("inductor", "fallback_random"),
    ("inductor", "deterministic"), ("inductor", "emulate_precision_casts"),
    ("inductor", "use_fast_math"), ("inductor", "freezing"), ("inductor", "epilogue_fusion"),
    ("inductor", "benchmark_fusion"), ("inductor", "split_reductions"),
    ("inductor", "online_softmax"), ("inductor", "shape_padding"),
    ("inductor", "comprehensive_padding"), ("inductor", "layout_optimization"),
    ("inductor", "cpp_wrapper"),
    ("inductor", "force_disable_caches"), ("inductor", "fx_graph_cache"),
    ("inductor", "autotune_local_cache"), ("inductor", "cpp.simdlen"),
    ("inductor", "cpp.threads"), ("inductor", "cpp.dynamic_threads"),
    ("inductor", "cpp.fallback_scatter_reduce_sum"),
    ("inductor", "cpp.enable_floating_point_contract_flag"),
    ("inductor", "cpp.enable_unsafe_math_opt_flag"), ("inductor", "triton.cudagraphs"),
    ("inductor", "triton.persistent_reductions"), ("inductor", "triton.cooperative_reductions"),
    ("inductor", "triton.multi_kernel"), ("inductor", "triton.divisible_by_16"),
    ("dynamo", "assume_static_by_default"), ("dynamo", "automatic_dynamic_shapes"),
    ("dynamo", "capture_scalar_outputs"), ("dynamo", "specialize_float"),
    ("dynamo", "recompile_limit"), ("dynamo", "optimize_ddp"),
)
