"""What each field of a lock means beyond its type: declared once, beside the field.

A field is declared as ``name: Annotated[type, Policy(...)]``. Pydantic keeps metadata it does
not know in ``FieldInfo.metadata`` and leaves it out of validation and of the JSON Schema, so the
policy costs nothing at read time and the schema stays what the types say.

A policy answers three questions that used to live in three other files:

* ``severity``: how a change of the field counts when two locks are compared (``breaking``,
  ``warning``, ``info``), or ``custom`` where the comparator has code of its own for it (a
  table of packages, the image's identity, python's version), or ``ignored`` for what describes
  the file or the capture rather than the environment (when it was written, how the image was
  found, what the probe could not collect); the comparator (``drift/compare``) reads the first three
  from here;
* ``fingerprint``: whether the field identifies the environment. Host- and time-specific values
  stay out, so that one stack captured on two hosts shares its id; ``integrity`` seals every
  field regardless;
* ``comment``: the line written under a table's header in ``env.lock`` (top-level tables only);
* ``process``: the field is state a running process set (seeds, torch's determinism flags), not
  the environment it runs in: kept in the lock and compared in-process, but outside the
  fingerprint, so one environment has one id whether it was captured from a shell, inside a
  training process or in its restored image.

A test walks every field of every model and fails when one has no policy: a field the
comparator silently ignored was how ``platform.os_pretty_name`` went unreported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast, get_args, get_origin

from pydantic import BaseModel

Severity = Literal["breaking", "warning", "info"]


@dataclass(frozen=True)
class Policy:
    severity: Severity | Literal["custom", "ignored"]
    fingerprint: bool = True
    comment: str | None = None
    process: bool = False


BREAKING = Policy("breaking")
WARNING = Policy("warning")
INFO = Policy("info")
# A fact of the host or the moment of capture: reported, never part of the identity.
HOST = Policy("info", fingerprint=False)
# What a running process set (seed_everything, deterministic(), training code): compared where
# that process is the one compared (in-process verify), reported by a fresh one, never identity.
PROCESS = Policy("breaking", fingerprint=False, process=True)
PROCESS_INFO = Policy("info", fingerprint=False, process=True)
# Compared by code of its own in the comparator (drift/compare, drift/packages).
CUSTOM = Policy("custom")
# About the file or the capture, not the environment: neither compared nor identifying.
NOT_COMPARED = Policy("ignored", fingerprint=False)


def policy_of(model: type[BaseModel], name: str) -> Policy | None:
    for item in model.model_fields[name].metadata:
        if isinstance(item, Policy):
            return item
    return None


def policies(model: type[BaseModel]) -> dict[str, Policy]:
    """Every field of ``model`` that declares a policy, in field order."""
    return {name: p for name in model.model_fields if (p := policy_of(model, name)) is not None}


def severities(model: type[BaseModel]) -> dict[str, Severity]:
    """The fields of ``model`` a comparison judges field by field, and how."""
    return {name: cast("Severity", p.severity) for name, p in policies(model).items()
            if p.severity not in ("custom", "ignored")}


def nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds (and whether as a list of them), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is list and args:
        inner = nested_model(args[0])
        return (inner[0], True) if inner is not None else None
    if len(args) == 1 and get_origin(annotation) is not dict:
        return nested_model(args[0])
    return None


def fingerprint_exclude(model: type[BaseModel]) -> dict[str, Any]:
    """What the fingerprint leaves out of ``model``, in the shape pydantic's ``exclude`` takes:
    True drops a key, a dict recurses, ``"__all__"`` applies to every item of a list."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        policy = policy_of(model, name)
        if policy is not None and not policy.fingerprint:
            out[name] = True
            continue
        inner = nested_model(field.annotation)
        if inner is None:
            continue
        sub = fingerprint_exclude(inner[0])
        if sub:
            out[name] = {"__all__": sub} if inner[1] else sub
    return out
