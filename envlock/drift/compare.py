"""One comparator for ``verify``, ``diff`` and the check inside restored containers.

Each difference carries a dotted path, the old and new value and a severity:

* ``breaking`` - results may differ or the code may not run: a package version, torch/CUDA/cuDNN,
  a determinism flag, a seed, the image digest, the canary's bytes;
* ``warning``  - worth a look, rarely changes numbers: driver version, a rebuilt wheel with the
  same version, the OS release;
* ``info``     - recorded for the reader: git commit, kernel, CPU model, unrelated env vars.

``verify`` fails (exit 1) on breaking differences only. A field's severity is declared beside
the field in the models (``envlock.lock``'s policies); what is compared by code of its own (the
image's identity, python's version, the canary; the packages in ``packages``) is here,
so every command agrees on what counts as drift.

What the environment *is* (packages, torch build, driver, image, variables set before start)
is apart from what a process *set* (seeds, torch's determinism flags, variables set by
``seed_everything()``/``deterministic()`` or training code: ``[determinism].process_env``).
A fresh process - a shell ``verify``, the check inside a restored image - cannot have the
second, so ``compare(..., process_state="report")`` moves those differences to
``Comparison.process``: reported as recorded, not counted as drift. In-process
``envlock.verify()`` (after ``apply()``) compares everything (``"compare"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from envlock.drift import native, packages
from envlock.drift.result import (
    OS_FROM_BASE_ENV as OS_FROM_BASE_ENV,  # where callers import it from
)
from envlock.drift.result import (
    SEVERITY_RANK,
    Collector,
    Comparison,
    Difference,
    ProcessState,
    Severity,
    Words,
    dump,
)
from envlock.lock import (
    Determinism,
    GpuDevice,
    GpuInfo,
    Lock,
    Platform,
    PythonInfo,
    Seeds,
    TorchBuild,
    TorchInfo,
    severities,
)
from envlock.probe.rules import COMPILE_ENV_PREFIXES, is_path_variable
from envlock.text.terminal import plural

# How a change of each field counts, as its model declares it (``Policy`` beside the field).
_PLATFORM = severities(Platform)
_PYTHON = severities(PythonInfo)
_TORCH = severities(TorchInfo)
_TORCH_BUILD = severities(TorchBuild)
_GPU = severities(GpuInfo)
_GPU_DEVICE = severities(GpuDevice)
_DETERMINISM = severities(Determinism)
# Determinism fields read without torch (the others are unknown when torch was not probed).
_NOT_FROM_TORCH = {"late"}
_SEEDS = severities(Seeds)
_ENV_WARNING = {"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH"}


def _python(c: Collector, old: Lock, new: Lock) -> None:
    a, b = old.python, new.python
    if a.version != b.version:
        same_minor = a.version.split(".")[:2] == b.version.split(".")[:2]
        c.add("python", "python.version", a.version, b.version, "warning" if same_minor else "breaking")
    c.fields("python", "python", dump(a), dump(b), _PYTHON)


def _image(c: Collector, old: Lock, new: Lock, expected_image_change: bool) -> None:
    a, b = old.image, new.image
    if expected_image_change:
        if (a.digest, a.id) != (b.digest, b.id):
            c.add("image", "image", a.digest or a.id, b.digest or b.id, "info",
                  "image differs from the lock's, as requested (--base)")
        return
    if a.digest and b.digest:
        if a.digest != b.digest:
            c.add("image", "image.digest", a.digest, b.digest, "breaking")
    elif a.id and b.id and a.id != b.id:
        c.add("image", "image.id", a.id, b.id, "breaking")
    elif (a.digest or a.id) and not (b.digest or b.id):
        w = c.words
        c.add("image", "image.digest", a.digest or a.id, None, "warning",
              f"{w.old} names an image, {w.new} names none" if w.is_diff else
              "the lock names an image, but this environment cannot tell its own image "
              "(outside a container, or run without ENVLOCK_IMAGE_DIGEST)")
    if a.in_container != b.in_container:
        c.add("image", "image.in_container", a.in_container, b.in_container, "info")


def _torch(c: Collector, old: Lock, new: Lock) -> None:
    if old.torch is None and new.torch is None:
        return
    if old.torch is None or new.torch is None:
        skipped = "torch" in new.probe.errors and "skipped" in new.probe.errors.get("torch", "")
        not_probed = (f"torch was not probed in {c.words.new} (--no-torch)" if c.words.is_diff
                      else "torch was not probed (--no-torch)")
        c.add("torch", "torch", old.torch and old.torch.version, new.torch and new.torch.version,
              "warning" if skipped else "breaking", not_probed if skipped else "")
        return
    a, b = dump(old.torch), dump(new.torch)
    build_a, build_b = a.pop("build", {}), b.pop("build", {})
    opts_a, opts_b = build_a.pop("options", {}), build_b.pop("options", {})
    explained = len(c.items)
    c.fields("torch", "torch.build", build_a, build_b, _TORCH_BUILD)
    # Each build option is judged as the options table is.
    c.fields("torch", "torch.build.options", opts_a, opts_b, {}, default=_TORCH_BUILD["options"])
    explained = len(c.items) - explained
    config_a, config_b = a.pop("config_sha256", None), b.pop("config_sha256", None)
    if config_a != config_b and not explained:
        # The readable build fields say what changed when they can; the hash is the fallback.
        c.add("torch", "torch.config_sha256", config_a, config_b, "warning",
              "torch.__config__.show() differs in a line envlock does not parse "
              "(or one side predates [torch.build])")
    c.fields("torch", "torch", a, b, _TORCH)


def _gpu(c: Collector, old: Lock, new: Lock) -> None:
    a, b = old.gpu, new.gpu
    if a is None and b is None:
        return
    if a is None or b is None:
        names_a = [d.name for d in a.devices] if a else None
        names_b = [d.name for d in b.devices] if b else None
        w = c.words
        if w.is_diff:
            message = f"no GPU in {w.new}" if b is None else f"GPUs in {w.new}, none in {w.old}"
        else:
            message = "no GPU visible now" if b is None else "GPUs visible now, none in the lock"
        c.add("gpu", "gpu", names_a, names_b, "warning", message)
        return
    c.fields("gpu", "gpu", dump(a), dump(b), _GPU)
    if len(a.devices) != len(b.devices):
        now = f"in {c.words.new}" if c.words.is_diff else "now"
        c.add("gpu", "gpu.devices", len(a.devices), len(b.devices), "warning",
              f"{plural(len(a.devices), 'GPU')} in {c.words.old}, {len(b.devices)} {now}")
    for i, (da, db) in enumerate(zip(a.devices, b.devices, strict=False)):
        c.fields("gpu", f"gpu.devices[{i}]", dump(da), dump(db), _GPU_DEVICE)


def _determinism(c: Collector, old: Lock, new: Lock) -> None:
    a, b = dump(old.determinism), dump(new.determinism)
    env_a, env_b = a.pop("env", {}), b.pop("env", {})
    if old.determinism.torch_loaded and not new.determinism.torch_loaded:
        c.add("determinism", "determinism", None, None, "warning",
              f"torch flags not compared: torch was not loaded in {c.words.new}" if c.words.is_diff
              else "torch flags not compared: torch was not loaded in this capture")
        # Compare only what was probed: thread counts come from torch too, so without torch
        # they are unknown, not "removed".
        a = {k: v for k, v in a.items() if k in _NOT_FROM_TORCH}
        b = {k: v for k, v in b.items() if k in _NOT_FROM_TORCH}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        severity = _DETERMINISM.get(key, "breaking")
        if (va is None or vb is None) and severity == "breaking":
            severity = "warning"  # the knob exists in only one of the two torch versions
        c.add("determinism", f"determinism.{key}", va, vb, severity)
    seeded = _reported_by_seeds(old, new)
    c.fields("determinism", "determinism.env", {k: v for k, v in env_a.items() if k not in seeded},
             {k: v for k, v in env_b.items() if k not in seeded}, {}, default="breaking")


def _compile_variables(names: set[str]) -> dict[str, Severity]:
    """torch.compile's variables choose kernels (a warning to look at); those that name a cache
    directory are info here, the caches' contents being compared under ``compile.caches``."""
    return {n: "info" if is_path_variable(n) else "warning"
            for n in names if n.startswith(COMPILE_ENV_PREFIXES)}


