"""Scrubbing: what of a string may enter a lock.

URLs lose their credentials wherever they appear, token-shaped words, private key blocks and
Basic credentials go, and the values of the variables that hold a secret
(``rules.looks_secret``) are replaced wherever they appear in the probe's document, raw,
percent-encoded or in base64. The functions only ever remove: a string that needs nothing
removed comes back unchanged, which is how the model tells a clean value. Stdlib only,
Python >= 3.8.

Which values are replaced wherever they appear (``secret_values``): only those that could be a
credential by their length and character mix (``rules.could_be_credential``: 8 characters or
more, and a symbol, a word mixing letters and digits, or a word of 16 characters or more). A
plain word or a slug (``MY_API_KEY=experiments``) stays elsewhere: replacing it rewrote the
project directory in every path of the lock. Where a path does lose a component to a secret
value, the lock says so in ``[probe].errors`` (``paths``): it no longer names a real location.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from .rules import (
    INDEX_VARIABLES,
    MIN_SECRET_LEN,
    REDACTED,
    could_be_credential,
    looks_secret,
    query_value_secret,
    signing_query_keys,
)

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
# without "://" would be tried, quadratic in its length. Public: every place that finds URLs in
# free text (an error's reason: ``export.redaction``) finds the same ones the lock is scrubbed of.
URL_PATTERN = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+"
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
# Which query items hold a credential is ``rules.query_value_secret`` (whole words of the key:
# ?token=, ?X-Amz-Signature=, ?sig=, but not ?author= or ?keyword=; and a value shaped like a
# token under any key but an identifier's), and which are a presigned URL's signature,
# ``rules.signing_query_keys``.
# Fragments pip gives meaning to; every other fragment is dropped (#token=..., #access_token=).
_SAFE_FRAGMENT_KEYS = ("egg", "subdirectory", "sha1", "sha224", "sha256", "sha384", "sha512", "md5")
# Users that name a service account, not a person or a token (git@github.com:org/repo.git).
_SERVICE_USERS = ("git", "hg")
# Index hosts that carry a token as a path segment: (host pattern, path pattern); the group is
# the token. Gemfury, conda's /t/TOKEN/ (any segment on a host named for conda; elsewhere only
# a segment with a digit, 8 characters or more, followed by a channel name: a forum's
# /t/<topic-slug>/<number> is no token), packagecloud /priv/TOKEN/, Cloudsmith entitlement
# tokens (dl.cloudsmith.io/TOKEN/...; "public" and "basic" are not tokens), Slack and Discord
# webhooks, Telegram bots.
_PATH_TOKENS = (
    # Gemfury: /TOKEN/ACCOUNT/ or /ACCOUNT/file; a segment before another directory, or one
    # with capitals (tokens are mixed case, account names are lowercase), is the token.
    (r"(?i)(^|\.)fury\.io$",
     r"^/((?=[^/]*[A-Z])[^/]+(?=/)|[^/]+(?=/[^/]+/))"),
    (r"(?i)conda", r"(?:^|/)t/([^/]+)"),
    (r".", r"(?:^|/)t/((?=[^/]*[0-9])[^/]{8,})(?=/(?![0-9]+(?:/|$))[^/])"),
    (r"(?i)(^|\.)packagecloud\.io$", r"^/priv/([^/]+)"),
    (r"(?i)^dl\.cloudsmith\.io$", r"^/(?!public/|basic/)([^/]+)/"),
    (r"(?i)^hooks\.slack\.com$", r"^/services/(.+)"),
    (r"(?i)(^|\.)discord(app)?\.com$", r"^/api/webhooks/(.+)"),
    (r"(?i)^api\.telegram\.org$", r"^/(?:file/)?bot([^/]+)"),
)
# Credentials recognisable by their own shape, wherever they appear in text: each provider's
# published prefix and alphabet, with a length floor below the real one, so a word that merely
# starts the same way (a run directory "sk-learn-baseline-2024", "pk_live_demo", "AIzawesome")
# is no token. Where the alphabet holds "-" or "_", the body must also hold a capital or a run of
# 16 lowercase letters and digits (a hex part): a slug of lowercase words and numbers
# ("dckr_pat_rotation-2024-notes", "xoxb-eval-loss-amp") has neither, and a random body of 20
# such characters lacks both once in 30,000 draws. Provider by provider:


def _body(alphabet: str, length: str) -> str:
    return rf"(?={alphabet}*(?:[A-Z]|[a-z0-9]{{16}})){alphabet}{{{length}}}"


_TOKEN_SHAPES = (
    r"gh[pousr]_[A-Za-z0-9]{20,}", r"github_pat_" + _body("[A-Za-z0-9_]", "20,"),  # GitHub
    r"gl(?:pat|dt|rt|ptt|ft|soat|oas|cbt|imt|agent)-" + _body("[A-Za-z0-9_-]", "20,"),  # GitLab
    r"hf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"xox[abeprs]-" + _body("[A-Za-z0-9-]", "10,"), r"xapp-[0-9]-" + _body("[A-Za-z0-9-]", "20,"),  # Slack
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key id
    # OpenAI (sk-proj-, sk-svcacct-, sk-admin-, and the older sk- + one run of 32+ letters and
    # digits), Anthropic (sk-ant-api03-...), OpenRouter (sk-or-v1-<hex>).
    r"sk-(?:proj|svcacct|admin|None)-" + _body("[A-Za-z0-9_-]", "20,"),
    r"sk-ant-[a-z]+[0-9]{2}-" + _body("[A-Za-z0-9_-]", "20,"),
    r"sk-or-v1-[0-9a-f]{32,}", r"sk-(?=[A-Za-z]*[0-9])[A-Za-z0-9]{32,}(?![A-Za-z0-9_-])",
    r"pypi-AgE[A-Za-z0-9_-]{40,}",  # PyPI API tokens are macaroons: "AgE" is their first byte
    r"npm_[A-Za-z0-9]{36}",  # npm
    # A JSON Web Token: base64url of a JSON header ('{"' is "eyJ"), a payload and a signature.
    r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*",
    r"AIza" + _body("[0-9A-Za-z_-]", "35"),  # Google API key
    r"ya29\." + _body("[0-9A-Za-z_-]", "20,"),  # Google OAuth access token
    r"[rs]k_(?:live|test)_[0-9A-Za-z]{20,}",  # Stripe secret and restricted keys (pk_ is public)
    r"dckr_(?:pat|oat)_" + _body("[A-Za-z0-9_-]", "20,"),  # Docker Hub access tokens
    r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{30,}",  # SendGrid
    r"do[opr]_v1_[0-9a-f]{64}",  # DigitalOcean
    r"dapi[0-9a-f]{32}(?:-[0-9]+)?",  # Databricks
    r"r8_[A-Za-z0-9]{30,}",  # Replicate
    r"gsk_[A-Za-z0-9]{40,}",  # Groq
    r"glsa_[A-Za-z0-9]{32}_[0-9a-fA-F]{8}",  # Grafana service account
    r"shp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}",  # Shopify
    r"lin_api_[A-Za-z0-9]{40}",  # Linear
    r"PMAK-[0-9a-f]{24}-[0-9a-f]{34}",  # Postman
)
_TOKEN_SHAPES_RE = re.compile(r"\b(?:" + "|".join(_TOKEN_SHAPES) + ")")


def _strip_query(query: str) -> str:
    """A query without its credentials: the values of secret keys and token-shaped values
    (``rules.query_value_secret``), and every signature parameter of a presigned URL
    (``rules.signing_query_keys``)."""
    items = [item.partition("=") for item in query.split("&")]
    signing = signing_query_keys([_unquote(key) for key, eq, _ in items if eq])
    out = []
    for key, eq, value in items:
        if not eq:
            # A bare item (?TOKEN) has no name to judge it by: it goes unless empty.
            out.append(REDACTED if key and key != REDACTED else key)
        elif value and value != REDACTED and (_unquote(key) in signing
                                              or query_value_secret(_unquote(key), _unquote(value))):
            out.append(key + "=" + REDACTED)
        else:
            out.append(key + eq + value)
    return "&".join(out)


def _path_params(path: str) -> str:
    """Path parameters (``/simple;token=...``, ``;jsessionid=...``) judged as query items are."""
    if ";" not in path:
        return path

    def one(m: "re.Match[str]") -> str:
        key, value = m.group(1), m.group(2)
        if value and value != REDACTED and query_value_secret(_unquote(key), _unquote(value)):
            return ";" + key + "=" + REDACTED
        return m.group(0)

    return re.sub(r";([^;/=]*)=([^;/]*)", one, path)


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
    path = _path_params(_path_tokens(host, path))
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


# A private key is a secret wherever it appears, whatever the variable or note holding it is
# called (CUDA_MPS_CLIENT_CERT): the block from its BEGIN line to its END line goes, or to the
# end of the string when the END line is missing (a key cut short is still most of a key). The
# words may be joined by spaces, "+" or "%20" (a key in a URL or a form). A certificate or a
# public key is no secret and stays. The dashes are counted (PEM has 5, SSH2 4): an unbounded
# run would make the search quadratic in a long run of dashes.
_KEY_SEP = r"(?:[ +]|%20)"
_KEY_WORDS = rf"(?:[A-Z0-9]+{_KEY_SEP})*?PRIVATE{_KEY_SEP}KEY(?:{_KEY_SEP}BLOCK)?"
_KEY_BLOCK = (rf"(?s)-{{3,5}} ?BEGIN{_KEY_SEP}{_KEY_WORDS} ?-{{3,5}}"
              rf"(?:.*?-{{3,5}} ?END{_KEY_SEP}{_KEY_WORDS} ?-{{3,5}}|.*)")
# HTTP Basic credentials (``Authorization: Basic dXNlcjpwYXNz``): base64 of "user:password",
# a credential whoever wrote it. Only what decodes to printable text holding a ":" goes, so
# "Basic training" or "basic dGVzdA==" ("test") stay. The scheme's name is matched case by
# case and its word boundary checked by ``_basic``: a case-blind pattern, or one that starts
# with a look-behind, is searched several times slower, in every document. The base64 is
# bounded (a user:password is far shorter): "Basic+Basic+..." is one long run of base64
# characters, which every "Basic" in it would otherwise read to its end.
_BASIC = r"[Bb][Aa][Ss][Ii][Cc](?:\s+|%20|\+)([A-Za-z0-9+/]{4,512}={0,2})(?![A-Za-z0-9+/=])"


def _user_password(b64: str) -> bool:
    import base64
    import binascii

    try:
        text = base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return False
    return ":" in text and text.isprintable()


def _basic(m: "re.Match[str]") -> str:
    before = m.string[m.start() - 1:m.start()]
    if (before and (before.isalnum() or before == "_")) or not _user_password(m.group(1)):
        return m.group(0)
    return m.group(0)[:m.start(1) - m.start(0)] + REDACTED


def _shaped(text: str) -> bool:
    """True when ``scrub_text`` may remove something from ``text`` that holds no URL or scp
    remote: a token shape, a private key block or Basic credentials (never a false "no")."""
    return (_TOKEN_SHAPES_RE.search(text) is not None or _key_block(text)
            or re.search(_BASIC, text) is not None)


def _key_block(text: str) -> bool:
    return "PRIVATE" in text and re.search(_KEY_BLOCK, text) is not None


def scrub_text(text: str) -> str:
    """``text`` with private key blocks, Basic credentials and token-shaped words removed, and
    every embedded URL and scp remote stripped."""
    if _key_block(text):
        text = re.sub(_KEY_BLOCK, REDACTED, text)
    if "://" in text:
        text = re.sub(URL_PATTERN, lambda m: strip_url(m.group(0)), text)
    if "@" in text:
        text = _strip_scp(text)
    text = re.sub(_BASIC, _basic, text)
    return _TOKEN_SHAPES_RE.sub(REDACTED, text)


# A path segment of an index URL that is a token, not a name: 16 characters or more of a
# token alphabet, letters and digits, and either both cases or one unbroken run of 16 letters
# and digits. Index paths are a few words (/acme/simple, /api/pypi/pypi-remote-2024/simple,
# /projects/12345/packages/pypi); a GUID's runs are 12 long at most.
_INDEX_SEGMENT = r"(?<=/)[A-Za-z0-9_-]{16,}(?=/|$)"


def _token_segment(segment: str) -> bool:
    if not (re.search(r"[0-9]", segment) and re.search(r"[A-Za-z]", segment)):
        return False
    if re.search(r"[a-z]", segment) and re.search(r"[A-Z]", segment):
        return True
    return any(re.search(r"[0-9]", run) and re.search(r"[A-Za-z]", run)
               for run in re.findall(r"[A-Za-z0-9]{16,}", segment))


def strip_index_url(url: str) -> str:
    """``strip_url`` for the URL of a package index, which also loses every path segment shaped
    like a token (``http://127.0.0.1:8080/<TOKEN>/acme/simple``), on any host.

    Only for index URLs: a file's URL has content hashes in its path, which are no secret."""
    url = strip_url(url)
    m = re.match(r"(?i)https?://[^/?#]*", url)
    if not m:
        return url
    cut = m.end() + len(re.split(r"[?#]", url[m.end():], maxsplit=1)[0])
    path = re.sub(_INDEX_SEGMENT, lambda s: REDACTED if _token_segment(s.group(0)) else s.group(0),
                  url[m.end():cut])
    return url[:m.end()] + path + url[cut:]


def scrub_index_text(text: str) -> str:
    """``scrub_text`` for a value that holds index URLs (``PIP_EXTRA_INDEX_URL="a b"``)."""
    if "://" in text:
        text = re.sub(URL_PATTERN, lambda m: strip_index_url(m.group(0)), text)
    return scrub_text(text)


def env_value(name: str, value: str) -> str:
    """What a lock may keep of one variable: nothing of a secret, a URL without credentials
    (an index URL also without a token in its path)."""
    if looks_secret(name):
        return REDACTED
    return scrub_index_text(value) if name in INDEX_VARIABLES else scrub_text(value)


def secret_values(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """Values of the variables that hold a secret, to scrub from the whole document.

    Only values that could be a credential (``rules.could_be_credential``: a plain word or a
    slug of words and numbers names a directory or a run far more often than it is a password,
    and replacing it rewrote every path holding it), and not the location of something on this
    machine (a secret-named variable may hold a path to a key file; its directory must not
    vanish from every path in the lock). The forms they travel in (percent-encoded, base64)
    are ``scrub_string``'s.
    """
    values = set()
    for name, value in (os.environ if environ is None else environ).items():
        values.update(_url_passwords(value))
        values.update(url_tokens(value, name in INDEX_VARIABLES))
        if not looks_secret(name) or not could_be_credential(value) or value == REDACTED:
            continue
        if os.path.isabs(value) and os.path.exists(value):
            continue
        values.add(value)
    return sorted(values, key=len, reverse=True)


def _url_passwords(value: str) -> List[str]:
    """Passwords of the URLs in any variable (``PIP_INDEX_URL=https://alice:PW@host``): the
    URL itself is stripped wherever it goes, but the password alone, pasted into ``--note``,
    is a secret too. The user name is not (it is often part of a home directory's path), nor a
    password that could not be a credential (``postgres://postgres:postgres@localhost``, a
    development default that also names directories and packages: replacing it everywhere
    would corrupt the lock)."""
    if "://" not in value or "@" not in value:
        return []
    out = []
    for m in re.finditer(URL_PATTERN, value):
        scheme = re.match(_SCHEME, m.group(0))
        if scheme is None:
            continue
        userinfo = _split_authority(m.group(0)[scheme.end():])[0]
        password = userinfo.partition(":")[2]
        out += [c for c in (password, _unquote(password)) if could_be_credential(c)]
    return out


def url_tokens(value: str, index: bool) -> List[str]:
    """The tokens the URLs of a variable carry in their path or query (``HF_ENDPOINT=
    https://h/?token=T``, ``PIP_INDEX_URL=https://pypi.fury.io/T/acme/``): the URL is stripped
    wherever it goes, and the token alone, pasted into ``--note``, goes too. Only what the URL
    rules remove, and only what could be a credential (``rules.could_be_credential``): a plain
    word or a number is more likely to stand elsewhere in the lock as something else
    (?download, /t/12345678/)."""
    if "://" not in value:
        return []
    out = []
    for m in re.finditer(URL_PATTERN, value):
        url = m.group(0).partition("#")[0]
        kept = strip_index_url(url) if index else strip_url(url)
        if kept == url:
            continue
        # What was removed: the pieces of the URL that are not in what was kept; not the values
        # of a presigned URL's signing parameters that are no credential by key or shape (its
        # date, algorithm or expiry: removed from the URL, but no secret to hunt elsewhere).
        pieces = re.split(r"[/?&;=]", url.partition("://")[2])
        left = set(re.split(r"[/?&;=]", kept.partition("://")[2])) | _signing_only_values(url)
        for piece in pieces:
            if piece in left or "@" in piece or not could_be_credential(piece):
                continue
            out += [piece, _unquote(piece)]
    return out


def _signing_only_values(url: str) -> Set[str]:
    """The values of ``url``'s presigned signing parameters whose key and shape are no
    credential's (``X-Amz-Date``, ``X-Amz-Algorithm``), as written."""
    items = [item.partition("=") for item in url.partition("?")[2].split("&")]
    signing = signing_query_keys([_unquote(key) for key, eq, _ in items if eq])
    return {value for key, eq, value in items
            if eq and _unquote(key) in signing and not query_value_secret(_unquote(key), _unquote(value))}


# ---------------------------------------------------------------------------------------------
# Secret values in every form they travel in. A value pasted into a URL or a form is
# percent-encoded (any character may be, "%2B" or "%2b"; a space may be "+"), and one in an
# Authorization header or a config file is base64, alone or as "user:value". The base64 of a
# text holding the value holds, whatever surrounds it, one of three strings (one for each
# offset of the value modulo 3 bytes), in the standard or the URL-safe alphabet: its "cores".
# Where a core is found, the whole base64 word around it goes (its first and last characters
# carry bits of the value too).
# ---------------------------------------------------------------------------------------------

_URLSAFE = str.maketrans("+/", "-_")
_HEX = frozenset("0123456789abcdefABCDEF")
_BASE64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")


class _Secret(NamedTuple):
    value: str
    cores: Tuple[str, ...]


def _utf8(text: str) -> bytes:
    # A value read from os.environ carries undecodable bytes as lone surrogates.
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _base64_cores(value: str) -> Tuple[str, ...]:
    import base64

    data = _utf8(value)
    out: List[str] = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + data).decode("ascii")
        # The characters whose 6 bits all come from the value: after the k bytes before it,
        # before the bits of whatever follows it.
        core = encoded[-(-8 * k // 6):8 * (k + len(data)) // 6]
        if len(core) >= MIN_SECRET_LEN:
            out += [core, core.translate(_URLSAFE)]
    return tuple(dict.fromkeys(out))


@lru_cache(maxsize=16)
def _prepared(secrets: Tuple[str, ...]) -> Tuple[_Secret, ...]:
    return tuple(_Secret(s, _base64_cores(s)) for s in secrets if s)


def _decoded(text: str, plus: bool) -> Tuple[str, List[int]]:
    """``text`` with its percent-escapes decoded (UTF-8 sequences as one character; with
    ``plus``, "+" read as a space), and where each decoded character starts in ``text``
    (one entry more: the end)."""
    chars: List[str] = []
    starts: List[int] = []
    i, n = 0, len(text)
    while i < n:
        run = bytearray()
        offsets: List[int] = []
        while i + 2 < n and text[i] == "%" and text[i + 1] in _HEX and text[i + 2] in _HEX:
            run.append(int(text[i + 1:i + 3], 16))
            offsets.append(i)
            i += 3
        p = 0
        while p < len(run):
            lead = run[p]
            size = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 1
            try:
                char = bytes(run[p:p + size]).decode("utf-8")
            except UnicodeDecodeError:
                char, size = bytes(run[p:p + 1]).decode("utf-8", "surrogateescape"), 1
            chars.append(char)
            starts.append(offsets[p])
            p += size
        if run:
            continue
        chars.append(" " if plus and text[i] == "+" else text[i])
        starts.append(i)
        i += 1
    starts.append(n)
    return "".join(chars), starts


def _finds(text: str, needle: str) -> List[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def _base64_word(text: str, start: int, end: int) -> Tuple[int, int]:
    """The base64 word around ``text[start:end]``: its alphabet (both) and up to two "="."""
    while start > 0 and text[start - 1] in _BASE64_CHARS:
        start -= 1
    while end < len(text) and text[end] in _BASE64_CHARS:
        end += 1
    for _ in range(2):
        if text[end:end + 1] == "=":
            end += 1
    return start, end


def _secret_spans(text: str, secrets: Tuple[_Secret, ...], decode: bool = True) -> List[Tuple[int, int]]:
    """Where ``text`` holds a secret value in any of its forms, as (start, end) spans; with
    ``decode`` False, only its forms as written (no percent-escape or "+" read)."""
    spans: List[Tuple[int, int]] = []
    for s in secrets:
        spans += [(at, at + len(s.value)) for at in _finds(text, s.value)]
        for core in s.cores:
            spans += [_base64_word(text, at, at + len(core)) for at in _finds(text, core)]
    if decode and "%" in text:
        spans += _decoded_spans(text, secrets, plus=False)
    if decode and "+" in text and any(" " in s.value for s in secrets):
        spans += _decoded_spans(text, secrets, plus=True)
    return spans


def _decoded_spans(text: str, secrets: Tuple[_Secret, ...], plus: bool) -> List[Tuple[int, int]]:
    view, starts = _decoded(text, plus)
    spans = []
    for s in secrets:
        spans += [(starts[at], starts[at + len(s.value)]) for at in _finds(view, s.value)]
        for core in () if plus else s.cores:
            for at in _finds(view, core):
                a, b = _base64_word(view, at, at + len(core))
                spans.append((starts[a], starts[b]))
    return spans


def _redact_spans(text: str, spans: List[Tuple[int, int]], mark: str = REDACTED) -> str:
    """``text`` with each span (overlapping ones merged) replaced by ``mark``."""
    out, last = [], 0
    for start, end in sorted(spans):
        if start < last:
            last = max(last, end)
            continue
        out += [text[last:start], mark]
        last = end
    return "".join(out) + text[last:]


# What a value replaced before the URL rules run reads as until they have: a character a URL
# may hold (a private-use one). "<redacted>" would end a URL there, and the URL rules would no
# longer see the userinfo it stands in ("https://u:<redacted>@host" kept its user).
_HELD = "\ue000"


def scrub_string(text: str, secrets: List[str]) -> str:
    """One string as it may enter a lock: secret values replaced in every form, URLs stripped.

    The values first: a URL rule that cuts a URL short (at an unescaped "#" of a value) would
    leave the value's first part, which no longer matches, in the text. Repeated until nothing
    changes, so that what it returns passes the model's own check (``scrub_text(x) == x``)
    even when a replacement makes a new pattern appear."""
    prepared = _prepared(tuple(secrets))
    for _ in range(4):
        before = text
        spans = _secret_spans(text, prepared) if prepared else []
        held = _HELD not in text
        if spans:
            text = _redact_spans(text, spans, _HELD if held else REDACTED)
        text = scrub_text(text)
        if spans and held:
            text = text.replace(_HELD, REDACTED)
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
    shape ``scrub_text`` removes (``_shaped``: a token, a private key block, Basic
    credentials), or a secret value in one of its forms. Shapes and values as written are
    searched once in all the document's strings joined by newlines: a shape's match inside one
    string has a match there too (its start holds no newline, and a newline is a non-word
    character like a string's edge), and a value or a base64 core inside one string is inside
    the joined text. Encoded forms are searched once in the strings that can hold one (a "%",
    or a "+" when a value holds a space) joined: decoding is local to each escape, so it does
    not cross the newline. So when the joined text holds no shape, a string without "://",
    "@" and the secrets found comes back from ``scrub_string`` unchanged, and is not scrubbed
    one by one.
    """

    def __init__(self, doc: Any, secrets: List[str]) -> None:
        parts: List[str] = []
        _strings(doc, parts)
        joined = "\n".join(parts)
        self.tokens = _shaped(joined)
        prepared = _prepared(tuple(secrets))
        spaced = any(" " in s for s in secrets)
        encoded = "\n".join(p for p in parts if "%" in p or (spaced and "+" in p))
        self.present = tuple(s for s in prepared
                             if _secret_spans(joined, (s,), decode=False) or _secret_spans(encoded, (s,)))

    def clean(self, text: str, secrets: bool = True) -> bool:
        """True when ``scrub_string(text, ...)`` would return ``text`` as it is."""
        if self.tokens or "://" in text or "@" in text:
            return False
        return not (secrets and self.present and _secret_spans(text, self.present))


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
    _say_which_paths_changed(doc, out)
    _keep_image_whole(doc, out)
    return out


# A path with a component replaced (a project directory named like a token, a secret value
# that is a directory's name) names no real location any more: the lock says so, in
# [probe].errors, rather than hand on "/srv/<redacted>/.venv" as if it were the environment's.
_PATHS_SHOWN = 3


def _say_which_paths_changed(doc: Dict[str, Any], out: Dict[str, Any]) -> None:
    if out == doc:  # the common case, compared in C; the walk below is Python
        return
    changed: List[str] = []
    _changed_paths(doc, out, "", changed)
    if not changed:
        return
    shown = ", ".join(changed[:_PATHS_SHOWN]) + (", ..." if len(changed) > _PATHS_SHOWN else "")
    probe = out.setdefault("probe", {})
    if isinstance(probe, dict) and isinstance(probe.setdefault("errors", {}), dict):
        probe["errors"]["paths"] = (
            f"{len(changed)} {'path' if len(changed) == 1 else 'paths'} ({shown}) had a secret "
            f"variable's value or a token in a component, written {REDACTED}: "
            f"{'it names' if len(changed) == 1 else 'they name'} no real location")


def _changed_paths(doc: Any, out: Any, where: str, found: List[str]) -> None:
    """The dotted keys (as scrubbed: a key may hold a secret too) of every absolute path that
    the scrub changed."""
    if isinstance(doc, dict) and isinstance(out, dict):
        for v, (k, w) in zip(doc.values(), out.items()):  # noqa: B905 (3.8)
            _changed_paths(v, w, f"{where}.{k}" if where else str(k), found)
    elif isinstance(doc, list) and isinstance(out, list):
        for i, (v, w) in enumerate(zip(doc, out)):  # noqa: B905 (3.8)
            _changed_paths(v, w, f"{where}.{i}", found)
    elif isinstance(doc, str) and doc.startswith("/") and out != doc:
        found.append(where)


# Image identity: a reference or digest with a word replaced is another image (or no valid
# reference at all, and the capture failed). A field the scrub would change is left out of the
# lock, with the reason in [probe].errors; it is never recorded half-redacted.
_IMAGE_KEYS = ("reference", "digest", "id", "container_id")


def _keep_image_whole(doc: Dict[str, Any], out: Dict[str, Any]) -> None:
    image, scrubbed = doc.get("image"), out.get("image")
    if not isinstance(image, dict) or not isinstance(scrubbed, dict):
        return
    for key in _IMAGE_KEYS:
        if isinstance(image.get(key), str) and scrubbed.get(key) != image[key]:
            del scrubbed[key]
            probe = out.setdefault("probe", {})
            if isinstance(probe, dict) and isinstance(probe.setdefault("errors", {}), dict):
                probe["errors"][f"image.{key}"] = "it holds a secret variable's value or a token"
