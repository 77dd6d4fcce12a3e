"""Installed distributions: every ``*.dist-info``/``*.egg-info`` on sys.path, and conda's own.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from .files import UnsafeFile, read_head, read_regular, read_text, sha256
from .rules import canonicalize_name, unreadable
from .scrub import strip_url

# Caps on what one distribution's files may hold (files.py says why every read has one). A
# METADATA's header block is read, never its description; torch's RECORD, among the largest,
# is about 2 MB.
MAX_METADATA = 16 << 20
MAX_RECORD = 64 << 20
MAX_DIRECT_URL = 1 << 20
# conda-meta records list every file of their package.
MAX_CONDA_META = 64 << 20


def _metadata_fields(text: str) -> Tuple[Optional[str], Optional[str]]:
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if name is None and line[:5].lower() == "name:":
            name = line[5:].strip()
        elif version is None and line[:8].lower() == "version:":
            version = line[8:].strip()
        if name is not None and version is not None:
            break
    return name, version


def _read_headers(path: str) -> Tuple[Optional[str], Optional[str]]:
    """Name and Version from a METADATA/PKG-INFO file, reading only the header block.

    (None, None) when there is no such file; ``OSError`` when it cannot be read safely."""
    try:
        head = read_head(path, 4096)
        name, version = _metadata_fields(head.decode("utf-8", "replace"))
        if (name is None or version is None) and b"\n\n" not in head:
            name, version = _metadata_fields(read_regular(path, MAX_METADATA).decode("utf-8", "replace"))
    except FileNotFoundError:
        return None, None
    return name, version


def distribution_name(info: str) -> Optional[str]:
    """The name a ``*.dist-info`` (or ``*.egg-info``) directory's distribution is known by
    (``packages.<name>`` of a record's context, the lock's ``[[packages]]``): its METADATA's
    (PKG-INFO's) Name, canonicalised as the scan above does; None when it has none or it cannot
    be read."""
    try:
        name, _ = _read_headers(os.path.join(info, "PKG-INFO" if info.endswith(".egg-info") else "METADATA"))
    except (OSError, ValueError):
        return None
    return canonicalize_name(name) if name else None


# Files an installer writes into the dist-info, not the wheel's: uv adds uv_cache.json (with a
# hash) when it installs from a local file, so a uv-made venv and its pip-restored image would
# otherwise name two builds of one wheel.
_NO_HASH_IN_RECORD = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "uv_cache.json")


def record_sha256(path: str) -> Optional[str]:
    """sha256 over the hashed, in-site-packages lines of RECORD, sorted.

    The raw RECORD differs between two venvs installing the same wheel: console scripts land
    in ``../../../bin`` with the venv's own interpreter in their shebang, and the installer adds
    INSTALLER/REQUESTED/direct_url.json (uv also uv_cache.json). Dropping those lines keeps a hash that names the exact
    build (every shipped file's hash) and is the same wherever that build is installed.
    """
    try:
        data = read_regular(path, MAX_RECORD)
    except FileNotFoundError:
        return None  # any other OSError is the distribution's error (collect_packages)
    return record_digest(data)


def record_libraries(data: bytes) -> List[str]:
    """The shared objects a RECORD lists inside its site directory (site-relative paths).

    Only the lines holding ".so" are looked at, found with bytes.find (memchr): torch's RECORD
    has 15,000 lines and a hundred libraries, and splitting every line in Python cost more than
    the rest of the scan.
    """
    libs = []
    at = data.find(b".so")
    while at >= 0:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        rel = data[start:end].split(b",", 1)[0].strip(b'"')
        leaf = rel.rsplit(b"/", 1)[-1]
        if (leaf.endswith(b".so") or b".so." in leaf) and not rel.startswith(b"../"):
            libs.append(rel.decode("utf-8", "surrogateescape"))
        at = data.find(b".so", end)
    return libs


class RecordReader:
    """``record_sha256`` of each RECORD, keeping the shared objects it lists from the same read
    (``libraries_of``): without the probe's cache, the package scan and the owners of the
    libraries a process loaded read every RECORD once between them."""

    def __init__(self) -> None:
        self.libraries: Dict[str, List[str]] = {}

    def __call__(self, path: str) -> Optional[str]:
        try:
            data = read_regular(path, MAX_RECORD)
        except FileNotFoundError:
            return None  # any other OSError is the distribution's error (collect_packages)
        self.libraries[path] = record_libraries(data)
        return record_digest(data)

    def libraries_of(self, path: str) -> Optional[List[str]]:
        if path not in self.libraries:
            try:
                self.libraries[path] = record_libraries(read_regular(path, MAX_RECORD))
            except OSError:
                return None
        return self.libraries[path]


def record_digest(data: bytes) -> str:
    """``record_sha256`` of a RECORD's bytes (also used on a wheel's own RECORD, unpacked)."""
    keep = []
    for raw in data.splitlines():
        if not raw or raw.startswith(b"../") or raw.startswith(b'"../'):
            continue
        head, sep, _size = raw.rpartition(b",")
        path_part, sep2, digest = head.rpartition(b",")
        if not sep or not sep2 or not digest:
            continue
        leaf = path_part.rstrip(b'"').rsplit(b"/", 1)[-1].decode("utf-8", "replace")
        if leaf in _NO_HASH_IN_RECORD:
            continue
        keep.append(raw)
    keep.sort()
    return sha256(b"\n".join(keep)).hexdigest()


def _direct_url(path: str) -> Dict[str, Any]:
    """Source of a distribution from PEP 610 ``direct_url.json`` (``OSError`` when it cannot
    be read safely; a file that is not PEP 610 JSON is an unknown source)."""
    try:
        data = json.loads(read_regular(path, MAX_DIRECT_URL).decode("utf-8"))
    except FileNotFoundError:
        return {"source": "unknown"}
    except (ValueError, RecursionError):
        return {"source": "unknown"}
    if not isinstance(data, dict):
        return {"source": "unknown"}
    url = strip_url(str(data.get("url", "")))
    out: Dict[str, Any] = {"url": url or None}
    if "vcs_info" in data:
        vcs = data["vcs_info"] or {}
        out.update({"source": "vcs", "vcs": vcs.get("vcs"), "commit": vcs.get("commit_id"),
                    "requested_revision": vcs.get("requested_revision")})
    elif "dir_info" in data:
        out["source"] = "editable" if (data["dir_info"] or {}).get("editable") else "local"
    elif "archive_info" in data:
        archive = data["archive_info"] or {}
        hashes = archive.get("hashes") or {}
        if "sha256" in hashes:
            out["archive_hash"] = "sha256=%s" % hashes["sha256"]
        elif archive.get("hash"):
            out["archive_hash"] = str(archive["hash"])
        out["source"] = "local" if url.startswith("file:") else "url"
    else:
        out["source"] = "unknown"
    return out


def path_entries(skip: Optional[str]) -> List[str]:
    seen = set()
    entries = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry in seen or (skip and entry == skip):
            continue
        seen.add(entry)
        entries.append(entry)
    return entries


def collect_packages(skip_dir: Optional[str] = None, locations: Optional[Dict[str, str]] = None,
                     deep_locations: Optional[List[Tuple[str, str, str]]] = None,
                     record_digest: Callable[[str], Optional[str]] = record_sha256,
                     errors: Optional[List[Dict[str, str]]] = None,
                     ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Every distribution visible on sys.path, first one wins, later ones reported as shadowed.

    Scanning ``*.dist-info`` directories ourselves is what importlib.metadata does, minus the
    full parse of METADATA (often megabytes of README) that dominates ``pip freeze``.
    ``locations``, when given, receives name -> metadata path of each active distribution (the
    OS packages block uses it to find the distributions an OS package owns).
    ``deep_locations`` collects ``(name, path entry, dist-info dir)`` of the active ones with a
    RECORD, for the deep check.
    ``errors``, when given, receives an ``[[unreadable]]`` entry for each distribution whose
    files cannot be read safely (a link to a device, a FIFO, an oversized or undecodable file),
    which is then left out: one bad distribution never empties the list or stops the scan, and
    the entry makes the lock say what it could not vouch for. Without it, the error is raised.
    """
    packages: List[Dict[str, Any]] = []
    duplicates: List[Dict[str, Any]] = []
    active: Dict[str, str] = {}
    # name -> (position in packages, metadata path), to recognise an editable project's own
    # build metadata when it shows up a second time on the path.
    seen: Dict[str, Tuple[int, str]] = {}
    for index, entry in enumerate(path_entries(skip_dir)):
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for fname in names:
            if fname.endswith(".dist-info"):
                kind = "dist-info"
            elif fname.endswith(".egg-info"):
                kind = "egg-info"
            else:
                continue
            full = os.path.join(entry, fname)
            try:
                found = _read_distribution(full, kind, record_digest)
            except Exception as exc:  # whatever one distribution holds is its own error
                if errors is None:
                    raise
                errors.append(unreadable("packages", _why(exc), fname))
                continue
            if found is None:
                continue
            cname, version, files, pkg = found
            if cname in active and kind == "egg-info":
                pos, _ = seen[cname]
                if _inside_editable(packages[pos], full):
                    continue  # the editable project's own src/NAME.egg-info, not a second copy
            if cname in active:
                pos, first = seen[cname]
                if first.endswith(".egg-info") and _inside_editable(pkg, first):
                    # The project's egg-info came first (src/ on PYTHONPATH): the editable
                    # install is the real entry, the egg-info its build metadata.
                    packages[pos], seen[cname], active[cname] = pkg, (pos, full), version
                    if locations is not None:
                        locations[cname] = full
                    _note_deep(deep_locations, cname, entry, fname, kind, files)
                else:
                    duplicates.append({"name": cname, "version": version,
                                       "active_version": active[cname], "path_index": index})
                continue
            active[cname] = version
            if locations is not None:
                locations[cname] = full
            _note_deep(deep_locations, cname, entry, fname, kind, files)
            seen[cname] = (len(packages), full)
            packages.append(pkg)
    packages.sort(key=lambda p: p["name"])
    return packages, duplicates


class _FileError(Exception):
    """A file of one distribution that cannot be read safely; the message names the file."""


def _reading(leaf: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # named here, then the distribution's error
        raise _FileError("%s: %s" % (leaf, _why(exc))) from None


def _why(exc: BaseException) -> str:
    """Why a file could not be read, in envlock's words: never the bytes that were read."""
    if isinstance(exc, _FileError):
        return str(exc)
    if isinstance(exc, UnsafeFile):
        return str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, UnicodeError):
        return "not UTF-8 text"
    return type(exc).__name__


def _read_distribution(full: str, kind: str, record_digest: Callable[[str], Optional[str]]
                       ) -> Optional[Tuple[str, str, Tuple[str, ...], Dict[str, Any]]]:
    """(name, version, the files of its metadata directory, its entry) of the distribution
    whose metadata is ``full``; None for what is not one (no metadata file at all). Raises
    when one of its files cannot be read safely."""
    files: Tuple[str, ...] = ()
    try:
        files = tuple(os.listdir(full))
    except (NotADirectoryError, FileNotFoundError):
        # A single-file egg-info (or a dangling link, which reads as nothing).
        name, version = _reading(os.path.basename(full), lambda: _read_headers(full))
    else:
        meta = "METADATA" if kind == "dist-info" else "PKG-INFO"
        name, version = _reading(meta, lambda: _read_headers(os.path.join(full, meta)))
    if not name or not version:
        return None
    cname = canonicalize_name(name)
    pkg: Dict[str, Any] = {"name": cname, "version": version, "source": "index"}
    if "INSTALLER" in files:
        installer = (read_text(os.path.join(full, "INSTALLER"), 256) or "").strip()
        if installer:
            pkg["installer"] = installer
    if kind == "dist-info":
        pkg["requested"] = "REQUESTED" in files
    if "direct_url.json" in files:
        pkg.update(_reading("direct_url.json",
                            lambda: _direct_url(os.path.join(full, "direct_url.json"))))
    if pkg.get("installer") == "conda" and pkg["source"] in ("local", "unknown", "index"):
        # conda-built wheels point at the build machine's file:// path; the package
        # really came from a conda channel (see [conda]).
        pkg["source"] = "conda"
        pkg.pop("url", None)
    if "RECORD" in files:
        pkg["record_sha256"] = _reading("RECORD", lambda: record_digest(os.path.join(full, "RECORD")))
        if pkg["record_sha256"] is None:  # listed, then not there: a dangling link
            raise _FileError("RECORD: not found")
    if kind == "egg-info" and pkg["source"] == "index":
        pkg["source"] = "unknown"
    return cname, version, files, {k: v for k, v in pkg.items() if v is not None}


def _note_deep(deep_locations: Optional[List[Tuple[str, str, str]]], name: str, entry: str,
               fname: str, kind: str, files: Tuple[str, ...]) -> None:
    """An active distribution with a RECORD is one the deep check re-hashes."""
    if deep_locations is not None and kind == "dist-info" and "RECORD" in files:
        deep_locations.append((name, entry, fname))


def _inside_editable(pkg: Dict[str, Any], metadata_path: str) -> bool:
    """True when ``metadata_path`` lies in the project directory of editable ``pkg``.

    setuptools leaves ``src/NAME.egg-info`` in a project whenever it builds it (a wheel, an
    sdist, an older editable install); with the project's src/ on sys.path that directory looks
    like a second, shadowed installation of the same distribution.
    """
    url = pkg.get("url") or ""
    if pkg.get("source") != "editable" or not url.startswith("file:"):
        return False
    from urllib.parse import unquote, urlsplit

    project = os.path.realpath(unquote(urlsplit(url).path))
    where = os.path.realpath(metadata_path)
    return where == project or where.startswith(project.rstrip(os.sep) + os.sep)


def collect_conda(errors: Optional[List[Dict[str, str]]] = None,
                  libraries: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """conda's own record of the environment; a record that cannot be read safely is an
    ``[[unreadable]]`` entry in ``errors`` (raised without it), as in ``collect_packages``.
    ``libraries``, when given, receives {absolute path: conda package} of every shared library
    a record lists (the owner of a library the process loaded from the environment's lib/)."""
    meta = os.path.join(sys.prefix, "conda-meta")
    if not os.path.isdir(meta):
        return None
    base = os.path.realpath(sys.prefix)  # /proc/self/maps names files by their real path
    pkgs = []
    for fname in sorted(os.listdir(meta)):
        if not fname.endswith(".json"):
            continue
        try:
            data = json.loads(read_regular(os.path.join(meta, fname), MAX_CONDA_META).decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except Exception as exc:  # whatever one record holds is its own error
            if errors is None:
                raise
            errors.append(unreadable("conda", _why(exc), fname))
            continue
        if libraries is not None and isinstance(data.get("name"), str):
            for rel in data.get("files") or ():
                if isinstance(rel, str) and (rel.endswith(".so") or ".so." in rel.rsplit("/", 1)[-1]):
                    libraries[os.path.normpath(os.path.join(base, rel))] = data["name"]
        pkgs.append(conda_record(data))
    return {"packages": pkgs}


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _texts(value: Any) -> Optional[List[str]]:
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v]
    return None


def conda_record(data: Dict[str, Any]) -> Dict[str, Any]:
    """The lock's entry of one ``conda-meta/*.json`` record (conda's, mamba's, micromamba's,
    pixi's and rattler's share the format): what the archive was (url, file name, hashes,
    size, subdir) and what it needs (depends, constrains), so that it can be exported, packed
    and installed again without a solver. Credentials are stripped from URLs; a field of the
    wrong type is left out, for the model to judge what remains."""
    channel = _text(data.get("channel")) or _text(data.get("schannel"))
    url = _text(data.get("url"))
    fn = _text(data.get("fn")) or (url.rsplit("/", 1)[-1] if url else None)
    noarch = data.get("noarch")
    if isinstance(noarch, dict):  # conda before 4.3 wrote {"type": "python"}
        noarch = noarch.get("type")
    requested = _texts(data.get("requested_specs"))
    if requested is None:
        requested = _texts(data.get("requested_spec"))
    entry = {
        "name": data.get("name"), "version": data.get("version"), "build": data.get("build"),
        "channel": strip_url(channel) if channel else None,
        "build_number": data.get("build_number") if type(data.get("build_number")) is int else None,
        "subdir": _text(data.get("subdir")),
        "fn": fn,
        "url": strip_url(url) if url else None,
        "md5": _text(data.get("md5")),
        "sha256": _text(data.get("sha256")),
        "size": data.get("size") if type(data.get("size")) is int else None,
        "depends": _texts(data.get("depends")),
        "constrains": _texts(data.get("constrains")),
        "noarch": noarch if noarch in ("python", "generic") else None,
        "requested_specs": requested or None,
    }
    return {k: v for k, v in entry.items() if v is not None}


# x86-64 micro-architecture levels (the psABI's), by the /proc/cpuinfo flags each adds. conda's
# __archspec names a CPU model (zen2, skylake) from archspec's database; without it the probe
# reports the generic level, which archspec lists among that model's ancestors.
_X86_64_LEVELS = (
    ("x86_64_v2", ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")),
    ("x86_64_v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")),
    ("x86_64_v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
)


def archspec(machine: str, cpu_flags: Optional[List[str]]) -> str:
    """The generic micro-architecture of this CPU: x86_64_v1..v4 by its flags, else the machine."""
    if machine != "x86_64" or cpu_flags is None:
        return machine
    have = set(cpu_flags)
    level = machine
    for name, needs in _X86_64_LEVELS:
        if not have.issuperset(needs):
            break
        level = name
    return level


def _cpu_flags() -> Optional[List[str]]:
    for line in (read_text("/proc/cpuinfo", 1 << 20) or "").splitlines():
        if line.startswith("flags"):
            return line.partition(":")[2].split()
    return None


def virtual_packages(platform: Optional[Dict[str, Any]], gpu: Optional[Dict[str, Any]]
                     ) -> List[Dict[str, str]]:
    """The virtual packages a conda solver would detect on this host (``__unix``, ``__linux``,
    ``__glibc``, ``__cuda``, ``__archspec``), from facts the probe read already: the platform's
    kernel and C library, and NVML's CUDA driver version."""
    out = []
    platform = platform or {}
    if os.name == "posix":
        out.append({"name": "__unix", "version": "0", "build": "0"})
    kernel = platform.get("kernel") or ""
    version = ".".join(part for part in kernel.split("-", 1)[0].split(".")[:3] if part.isdigit())
    if platform.get("os") == "Linux" and version:
        out.append({"name": "__linux", "version": version, "build": "0"})
    if platform.get("libc") == "glibc" and platform.get("libc_version"):
        out.append({"name": "__glibc", "version": str(platform["libc_version"]), "build": "0"})
    if gpu and gpu.get("cuda_driver"):
        out.append({"name": "__cuda", "version": str(gpu["cuda_driver"]), "build": "0"})
    machine = platform.get("machine")
    if machine:
        out.append({"name": "__archspec", "version": "1",
                    "build": archspec(str(machine), _cpu_flags() if machine == "x86_64" else None)})
    return out
