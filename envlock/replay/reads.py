"""A record's ``[reads]``: the traces the run's processes left (``probe.trace``), made into
what a replay compares.

Each traced process wrote ``<pid>.json`` into the run's trace directory. Here, after the
command ended, their reads are joined, filtered and hashed:

* left out, as no input: what any of the processes opened for writing (its own outputs, a file
  it created in the temporary directory and read back), the run's journal directory, the
  record, the lock and the declared outputs, ``/proc``, ``/sys``, ``/dev``, bytecode caches,
  the interpreter's standard library, envlock's own files, directories;
* left out, as compared elsewhere: the compile caches' kernels (``compile.caches.*``), a file
  a distribution's ``RECORD`` lists with the size it has (``packages.<name>`` compares the
  distribution; deep verify its bytes), a workspace file ``[code]`` holds, a declared ``--input``; a variable the lock records (``[context]``'s
  ``env.*``);
* named: the distributions a file of which any process read (``Reads.distributions``), its
  ``entry_points.txt`` aside, and those shipping a program a process started, so that a replay tells the packages that can be a cause from those
  installed for something else; not known for a container's run (its ``RECORD`` files are the
  image's) or a trace that started late (what it opened before is not in it);
* kept: every other file by sha256 (the probe's stat cache, as ``--deep`` uses it: a file
  whose stat is unchanged is not read again), over ``MAX_HASHED`` bytes by a sample's digest
  (``sample_sha256``: the first and last MiB), and every other variable by its value as the
  lock scrubs it (a secret as ``sha256:<16 hex>`` of its value: a changed token still shows,
  its value never does);
* left out, as not there when the run ended: an open that failed (``importlib.metadata`` tries
  every distribution's ``entry_points.txt``) or a scratch file gone since; a file only one of
  two runs found is named all the same, from the other's record;
* the programs of child processes that are not Python, which nothing traced, are named.

The process-wide facts a trace takes (CPU affinity and quota, torch's default dtype, what
``torch.set_flush_denormal`` was called with) go to the record's ``[context]``, where every
other fact of the process is compared.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envlock.probe.deep import read_record
from envlock.replay.record import FileRead, Reads, holds, unrecordable

# The trace directory's name inside the run's journal directory.
TRACE_DIR = "trace"
# Above this a file is represented by a sample of it: hashing a 50 GB dataset shard after
# every run would cost more than the run.
MAX_HASHED = 256 * 1024 * 1024
SAMPLE = 1024 * 1024
# A run of many processes (a DataLoader of many workers, many ranks) leaves a file each.
MAX_TRACES = 4096
MAX_TRACE_BYTES = 64 * 1024 * 1024
# What a process read under these is no input of the run.
_SYSTEM = ("/proc/", "/sys/", "/dev/")
# In a container's run: envlock's own mounts (the record's journal, the probe, the check's files).
_CONTAINER_OWN = ("/envlock-", "/tmp/envlock-", "/usr/local/share/envlock-")
# The keys of ``[context]`` the traced process facts go to.
STATE_KEYS = {"flush_denormal": "determinism.flush_denormal", "default_dtype": "determinism.default_dtype",
              "cpu_affinity": "process.cpu_affinity", "cpu_quota": "process.cpu_quota"}
_PYTHON = re.compile(r"python[0-9.]*(?:[dmu]*)(?:\.exe)?")


def trace_dir(journal_dir: Path) -> Path:
    return journal_dir / TRACE_DIR


def load_traces(directory: Path) -> list[dict[str, Any]]:
    """Every process's trace, by pid; a file that does not parse (a process killed while it
    wrote is never one: it writes a temp file and renames it) is left out."""
    out = []
    names = sorted((p for p in directory.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    for path in names[:MAX_TRACES]:
        try:
            if path.stat().st_size > MAX_TRACE_BYTES:
                continue
            doc = json.loads(path.read_text(encoding="utf-8", errors="surrogateescape"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
            out.append(doc)
    return out


def _strings(doc: Mapping[str, Any], key: str) -> list[str]:
    found = doc.get(key)
    return [s for s in found if isinstance(s, str)] if isinstance(found, list) else []


class _Distributions:
    """The files distributions' ``RECORD`` files list, by absolute path, with their sizes and
    the distribution's name; each directory's ``*.dist-info`` read once."""

    def __init__(self) -> None:
        self.dirs: dict[str, dict[str, tuple[int | None, str | None]]] = {}
        # Distributions whose files no RECORD links to what the run read: an ``*.egg-info``
        # (no RECORD), a RECORD that lists nothing outside its own dist-info. Which of their
        # files the run read cannot be told, so each counts as read: never "not a cause".
        self.untold: set[str] = set()

    def owner(self, path: str) -> tuple[str | None, int | None] | None:
        """(the distribution whose RECORD lists ``path``, the size it lists, None for any), or
        None when no RECORD does."""
        d = os.path.dirname(path)
        while True:
            files = self._of(d)
            if path in files:
                want, name = files[path]
                return name, want
            parent = os.path.dirname(d)
            if parent == d:
                return None
            d = parent

    def shipping(self, path: str) -> str | None:
        """The distribution whose RECORD lists ``path``, by its directories, else among every
        RECORD read so far: a script RECORD lists as ``../../../bin/NAME`` is beside no
        dist-info of its own, and the run's site directories were read for its modules."""
        found = self.owner(path)
        if found is not None:
            return found[0]
        return next((files[path][1] for files in self.dirs.values() if path in files), None)

    def _of(self, d: str) -> dict[str, tuple[int | None, str | None]]:
        from envlock.probe.packages import distribution_name

        found = self.dirs.get(d)
        if found is not None:
            return found
        out: dict[str, tuple[int | None, str | None]] = {}
        try:
            infos = [n for n in os.listdir(d) if n.endswith((".dist-info", ".egg-info"))]
        except OSError:
            infos = []
        for info in infos:
            name = distribution_name(os.path.join(d, info))
            if info.endswith(".egg-info"):
                if name is not None:
                    self.untold.add(name)
                continue
            try:
                rows = list(read_record(os.path.join(d, info, "RECORD")))
            except (OSError, UnicodeDecodeError, csv.Error):
                rows = []
            if name is not None and not any(digest and not rel.startswith(info + "/") for rel, digest, _ in rows):
                self.untold.add(name)
            # A row without a hash (RECORD itself, bytecode) has no size either: any size goes.
            out.update((os.path.normpath(os.path.join(d, rel)), (size if digest else None, name))
                       for rel, digest, size in rows)
        self.dirs[d] = out
        return out


