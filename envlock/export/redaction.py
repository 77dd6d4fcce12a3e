"""How an index URL is shown: in an output (``public``), in a message (``shown``), and as the
address envlock requests (``redact``: user:password taken out, to travel as a header).

What counts as a credential is decided once, by the probe's rules (``probe.scrub``: userinfo,
secret query parameters and fragments, an index path segment shaped like a token), the rules a
lock is scrubbed and validated with; this module only chooses which of them each place applies,
so an output or a message cannot call a secret what the lock does not. Apart from the
simple-API client (``index``) because the writers (requirements.txt, pylock.toml) and the error
messages need the rules without it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from envlock.probe.scrub import URL_PATTERN, strip_index_url


def public(url: str) -> str:
    """An index URL as an output may carry it (requirements.txt, pylock.toml): no user:password,
    no secret query value or fragment, no token in the path (``/<TOKEN>/acme/``, on any host);
    what was a credential reads ``<redacted>``. The installer brings its own (keyring, netrc,
    PIP_INDEX_URL), as it does for a password."""
    return strip_index_url(url)


def shown(url: str) -> str:
    """``url`` for an error message or a log: ``public``, and no query or fragment at all, where
    index tokens travel (``?token=...``); a message never needs them to say which index."""
    base, query, _ = public(url).partition("#")[0].partition("?")
    return base + ("?..." if query else "")


def redact(url: str) -> str:
    """``url`` without user:password: the address envlock requests and keys its listing cache by,
    while the credentials travel as a header to the index's own origin (``SimpleIndex``). A token
    in the path or query stays, being part of the address; ``public`` and ``shown`` are what an
    output and a message carry."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


_URL_IN_TEXT = re.compile(URL_PATTERN)  # the URLs the probe finds in free text, no other


def shown_reason(reason: object) -> str:
    """An OS or HTTP library's reason, with any URL in it shown as ``shown`` shows it (a
    redirect's error can name the ``Location``, token and all)."""
    return _URL_IN_TEXT.sub(lambda m: shown(m.group()), str(reason))


__all__ = ["public", "redact", "shown", "shown_reason"]