def _reported_by_seeds(old: Lock, new: Lock) -> set[str]:
    """Variables that [seeds] already reports (as python_hash_seed, seed, seed_source)."""
    names = {"PYTHONHASHSEED"}
    if old.seeds.seed is not None or new.seeds.seed is not None:
        names |= {"ENVLOCK_SEED", "ENVLOCK_SEED_SOURCE"}
    return names


def _canary(c: Collector, old: Lock, new: Lock) -> None:
    """Numeric drift: the same seeded kernels give other bytes, whatever the versions say.

    Each mismatch names the settings that also differ (threads, oneDNN, CPU ISA, TF32), because
    those are the usual explanation when every version matches.
    """
    if old.canary is None or new.canary is None:
        return
    if old.canary.version != new.canary.version:
        c.add("canary", "canary.version", old.canary.version, new.canary.version, "warning",
              "canary kernels changed between envlock versions; hashes not compared")
        return
    settings_a, settings_b = old.canary.settings, new.canary.settings
    changed = [f"{k} {settings_a.get(k, '-')} -> {settings_b.get(k, '-')}"
               for k in sorted(set(settings_a) | set(settings_b)) if settings_a.get(k) != settings_b.get(k)]
    more = f", and {len(changed) - 4} more" if len(changed) > 4 else ""
    hint = f" (settings differ: {', '.join(changed[:4])}{more})" if changed else ""
    a = {(r.name, r.device, r.dtype): r.sha256 for r in old.canary.results}
    b = {(r.name, r.device, r.dtype): r.sha256 for r in new.canary.results}
    for key in sorted(set(a) | set(b)):
        name, device, dtype = key
        path = f"canary.{name}[{device},{dtype}]"
        if key in a and key in b:
            if a[key] != b[key]:
                c.add("canary", path, a[key][:12], b[key][:12], "breaking",
                      f"numeric drift: {name} on {device} ({dtype}) gives different bytes{hint}")
        elif key in a:
            why = new.canary.errors.get(f"{name}[{device},{dtype}]")
            c.add("canary", path, a[key][:12], None, "warning" if why else "info",
                  f"{name} on {device} ({dtype}) "
                  + (f"failed {c.words.where_new()}: {why}" if why else f"not run {c.words.where_new()}"))
        else:
            c.add("canary", path, None, b[key][:12], "info", f"{name} on {device} not in {c.words.old}")
    # Settings reported elsewhere (a variable, a determinism flag, the CPU ISA) appear once:
    # in the hint above and under their own path, not again as canary.settings.*.
    seen = set(old.env) | set(new.env) | set(old.determinism.env) | set(new.determinism.env)
    elsewhere = {f"env.{k}" for k in seen} | set(dump(old.determinism)) | set(dump(new.determinism))
    if old.torch and new.torch and old.torch.cpu_capability and new.torch.cpu_capability:
        elsewhere.add("cpu_capability")
    c.fields("canary", "canary.settings", {k: v for k, v in settings_a.items() if k not in elsewhere},
             {k: v for k, v in settings_b.items() if k not in elsewhere}, {}, default="info")