def _discovery(path: str) -> bool:
    """A distribution's ``entry_points.txt``, which plugin discovery reads for every
    distribution there is (``import torch`` looks for its backends' group so): reading it runs
    none of the distribution's code, and an entry point that is loaded has its module read,
    which counts the distribution as read."""
    return os.path.basename(path) == "entry_points.txt" and os.path.dirname(path).endswith(".dist-info")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def _stdlib(path: str, roots: Iterable[str]) -> bool:
    return _under(path, roots) and "/site-packages/" not in path and "/dist-packages/" not in path


def shown_path(path: str, base: Path) -> str:
    """A path as the record names it: relative to the workspace inside it, ``~/...`` under
    HOME, else absolute."""
    root = str(base)
    if _under(path, [root]):
        return os.path.relpath(path, root)
    home = os.path.expanduser("~")
    if home not in ("", "/") and _under(path, [home]):
        return "~/" + os.path.relpath(path, home)
    return path


def _sample(path: str, size: int) -> str:
    """sha256 of the first and last ``SAMPLE`` bytes and the size."""
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        h.update(fh.read(SAMPLE))
        fh.seek(max(size - SAMPLE, 0))
        h.update(fh.read(SAMPLE))
    return h.hexdigest()


def hash_files(paths: Sequence[str]) -> dict[str, FileRead]:
    """Each file's ``FileRead``: its sha256 through the stat cache ``--deep`` uses (a file
    whose stat is the one remembered is not read again), a sample's over ``MAX_HASHED``."""
    from envlock._files import file_digest
    from envlock.probe.filehashes import FileHashes
    from envlock.probe.statcache import file_cache_allowed

    cache = FileHashes(["envlock-reads"], read=file_cache_allowed())
    known = cache.lookup(paths)
    out: dict[str, FileRead] = {}
    fresh: list[int] = []
    digests: list[str] = []
    for i, (path, digest) in enumerate(zip(paths, known, strict=True)):
        try:
            size = os.stat(path).st_size
            if digest is not None:
                out[path] = FileRead(sha256=digest.partition("=")[2], size=size)
            elif size > MAX_HASHED:
                out[path] = FileRead(sample_sha256=_sample(path, size), size=size)
            else:
                found = file_digest(path)
                out[path] = FileRead(sha256=found.hexdigest, size=found.size)
                fresh.append(i)
                digests.append("sha256=" + found.hexdigest)
        except OSError:
            out[path] = FileRead(missing=True)
    cache.store(fresh, digests)
    cache.save()
    return out


