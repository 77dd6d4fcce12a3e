"""A host judged against a lock's declared requirements (``[requires]``) alone.

``verify`` compares everything the capturing host had; a CPU-only CI runner verifying a lock
made on a GPU box then reports every GPU fact as missing, and passes or fails nothing useful.
``verify --requirements`` asks only what the lock declares a host needs, and for each
requirement says whether this host meets it, fails it, or cannot tell (no NVIDIA driver, no
GPU): the job passes what it can check and names what it could not.

Pure functions of the lock, the host's probe and its CPU flags; the command line is in
``commands/verify.py``, the text in ``report/requirements.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from envlock.errors import UsageError
from envlock.probe.requires import derive
from envlock.probe.rules import kernels_for

if TYPE_CHECKING:
    from envlock.lock import Lock, Requires

Verdict = Literal["ok", "fail", "unchecked"]
# The keys of [requires], as --require spells them; the lists take comma-separated values.
KEYS = ("cuda_driver", "glibc", "gpu_archs", "cpu_features")
_LISTS = ("gpu_archs", "cpu_features")


class Check(NamedTuple):
    """One requirement judged on this host, kept as the words ``verify --requirements`` prints
    and the JSON it writes."""

    requirement: str  # "glibc >= 2.28"
    verdict: Verdict
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"requirement": self.requirement, "verdict": self.verdict, "message": self.message}


class Host(NamedTuple):
    """What a requirement is judged against, read on the host being checked."""

    libc: str | None  # "glibc", "musl"
    libc_version: str | None
    cuda_driver: str | None  # the CUDA version the driver supports (NVML)
    gpu_error: str | None  # why NVML could not answer, when a driver is there
    gpus: tuple[tuple[int, str, str | None], ...]  # (index, name, compute capability)
    cpu_flags: frozenset[str] | None  # None: not readable here (no /proc/cpuinfo)
    machine: str


class RequirementsResult(NamedTuple):
    """Every requirement judged, with whether they were declared or derived from an older
    lock's facts; ``strict`` counts what could not be checked here as failed."""

    checks: tuple[Check, ...]
    derived: bool  # the lock has no [requires] (older than it): derived from its facts
    strict: bool = False

    @property
    def ok(self) -> bool:
        failing = ("fail", "unchecked") if self.strict else ("fail",)
        return not any(c.verdict in failing for c in self.checks)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for c in self.checks if c.verdict == verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "strict": self.strict, "derived": self.derived,
                "counts": {v: self.count(v) for v in ("ok", "fail", "unchecked")},
                "checks": [c.to_dict() for c in self.checks]}


def host_of(current: Lock, cpu_flags: frozenset[str] | None) -> Host:
    """The host's facts from a probe of it (torch is not needed: no requirement asks torch)."""
    gpus = tuple((d.index, d.name, d.compute_capability) for d in current.gpu.devices) \
        if current.gpu else ()
    return Host(current.platform.libc, current.platform.libc_version,
                current.gpu.cuda_driver if current.gpu else None, current.probe.errors.get("gpu"),
                gpus, cpu_flags, current.platform.machine)


def requirements_of(lock: Lock) -> tuple[Requires, bool]:
    """The lock's ``[requires]``; for a lock captured before the table existed, what can be
    derived from its detected facts (the same rule capture uses), and True."""
    from envlock.lock import Requires

    if lock.requires is not None:
        return lock.requires, False
    torch = lock.torch.model_dump(mode="json", exclude_none=True) if lock.torch else None
    return Requires.model_validate(derive(torch, None)), True


def release_numbers(version: str) -> tuple[int, ...]:
    """The numbers of a version string, in order ("2.35" -> (2, 35), "13.0.96" -> (13, 0, 96)):
    what a required glibc or driver and a loaded CUDA library are compared by."""
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _at_least(what: str, have: str, need: str, met: str, failed: str) -> Check:
    """Version ``have`` against ``need``: met, or failed, with the message of each."""
    return Check(what, "ok", met) if release_numbers(have) >= release_numbers(need) else Check(what, "fail", failed)