def _unreadable(c: Collector, old: Lock, new: Lock) -> None:
    """What a probe could not capture (``[[unreadable]]``) is breaking, on either side: the lock
    cannot vouch for what it could not read, nor can this environment be said to match what it
    cannot read now. Fail closed: a distribution whose files are a device or a FIFO must not
    verify as an unnoticed addition. A diff reports only the entries the two files disagree on
    (two identical files are no difference)."""
    w = c.words
    before = {(u.section, u.item or ""): u.error for u in old.unreadable}
    now = {(u.section, u.item or ""): u.error for u in new.unreadable}
    for section, item in sorted(set(before) | set(now)):
        a, b = before.get((section, item)), now.get((section, item))
        if w.is_diff and a == b:
            continue
        what = f"{section} {item}" if item else f"the {section} section"
        if a is not None and b is not None:
            message = f"{what} could not be captured in {w.old} nor {w.where_new()}: {b}"
        elif a is not None:
            message = f"{what} could not be captured in {w.old}: {a}"
        else:
            message = f"{what} cannot be read {w.where_new()}: {b}"
        c.add("unreadable", f"unreadable.{section}" + (f".{item}" if item else ""), a, b,
              "breaking", message)


def _hash_seed_hint(c: Collector) -> None:
    """PYTHONHASHSEED is fixed when an interpreter starts, so a shell verify of a training run
    launched with it must be started with it too: say how, instead of "removed (was 1234)"."""
    if c.words.is_diff:
        return
    for i, d in enumerate(c.items):
        if d.path == "seeds.python_hash_seed" and d.old is not None and d.new is None:
            c.items[i] = d._replace(message=f"PYTHONHASHSEED={d.old} in the lock, unset here: "
                                            f"run with PYTHONHASHSEED={d.old}")


# Seeds a process sets (seed_everything); PYTHONHASHSEED is fixed at start, so it is environment
# unless the process changed the variable itself.
_SEEDS_PROCESS = {"seeds.seed", "seeds.seed_source", "seeds.torch_initial_seed"}


