"""The probe's orchestration: run every collector, guarded, and print one JSON document.

Rules every collector follows: a subprocess is an argv list with no shell and a timeout; a
missing tool or library leaves the field out and records the reason in ``probe.errors``; a
collector that raises never takes the whole probe down. Torch is imported only when it is
installed and asked for; if the calling process already imported it, its *live* flags are read.
Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import statcache
from .cache import cache_read, cache_write, library_stats, torch_cache_key
from .env import collect_env
from .files import read_text
from .flags import DOCUMENT_MARKER, FLAGS, INT, REPEATED, SWITCH
from .git import GitJob
from .gpu import collect_gpu, nvml_timeout_from_env
from .image import collect_image
from .native import collect_runtimes, loaded_libraries
from .packages import RecordReader, collect_conda, collect_packages, virtual_packages
from .procs import run_tool
from .requires import derive as derive_requires
from .requires import wheel_glibc
from .rules import kernels_for, unreadable
from .scrub import scrub_lock_document, secret_values
from .source import PROBE_VERSION
from .statcache import Clock, RecordDigests, load_os_packages
from .system import collect_platform, collect_python
from .torchstack import (
    collect_determinism,
    collect_seeds,
    collect_torch,
    cuda_libraries,
    torch_pins,
    want_torch,
)

DEFAULT_GIT_TIMEOUT = 5.0
# Sections a lock cannot do without: when one cannot be collected, the lock says so in
# ``[[unreadable]]`` (which verify counts as breaking), never just leaves it empty.
MUST_CAPTURE = ("packages", "os_packages", "conda", "deep")
# ``collect(torch=CACHED_ONLY)``: torch's facts from the cache or none at all, never an import
# (verify's kept check in envlock's own process: an answer that needs torch imported is no
# answer kept, and the probe in another interpreter gives it).
CACHED_ONLY = "cached"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while envlock works inside a training process, and
    on again afterwards (when it was on).

    After ``import torch`` the collector tracks some 165,000 objects, and every full collection
    walks all of them. The probe's document and, for ``envlock.capture()``, the building of the
    lock's models allocate enough to set off several: measured, they were half of what
    ``envlock.capture()`` added to a training process (``benchmarks/training.py``). What envlock
    allocates meanwhile holds no cycle that must be freed at once; the first collection after
    the pause frees any.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cacheable(torch: str, canary: bool) -> bool:
    # Seeds are process state, and the canary runs kernels: both need the real torch.
    return torch in ("auto", CACHED_ONLY) and not canary and "torch" not in sys.modules \
        and "ENVLOCK_SEED" not in os.environ


def collect(torch: str = "auto", canary: bool = False, image: Optional[str] = None,
            cwd: Optional[str] = None, git_timeout: Optional[float] = None,
            nvml_timeout: Optional[float] = None, skip_dir: Optional[str] = None,
            deep: bool = False, cache: bool = False, progress: bool = False,
            processes: bool = False, git_exclude: Sequence[str] = (),
            now_ns: Clock = time.time_ns, hash_cache: Optional[bool] = None,
            git: bool = True, refresh: bool = False) -> Dict[str, Any]:
    """Probe this interpreter and process; return a JSON-ready document (never raises).

    ``torch``: "auto" imports it when installed, "no" never; ``CACHED_ONLY`` reads its facts
    from the cache (as ``cache``) and, where none are kept, leaves ``[torch]`` out with the
    reason in ``probe.errors`` rather than importing it.

    ``git_exclude``: files left out of the git state (the lock about to be written).

    ``cache``: reuse the torch facts of an earlier run when nothing they depend on changed
    (see the ``cache`` module); only for a fresh interpreter, never a training process.

    ``hash_cache``: reuse what was learnt of files while their stat is unchanged (``statcache``,
    ``filehashes``): each RECORD's digest and shared libraries, the parsed OS package database,
    which OS package lists a library, the hashes of loaded libraries no package vouches for.
    They describe files, not the process, so a training process may use them too: its first
    ``envlock.record()`` then reads torch's 15,000-line RECORD and the package database once per
    change, not at every start. None: as ``cache``. Without it nothing is read or written.

    ``now_ns``: the clock the stat-keyed caches judge a file's age by (``statcache``).

    ``refresh`` (``--no-cache``, with ``cache`` False): read no torch facts, import torch, and
    write what it told under the key, replacing a stale entry; one that was only bypassed would
    be served again by the next run without the flag. Only for a fresh interpreter, as ``cache``.

    ``git``: read the working tree's git state (``[git]``). A replay record's context keeps no
    git facts (envlock reads the workspace's git state itself, before the command starts), so
    ``envlock.record()`` does not start git from inside a training process.
    """
    start = time.perf_counter()
    errors: Dict[str, str] = {}
    failed: List[Dict[str, str]] = []  # [[unreadable]]: what the lock cannot vouch for
    doc: Dict[str, Any] = {}
    git_timeout = git_timeout if git_timeout is not None else float(
        os.environ.get("ENVLOCK_GIT_TIMEOUT", DEFAULT_GIT_TIMEOUT))
    nvml_timeout = nvml_timeout if nvml_timeout is not None else nvml_timeout_from_env()
    git_job = GitJob(cwd or os.getcwd(), git_timeout, git_exclude) if git else None
    files_cache = cache if hash_cache is None else hash_cache

    def guard(section: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # one broken collector must not lose the others
            errors[section] = "%s: %s" % (type(exc).__name__, exc)
            if section in MUST_CAPTURE:
                # The type only: a message may quote what was read.
                failed.append(unreadable(section, "not captured: %s" % type(exc).__name__))
            return None

    doc["image"] = guard("image", lambda: collect_image(image)) or {"source": "none"}
    doc["platform"] = guard("platform", collect_platform)
    doc["python"] = guard("python", collect_python)
    locations: Dict[str, str] = {}
    deep_locations: List[Tuple[str, str, str]] = []
    records = guard("cache", lambda: RecordDigests(now_ns)) if files_cache else None
    reader = RecordReader()
    pkgs = guard("packages", lambda: collect_packages(skip_dir, locations, deep_locations,
                                                      records or reader, failed))
    doc["packages"], doc["duplicates"] = pkgs if pkgs else ([], [])
    databases: List[Any] = []
    os_packages = guard("os_packages", lambda: collect_os_packages(
        doc["packages"], locations, cache=files_cache, now_ns=now_ns, found=databases))
    if os_packages:
        doc["os_packages"] = os_packages
    if deep:
        guard("deep", lambda: _deep_check(doc, deep_locations, progress, processes, cache, now_ns))
    conda_libraries: Dict[str, str] = {}
    conda = guard("conda", lambda: collect_conda(failed, conda_libraries))
    if conda is not None:
        doc["conda"] = conda
    key = guard("cache", lambda: torch_cache_key(
        records, doc["packages"] if pkgs is not None else None)) \
        if (cache or refresh) and _cacheable(torch, canary) else None

    def libraries_of(record: str) -> Optional[List[str]]:
        scanned = records.scan(record) if records is not None else None
        return scanned[1] if scanned is not None else reader.libraries_of(record)
    facts = cache_read(key) if key and cache else None
    gpu = None
    if facts is not None:
        gpu = guard("gpu", lambda: collect_gpu(None, nvml_timeout))
        if (gpu is None or gpu[0] is None) and facts["torch"].get("cuda_available"):
            facts = None  # NVML failed: only a live torch.cuda can describe the GPUs
    if facts is not None:
        torch_mod = None
        doc["torch"] = facts["torch"]
        det = dict(facts["determinism"])
        det.update(guard("determinism", lambda: collect_determinism(None)) or {})
        det["torch_loaded"] = True
        doc["determinism"] = det
    else:
        torch_mod, why = (None, "no cached torch facts") if torch == CACHED_ONLY else want_torch(torch)
        if torch_mod is not None:
            info = guard("torch", lambda: collect_torch(torch_mod))
            if info:
                doc["torch"] = info
                libs = guard("torch", lambda: cuda_libraries(
                    torch_mod, _mapped_now(), torch_pins(
                        _metadata_head(locations.get("torch")),
                        _metadata_head(locations.get("cuda-toolkit")))))
                if libs:
                    info["cuda_libraries"] = libs
        elif why:
            errors["torch"] = why
        gpu = guard("gpu", lambda: collect_gpu(torch_mod, nvml_timeout))
        doc["determinism"] = guard("determinism", lambda: collect_determinism(torch_mod)) or {}
    if gpu:
        if gpu[0] is not None:
            doc["gpu"] = gpu[0]
            guard("gpu", lambda: _device_kernels(doc))
        elif gpu[1]:  # None: no NVIDIA driver on this host, which is no error
            errors["gpu"] = gpu[1]
    doc["seeds"] = guard("seeds", lambda: collect_seeds(torch_mod)) or {}
    doc["env"] = guard("env", collect_env) or {}
    if canary:
        result = guard("canary", lambda: run_canary(torch_mod))
        if result:
            doc["canary"] = result
    # Native code as loaded, read after everything this run imports (torch, NVML, the canary):
    # with cached facts, the libraries and runtimes `import torch` loaded come from the cache.
    # Where the mapped libraries cannot be read (no maps file, one unreadable or over its cap),
    # there is no [native] at all, and the error says why: an empty one would be a process that
    # loaded nothing, and a comparison would name every library the other side loaded.
    mapped = guard("native", loaded_libraries)
    loaded = mapped or []
    runtimes: Tuple[List[Dict[str, Any]], str] = ([], "maps")
    if mapped is not None:
        if facts is not None:
            loaded = sorted(set(loaded) | set(facts.get("libraries") or ()))
            runtimes = (facts.get("runtimes") or [], facts.get("runtimes_source") or "maps")
        else:
            runtimes = guard("native", lambda: collect_runtimes(loaded)) or ([], "maps")
        native = guard("native", lambda: _native(
            loaded, runtimes, deep_locations, libraries_of, conda_libraries, databases,
            files_cache, now_ns))
        if native is not None:
            doc["native"] = native
    if "torch" in doc:
        from .compilestate import collect_compile

        compiled = guard("compile", lambda: collect_compile(doc["packages"]))
        if compiled is not None:
            doc["compile"] = compiled
    if "conda" in doc:
        doc["conda"]["virtual_packages"] = guard("conda", lambda: virtual_packages(
            doc.get("platform"), doc.get("gpu"))) or []
    requires = guard("requires", lambda: derive_requires(
        doc.get("torch"), wheel_glibc(deep_locations, libraries_of)))
    if requires:
        doc["requires"] = requires
    if records is not None:
        records.save()
    if facts is None and key and "torch" in doc and "torch" not in errors \
            and "determinism" not in errors and "native" not in errors and "native" in doc:
        # The flags of this fresh interpreter, minus what is read live on every run; the files
        # importing torch mapped and the runtimes among them.
        flags = {k: v for k, v in doc["determinism"].items() if k not in ("env", "late")}
        cache_write(key, {"torch": doc["torch"], "determinism": flags, "libraries": loaded,
                          "library_stats": library_stats(loaded),
                          "runtimes": runtimes[0], "runtimes_source": runtimes[1]})
    if git_job is not None:
        state, git_error = git_job.collect()
        if state is not None:
            doc["git"] = {k: v for k, v in state.items() if v is not None}
        elif git_error:
            errors["git"] = git_error
    if failed:
        doc["unreadable"] = failed
    doc["probe"] = {"version": PROBE_VERSION, "errors": errors,
                    "duration_ms": round((time.perf_counter() - start) * 1000, 1)}
    if "torch" in doc:
        doc["probe"]["torch_facts"] = "cached" if facts is not None else "live"
    return scrub_lock_document(doc, secret_values())


def collect_os_packages(packages: List[Dict[str, Any]], locations: Dict[str, str],
                        root: str = "/", cache: bool = False, now_ns: Clock = time.time_ns,
                        found: Optional[List[Any]] = None) -> Optional[Dict[str, Any]]:
    """``[os_packages]`` of ``root``; distributions an OS package owns become source "system".

    ``cache``: reuse the parsed database while its file is unchanged (``statcache.load_os_packages``).
    ``found``, when given, receives the database (which also names the owners of libraries).
    """
    from . import ospkgs

    db = load_os_packages(root, run_tool, now_ns) if cache else ospkgs.load(root, run_tool)
    if db is None:
        return None
    if found is not None:
        found.append(db)
    ospkgs.mark_system(packages, locations, db)
    doc: Dict[str, Any] = db.document()
    return doc


def _metadata_head(dist_info: Optional[str]) -> str:
    """The header block of a dist-info's METADATA ("" when there is none to read)."""
    if not dist_info:
        return ""
    text = read_text(os.path.join(dist_info, "METADATA"), 1 << 18) or ""
    return text.split("\n\n", 1)[0]


def _device_kernels(doc: Dict[str, Any]) -> None:
    """Each GPU's ``torch_kernels``: what the torch build has for its compute capability."""
    arch_list = (doc.get("torch") or {}).get("arch_list") or []
    for device in doc["gpu"].get("devices") or []:
        found = kernels_for(str(device.get("compute_capability") or ""), arch_list)
        if found:
            device["torch_kernels"] = found


def _native(loaded: List[str], runtimes: Tuple[List[Dict[str, Any]], str],
            dists: List[Tuple[str, str, str]], libraries_of: Callable[[str], Optional[List[str]]],
            conda_libraries: Dict[str, str], databases: List[Any], hash_cache: bool,
            now_ns: Clock) -> Dict[str, Any]:
    """``[native]``: every library mapped into this process and who vouches for it, and the
    BLAS/OpenMP runtimes among them."""
    from .filehashes import FileHashes
    from .native import NoHashes, describe_libraries, distribution_files

    owners = distribution_files(dists, libraries_of)
    hashes = FileHashes([NATIVE_HASHES], now_ns=now_ns) if hash_cache else NoHashes()
    db = databases[0] if databases else None
    if db is not None and hash_cache:
        # Which package lists a library is a fact of dpkg's files, remembered by their stat
        # (``statcache``) in a training process too: reading every list costs tens of ms.
        db.dpkg_owners = lambda info_dir, wanted, kind: statcache.dpkg_owners(
            info_dir, wanted, now_ns, kind)
    libraries = describe_libraries(loaded, owners, conda_libraries,
                                   db.file_owners if db is not None else None, hashes)
    out: Dict[str, Any] = {"libraries": libraries, "runtimes": runtimes[0]}
    if runtimes[0]:
        out["runtimes_source"] = runtimes[1]
    return out


def _mapped_now() -> List[str]:
    """The libraries mapped now, for what torch's CUDA libraries say of themselves; [] where
    they cannot be read (then no loaded version is known, and [native]'s error says why)."""
    try:
        return loaded_libraries() or []
    except OSError:
        return []


# The stat cache of the loaded libraries' hashes, apart from --deep's per site directory.
NATIVE_HASHES = "<native libraries>"


def _deep_check(doc: Dict[str, Any], locations: List[Tuple[str, str, str]], progress: bool,
                processes: bool, cache: bool, now_ns: Clock = time.time_ns) -> None:
    """``--deep``: every file of every active distribution against its RECORD, and in a conda
    prefix every file of every conda package against its ``conda-meta`` record (deep.py).

    Findings go to ``doc["deep"]`` (the verify report, not part of a lock); each package gets
    ``files_sha256`` (its files as they are on disk) and ``files_changed`` when any differ.
    Files whose stat is unchanged since an earlier check are not read (filehashes.py); without
    ``cache`` every file is, and the cache is rewritten from what was read.
    """
    from . import deep
    from .filehashes import FileHashes

    cb = None
    if progress:
        def cb(files: int, total_files: int, nbytes: int, total_bytes: int) -> None:
            # One line per tick on stderr, which the CLI reads and draws; never on stdout.
            sys.stderr.write("\x1eenvlock-progress %d %d %d %d\n"
                             % (files, total_files, nbytes, total_bytes))
            sys.stderr.flush()
    conda_prefix = sys.prefix if os.path.isdir(os.path.join(sys.prefix, "conda-meta")) else None
    hashes = FileHashes([site for _, site, _ in locations] + ([conda_prefix] if conda_prefix else []),
                        read=cache, now_ns=now_ns)
    report = deep.check(locations, progress=cb, processes=processes, stat_cache=hashes,
                        conda_prefix=conda_prefix)
    hashes.save()
    report["stat_cache"] = hashes.state
    by_name = {p["name"]: p for p in doc.get("packages", [])}
    for name, digest in report.pop("digests").items():
        pkg = by_name.get(name)
        if pkg is None:
            continue
        pkg["files_sha256"] = digest
        found = report["dists"].get(name)
        if found:
            pkg["files_changed"] = deep.changes(found)
    doc["deep"] = report


def run_canary(torch_mod: Any) -> Optional[Dict[str, Any]]:
    if torch_mod is None:
        raise RuntimeError("the canary needs torch")
    from . import kernels  # imported only when a canary runs

    result: Optional[Dict[str, Any]] = kernels.run(torch_mod)
    return result


def parser() -> argparse.ArgumentParser:
    """The probe's argument parser, built from the one table envlock writes them from."""
    parser = argparse.ArgumentParser(
        prog="probe", description="The envlock probe: prints what it knows about this environment as JSON.")
    for flag in FLAGS:
        if flag.kind == SWITCH:
            parser.add_argument(flag.name, action="store_true", help=flag.help)
        elif flag.kind == REPEATED:
            parser.add_argument(flag.name, action="append", default=flag.default(), help=flag.help)
        else:
            parser.add_argument(flag.name, type=int if flag.kind == INT else str, help=flag.help)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = vars(parser().parse_args(sys.argv[1:] if argv is None else argv))
    here = os.path.dirname(os.path.abspath(__file__))  # never a distribution of its own
    # Run as a program, this is a fresh interpreter of our own: its torch state is a fresh
    # import's (cacheable) and it may fork hashing workers.
    doc = collect(torch="no" if args["no_torch"] else "auto", canary=args["canary"],
                  image=args["image"], cwd=args["cwd"], skip_dir=here, deep=args["deep"],
                  cache=not args["no_cache"] and not os.environ.get("ENVLOCK_NO_CACHE"),
                  refresh=args["no_cache"] and not os.environ.get("ENVLOCK_NO_CACHE"),
                  progress=args["progress"], processes=True, git_exclude=args["git_exclude"])
    # A line of its own even after start-up output that did not end its line.
    sys.stdout.write("\n%s\n" % DOCUMENT_MARKER)
    sys.stdout.write(json.dumps(doc, indent=args["indent"], sort_keys=True))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
