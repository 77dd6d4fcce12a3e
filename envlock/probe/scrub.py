"""Scrubbing: what of a string may enter a lock.

URLs lose their credentials wherever they appear, token-shaped words go, and the values of
the variables that hold a secret (``rules.looks_secret``) are replaced wherever they appear in
the probe's document. The functions only ever remove: a string that needs nothing removed comes
back unchanged, which is how the model tells a clean value. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .rules import MIN_SECRET_LEN, REDACTED, looks_secret

# ---------------------------------------------------------------------------------------------
# URL hygiene: applied to every URL that reaches the document, wherever it came from.
# A URL keeps its scheme, host, path and harmless query parameters; it loses its userinfo
# (except the service user of an ssh remote, "git@"), secret-looking query values, every
# fragment other than pip's own (#egg=, #subdirectory=, #sha256=...), and the token segment of
# index hosts known to carry one in the path. The functions only ever remove: a string that
# needs nothing removed comes back unchanged, which is how the model tells a clean value.
# ---------------------------------------------------------------------------------------------

# The patterns below are strings that ``re`` compiles (and keeps) on first use: most documents
# hold few URLs and no scp remote, and compiling every pattern at import cost every run.
# Only the token shapes, which every string is checked against, are compiled here.
# Starts only where a run of scheme characters starts: otherwise every position of a long run
# without "://" would be tried, quadratic in its length.
_URL = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+"
# scp-style remotes (user[:password]@host:path) in free text: a word (between blanks and
# quotes) holding "@host:" after a userinfo without "/", the userinfo running from the word's
# start, or from after a leading "key=" / "(", to the *last* such "@", so a password holding
# "@", ";" or "=" goes with it. Found by hand, in time linear in the text (a regex with a greedy
# userinfo backtracks quadratically on "=a@=a@...").
_SCP_HINT = r"@[A-Za-z0-9][A-Za-z0-9.-]*:\S"
_SCP_WORD = r"(?<![^\s\"'<>`])[^\s\"'<>`]*@[^\s\"'<>`]*"
_SCP_KEEP = r"[^:@/=(,;]*[=(,;]"
_SCP_HOST = r"[A-Za-z0-9][A-Za-z0-9.-]*:(?=\S)"
_SCHEME = r"([A-Za-z][A-Za-z0-9+.-]*)://"
# Query keys whose value is a credential (GitLab private_token, S3 X-Amz-Signature, SAS sig).
_SECRET_QUERY = (
    r"(?i)(token|secret|passw|pass$|pwd|key|sig|auth|credential|session|cookie|jwt|otp|ticket|code$)")
# Fragments pip gives meaning to; every other fragment is dropped (#token=..., #access_token=).
_SAFE_FRAGMENT_KEYS = ("egg", "subdirectory", "sha1", "sha224", "sha256", "sha384", "sha512", "md5")
# Users that name a service account, not a person or a token (git@github.com:org/repo.git).
_SERVICE_USERS = ("git", "hg")
# Index hosts that carry a token as a path segment: (host pattern, path pattern); the group is
# the token. Gemfury, Anaconda's channel host and conda's own rule for
# any channel (/t/TOKEN/), packagecloud /priv/TOKEN/, Cloudsmith entitlement tokens
# (dl.cloudsmith.io/TOKEN/...; "public" and "basic" are not tokens), Slack and Discord
# webhooks, Telegram bots.
_PATH_TOKENS = (
    # Gemfury: /TOKEN/ACCOUNT/ or /ACCOUNT/file; a segment before another directory, or one
    # with capitals (tokens are mixed case, account names are lowercase), is the token.
    (r"(?i)(^|\.)fury\.io$",
     r"^/((?=[^/]*[A-Z])[^/]+(?=/)|[^/]+(?=/[^/]+/))"),
    (r".", r"(?:^|/)t/([^/]+)"),
    (r"(?i)(^|\.)packagecloud\.io$", r"^/priv/([^/]+)"),
    (r"(?i)^dl\.cloudsmith\.io$", r"^/(?!public/|basic/)([^/]+)/"),
    (r"(?i)^hooks\.slack\.com$", r"^/services/(.+)"),
    (r"(?i)(^|\.)discord(app)?\.com$", r"^/api/webhooks/(.+)"),
    (r"(?i)^api\.telegram\.org$", r"^/(?:file/)?bot([^/]+)"),
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
        elif value and value != REDACTED and re.search(_SECRET_QUERY, _unquote(key)):
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
        if not re.search(host_re, host):
            continue
        m = re.search(path_re, path)
        if m and m.group(1) != REDACTED:
            path = path[:m.start(1)] + REDACTED + path[m.end(1):]
    return path


def strip_url(url: str) -> str:
    """``url`` without credentials (see the rules above); unchanged when it has none."""
    m = re.match(_SCHEME, url)
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
    keep = re.match(_SCP_KEEP, word)
    start = keep.end() if keep else 0
    slash = word.find("/", start)
    at = word.rfind("@", start, slash if slash >= 0 else len(word))
    while at > start:
        if re.compile(_SCP_HOST).match(word, at + 1) is not None:
            return word if word[start:at] in _SERVICE_USERS else word[:start] + word[at + 1:]
        at = word.rfind("@", start, at)
    return word


def _strip_scp(text: str) -> str:
    if "@" not in text or re.search(_SCP_HINT, text) is None:
        return text
    return re.sub(_SCP_WORD, lambda m: _scp_word(m.group(0)), text)


def scrub_text(text: str) -> str:
    """``text`` with every embedded URL and scp remote stripped and token-shaped words removed."""
    if "://" in text:
        text = re.sub(_URL, lambda m: strip_url(m.group(0)), text)
    if "@" in text:
        text = _strip_scp(text)
    return _TOKEN_SHAPES_RE.sub(REDACTED, text)


def env_value(name: str, value: str) -> str:
    """What a lock may keep of one variable: nothing of a secret, a URL without credentials."""
    return REDACTED if looks_secret(name) else scrub_text(value)


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
    for m in re.finditer(_URL, value):
        scheme = re.match(_SCHEME, m.group(0))
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
    return _scrub_tree(doc, secrets, _Precheck(doc, secrets))


class _Precheck:
    """Which strings of one document ``scrub_string`` can change, decided for all at once.

    ``scrub_string`` changes a string only if it holds "://" or "@" (URLs, scp remotes), a
    token shape, or a secret value. The last two are searched once in all the document's
    strings joined by newlines: a token shape matched inside one string matches there too (no
    part of the pattern matches a newline, and a newline is a non-word character like a
    string's edge), and a value inside one string is inside the joined text. So when the
    joined text holds no token shape, a string without "://", "@" and the secrets found in the
    joined text comes back from ``scrub_string`` unchanged, and is not scrubbed one by one.
    """

    def __init__(self, doc: Any, secrets: List[str]) -> None:
        parts: List[str] = []
        _strings(doc, parts)
        joined = "\n".join(parts)
        self.tokens = _TOKEN_SHAPES_RE.search(joined) is not None
        self.present = [s for s in secrets if s in joined]

    def clean(self, text: str, secrets: bool = True) -> bool:
        """True when ``scrub_string(text, ...)`` would return ``text`` as it is."""
        if self.tokens or "://" in text or "@" in text:
            return False
        return not (secrets and any(s in text for s in self.present))


def _strings(doc: Any, out: List[str]) -> None:
    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(k, str):
                out.append(k)
            _strings(v, out)
    elif isinstance(doc, list):
        for v in doc:
            _strings(v, out)
    elif isinstance(doc, str):
        out.append(doc)


def _scrub_tree(doc: Any, secrets: List[str], check: _Precheck) -> Any:
    if isinstance(doc, dict):
        return {_scrub_leaf(k, secrets, check) if isinstance(k, str) else k:
                _scrub_tree(v, secrets, check) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_scrub_tree(v, secrets, check) for v in doc]
    if isinstance(doc, str):
        return _scrub_leaf(doc, secrets, check)
    return doc


def _scrub_leaf(text: str, secrets: List[str], check: _Precheck) -> str:
    return text if check.clean(text, bool(secrets)) else scrub_string(text, secrets)


# What is installed is named by package metadata, never by the environment: a secret value that
# happens to be a word (POSTGRES_PASSWORD=requests, a DATABASE_URL password "postgres") must not
# rename a package, which made the whole capture fail as an invalid lock.
_IDENTITY_KEYS = ("name", "version", "active_version")


def scrub_lock_document(doc: Dict[str, Any], secrets: List[str]) -> Dict[str, Any]:
    """``scrub_document`` for a probe's whole output, package names and versions exempt from
    the secret values (URLs and token shapes are still stripped from them)."""
    check = _Precheck(doc, secrets)
    os_pkgs = doc.get("os_packages")
    pins = os_pkgs.get("packages") if isinstance(os_pkgs, dict) else None
    rest = doc
    if isinstance(os_pkgs, dict) and isinstance(pins, list):
        # Scrubbed below without the secret values; not twice (a desktop has ~2,000 pins).
        rest = dict(doc, os_packages=dict(os_pkgs, packages=[]))
    out: Dict[str, Any] = _scrub_tree(rest, secrets, check)
    for table in ("packages", "duplicates"):
        for i, row in enumerate(doc.get(table) or []):
            for k in _IDENTITY_KEYS:
                if isinstance(row, dict) and isinstance(row.get(k), str):
                    out[table][i][k] = _scrub_leaf(row[k], [], check)
    if isinstance(pins, list):
        out["os_packages"]["packages"] = _scrub_tree(pins, [], check)
    return out
