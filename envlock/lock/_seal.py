"""Sealing a lock: two hashes over its canonical form, and the id derived from one of them.

A lock's canonical form is what its model dumps to (``model_dump(mode="json",
exclude_none=True)``). Both hashes are sha256 of that form as canonical JSON (sorted keys, no
whitespace, UTF-8). They pull in opposite directions:

* ``fingerprint`` covers what identifies the environment: the fields whose policy says
  ``fingerprint=False`` (host- and time-specific values) are left out, so one stack captured on
  two hosts shares it, and the short id quoted in papers is derived from it;
* ``integrity`` covers everything else too, so no hand edit anywhere goes unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol, TypeVar

from envlock.errors import LockTampered
from envlock.lock._derived import FINGERPRINT_EXCLUDE as FINGERPRINT_EXCLUDE

# No pydantic here, and no import of the models (``_model`` imports ``short_id`` from here): the
# sealed header (``_header``) recomputes both hashes over a lock's TOML table with these same
# functions. What the fingerprint leaves out (``FINGERPRINT_EXCLUDE``, pydantic's ``exclude``
# shape) is derived from the policies and generated into ``_derived``.
_L = TypeVar("_L", bound="LockData")


class _Meta(Protocol):
    """``[envlock]`` as the seal reads it (``_model.Meta``)."""

    @property
    def fingerprint(self) -> str | None: ...
    @property
    def integrity(self) -> str | None: ...
    def model_copy(self, *, update: dict[str, Any]) -> _Meta: ...


class LockData(Protocol):
    """What the seal needs of a lock's model (``_model.LockData``)."""

    @property
    def envlock(self) -> _Meta: ...
    def model_dump(self, *, mode: str, exclude_none: bool) -> dict[str, Any]: ...
    def model_copy(self: _L, *, update: dict[str, Any]) -> _L: ...


def canonical_json(data: Any) -> bytes:
    """The bytes a seal hashes: sorted keys, no spaces, UTF-8, so the same data always hashes the
    same and a file's formatting (which the writer may change) never enters a seal."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def excluding(data: Any, spec: Any) -> Any:
    """``data`` without what ``spec`` (pydantic's ``exclude`` shape) names; ``data`` is kept."""
    if isinstance(spec, (set, frozenset)):
        spec = dict.fromkeys(spec, True)
    if isinstance(data, list):
        every = spec.get("__all__")
        return [excluding(item, every) if every is not None else item for item in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        sub = spec.get(key)
        if sub is True:
            continue
        out[key] = value if sub is None else excluding(value, sub)
    return out


def _sha256(data: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


def canonical_form(lock: LockData) -> dict[str, Any]:
    """What both hashes are computed over: the model's dump, through ``sealed_form``."""
    return sealed_form(lock.model_dump(mode="json", exclude_none=True))


def sealed_form(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a model's dump, or a lock's TOML table) as the hashes see it. An empty
    ``unreadable`` (the probe read everything) adds nothing, so a lock sealed before that field
    existed keeps its seal."""
    form = dict(data)
    if not form.get("unreadable", True):
        del form["unreadable"]
    return form


def _fingerprint_of(form: dict[str, Any]) -> str:
    det = form.get("determinism")
    names = set(det.get("process_env", ())) if isinstance(det, dict) else set()
    return _sha256(_without_process_env(excluding(form, FINGERPRINT_EXCLUDE), names))


def _without_process_env(form: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """The variables the process set itself (``[determinism].process_env``: deterministic()'s
    CUBLAS_WORKSPACE_CONFIG, seed_everything()'s ENVLOCK_SEED) are process state, like the
    flags: a shell capture of the same environment does not have them. Those set before the
    process started stay part of the identity."""
    det = form.get("determinism")
    if not names or not isinstance(det, dict):
        return form
    out = dict(form)
    out["determinism"] = {**det, "env": {k: v for k, v in det.get("env", {}).items() if k not in names}}
    seeds = form.get("seeds")
    if "PYTHONHASHSEED" in names and isinstance(seeds, dict):
        out["seeds"] = {k: v for k, v in seeds.items() if k != "python_hash_seed"}
    return out


def _integrity_of(form: dict[str, Any]) -> str:
    meta = {k: v for k, v in form.get("envlock", {}).items() if k not in ("fingerprint", "integrity")}
    return _sha256({**form, "envlock": meta})


def fingerprint(lock: LockData) -> str:
    """The identity hash: what identifies the environment (the [envlock] table is left out)."""
    return _fingerprint_of(canonical_form(lock))


def integrity(lock: LockData) -> str:
    """The tamper hash: everything but the two hashes themselves."""
    return _integrity_of(canonical_form(lock))


def seal(lock: _L) -> _L:
    """Return ``lock`` with both hashes recomputed for its current content."""
    form = canonical_form(lock)  # neither hash covers the hashes, so the old ones may stay
    meta = lock.envlock.model_copy(update={"fingerprint": _fingerprint_of(form),
                                           "integrity": _integrity_of(form)})
    return lock.model_copy(update={"envlock": meta})


def check_seal(lock: LockData, name: str = "env.lock") -> None:
    """Raise LockTampered when the content no longer matches the hashes written with it."""
    meta = lock.envlock
    check_hashes(meta.fingerprint, meta.integrity, canonical_form(lock), name)


def check_hashes(fingerprint: object, integrity: object, form: dict[str, Any], name: str) -> None:
    """Raise LockTampered unless ``fingerprint`` and ``integrity`` (as written in ``[envlock]``)
    are the two hashes of ``form``: the one seal check, for the models' form (``check_seal``)
    and for the TOML table itself (``_header``), so both doors refuse in the same words."""
    if fingerprint is None or integrity is None:
        raise LockTampered(
            f"{name} is not sealed (no fingerprint)", hint=f"run `envlock fmt {name}` to seal it"
        )
    if integrity == _integrity_of(form) and fingerprint != _fingerprint_of(form):
        # The content is as sealed; only the id differs: the lock was sealed by an envlock that
        # left less out of the fingerprint (seeds, determinism flags and the image were once
        # part of it). Said as such, not as an edit: re-sealing changes its id and nothing else.
        new = _fingerprint_of(form)
        raise LockTampered(
            f"{name} was sealed by an earlier envlock, whose id covered process state (seeds, "
            f"determinism flags) and the image: its content is unchanged, its id is now "
            f"{new.split(':', 1)[-1][:12]} (was {str(fingerprint).split(':', 1)[-1][:12]})",
            hint=f"run `envlock fmt {name}` to re-seal it with the current id",
        )
    if integrity != _integrity_of(form) or fingerprint != _fingerprint_of(form):
        raise LockTampered(
            f"{name} was edited after capture: its fingerprint does not match its content",
            hint=f"if the edit was deliberate, run `envlock fmt {name}` to re-seal it",
        )


def short_id(fingerprint: str | None) -> str:
    """12 hex digits of the fingerprint: the id quoted in papers and pull requests (the models'
    ``short_id`` and the sealed header's)."""
    return fingerprint.split(":", 1)[1][:12] if fingerprint else "unsealed"
