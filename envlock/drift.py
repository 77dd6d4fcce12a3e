"""One comparator for ``verify``, ``diff`` and the check inside restored containers.

Each difference carries a dotted path, the old and new value and a severity:

* ``breaking`` - results may differ or the code may not run: a package version, torch/CUDA/cuDNN,
  a determinism flag, a seed, the image digest, the canary's bytes;
* ``warning``  - worth a look, rarely changes numbers: driver version, a rebuilt wheel with the
  same version, the OS release;
* ``info``     - recorded for the reader: git commit, kernel, CPU model, unrelated env vars.

``verify`` fails (exit 1) on breaking differences only. The table of severities lives here and
nowhere else, so every command agrees on what counts as drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from envlock.model import Lock

Severity = Literal["breaking", "warning", "info"]
SEVERITY_RANK = {"breaking": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Difference:
    category: str
    path: str
    old: Any
    new: Any
    severity: Severity
    message: str = ""

    def describe(self) -> str:
        if self.message:
            return self.message
        if self.old is None:
            return f"added: {self.new}"
        if self.new is None:
            return f"removed (was {self.old})"
        return f"{self.old} -> {self.new}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "severity": self.severity,
            "message": self.describe(),
        }


@dataclass(frozen=True)
class Comparison:
    """The differences between an expected lock (``old``) and an actual one (``new``)."""

    differences: tuple[Difference, ...] = field(default_factory=tuple)

    @property
    def breaking(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.severity == "breaking")

    @property
    def ok(self) -> bool:
        return not self.breaking

    def count(self, severity: Severity) -> int:
        return sum(1 for d in self.differences if d.severity == severity)

    def by_category(self, category: str) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.category == category)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": {s: self.count(s) for s in ("breaking", "warning", "info")},
            "differences": [d.to_dict() for d in self.differences],
        }


class _Collector:
    def __init__(self) -> None:
        self.items: list[Difference] = []

    def add(self, category: str, path: str, old: Any, new: Any, severity: Severity, message: str = "") -> None:
        self.items.append(Difference(category, path, old, new, severity, message))

    def fields(
        self,
        category: str,
        prefix: str,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        rules: Mapping[str, Severity],
        default: Severity | None = None,
    ) -> None:
        """Compare two flat dicts; keys without a rule use ``default`` (None: ignored)."""
        for key in sorted(set(old) | set(new)):
            severity = rules.get(key, default)
            if severity is None:
                continue
            a, b = old.get(key), new.get(key)
            if a != b:
                self.add(category, f"{prefix}.{key}", a, b, severity)


def _dump(model: Any) -> dict[str, Any]:
    return {} if model is None else dict(model.model_dump(mode="json", exclude_none=True))


_PLATFORM: dict[str, Severity] = {
    "machine": "breaking", "os": "breaking", "os_id": "warning", "os_version_id": "warning",
    "libc": "warning", "libc_version": "warning", "kernel": "info", "cpu_model": "info",
    "cpu_count": "info",
}
_PYTHON: dict[str, Severity] = {
    "implementation": "breaking", "soabi": "breaking", "platform_tag": "warning",
    "prefix_kind": "info",
}
_TORCH: dict[str, Severity] = {
    "version": "breaking", "git_version": "breaking", "cuda": "breaking", "cudnn": "breaking",
    "nccl": "breaking", "hip": "breaking", "debug": "breaking", "cxx11_abi": "breaking",
    "arch_list": "warning", "config_sha256": "warning", "mkl": "warning", "mkldnn": "warning",
    "openmp": "warning", "cuda_available": "warning", "device_count": "info",
}
_GPU: dict[str, Severity] = {"source": "info", "driver": "warning", "cuda_driver": "warning"}
_GPU_DEVICE: dict[str, Severity] = {
    "name": "warning", "compute_capability": "warning", "memory_total_mib": "warning",
    "mig_mode": "warning",
}
_DETERMINISM_SOFT: dict[str, Severity] = {
    "num_threads": "warning", "num_interop_threads": "warning", "late": "warning", "torch_loaded": "info",
}
_SEEDS: dict[str, Severity] = {
    "seed": "breaking", "python_hash_seed": "breaking", "hash_randomization": "breaking",
    "torch_initial_seed": "breaking", "seed_source": "info",
}
_PACKAGE: dict[str, Severity] = {
    "version": "breaking", "source": "warning", "url": "warning", "vcs": "breaking",
    "commit": "breaking", "archive_hash": "warning", "record_sha256": "warning",
    "requested_revision": "info", "installer": "info", "requested": "info",
    # Only compared when both locks were captured with --deep (deepreport.align).
    "files_sha256": "breaking", "files_changed": "breaking",
}
_ENV_WARNING = {"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH"}


def _python(c: _Collector, old: Lock, new: Lock) -> None:
    a, b = old.python, new.python
    if a.version != b.version:
        same_minor = a.version.split(".")[:2] == b.version.split(".")[:2]
        c.add("python", "python.version", a.version, b.version, "warning" if same_minor else "breaking")
    c.fields("python", "python", _dump(a), _dump(b), _PYTHON)


def _image(c: _Collector, old: Lock, new: Lock, expected_image_change: bool) -> None:
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
        c.add("image", "image.digest", a.digest or a.id, None, "warning",
              "the lock names an image, but this environment cannot tell its own image "
              "(outside a container, or run without ENVLOCK_IMAGE_DIGEST)")
    if a.in_container != b.in_container:
        c.add("image", "image.in_container", a.in_container, b.in_container, "info")


def _torch(c: _Collector, old: Lock, new: Lock) -> None:
    if old.torch is None and new.torch is None:
        return
    if old.torch is None or new.torch is None:
        skipped = "torch" in new.probe.errors and "skipped" in new.probe.errors.get("torch", "")
        c.add("torch", "torch", old.torch and old.torch.version, new.torch and new.torch.version,
              "warning" if skipped else "breaking",
              "torch was not probed (--no-torch)" if skipped else "")
        return
    c.fields("torch", "torch", _dump(old.torch), _dump(new.torch), _TORCH)


def _gpu(c: _Collector, old: Lock, new: Lock) -> None:
    a, b = old.gpu, new.gpu
    if a is None and b is None:
        return
    if a is None or b is None:
        names_a = [d.name for d in a.devices] if a else None
        names_b = [d.name for d in b.devices] if b else None
        c.add("gpu", "gpu", names_a, names_b, "warning",
              "no GPU visible now" if b is None else "GPUs visible now, none in the lock")
        return
    c.fields("gpu", "gpu", _dump(a), _dump(b), _GPU)
    if len(a.devices) != len(b.devices):
        c.add("gpu", "gpu.devices", len(a.devices), len(b.devices), "warning",
              f"{len(a.devices)} GPU(s) in the lock, {len(b.devices)} now")
    for i, (da, db) in enumerate(zip(a.devices, b.devices, strict=False)):
        c.fields("gpu", f"gpu.devices[{i}]", _dump(da), _dump(db), _GPU_DEVICE)


def _determinism(c: _Collector, old: Lock, new: Lock) -> None:
    a, b = _dump(old.determinism), _dump(new.determinism)
    env_a, env_b = a.pop("env", {}), b.pop("env", {})
    if old.determinism.torch_loaded and not new.determinism.torch_loaded:
        c.add("determinism", "determinism", None, None, "warning",
              "torch flags not compared: torch was not loaded in this capture")
        a = {k: v for k, v in a.items() if k in _DETERMINISM_SOFT}
        b = {k: v for k, v in b.items() if k in _DETERMINISM_SOFT}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        severity = _DETERMINISM_SOFT.get(key, "breaking")
        if (va is None or vb is None) and severity == "breaking":
            severity = "warning"  # the knob exists in only one of the two torch versions
        c.add("determinism", f"determinism.{key}", va, vb, severity)
    c.fields("determinism", "determinism.env", env_a, env_b, {}, default="breaking")


def _packages(c: _Collector, old: Lock, new: Lock) -> None:
    a = {p.name: p for p in old.packages}
    b = {p.name: p for p in new.packages}
    for name in sorted(set(a) | set(b)):
        pa, pb = a.get(name), b.get(name)
        if pa is None and pb is not None:
            c.add("packages", f"packages.{name}", None, pb.version, "breaking",
                  f"{name} {pb.version} is installed but not in the lock")
        elif pb is None and pa is not None:
            c.add("packages", f"packages.{name}", pa.version, None, "breaking",
                  f"{name} {pa.version} is in the lock but not installed")
        elif pa is not None and pb is not None and pa != pb:
            da, db = _dump(pa), _dump(pb)
            if da.get("version") != db.get("version"):
                c.add("packages", f"packages.{name}.version", pa.version, pb.version, "breaking",
                      f"{name} {pa.version} -> {pb.version}")
                continue  # a new version explains every other field of the same package
            for key in sorted(set(da) | set(db)):
                if key == "name" or da.get(key) == db.get(key):
                    continue
                severity = _PACKAGE.get(key, "info")
                message = ""
                if key == "record_sha256":
                    message = f"{name} {pa.version}: same version, different build (RECORD differs)"
                c.add("packages", f"packages.{name}.{key}", da.get(key), db.get(key), severity, message)
    dup_a = {(d.name, d.version) for d in old.duplicates}
    dup_b = {(d.name, d.version) for d in new.duplicates}
    for name, version in sorted(dup_a ^ dup_b):
        gone = (name, version) in dup_a
        c.add("packages", f"duplicates.{name}", version if gone else None, None if gone else version,
              "warning", f"shadowed copy of {name} {version} " + ("gone" if gone else "appeared"))


def _conda(c: _Collector, old: Lock, new: Lock) -> None:
    a = {p.name: p for p in (old.conda.packages if old.conda else [])}
    b = {p.name: p for p in (new.conda.packages if new.conda else [])}
    for name in sorted(set(a) | set(b)):
        pa, pb = a.get(name), b.get(name)
        if pa is None or pb is None:
            c.add("conda", f"conda.{name}", pa and pa.version, pb and pb.version, "breaking")
        elif pa.version != pb.version:
            c.add("conda", f"conda.{name}.version", pa.version, pb.version, "breaking")
        elif pa.build != pb.build or pa.channel != pb.channel:
            c.add("conda", f"conda.{name}.build", f"{pa.channel}/{pa.build}", f"{pb.channel}/{pb.build}", "warning")


def _canary(c: _Collector, old: Lock, new: Lock) -> None:
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
                  f"{name} on {device} ({dtype}) " + (f"failed here: {why}" if why else "not run here"))
        else:
            c.add("canary", path, None, b[key][:12], "info", f"{name} on {device} not in the lock")
    c.fields("canary", "canary.settings", settings_a, settings_b, {}, default="info")


def compare(old: Lock, new: Lock, *, expected_image_change: bool = False) -> Comparison:
    """Differences from ``old`` (the lock, or diff's A) to ``new`` (now, or B), most severe first."""
    c = _Collector()
    _image(c, old, new, expected_image_change)
    c.fields("platform", "platform", _dump(old.platform), _dump(new.platform), _PLATFORM)
    _python(c, old, new)
    _torch(c, old, new)
    _gpu(c, old, new)
    _determinism(c, old, new)
    c.fields("seeds", "seeds", _dump(old.seeds), _dump(new.seeds), _SEEDS)
    env_rules: dict[str, Severity] = {k: "warning" for k in _ENV_WARNING}
    c.fields("env", "env", old.env, new.env, env_rules, default="info")
    _packages(c, old, new)
    _conda(c, old, new)
    _canary(c, old, new)
    gold, gnew = _dump(old.git), _dump(new.git)
    c.fields("git", "git", gold, gnew, {}, default="info")
    ordered = sorted(c.items, key=lambda d: SEVERITY_RANK[d.severity])
    return Comparison(tuple(ordered))

