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

from .rules import INDEX_VARIABLES, MIN_SECRET_LEN, REDACTED, looks_secret, secret_query_key

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
# Which query keys hold a credential is ``rules.secret_query_key`` (whole words of the key:
# ?token=, ?X-Amz-Signature=, ?sig=, but not ?author= or ?keyword=).
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
    out = []
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if not eq:
            # A bare item (?TOKEN) has no name to judge it by: it goes unless empty.
            out.append(REDACTED if key and key != REDACTED else key)
        elif value and value != REDACTED and secret_query_key(_unquote(key)):
            out.append(key + "=" + REDACTED)
        else:
            out.append(item)
    return "&".join(out)


def _path_params(path: str) -> str:
    """Path parameters (``/simple;token=...``, ``;jsessionid=...``) judged as query items are."""
    if ";" not in path:
        return path

    def one(m: "re.Match[str]") -> str:
        key, value = m.group(1), m.group(2)
        if value and value != REDACTED and secret_query_key(_unquote(key)):
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


def scrub_text(text: str) -> str:
    """``text`` with every embedded URL and scp remote stripped and token-shaped words removed."""
    if "://" in text:
        text = re.sub(_URL, lambda m: strip_url(m.group(0)), text)
    if "@" in text:
        text = _strip_scp(text)
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
        text = re.sub(_URL, lambda m: strip_index_url(m.group(0)), text)
    return scrub_text(text)


def env_value(name: str, value: str) -> str:
    """What a lock may keep of one variable: nothing of a secret, a URL without credentials
    (an index URL also without a token in its path)."""
    if looks_secret(name):
        return REDACTED
    return scrub_index_text(value) if name in INDEX_VARIABLES else scrub_text(value)


def secret_values(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """Values of the variables that hold a secret, to scrub from the whole document.

    Only values that can be a credential: at least MIN_SECRET_LEN long, and not the location
    of something on this machine (a secret-named variable may hold a path to a key file; its
    directory must not vanish from every path in the lock).
    """
    values = set()
    for name, value in (os.environ if environ is None else environ).items():
        values.update(_url_passwords(value))
        values.update(url_tokens(value, name in INDEX_VARIABLES))
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


def url_tokens(value: str, index: bool) -> List[str]:
    """The tokens the URLs of a variable carry in their path or query (``HF_ENDPOINT=
    https://h/?token=T``, ``PIP_INDEX_URL=https://pypi.fury.io/T/acme/``): the URL is stripped
    wherever it goes, and the token alone, pasted into ``--note``, goes too. Only what the URL
    rules remove, and only as long as a credential (MIN_SECRET_LEN)."""
    if "://" not in value:
        return []
    out = []
    for m in re.finditer(_URL, value):
        url = m.group(0).partition("#")[0]
        kept = strip_index_url(url) if index else strip_url(url)
        if kept == url:
            continue
        # What was removed: the pieces of the URL that are not in what was kept.
        pieces = re.split(r"[/?&;=]", url.partition("://")[2])
        left = set(re.split(r"[/?&;=]", kept.partition("://")[2]))
        for piece in pieces:
            # A plain word or a number is more likely to stand elsewhere in the lock as
            # something else (?download, /t/12345678/) than to be a credential: kept.
            if piece in left or "@" in piece or len(piece) < MIN_SECRET_LEN or piece.isdigit() \
                    or (piece.isalpha() and len(piece) < 16):
                continue
            out += [piece, _unquote(piece)]
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
    _keep_image_whole(doc, out)
    return out


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
