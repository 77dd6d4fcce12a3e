"""The value rules the models enforce on strings a lock may carry from outside.

The probe decides what is a secret and how names normalise; these checks refuse, on a hand
edited or foreign lock, exactly what capture would have stripped. Apart from ``_model`` only to
keep that module to its fields; nothing here needs pydantic.
"""

from __future__ import annotations

import re

from envlock.probe.rules import REDACTED, looks_secret
from envlock.probe.scrub import env_value, scrub_text, strip_url

_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(f"not a normalised (PEP 503) distribution name: {value!r}")
    return value


_CREDENTIALS = ("carries credentials (a URL's user:password@, a secret query parameter or fragment, "
                "an index token in the path, or a token-shaped word); envlock never stores them")


def check_clean(value: str) -> str:
    """The rule capture applies, enforced on every string a lock may carry from outside:
    a value is clean when scrubbing would leave it unchanged. So a hand edit that puts a
    credential back is refused (``fmt`` will not seal it) exactly as capture would strip it."""
    if scrub_text(value) != value:
        raise ValueError(_CREDENTIALS)
    return value


def check_url(value: str) -> str:
    if strip_url(value) != value or scrub_text(value) != value:
        raise ValueError(f"URL {_CREDENTIALS}")
    if any(c in value for c in "\n\r\t \"'`$\\"):
        raise ValueError(f"URL contains a character that is not allowed: {value!r}")
    return value


def check_env(env: dict[str, str], table: str = "env") -> dict[str, str]:
    # A validator on a dict cannot point its error at one key, so the message names it.
    for name, value in env.items():
        if looks_secret(name):
            if value != REDACTED:
                raise ValueError(f"{table}.{name} looks like a secret; a lock only stores it as {REDACTED!r}")
        elif env_value(name, value) != value:  # the capture rule (an index URL's path token too)
            raise ValueError(f"{table}.{name} {_CREDENTIALS}")
    return dict(sorted(env.items()))


def split_os_spec(spec: str) -> tuple[str, str, str]:
    """(name, arch, version) of ``name:arch=version`` (a version may hold an epoch colon)."""
    head, _, version = spec.partition("=")
    name, _, arch = head.partition(":")
    return name, arch, version
