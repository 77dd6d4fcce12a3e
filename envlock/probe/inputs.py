"""What an experiment read: Hugging Face cache revisions and the sha256 of declared data paths.

Stdlib only, Python >= 3.8 (the probe's rules), so the same code can run wherever the data is.

**Hugging Face.** ``huggingface_hub`` keeps one folder per repository in its cache
(``models--org--name``, ``datasets--org--name``, ``spaces--org--name``): ``refs/<ref>`` holds the
commit a branch pointed at when it was last resolved, ``snapshots/<commit>/`` the files of that
commit, each a symlink to ``blobs/<etag>`` (a git blob sha1, or the sha256 of an LFS file). The
commit names the revision; the blob names under it are a content id of every file, read with
``readlink`` alone, so a blob replaced in place (a model re-quantised under a moved ``main``) is
seen without reading gigabytes. No hub is asked: the cache is what the experiment read.

**Data paths.** A file is the sha256 of its bytes; a directory the sha256 of its sorted
``relative path, file sha256`` lines (symlinks followed as the experiment's open() would).
Hashes are remembered by each file's stat in the ``--deep`` cache (``filehashes``), so an
unchanged dataset is stat-ed, not read, on the next check.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from .deep import record_hash
from .filehashes import FileHashes
from .statcache import Clock

HF_PREFIX = "hf:"
_HF_KINDS = {"models": "models", "datasets": "datasets", "spaces": "spaces"}
_HF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_HF_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A directory of more files than this is not data an experiment declares by hand; it is refused
# rather than walked for minutes.
MAX_FILES = 1000000


class InputError(Exception):
    """A declared input that cannot be read (its message is one line for the user)."""


def hf_cache_dir(environ: Optional[Dict[str, str]] = None) -> str:
    """The hub cache as huggingface_hub finds it: ``HF_HUB_CACHE``, then the older
    ``HUGGINGFACE_HUB_CACHE``, then ``$HF_HOME/hub``, then ``$XDG_CACHE_HOME/huggingface/hub``."""
    env = os.environ if environ is None else environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return os.path.expanduser(env[name])
    home = env.get("HF_HOME")
    if not home:
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        home = os.path.join(xdg, "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def parse_hf(spec: str) -> Tuple[str, str, str]:
    """``hf:[models/|datasets/|spaces/]org/name[@ref]`` -> (kind, repo id, ref)."""
    body = spec[len(HF_PREFIX):] if spec.startswith(HF_PREFIX) else spec
    body, _, ref = body.partition("@")
    kind = "models"
    head, sep, rest = body.partition("/")
    if sep and head in _HF_KINDS and rest:
        kind, body = _HF_KINDS[head], rest
    ref = ref or "main"
    if not _HF_NAME.match(body) or ".." in body or not _HF_REF.match(ref) or ".." in ref:
        raise InputError("%r is not a Hugging Face repository (hf:org/name, hf:datasets/org/name, "
                         "optionally @ref)" % spec)
    return kind, body, ref


def hf_folder(kind: str, repo: str, cache: Optional[str] = None) -> str:
    """The folder of a repository in the hub cache (``models--org--name``)."""
    return os.path.join(cache or hf_cache_dir(), "%s--%s" % (kind, repo.replace("/", "--")))


def hf_revision(spec: str, cache: Optional[str] = None) -> Dict[str, Any]:
    """The cached revision of a Hugging Face repository and the digest of its snapshot's files.

    ``revision`` is None when the cache has no such ref; ``files_sha256`` is None when the
    snapshot folder is missing (the ref was resolved, the files never downloaded or deleted).
    """
    kind, repo, ref = parse_hf(spec)
    folder = hf_folder(kind, repo, cache)
    out = {"kind": "hf", "name": "%s%s/%s@%s" % (HF_PREFIX, kind, repo, ref), "revision": None,
           "files_sha256": None, "files": None}  # type: Dict[str, Any]
    if _COMMIT.match(ref):
        revision = ref  # pinned by commit: no ref file to read
    else:
        try:
            with open(os.path.join(folder, "refs", ref), "r", encoding="ascii") as fh:
                revision = fh.read(128).strip()
        except (OSError, ValueError):
            return out
        if not _COMMIT.match(revision):
            return out
    out["revision"] = revision
    snapshot = os.path.join(folder, "snapshots", revision)
    if not os.path.isdir(snapshot):
        return out
    lines = []  # type: List[str]
    for rel in _files(snapshot):
        path = os.path.join(snapshot, rel)
        if os.path.islink(path):
            blob = os.path.basename(os.readlink(path))
        else:  # a cache without symlinks (huggingface_hub's fallback on some filesystems)
            blob = "sha256:" + _hex(record_hash(path))
        lines.append("%s\0%s\n" % (rel, blob))
    out["files"] = len(lines)
    out["files_sha256"] = hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
    return out


def _files(root: str) -> List[str]:
    """Every regular file under ``root`` (through symlinks), relative, sorted, ``/``-separated."""
    found = []  # type: List[str]
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path):
                found.append(os.path.relpath(path, root).replace(os.sep, "/"))
                if len(found) > MAX_FILES:
                    raise InputError("%s holds more than %d files" % (root, MAX_FILES))
    return sorted(found)


def _hex(digest: str) -> str:
    """RECORD's ``sha256=<urlsafe base64>`` (what the stat cache stores) as hex."""
    b64 = digest.split("=", 1)[1]
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def path_digest(path: str, cache: bool = True, cache_directory: Optional[str] = None,
                now_ns: Clock = time.time_ns) -> Dict[str, Any]:
    """The sha256 of a data file, or of a directory's sorted (path, sha256) lines.

    Files whose stat is the one remembered are not read (``filehashes``: a cache keyed by the
    path's absolute location); ``cache=False`` reads every file. A missing path raises.
    """
    root = os.path.abspath(path)
    if os.path.isfile(root):
        rels, single = [""], True
    elif os.path.isdir(root):
        rels, single = _files(root), False
    else:
        raise InputError("%s: no such file or directory" % path)
    paths = [root if single else os.path.join(root, rel) for rel in rels]
    stat_cache = FileHashes([root], read=cache, directory=cache_directory, now_ns=now_ns)
    found = stat_cache.lookup(paths)
    missing = [i for i, digest in enumerate(found) if digest is None]
    fresh = []  # type: List[str]
    for i in missing:
        try:
            fresh.append(record_hash(paths[i]))
        except OSError as exc:
            raise InputError("%s: %s" % (paths[i], exc.strerror or exc)) from None
    stat_cache.store(missing, fresh)
    for i, digest in zip(missing, fresh):  # noqa: B905 (3.8)
        found[i] = digest
    stat_cache.save()
    hexes = [_hex(str(d)) for d in found]
    size = 0
    for p in paths:
        try:
            size += os.stat(p).st_size
        except OSError:
            pass
    if single:
        digest = hexes[0]
    else:
        digest = hashlib.sha256("".join("%s\0%s\n" % (rel, h) for rel, h in zip(rels, hexes))  # noqa: B905
                                .encode("utf-8", "surrogateescape")).hexdigest()
    return {"kind": "path", "name": path, "sha256": digest, "files": len(paths), "size": size}


def describe(spec: str, base: Optional[str] = None, cache: bool = True,
             hf_cache: Optional[str] = None) -> Dict[str, Any]:
    """One declared input: ``hf:...`` is a Hugging Face repository, anything else a path
    (relative to ``base`` when given, recorded as written)."""
    if spec.startswith(HF_PREFIX):
        return hf_revision(spec, hf_cache)
    full = spec if base is None or os.path.isabs(spec) else os.path.join(base, spec)
    out = path_digest(full, cache=cache)
    out["name"] = spec
    return out
