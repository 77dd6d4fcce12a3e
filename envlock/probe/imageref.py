"""Container image references (``[domain/]repo[:tag][@sha256:...]`` or an image id): one parser.

The probe records what a container says about its own image, restore validates what goes into
``FROM``, and the engine matches the names it lists (``RepoDigests``, ``localhost/`` prefixes) with
what the user asked for: all of them cut a reference the same way, here. The module is
stdlib-only, Python 3.8 syntax and imports nothing of envlock, so that the probe can ship it into
any image.

``split`` cuts without judging (the probe records what it is told); ``parse`` also checks
Docker's reference grammar (distribution/reference) and raises ``InvalidReference`` with the
reason, which restore turns into its own refusal.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

MAX_LENGTH = 512
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# Docker's reference grammar, without the parts nobody writes by hand.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?)"
_REPO_RE = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# How engines spell a Docker Hub or a local image in what they list; all name the same repository.
_IMPLIED_PREFIXES = ("docker.io/library/", "docker.io/", "localhost/")
LOCAL_PREFIX = "localhost/"


class InvalidReference(ValueError):
    """Not an image reference; ``reason`` says which part is wrong."""

    def __init__(self, value: object, reason: str) -> None:
        super().__init__(f"{value!r}: {reason}")
        self.value = value
        self.reason = reason


class ImageRef(NamedTuple):
    """The parts of a reference; an image id is ``ImageRef("", None, "sha256:...")``.

    A NamedTuple: a value that is compared, hashed and unpacked like the tuple it is."""

    repo: str
    tag: Optional[str] = None
    digest: Optional[str] = None

    @property
    def name(self) -> str:
        """``repo[:tag]``: the reference without its digest."""
        return f"{self.repo}:{self.tag}" if self.tag is not None else self.repo

    @property
    def pinned(self) -> bool:
        """True when the reference names immutable content (a digest or an image id)."""
        return self.digest is not None

    @property
    def local(self) -> bool:
        """True for a name only this machine knows (Podman's ``localhost/...``)."""
        return self.repo.startswith(LOCAL_PREFIX)


def is_image_id(value: str) -> bool:
    return DIGEST_RE.fullmatch(value) is not None


def split(value: str) -> ImageRef:
    """The parts of ``value`` without checking them; never raises.

    The tag is what follows the last ``:`` after the last ``/`` (a ``:`` before a ``/`` is a
    registry's port), the digest what follows the first ``@``.
    """
    if is_image_id(value):
        return ImageRef("", None, value)
    name, at, digest = value.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    repo, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, None)
    return ImageRef(repo, tag, digest if at else None)


def split_digest(value: str) -> tuple[str, str | None]:
    """``(repo[:tag], sha256 digest or None)``: what a container says its image is, as said.

    Anything after ``@`` that is not a sha256 digest stays part of the name, so a strange value
    is recorded whole rather than half.
    """
    if not is_image_id(value):
        ref = split(value)
        if ref.digest is not None and ref.digest.startswith("sha256:"):
            return ref.name, ref.digest
    return value, None


def parse(value: object) -> ImageRef:
    """The parts of a valid reference (Docker's grammar) or an image id; else ``InvalidReference``."""
    if not isinstance(value, str) or len(value) > MAX_LENGTH:
        raise InvalidReference(value, "not an image reference")
    ref = split(value)
    if ref.digest is not None and not DIGEST_RE.fullmatch(ref.digest):
        raise InvalidReference(value, "the digest is not sha256:<64 hex digits>")
    if is_image_id(value):
        return ref  # an image id, as used for images that exist only locally
    if ref.tag is not None and not _TAG_RE.fullmatch(ref.tag):
        raise InvalidReference(value, "bad tag")
    if not _REPO_RE.fullmatch(ref.repo):
        raise InvalidReference(value, "not an image reference")
    return ref


def normal_repo(repo: str) -> str:
    """``repo`` without the prefixes engines add (``docker.io/library/``, ``localhost/``)."""
    for prefix in _IMPLIED_PREFIXES:
        if repo.startswith(prefix):
            repo = repo[len(prefix):]
    return repo[len("library/"):] if repo.startswith("library/") else repo


def same_repo(a: str, b: str) -> bool:
    """True when two repository names (no tag, no digest) name the same repository."""
    return normal_repo(a) == normal_repo(b)


def same_ref(a: str, b: str) -> bool:
    """True when two references name the same repository, tag and digest (``localhost/x:1`` as
    Podman lists it is ``x:1``)."""
    ra, rb = split(a), split(b)
    return same_repo(ra.repo, rb.repo) and (ra.tag, ra.digest) == (rb.tag, rb.digest)
