"""A verify's answer kept for the next one: when neither the lock nor the environment changed,
``envlock verify`` prints what it printed last time, without building the models.

Building the lock's models (pydantic's import and their schemas) is most of a warm verify,
yet when the lock's seal verifies (its sealed header, ``lock.header``) and the probe reports the
very document it reported before, the verdict is known: the comparator and the report are
functions of the two. So a verify that passed keeps its output, keyed in two parts:

* the file's name: what is known before the probe runs: this envlock's version, the lock's two
  hashes (every field of it: an edited and re-sealed lock is another entry), the name the lock
  was given, the options that change the output, the environment chosen and how, the working
  directory and home (paths are shown relative to them), and what ``judge`` reads beyond the two
  locks (the restore facts of an image, ``OS_FROM_BASE``). No entry: the verify runs as ever,
  the lock's models built while the probe runs;
* inside the entry: what the probe reported (its whole document, less its timings) and what is
  derived from it for the report. Anything different is a miss: the models are built, the
  verdict given by ``check/local.judge`` as always, and the entry replaced.

Where the probe runs is part of the key. When envlock is the program and the interpreter to
judge is its own, started as the probe's would be (``probe_here``), the kept check runs the
probe in this process (``probing.capture.run_probe_as_fresh``: torch's facts from the cache,
never imported) instead of starting a second interpreter, which was half of a warm verify. Its
document is not the other interpreter's (this process has loaded other libraries, its path
begins elsewhere), so it is never compared with one: an entry is kept, for that key, with the
digest of the document this process collected *before* the judged probe started (what it read
is never newer than what was judged), and only when the one in another interpreter judged the
environment. Such an entry names the lock by its text (``text_digest``) rather than its
header's hashes, and holds what a verify needs of the header before its probe runs
(``KeptLock``): the header is read from that very text when the answer is kept, and a header is
a function of the text, so a hit reads the file but parses nothing. A change the other probe
would see is one this one sees (the same interpreter, files, variables and caches), so it is a
miss, and the miss is judged as ever. No torch facts kept, a canary to run, torch imported, a
host calling ``main``: the probe runs elsewhere.

Only a verify that passed is kept (a drift is reported by the models, every time), and only
the plain one: ``--deep``, ``--record``, ``--fleet``, ``--requirements`` and ``--no-cache``
are never answered from here. Entries are read and written through the probe's cache rules (``probe.statcache``:
the caller's own private directory, regular files only, atomic writes, bounded reads); one
that is missing, unreadable, corrupt, not the caller's own or keyed otherwise is a miss.
``ENVLOCK_NO_CACHE=1`` reads none and keeps none (its value is part of the key anyway). An entry is a cache of an answer
``load()`` and the comparator gave for a lock of this integrity; it is never a second verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from envlock._version import __version__

FORMAT = 1
DIRECTORY = "verify"  # under envlock's cache directory (``probe.statcache.cache_dir``)
PREFIX = "verdict-"
KEEP = 64  # entries kept; the oldest beyond are removed when one is written
MAX_BYTES = 4 * 1024 * 1024


class KeptLock(NamedTuple):
    """What the answer's lock header said that a verify needs before its probe runs: the tables
    that choose the probe and the prefix the lock was captured in. Kept for an entry named by
    the lock's text (the probe here), whose header is then not read on a hit."""

    tables: frozenset[str]
    prefix: str | None


class Kept(NamedTuple):
    """The kept answer: what verify printed, the digest of what it was derived from, and the
    lock's header facts when the entry is named by the lock's text."""

    output: str
    inputs: str
    lock: KeptLock | None = None


def text_digest(text: str) -> str:
    """A lock named by its text (as ``lock.read_text`` read it): the same text is the same
    header, so an answer kept for the header read from it is that text's."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def digest(material: Any) -> str:
    """sha256 of ``material`` as sorted, compact JSON: the same material is the same digest."""
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False, default=str).encode("utf-8")).hexdigest()


def _directory() -> Path:
    from envlock.probe.statcache import cache_dir

    return Path(cache_dir()) / DIRECTORY


def _path(key: str) -> Path:
    return _directory() / f"{PREFIX}{key[:40]}.json"


def probe_here(python: str, prefix: str, *, program: bool) -> bool:
    """Whether the kept check may run the probe in this process (``run_probe_as_fresh``) for
    the interpreter ``python`` of the environment ``prefix``: when envlock is this process's
    program (``commands.is_program``), that interpreter is this one, started as the probe's
    would be (no flag that changes its path or what it reads of the environment), with its path
    as it began (the first entry, which the probe's own replaces, nowhere else on it), torch not
    imported, and the caches allowed."""
    import sys

    from envlock.probe.statcache import file_cache_allowed

    flags = sys.flags
    first = os.path.abspath(sys.path[0] or os.getcwd()) if sys.path else None
    return (program and first is not None and "torch" not in sys.modules
            and os.path.abspath(python) == os.path.abspath(sys.executable)
            and os.path.abspath(prefix) == os.path.abspath(sys.prefix)
            and not (flags.isolated or flags.ignore_environment or flags.no_user_site
                     or flags.no_site or flags.safe_path or sys._xoptions)
            and [os.path.abspath(p or os.getcwd()) for p in sys.path].count(first) == 1
            and file_cache_allowed())


def find(key: str) -> Kept | None:
    """The answer kept under ``key``, or None (never raises)."""
    from envlock.probe.statcache import file_cache_allowed, read_entry

    if not file_cache_allowed():
        return None
    entry = read_entry(str(_path(key)), MAX_BYTES, format=FORMAT, key=key)
    if entry is None:
        return None
    output, inputs, lock = entry.get("output"), entry.get("inputs"), entry.get("lock")
    if not isinstance(output, str) or not isinstance(inputs, str):
        return None
    if isinstance(lock, dict):
        tables, prefix = lock.get("tables"), lock.get("prefix")
        if not (isinstance(tables, list) and all(isinstance(t, str) for t in tables)
                and (prefix is None or isinstance(prefix, str))):
            return None
        return Kept(output=output, inputs=inputs, lock=KeptLock(frozenset(tables), prefix))
    return Kept(output=output, inputs=inputs) if lock is None else None


def keep(key: str, *, inputs: str, output: str, lock: KeptLock | None = None) -> bool:
    """Keep ``output`` under ``key`` for these ``inputs`` (and the ``lock`` header's facts);
    False when nothing was written."""
    from envlock.probe.statcache import file_cache_allowed, prune, write_cache

    if not file_cache_allowed():
        return False
    entry = {"format": FORMAT, "key": key, "envlock": __version__, "inputs": inputs, "output": output,
             "lock": None if lock is None else {"tables": sorted(lock.tables), "prefix": lock.prefix},
             "kept_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    written = write_cache(str(_path(key)), entry)
    if written:
        prune(PREFIX, KEEP, str(_directory()))
    return written


def file_state(path: str) -> str | None:
    """A file ``judge`` reads beyond the two locks, as key material: its bytes' digest, or None
    when it cannot be read (as ``judge`` then reads nothing)."""
    from envlock._files import sha256_file

    try:
        return sha256_file(path)
    except OSError:
        return None


def here() -> dict[str, Any]:
    """What a report's paths are shown relative to (``probing.target.display_path``)."""
    return {"cwd": os.getcwd(), "home": os.path.expanduser("~")}
