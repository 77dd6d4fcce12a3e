"""Strict checks for every value that reaches a Dockerfile, a requirements file or a command.

A lock is data from somewhere else (a paper's artifact, a colleague's branch). The model already
limits character sets, but the model is about *storing* values faithfully; restore is about
*executing* them, so it re-checks each value against the grammar of the place it goes to and
refuses anything else with ``UnsafeValue`` (exit 2). Checks are allowlists: a value either
matches a grammar that cannot express a command, or the restore stops.

Even valid values never meet a shell: ``RUN`` lines are rendered in exec (JSON) form and the
packages go to pip through requirement files, so these checks are a second wall, not the only one.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from envlock.errors import EnvlockError, PlainHttp, UnsafeValue, UsageError
from envlock.probe import imageref
from envlock.probe.scrub import scrub_index_text, strip_index_url, strip_url

_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,126}[a-z0-9])?$")
_VERSION_CHARS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}$")
# The algorithms pip's ``--hash`` takes (pip's STRONG_HASHES), with their hex lengths: the one
# rule for what goes into a requirement file; envlock checks any other (md5) itself.
PIP_HASH_ALGORITHMS = {"sha256": 64, "sha384": 96, "sha512": 128}
_HASH_RE = re.compile(r"^([a-z0-9]+)[:=]([0-9a-f]+)$")
_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# Printable ASCII without quotes, backslash, dollar and backtick: inert inside a double-quoted
# Dockerfile ENV value (no escapes, no variable expansion) and inside any shell quoting.
_ENV_VALUE_RE = re.compile(r"^[A-Za-z0-9 _.,:;=/+@%*#!?&()\[\]{}<>|^~-]{0,4096}$")
_PATH_RE = re.compile(r"^(/[A-Za-z0-9._+-]+)+/?$")
# URL characters without anything a shell, pip's requirement-file parser (${VAR} expansion,
# options after whitespace) or a Dockerfile would interpret.
_URL_CHARS_RE = re.compile(r"^[A-Za-z0-9._~:/?#@!&+,=%-]{1,2048}$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")

ARCHIVE_SCHEMES = frozenset({"https", "http"})
VCS_SCHEMES = {"git": frozenset({"https", "http", "ssh"}), "hg": frozenset({"https", "http", "ssh"})}
FORBIDDEN_PATH_PREFIXES = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr/bin",
                           "/usr/sbin", "/usr/lib", "/boot", "/run")


def _refuse(what: str, value: object, why: str) -> EnvlockError:
    # A refused value is shown without what made it refused when that is a credential
    # ("--index-url 'https://u:<redacted>...': carries credentials" must not print the password).
    shown = repr(scrub_index_text(value) if isinstance(value, str) else value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    if what.startswith("--"):
        # The user typed it: a usage error about that option, not a verdict on the lock.
        return UsageError(f"{what} {shown} {why}" if why.startswith("is ") else f"{what} {shown}: {why}")
    return UnsafeValue(f"refusing {what} {shown}: {why}",
                       hint="the lock was edited or crafted; restore only renders provably inert values")


MAX_INTERPRETER = 1024


def interpreter(value: str, *, what: str = "--python") -> str:
    """An interpreter inside an image: an absolute path or a command name on the image's PATH.

    It is an argv element (exec-form RUN, the container's command), never shell text, so any
    path is acceptable as long as it is inert: printable, no NUL or control characters, a sane
    length, and not something a program would read as an option.
    """
    if not isinstance(value, str) or not value or len(value) > MAX_INTERPRETER:
        raise _refuse(what, value, f"must be a path or command of 1 to {MAX_INTERPRETER} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _refuse(what, value, "contains a control character (NUL, newline, tab, ...)")
    if value.startswith("-"):
        raise _refuse(what, value, "starts with '-'")
    if "/" in value and not value.startswith("/"):
        raise _refuse(what, value, "must be an absolute path inside the image or a command name")
    return value


def dist_name(name: str) -> str:
    """A PEP 503 normalised distribution name, exactly (``Foo_Bar`` is refused, not fixed)."""
    # packaging only where a package is validated: ``run`` validates variables and image
    # references through this module on every start, and needs no package rule.
    from packaging.utils import canonicalize_name

    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or canonicalize_name(name) != name:
        raise _refuse("package name", name, "not a normalised (PEP 503) distribution name")
    return name


def version(value: str, *, name: str = "package") -> str:
    """A PEP 440 version (local labels such as ``+cu121`` kept), returned as written."""
    from packaging.version import InvalidVersion, Version

    if not isinstance(value, str) or not _VERSION_CHARS_RE.fullmatch(value):
        raise _refuse(f"version of {name}", value, "not a PEP 440 version")
    try:
        Version(value)
    except InvalidVersion:
        raise _refuse(f"version of {name}", value, "not a PEP 440 version") from None
    return value


def local_label(value: str) -> str | None:
    """The local version label (``cu121`` of ``2.4.1+cu121``), or None."""
    from packaging.version import Version

    local = Version(value).local
    return str(local) if local else None


def digest(value: str) -> str:
    if not isinstance(value, str) or not imageref.is_image_id(value):
        raise _refuse("image digest", value, "not sha256:<64 hex digits>")
    return value


def hash_algorithm(value: str) -> str:
    """The algorithm of an ``algo:hex`` or ``algo=hex`` hash (``md5`` of ``md5=...``)."""
    return re.split(r"[=:]", value, maxsplit=1)[0]


def pip_checks(value: str) -> bool:
    """True when pip's ``--hash`` can check this hash; others are envlock's to check."""
    return hash_algorithm(value) in PIP_HASH_ALGORITHMS


def package_hash(value: str, *, name: str = "package") -> str:
    """A hash in pip's ``--hash`` spelling (``sha256:<hex>``); ``sha256=<hex>`` is accepted."""
    m = _HASH_RE.fullmatch(value) if isinstance(value, str) else None
    if not m or len(m.group(2)) != PIP_HASH_ALGORITHMS.get(m.group(1)):
        raise _refuse(f"hash of {name}", value, "not sha256/sha384/sha512 with the right length")
    return f"{m.group(1)}:{m.group(2)}"


def _parsed_ref(value: str, what: str = "image reference") -> imageref.ImageRef:
    try:
        return imageref.parse(value)
    except imageref.InvalidReference as exc:
        raise _refuse(what, value, exc.reason) from None


def image_ref(value: str, *, what: str = "image reference") -> str:
    """``[domain/]repo[:tag][@sha256:...]`` per Docker's reference grammar, or a bare image id."""
    _parsed_ref(value, what)
    return value


def split_ref(value: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of a validated reference; an image id gives ("", None, id)."""
    ref = _parsed_ref(value)
    return ref.repo, ref.tag, ref.digest


def is_pinned(ref: str) -> bool:
    """True when ``ref`` names immutable content: ``repo@sha256:...`` or an image id."""
    return _parsed_ref(ref).pinned


def env_name(name: str) -> str:
    if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
        raise _refuse("environment variable name", name, "not [A-Z_][A-Z0-9_]*")
    return name


def env_value(value: str, *, name: str = "variable") -> str:
    if not isinstance(value, str) or not _ENV_VALUE_RE.fullmatch(value):
        raise _refuse(f"value of {name}", value,
                      "contains a quote, backslash, $, backtick, newline or non-ASCII character")
    return value


def abs_path(value: str, *, what: str = "path") -> str:
    """An absolute POSIX path of plain segments (no ``..``, no spaces), outside system dirs."""
    if not isinstance(value, str) or not _PATH_RE.fullmatch(value) or len(value) > 1024:
        raise _refuse(what, value, "not an absolute path of [A-Za-z0-9._+-] segments")
    parts = value.rstrip("/").split("/")
    if any(p in (".", "..") for p in parts):
        raise _refuse(what, value, "contains . or .. segments")
    clean = value.rstrip("/") or "/"
    if clean == "/" or any(clean == p or clean.startswith(p + "/") for p in FORBIDDEN_PATH_PREFIXES):
        raise _refuse(what, value, "is a system directory")
    return clean


def url(value: str, *, schemes: frozenset[str] = ARCHIVE_SCHEMES, what: str = "URL",
        allow_http: bool = False, index: bool = False) -> str:
    """A URL with an allowed scheme, a host, no credentials and only inert characters.

    Plain ``http`` needs ``allow_http``. An ``ssh`` URL keeps its user name (``git@host``): it
    names the account, not a secret, and without it the clone logs in as the wrong user.
    ``index``: a package index's URL, which also may not carry a token-shaped path segment
    (``https://host/<TOKEN>/acme/simple``, the capture rule for index variables).
    """
    if not isinstance(value, str) or not _URL_CHARS_RE.fullmatch(value):
        raise _refuse(what, value, "contains characters that are not allowed in a restorable URL")
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise _refuse(what, value, f"scheme must be one of {', '.join(sorted(schemes))}")
    if parts.scheme == "http" and not allow_http:
        raise PlainHttp(f"refusing {what} {scrub_index_text(value)!r}: plain http can be tampered with in transit",
                        hint="use https, or pass --allow-http to accept the risk")
    if not parts.hostname:
        raise _refuse(what, value, "has no host")
    # The capture rule, not a stricter copy: ssh's service user (git@host) is no credential.
    if (strip_index_url(value) if index else strip_url(value)) != value:
        raise _refuse(what, value, "carries credentials")
    return value


_OS_SPEC_RE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9+._-]{0,127}:[a-z0-9][a-z0-9_-]{0,31}=[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}$")


def os_package(spec: str) -> str:
    """An OS package pin ``name:arch=version``; every character is inert in an argv."""
    if not isinstance(spec, str) or not _OS_SPEC_RE.fullmatch(spec):
        raise _refuse("OS package", spec, "not name:arch=version")
    return spec


def vcs_commit(value: str, *, vcs: str) -> str:
    """A full commit id: a branch or tag name could move, a hash cannot."""
    lengths = {"git": (40, 64), "hg": (40,)}
    if not isinstance(value, str) or not _HEX_RE.fullmatch(value) or len(value) not in lengths.get(vcs, ()):
        raise _refuse(f"{vcs} commit", value, "not a full commit hash")
    return value