def _variables(traces: Sequence[Mapping[str, Any]], hook: str | None) -> tuple[dict[str, str], list[str]]:
    """The ordinary variables the processes read (the first process to read one gives its
    value), scrubbed as the lock scrubs them; and those looked up unset."""
    from envlock.probe.rules import (
        ENV_NOT_RECORDED,
        launcher_variable,
        looks_secret,
        recorded_name,
        without_trace_hook,
    )
    from envlock.probe.scrub import env_value, scrub_string, secret_values

    found: dict[str, str | None] = {}
    for doc in traces:
        env = doc.get("env")
        for name, value in (env.items() if isinstance(env, dict) else ()):
            if isinstance(name, str) and (value is None or isinstance(value, str)):
                found.setdefault(name, value)
    secrets = secret_values({**os.environ, **{k: v for k, v in found.items() if v is not None}})
    values: dict[str, str] = {}
    unset: list[str] = []
    for name, value in sorted(found.items()):
        if (recorded_name(name) or name in ENV_NOT_RECORDED or name.startswith("ENVLOCK_")
                or launcher_variable(name) or not holds(name) or len(name) > 200):
            continue
        if value is None:
            unset.append(name)
            continue
        if name == "PYTHONPATH":
            value = without_trace_hook(value, hook)
        if looks_secret(name):
            kept = "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        else:
            kept = scrub_string(env_value(name, value), secrets)
        values[name] = kept if holds(kept) else unrecordable(kept)
    return values, unset


def _is_python(program: str, executables: set[str]) -> bool:
    if _PYTHON.fullmatch(os.path.basename(program)):
        return True
    try:
        return os.path.realpath(program) in executables
    except (OSError, ValueError):
        return False


def _compile_caches(traces: Sequence[Mapping[str, Any]]) -> list[str]:
    """The compile caches' directories (Inductor's, Triton's): their kernels are named by their
    contents in directories a cold compile fills anew, and ``[context]``'s ``compile.caches.*``
    compares them for a process that compiled. As envlock sees them, and as the run's processes
    looked their variables up."""
    from envlock.probe.compilecache import INDUCTOR_DIR_ENV
    from envlock.probe.compilestate import cache_dirs

    found = [path for _, path in cache_dirs()]
    for doc in traces:
        env = doc.get("env")
        if isinstance(env, Mapping):
            found += [os.path.abspath(v) for k, v in env.items()
                      if k in (INDUCTOR_DIR_ENV, "TRITON_CACHE_DIR") and isinstance(v, str) and v]
    return found


