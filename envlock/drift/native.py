"""The comparator's sections for what runs beneath the packages: the native libraries a process
loaded and the BLAS/OpenMP runtimes among them (``[native]``), torch.compile's state
(``[compile]``), the CUDA libraries torch loaded against those it was built with, and what the
torch build has for each GPU.

A lock written before these tables existed has none of them: a section absent on either side
is not compared (absent is not drift). What a process loaded depends on what it imported, so a
library or runtime present on one side only is reported as info, never counted; one loaded on
both sides from another file is drift when it is one of the libraries that decide numerics
(``rules.numerics_library``), named with both paths.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envlock.drift.requirements import release_numbers
from envlock.drift.result import Collector
from envlock.lock import CudaLibrary, Library, Lock, Runtime
from envlock.probe.rules import RUNTIME_FIELDS, numerics_library

_CUDA_LABELS = {"cudart": "the CUDA runtime", "cudnn": "cuDNN", "cublas": "cuBLAS", "nccl": "NCCL",
                "cufft": "cuFFT", "curand": "cuRAND", "cusolver": "cuSOLVER",
                "cusparse": "cuSPARSE", "cusparselt": "cuSPARSELt", "nvrtc": "NVRTC"}
# torch.cudnn already is the loaded cuDNN (compared as [torch]); torch.nccl is the NCCL torch
# was compiled against, so the loaded one is compared here.
_LOADED_ELSEWHERE = {"cudnn"}


def _identity(lib: Library) -> tuple[str, ...]:
    """What makes two entries the same file: its owner and its place in the owner (the path of
    a venv differs between hosts, a RECORD's relative path does not), or its bytes."""
    if lib.deleted:
        return ("deleted", lib.path)
    if lib.distribution:
        return ("distribution", lib.distribution, lib.file or lib.name)
    if lib.conda_package:
        return ("conda", lib.conda_package, lib.name)
    if lib.os_package:
        return ("os", lib.os_package, lib.path)
    return ("sha256", lib.sha256 or lib.path)


def where(lib: Library) -> str:
    """A library's file and who vouches for it, as messages name it."""
    if lib.deleted:
        return f"{lib.path} (deleted or replaced after it was loaded)"
    if lib.distribution:
        return f"{lib.path} (distribution {lib.distribution})"
    if lib.conda_package:
        return f"{lib.path} (conda package {lib.conda_package})"
    if lib.os_package:
        return f"{lib.path} (OS package {lib.os_package})"
    return f"{lib.path} (no package vouches for it; sha256 {(lib.sha256 or '?')[:12]})"


def _by_name(libraries: Iterable[Library]) -> dict[str, list[Library]]:
    out: dict[str, list[Library]] = {}
    for lib in libraries:
        out.setdefault(lib.name, []).append(lib)
    return out


def libraries(c: Collector, old: Lock, new: Lock) -> None:
    """The native libraries each process had loaded, by name: a numerics library loaded from
    another file is breaking (it computes the numbers), one loaded by one process only is info
    (that process imported less), and any other library that moved is info."""
    if old.native is None or new.native is None:
        return
    w = c.words
    a, b = _by_name(old.native.libraries), _by_name(new.native.libraries)
    for name in sorted(set(a) | set(b)):
        numerics = numerics_library(name)
        if name not in a or name not in b:
            if numerics:  # the other process did not load it: it imported less, or other things
                side = w.old if name in a else w.new
                only = a.get(name) or b.get(name) or []
                c.add("native", f"native.libraries.{name}", where(only[0]) if name in a else None,
                      where(only[0]) if name in b else None, "info",
                      f"{name} was loaded only in {side}'s process ({where(only[0])})")
            continue
        ids_a, ids_b = sorted(map(_identity, a[name])), sorted(map(_identity, b[name]))
        if ids_a == ids_b:
            continue
        before, after = "; ".join(map(where, a[name])), "; ".join(map(where, b[name]))
        here = w.where_new() if w.is_diff else "now"
        c.add("native", f"native.libraries.{name}", before, after,
              "breaking" if numerics else "info",
              f"{name} is loaded from another file: {before} in {w.old}, {after} {here}")


def learnt_by_both(a: Any, b: Any) -> bool:
    """Whether a runtime's field (``RUNTIME_FIELDS``) is compared: both sides have it. A process
    learns these fields by asking the runtime through threadpoolctl; one without threadpoolctl
    names its runtimes from their files alone, so a field one side lacks is not a difference
    (installing threadpoolctl between two runs changes no runtime). Verify and a replay's
    context both follow this rule (``runtime_field``)."""
    return a is not None and b is not None


def runtime_field(key: str) -> bool:
    """Whether a flat context key is one of a runtime's fields (``context_form``'s
    ``native.runtimes.<runtime>.<field>``), compared only when ``learnt_by_both``."""
    return key.startswith("native.runtimes.") and key.rsplit(".", 1)[-1] in RUNTIME_FIELDS


def _pair_runtimes(a: Sequence[Runtime], b: Sequence[Runtime]
                   ) -> tuple[list[tuple[Runtime, Runtime]], list[Runtime], list[Runtime]]:
    """Runtimes paired by (api, implementation) where each side has one of that kind (numpy's
    OpenBLAS changes its file name with every numpy), else by file name."""
    pairs: list[tuple[Runtime, Runtime]] = []
    left, right = list(a), list(b)
    for rt in list(left):
        kind = (rt.api, rt.implementation)
        same_a = [x for x in left if (x.api, x.implementation) == kind]
        same_b = [x for x in right if (x.api, x.implementation) == kind]
        match = same_b[0] if len(same_a) == 1 and len(same_b) == 1 else next(
            (x for x in same_b if x.library == rt.library), None)
        if match is not None:
            pairs.append((rt, match))
            left.remove(rt)
            right.remove(match)
    return pairs, left, right


def runtimes(c: Collector, old: Lock, new: Lock) -> None:
    """The BLAS and OpenMP runtimes, paired by API and implementation: a version, threading
    layer, architecture or thread count that differs can change how sums are ordered, which no
    package version shows."""
    if old.native is None or new.native is None:
        return
    pairs, only_a, only_b = _pair_runtimes(old.native.runtimes, new.native.runtimes)
    for ra, rb in pairs:
        label = f"{ra.implementation} ({ra.api})"
        for field in RUNTIME_FIELDS:
            va, vb = getattr(ra, field), getattr(rb, field)
            if learnt_by_both(va, vb) and va != vb:
                c.add("native", f"native.runtimes.{ra.api}.{ra.implementation}.{field}", va, vb,
                      "warning", f"{label} {field.replace('_', ' ')}: {va} -> {vb}")
    for side, rt in [(c.words.old, r) for r in only_a] + [(c.words.new, r) for r in only_b]:
        c.add("native", f"native.runtimes.{rt.api}.{rt.implementation}",
              rt.library if side == c.words.old else None,
              rt.library if side == c.words.new else None, "info",
              f"{rt.implementation} ({rt.api}, {rt.library}) was loaded only in {side}'s process")


def compile_state(c: Collector, old: Lock, new: Lock) -> None:
    """torch.compile's settings and Triton, compared only where both processes had imported
    them: an older lock, or a process that never compiled, did not look."""
    a, b = old.compile, new.compile
    if a is None or b is None:
        return
    if a.triton != b.triton:  # the triton package's own change is judged with the packages
        c.add("compile", "compile.triton", a.triton, b.triton, "info")
    if a.settings and b.settings:  # read only where the process had imported them
        for key in sorted(set(a.settings) | set(b.settings)):
            va, vb = a.settings.get(key), b.settings.get(key)
            if va != vb:
                c.add("compile", f"compile.settings.{key}", va, vb,
                      "breaking" if va is not None and vb is not None else "warning",
                      f"torch.compile setting {key}: {va} -> {vb}" if va is not None and vb is not None
                      else "")
    if a.loaded != b.loaded:
        c.add("compile", "compile.loaded", a.loaded, b.loaded, "warning", _loaded_message(a.loaded, b.loaded))
    caches_a = {x.kind: x for x in a.caches}
    caches_b = {x.kind: x for x in b.caches}
    for kind in sorted(set(caches_a) & set(caches_b)):
        ca, cb = caches_a[kind], caches_b[kind]
        if (ca.files, ca.sha256) != (cb.files, cb.sha256):
            state = ("cold (empty)" if not cb.files else "warm") if cb.files != ca.files else "other entries"
            c.add("compile", f"compile.caches.{kind}", f"{ca.files} files", f"{cb.files} files",
                  "info", f"{kind} cache {cb.path}: {ca.files} files -> {cb.files} ({state}; "
                  "a compiled model runs the kernels its cache and autotuning pick)")
        elif ca.path != cb.path:
            c.add("compile", f"compile.caches.{kind}.path", ca.path, cb.path, "info")


def _loaded_message(a: str | None, b: str | None) -> str:
    """A compile cache loaded on one side and not the other is cold against warm: the kernels
    of a warm run are the ones the cache holds, a cold one's are what it compiles and tunes."""
    def name(digest: str | None) -> str:
        return f"compile cache {digest[:12]}" if digest else "none (compiled cold)"
    return f"compile cache loaded before compiling: {name(a)} -> {name(b)}"


def mismatch(built: str, loaded: str) -> str | None:
    """How far ``loaded`` is from ``built``, on the parts both name ("13.0" against "13.0.96"):
    None when they agree, "major" for another major version, "older" or "newer" otherwise."""
    a, b = release_numbers(built), release_numbers(loaded)
    n = min(len(a), len(b))
    if not n or a[:n] == b[:n]:
        return None
    if a[0] != b[0]:
        return "major"
    return "older" if b[:n] < a[:n] else "newer"


def _mismatch_text(name: str, lib: CudaLibrary) -> str:
    return f"torch was built against {_CUDA_LABELS[name]} {lib.built}; the process loaded {lib.loaded}"


def cuda_libraries(c: Collector, old: Lock, new: Lock) -> None:
    """The CUDA libraries torch loaded: a version torch was not built against (a cuDNN from
    LD_LIBRARY_PATH; in a verify whenever this environment has one, in a diff when B has one A
    did not), and a loaded library (but cuDNN, compared as ``torch.cudnn``) that changed."""
    a = (old.torch.cuda_libraries if old.torch else None) or {}
    b = (new.torch.cuda_libraries if new.torch else None) or {}
    for name in sorted(set(a) | set(b)):
        la, lb = a.get(name), b.get(name)
        if lb is not None and lb.built and lb.loaded and not (c.words.is_diff and la == lb):
            how = mismatch(lb.built, lb.loaded)
            if how is not None:
                c.add("torch", f"torch.cuda_libraries.{name}", la.loaded if la else None, lb.loaded,
                      "breaking" if how == "major" else "warning",
                      _mismatch_text(name, lb) + (" (another major version: its kernels and API "
                                                  "differ)" if how == "major" else ""))
                continue
        if name in _LOADED_ELSEWHERE or la is None or lb is None:
            continue
        if la.loaded != lb.loaded and la.loaded and lb.loaded:
            c.add("torch", f"torch.cuda_libraries.{name}.loaded", la.loaded, lb.loaded, "breaking",
                  f"{_CUDA_LABELS[name]} loaded: {la.loaded} -> {lb.loaded}")


def device_kernels(c: Collector, old: Lock, new: Lock) -> None:
    """A GPU the torch build has no kernels for (breaking) or only PTX for (warning): in a
    verify whenever this host has one (its GPU code cannot run, or runs JIT-compiled code), in
    a diff when B has one that A did not."""
    if new.gpu is None or new.torch is None:
        return
    before = {d.index: d.torch_kernels for d in old.gpu.devices} if old.gpu else {}
    for device in new.gpu.devices:
        kernels = device.torch_kernels
        if kernels not in ("ptx", "none") or (c.words.is_diff and before.get(device.index) == kernels):
            continue
        archs = ", ".join(new.torch.arch_list) or "none"
        what = (f"GPU {device.index} ({device.name}, compute capability "
                f"{device.compute_capability}): torch {new.torch.version}")
        if kernels == "none":
            c.add("gpu", f"gpu.devices[{device.index}].torch_kernels", before.get(device.index),
                  kernels, "breaking", f"{what} has no kernels for it (built for {archs})")
        else:
            c.add("gpu", f"gpu.devices[{device.index}].torch_kernels", before.get(device.index),
                  kernels, "warning", f"{what} has only PTX for it, which the driver JIT-compiles "
                  f"(other code than a native build's; built for {archs})")


# Of the other libraries a replay record keeps those no package vouches for, at most this many
# (by name): a process maps a few of them (the interpreter's own libpython, a project's custom op,
# a preloaded library), and a record stays small.
MAX_CONTEXT_UNOWNED = 32


def _unowned(lib: Library) -> bool:
    return not (lib.distribution or lib.conda_package or lib.os_package)


def runtime_keys(runtimes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each runtime's name in a record's context, in order: its kind (``blas.openblas``) where
    the process loaded one of that kind, so that it meets its counterpart whatever its file is
    called (numpy's OpenBLAS changes its file name with every numpy), as ``_pair_runtimes`` pairs
    them; else its kind and file name, so that two of one kind (libgomp and libiomp5, numpy's and
    scipy's OpenBLAS) are both kept; two files of one name, by their directory too."""
    kinds = Counter((r["api"], r["implementation"]) for r in runtimes)
    keys = [f"{r['api']}.{r['implementation']}" + (
        f".{r['library']}" if kinds[(r["api"], r["implementation"])] > 1 else "") for r in runtimes]
    same = Counter(keys)
    return [key + (f".{os.path.basename(os.path.dirname(str(r.get('path') or '')))}"
                   if same[key] > 1 else "") for key, r in zip(keys, runtimes, strict=True)]


def _vouchers(form: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """What each owner a library can have says of the files it installed, by (kind of owner, as
    messages name it, and name): a distribution's version and RECORD digest (a wheel rebuilt at one version has
    another), a conda package's version and build, an OS package's version (an OS upgrade of
    libgomp or OpenBLAS keeps its path and its package's name)."""
    out: dict[tuple[str, str], str] = {}
    for p in form.get("packages") or ():
        if isinstance(p, Mapping) and p.get("name"):
            digest = f", RECORD sha256 {p['record_sha256']}" if p.get("record_sha256") else ""
            out[("distribution", p["name"])] = f"{p.get('version')}{digest}"
    conda = form.get("conda")
    for p in (conda.get("packages") or ()) if isinstance(conda, Mapping) else ():
        if isinstance(p, Mapping) and p.get("name"):
            build = f" {p['build']}" if p.get("build") else ""
            out[("conda package", p["name"])] = f"{p.get('version')}{build}"
    versions: dict[str, set[str]] = {}
    os_packages = form.get("os_packages")
    for spec in (os_packages.get("packages") or ()) if isinstance(os_packages, Mapping) else ():
        name, _, version = str(spec).partition("=")  # name:arch=version
        versions.setdefault(name.split(":", 1)[0], set()).add(version)
    out.update({("OS package", name): ",".join(sorted(v)) for name, v in versions.items()})
    return out


def _content(lib: Library, vouchers: Mapping[tuple[str, str], str]) -> str | None:
    """What identifies the bytes of a library a package vouches for (``_vouchers``; the owner's
    name alone where its facts were not captured); None for one nobody vouches for, whose
    ``where`` already carries its own sha256, and for one deleted since it was loaded."""
    for kind, owner in (("distribution", lib.distribution), ("conda package", lib.conda_package),
                        ("OS package", lib.os_package)):
        if owner and not lib.deleted:
            known = vouchers.get((kind, owner))
            return f"{kind} {owner} {known}" if known else f"{kind} {owner}"
    return None


# A distribution as ``where`` (``path (distribution NAME)``) and ``_content`` (``distribution NAME
# VERSION, ...``) name it in a record's ``native.libraries.*`` and ``native.content.*``.
_DISTRIBUTION_NAMED = re.compile(r"\bdistribution ([^\s);,]+)")


def distributions_named(value: str) -> set[str]:
    """The distributions a ``native.libraries.*`` or ``native.content.*`` value of a record's
    context names as vouching for a library the process loaded: the process ran their code, so
    a replay counts them as read (``replay.compare``). Read from the text ``where`` and
    ``_content`` write, here beside them; a word too many only keeps a cause."""
    return set(_DISTRIBUTION_NAMED.findall(value))


def context_form(form: Mapping[str, Any]) -> dict[str, Any]:
    """A lock's canonical form with its lists of libraries, runtimes and caches keyed by what
    pairs them, for a replay record's flat ``[context]`` (``replay/compare.context_of``): a list
    flattened by position would pair the 12th library of one run with the 12th of the other.
    ``[[packages]]`` is left out (the context keeps each version, by name, on its own).

    Each library is kept as where it was loaded from: those that decide numerics
    (``native.libraries``), and, whatever their name, those no package vouches for
    (``native.unowned``, with ``native.unowned_count``: how many there were, which also marks a
    record that kept them): a custom op's library rebuilt in place, a ``libfoo.so`` found on
    ``LD_LIBRARY_PATH`` or preloaded. A library that decides numerics and that a package
    vouches for is also kept as what identifies its bytes (``native.content``, ``_content``): at
    one path, a rebuilt wheel or an upgraded OS package runs other code. Any other library a
    package ships changes with that package's version, which the record keeps as
    ``packages.<name>``; the kernels torch.compile built and loaded from its caches are the
    caches' (``compile.caches.*``): one file per kernel, named by its contents, and in a fresh
    cache directory at every cold start. Runtimes are keyed by ``runtime_keys``."""
    out = {k: v for k, v in form.items() if k != "packages"}
    native = form.get("native")
    compiled = form.get("compile")
    if isinstance(native, dict):
        libs = [Library.model_validate(x) for x in native.get("libraries") or ()]
        runtimes_ = native.get("runtimes") or ()
        groups = _by_name(libs)
        vouchers = _vouchers(form)
        caches = tuple(os.path.join(str(c.get("path")), "") for c in
                       (compiled.get("caches") or () if isinstance(compiled, dict) else ())
                       if isinstance(c, dict) and c.get("path"))
        others = sorted(name for name, group in groups.items() if not numerics_library(name)
                        and any(_unowned(x) and not x.path.startswith(caches) for x in group))
        numerics = {name: group for name, group in groups.items() if numerics_library(name)}
        content = {name: [c for c in (_content(x, vouchers) for x in group) if c]
                   for name, group in numerics.items()}
        out["native"] = {
            "libraries": {name: "; ".join(where(x) for x in group) for name, group in numerics.items()},
            "content": {name: "; ".join(found) for name, found in content.items() if found},
            "unowned": {name: "; ".join(where(x) for x in groups[name])
                        for name in others[:MAX_CONTEXT_UNOWNED]},
            "unowned_count": len(others),
            "runtimes": {key: {k: v for k, v in r.items() if k in (*RUNTIME_FIELDS, "library")}
                         for key, r in zip(runtime_keys(runtimes_), runtimes_, strict=True)},
        }
    if isinstance(compiled, dict):
        out["compile"] = {
            "triton": compiled.get("triton"), "settings": compiled.get("settings") or {},
            "loaded": compiled.get("loaded"),
            "caches": {x["kind"]: {"files": x.get("files"), "sha256": x.get("sha256")}
                       for x in compiled.get("caches") or ()}}
    return out
