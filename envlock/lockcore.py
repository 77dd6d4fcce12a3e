"""What sealing a lock means, over the lock's canonical dict form, with no pydantic.

A lock's canonical form is what its model dumps to (``model_dump(mode="json",
exclude_none=True)``). Both hashes are sha256 of that form as canonical JSON (sorted keys, no
whitespace, UTF-8), so they can be checked on the model (``lockwrite``) and on a lock read
without the models (``lockdata``) by this one code: a second implementation of the hashes could
disagree with the first on exactly the lock that matters.

Also here: the few helpers that both a model and a read-only lock view answer (``short_id``,
OS package pins), so that neither needs the other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1

# Content that identifies the environment. Everything not listed here is still sealed by
# ``integrity`` (tamper detection), but two captures of the same stack on different hosts must
# share a fingerprint, so host- and time-specific values stay out of it. The shape is the one
# pydantic's ``exclude`` takes: True drops a key, a set drops those keys of a table, a dict
# recurses, ``"__all__"`` applies to every item of an array.
FINGERPRINT_EXCLUDE: dict[str, Any] = {
    "envlock": True,
    "probe": True,
    "git": True,
    "env": True,
    "canary": True,
    "image": {"source", "reference", "container_id", "in_container", "engine"},
    "platform": {"kernel", "cpu_model", "cpu_count", "os_pretty_name"},
    "python": {"executable", "prefix"},
    "torch": {"cuda_available", "device_count", "cpu_capability"},
    "gpu": {"devices": {"__all__": {"uuid_sha256", "index"}}},
    "determinism": {"num_threads", "num_interop_threads", "late", "process_env"},
    # files_sha256 stays out: the same environment captured with and without --deep must
    # share its id. An edited file still changes the id through files_changed, which a clean
    # install never has, and integrity seals the digest against hand edits.
    "packages": {"__all__": {"installer", "requested", "files_sha256"}},
}


def canonical_json(data: Any) -> bytes:
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


def fingerprint_of(data: Mapping[str, Any]) -> str:
    """The identity hash of a lock in canonical form (the [envlock] table is left out)."""
    return _sha256(excluding(dict(data), FINGERPRINT_EXCLUDE))


def integrity_of(data: Mapping[str, Any]) -> str:
    """The tamper hash: everything but the two hashes themselves."""
    meta = {k: v for k, v in data.get("envlock", {}).items() if k not in ("fingerprint", "integrity")}
    return _sha256({**data, "envlock": meta})


def seal_matches(data: Mapping[str, Any]) -> bool:
    """Whether a lock in canonical form carries both hashes and both match its content."""
    meta = data.get("envlock")
    if not isinstance(meta, dict) or meta.get("fingerprint") is None or meta.get("integrity") is None:
        return False
    return bool(meta["integrity"] == integrity_of(data) and meta["fingerprint"] == fingerprint_of(data))


def short_id(fingerprint: str | None) -> str:
    """12 hex digits of the fingerprint: the id quoted in papers and pull requests."""
    return fingerprint.split(":", 1)[1][:12] if fingerprint else "unsealed"


def split_os_spec(spec: str) -> tuple[str, str, str]:
    """(name, arch, version) of ``name:arch=version`` (a version may hold an epoch colon)."""
    head, _, version = spec.partition("=")
    name, _, arch = head.partition(":")
    return name, arch, version


def os_versions(specs: list[str]) -> dict[str, str]:
    """``name:arch`` -> version of a list of ``name:arch=version`` pins."""
    out = {}
    for spec in specs:
        name, arch, version = split_os_spec(spec)
        out[f"{name}:{arch}"] = version
    return out