def collect(directory: Path, base: Path, *, exclude: Sequence[str] = (), skip: Iterable[str] = (),
            root_pid: int | None = None, program: str | None = None,
            hook: str | None = None, inside: str | None = None) -> tuple[Reads, dict[str, Any]]:
    """The run's ``Reads`` and the process facts for ``[context]``. ``exclude``: absolute
    paths (files or directories) that are no input (the record, the lock, declared outputs
    and inputs); ``skip``: the paths, as the record shows them, another table compares
    (``[code]``'s files); ``root_pid``: envlock's own pid, whose child is the command:
    when it left no trace, ``program`` (what the command ran) is named as not traced.
    ``inside``: the workspace's path in the container the processes ran in. Their paths are
    the container's: one under it is the workspace's file here; any other exists only in the
    container (a file of the same name here may hold other bytes), so it is never hashed here:
    the environment's files (``site-packages``, ``dist-packages``) are the image's, which the
    check inside proved equal to the lock, and every other one is counted as not compared
    (``Reads.unhashed``)."""
    traces = load_traces(directory)
    written: set[str] = set()
    stdlib: set[str] = set()
    for doc in traces:
        written.update(os.path.normpath(p) for p in _strings(doc, "written"))
        stdlib.update(_strings(doc, "stdlib"))
    own = [str(Path(__file__).resolve().parents[1]), str(directory.parent), *exclude, *_compile_caches(traces)]
    skipped = set(skip)
    dists = _Distributions()
    # The distributions a file of which the run read (on this host: a container's RECORD files
    # are the image's), even where the file is no input here (envlock's own): which
    # ``packages.<name>`` can be a cause. Not known from a trace that started late.
    distributions: set[str] | None = None if inside is not None or any(d.get("late") is True for d in traces) else set()
    wanted: list[str] = []
    unhashed = 0
    for path in sorted({os.path.normpath(p) for doc in traces for p in _strings(doc, "read")} - written):
        if path.startswith(_SYSTEM) or "/__pycache__/" in path or path.endswith((".pyc", ".pyo")):
            continue
        owner = dists.owner(path) if inside is None else None
        if owner is not None and owner[0] is not None and distributions is not None and not _discovery(path):
            distributions.add(owner[0])
        if _stdlib(path, stdlib) or _under(path, own):
            continue
        if inside is not None:
            if not _under(path, [inside]):
                env_file = "/site-packages/" in path or "/dist-packages/" in path
                unhashed += 0 if env_file or path.startswith(_CONTAINER_OWN) else 1
                continue
            path = os.path.normpath(os.path.join(str(base), os.path.relpath(path, inside)))
            if _under(path, own):
                continue
        try:
            st = os.stat(path)
        except OSError:
            # Not there: an open that failed (importlib.metadata tries every distribution's
            # entry_points.txt), or a scratch file gone since. A file only one run found is
            # still named: the other run's record lists it.
            continue
        if not os.path.isfile(path):
            continue
        if inside is not None:
            owner = dists.owner(path)
        if owner is not None and owner[1] in (None, st.st_size):
            continue  # compared by packages.<name>
        wanted.append(path)
    files: dict[str, FileRead] = {}
    left_out = 0
    for path, found in hash_files(wanted).items():
        shown = shown_path(path, base)
        if shown in skipped:
            continue
        if holds(shown):
            files[shown] = found
        else:
            left_out += 1
    variables, unset = _variables(traces, hook)
    executables = {os.path.realpath(doc["executable"]) for doc in traces if isinstance(doc.get("executable"), str)}
    untraced = {p for doc in traces for p in _strings(doc, "spawned") if not _is_python(p, executables)}
    if root_pid is not None and program and not any(doc.get("ppid") == root_pid for doc in traces):
        untraced.add(program)
    if distributions is not None:
        distributions |= dists.untold
        distributions |= _programs_of(dists, {p for doc in traces for p in _strings(doc, "spawned")})
    reads = Reads(files=files, variables=variables, unset=unset or None,
                  untraced=sorted(p for p in untraced if holds(p)) or None,
                  processes=len(traces), late=sum(doc.get("late") is True for doc in traces) or None,
                  unhashed=unhashed or None, left_out=left_out or None,
                  # None for none at all as well: a record's TOML keeps no empty list.
                  distributions=(sorted(d for d in distributions if holds(d)) or None) if distributions is not None else None)
    return reads, _state(traces, root_pid)


def _programs_of(dists: _Distributions, programs: Iterable[str]) -> set[str]:
    """The distributions that ship a program a process started (a wheel's ``bin/ninja``,
    ``ptxas`` of a CUDA wheel): it ran, though nothing traced what it read. A bare name is
    looked up on ``PATH`` as the run had it, which is envlock's own."""
    import shutil

    out: set[str] = set()
    for program in programs:
        found = program if os.path.isabs(program) else shutil.which(program)
        if not found:
            continue
        name = dists.shipping(os.path.normpath(found))
        if name is not None:
            out.add(name)
    return out


def _state(traces: Sequence[Mapping[str, Any]], root_pid: int | None) -> dict[str, Any]:
    """The process facts of the process that recorded (``envlock.record``'s rank 0), else of
    the command's own process, as ``[context]`` keys."""
    chosen = next((d for d in traces if d.get("recorded")), None) or next(
        (d for d in traces if d.get("ppid") == root_pid), None)
    state = chosen.get("state") if chosen is not None else None
    if not isinstance(state, dict):
        return {}
    return {STATE_KEYS[k]: v for k, v in state.items()
            if k in STATE_KEYS and isinstance(v, (bool, str)) and (not isinstance(v, str) or holds(v))}