def judge(req: Requires, host: Host) -> list[Check]:
    """One check per declared requirement (none for what the lock does not declare)."""
    checks: list[Check] = []
    if req.cuda_driver:
        what = f"NVIDIA driver supporting CUDA >= {req.cuda_driver}"
        if host.cuda_driver is None:
            why = (f"the driver did not answer ({host.gpu_error})" if host.gpu_error
                   else "no NVIDIA driver on this host")
            checks.append(Check(what, "unchecked", why))
        else:
            has = f"the driver supports CUDA {host.cuda_driver}"
            checks.append(_at_least(what, host.cuda_driver, req.cuda_driver, has,
                                    f"{has} only: upgrade it, or run on another host"))
    if req.glibc:
        what = f"glibc >= {req.glibc}"
        if host.libc == "glibc" and host.libc_version:
            has = f"this host has glibc {host.libc_version}"
            checks.append(_at_least(what, host.libc_version, req.glibc, has,
                                    f"{has}: the environment's wheels were built for a newer one"))
        elif host.libc:
            checks.append(Check(what, "fail", f"this host's C library is {host.libc}, not glibc"))
        else:
            checks.append(Check(what, "unchecked", "the C library of this host is not known"))
    if req.gpu_archs:
        what = f"GPU architecture among {', '.join(req.gpu_archs)}"
        if not host.gpus:
            checks.append(Check(what, "unchecked", "no GPU visible on this host"))
        for index, name, capability in host.gpus:
            kernels = kernels_for(capability or "", list(req.gpu_archs))
            label = f"GPU {index} ({name}, compute capability {capability or '?'})"
            if kernels is None:
                checks.append(Check(what, "unchecked", f"{label}: its compute capability is not known"))
            elif kernels == "native":
                checks.append(Check(what, "ok", f"{label}: native kernels"))
            elif kernels == "ptx":
                checks.append(Check(what, "ok", f"{label}: PTX only, JIT-compiled by the driver at "
                                                "first use (other code than native kernels)"))
            else:
                checks.append(Check(what, "fail", f"{label}: the build has no kernels for it"))
    if req.cpu_features:
        what = f"CPU features {', '.join(req.cpu_features)}"
        if host.cpu_flags is None:
            checks.append(Check(what, "unchecked", "the CPU's features cannot be read here"))
        else:
            missing = [f for f in req.cpu_features if f not in host.cpu_flags]
            if missing:
                checks.append(Check(what, "fail", f"this {host.machine} CPU lacks {', '.join(missing)}: "
                                                  "torch dispatches to other kernels here"))
            else:
                checks.append(Check(what, "ok", f"this {host.machine} CPU has them"))
    return checks


def check(lock: Lock, host: Host, *, strict: bool = False) -> RequirementsResult:
    """The host judged against the lock's ``[requires]`` alone (or what its torch build implies
    when it has none), so a lock made on a GPU box can be checked on a CPU-only machine."""
    req, derived = requirements_of(lock)
    return RequirementsResult(tuple(judge(req, host)), derived, strict)


def requirement_updates(specs: Sequence[str]) -> dict[str, Any]:
    """``--require KEY=VALUE`` options as updates of ``[requires]`` (None or [] removes one),
    each value checked as a hand edit is: a bad one is a usage error (exit 2), reported before
    anything runs."""
    from pydantic import ValidationError

    from envlock.lock import Requires

    updates: dict[str, Any] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in KEYS:
            raise UsageError(f"--require {spec!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(KEYS)}")
        if key in _LISTS:
            updates[key] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            updates[key] = value or None
    try:
        Requires.model_validate({k: v for k, v in updates.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"--require: requires.{where}: {err['msg']}") from None
    return updates


def with_requirements(lock: Lock, updates: dict[str, Any]) -> Lock:
    """``lock`` with ``requirement_updates`` applied to its ``[requires]`` (not yet sealed); a
    key set (or removed) here is declared, so it leaves ``derived``."""
    from envlock.lock import Requires

    data: dict[str, Any] = lock.requires.model_dump(mode="json") if lock.requires else {}
    data.update(updates)
    derived = [key for key in data.get("derived") or () if key not in updates]
    data["derived"] = derived or None
    return lock.model_copy(update={"requires": Requires.model_validate(
        {k: v for k, v in data.items() if v is not None})})