def _is_process_state(d: Difference, names: set[str]) -> bool:
    path = d.path
    if path in _SEEDS_PROCESS:
        return True
    if path == "seeds.python_hash_seed":
        return "PYTHONHASHSEED" in names
    for prefix in ("determinism.env.", "env."):
        if path.startswith(prefix):
            return path[len(prefix):] in names
    # torch's knobs (and which were set too late), torch.compile's settings and the compile
    # cache it loaded are set by the process; their defaults follow from the torch build and the
    # variables above, which stay compared.
    return (path.startswith("determinism.") and path != "determinism.torch_loaded") \
        or path.startswith("compile.settings.") or path == "compile.loaded"


def compare(old: Lock, new: Lock, *, expected_image_change: bool = False, strict: bool = False,
            names: tuple[str, str] | None = None,
            process_state: ProcessState = "compare") -> Comparison:
    """Differences from ``old`` (the lock, or diff's A) to ``new`` (now, or B), most severe first.

    With ``strict``, warnings fail the comparison as well as breaking differences. ``names``
    (diff's two file names) makes messages speak of A and B instead of the lock and this
    environment. ``process_state="report"``: ``new`` is a fresh process, so what ``old``'s
    process set is returned in ``Comparison.process`` instead of as drift (see the module
    docstring).
    """
    c = Collector(Words(names[0], names[1], is_diff=True) if names else None)
    _image(c, old, new, expected_image_change)
    c.fields("platform", "platform", dump(old.platform), dump(new.platform), _PLATFORM)
    _python(c, old, new)
    _torch(c, old, new)
    native.cuda_libraries(c, old, new)
    _gpu(c, old, new)
    native.device_kernels(c, old, new)
    _determinism(c, old, new)
    seeds_a, seeds_b = dump(old.seeds), dump(new.seeds)
    if not new.determinism.torch_loaded:
        # torch.initial_seed() is only known where torch was loaded.
        seeds_a.pop("torch_initial_seed", None)
        seeds_b.pop("torch_initial_seed", None)
    c.fields("seeds", "seeds", seeds_a, seeds_b, _SEEDS)
    _hash_seed_hint(c)
    env_rules: dict[str, Severity] = {k: "warning" for k in _ENV_WARNING}
    env_rules.update(_compile_variables(set(old.env) | set(new.env)))
    # A numerics variable is reported once, as determinism.env.X (where it is breaking).
    numerics = set(old.determinism.env) | set(new.determinism.env) | _reported_by_seeds(old, new)
    c.fields("env", "env", {k: v for k, v in old.env.items() if k not in numerics},
             {k: v for k, v in new.env.items() if k not in numerics}, env_rules, default="info")
    packages.packages(c, old, new)
    packages.conda(c, old, new)
    packages.os_packages(c, old, new)
    native.libraries(c, old, new)
    native.runtimes(c, old, new)
    native.compile_state(c, old, new)
    _unreadable(c, old, new)
    _canary(c, old, new)
    gold, gnew = dump(old.git), dump(new.git)
    c.fields("git", "git", gold, gnew, {}, default="info")
    ordered = sorted(c.items, key=lambda d: SEVERITY_RANK[d.severity])
    if process_state == "compare":
        return Comparison(tuple(ordered), strict=strict)
    set_by_process = set(old.determinism.process_env) | set(new.determinism.process_env)
    flags = [_is_process_state(d, set_by_process) for d in ordered]
    return Comparison(tuple(d for d, p in zip(ordered, flags, strict=True) if not p),
                      tuple(d for d, p in zip(ordered, flags, strict=True) if p), strict=strict)


def as_info(cmp: Comparison, matches: Callable[[Difference], bool], why: str) -> Comparison:
    """``cmp`` with the differences ``matches`` picks reported as info, ``why`` appended: a
    difference expected by construction (e.g. inside a restored image) is told, not counted."""
    moved = [d._replace(severity="info", message=f"{d.describe()} ({why})") if matches(d) else d
             for d in cmp.differences]
    return cmp._replace(differences=tuple(sorted(moved, key=lambda d: SEVERITY_RANK[d.severity])))


def os_packages_from_base(cmp: Comparison) -> Comparison:
    """OS package differences as info: what the restore's own check inside the image decides,
    so an in-process ``envlock.verify()`` there agrees with it."""
    return as_info(cmp, lambda d: d.category == "os_packages", "OS packages come from the base image")


def os_packages_come_from_base() -> bool:
    """True inside an image `envlock run` started whose OS packages are its base's."""
    return os.environ.get(OS_FROM_BASE_ENV) == "base"

