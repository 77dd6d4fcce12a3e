"""The lock and nothing else: its models, each field's policy, the seal, the reader, the writer
and the JSON Schema. Callers import from here; the ``_`` modules are its inside. The replay
record is the one other format envlock seals and writes, and it does so through this API too
(``canonical_json``, ``check_clean``, ``parse_toml``, ``schema_reader``, ``toml_table``,
``atomic_write``), so the two formats share one seal, one character rule, one TOML reader, one
rule for schema versions and one writer. Names are resolved on first use, so that ``verify`` can read a lock's tables (``read_data``) and start
its probe before pydantic and the models are imported.

=============  ====================================================================
``_model``     the typed, frozen models, with each field's policy beside its type
``_lock``      ``Lock``: the models' root with the method that writes it (``save``)
``_values``    the character rules for strings that may come from outside
``_policy``    what a policy is, and what is derived from the policies
``_seal``      fingerprint and integrity over the canonical form
``_text``      the reader's first stage: the file's bytes to its TOML table (no pydantic)
``_find``      which env.lock a command reads when none is named (the nearest one upward)
``_read``      the one reader (``_text``, then the models, then the seal)
``_header``    the sealed header: the second door, for a fast path (``_text``, then the seal)
``_derived``   what the seal needs of the models, generated from them (no pydantic)
``_write``     the TOML text of a lock and its atomic write
``_toml``      a linear-time TOML writer for the shapes a lock has
``_schema``    the JSON Schema generated from the models (``python -m envlock.lock``)
=============  ====================================================================
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envlock.lock._find import LOCK_NAME, find_lock, project_root, search_top
    from envlock.lock._header import Header, header
    from envlock.lock._lock import Lock
    from envlock.lock._model import (
        Canary,
        CanaryResult,
        Compile,
        CompileCache,
        Conda,
        CondaPackage,
        CudaLibrary,
        Determinism,
        Duplicate,
        GitInfo,
        GpuDevice,
        GpuInfo,
        Image,
        Library,
        Meta,
        Native,
        OsPackages,
        Package,
        Platform,
        ProbeInfo,
        PythonInfo,
        Requires,
        Runtime,
        Seeds,
        TorchBuild,
        TorchInfo,
    )
    from envlock.lock._policy import (
        Policy,
        Severity,
        policies,
        severities,
    )
    from envlock.lock._read import (
        from_dict,
        load,
        loads,
        schema_reader,
    )
    from envlock.lock._schema import (
        json_schema,
        schema_json,
    )
    from envlock.lock._seal import (
        FINGERPRINT_EXCLUDE,
        canonical_form,
        canonical_json,
        check_seal,
        fingerprint,
        integrity,
        seal,
    )
    from envlock.lock._text import (
        MAX_LOCK_BYTES,
        SCHEMA_VERSION,
        parse_toml,
        read_data,
        read_text,
    )
    from envlock.lock._toml import array_of_tables as toml_array_of_tables
    from envlock.lock._toml import document as toml_document
    from envlock.lock._toml import table as toml_table
    from envlock.lock._values import check_clean, split_os_spec
    from envlock.lock._write import (
        PROTECTED_ENV,
        REPLAY_DIR,
        STALE_TMP_SECONDS,
        TMP_SUFFIX,
        atomic_write,
        dumps,
        file_head,
        looks_like_lock,
        remove_stale_temps,
        save,
        write_target,
    )

_WHERE = {
    "SCHEMA_VERSION": ("_text", "SCHEMA_VERSION"),
    "Canary": ("_model", "Canary"),
    "CanaryResult": ("_model", "CanaryResult"),
    "Compile": ("_model", "Compile"),
    "CompileCache": ("_model", "CompileCache"),
    "Conda": ("_model", "Conda"),
    "CudaLibrary": ("_model", "CudaLibrary"),
    "Library": ("_model", "Library"),
    "Native": ("_model", "Native"),
    "Requires": ("_model", "Requires"),
    "Runtime": ("_model", "Runtime"),
    "CondaPackage": ("_model", "CondaPackage"),
    "Determinism": ("_model", "Determinism"),
    "Duplicate": ("_model", "Duplicate"),
    "GitInfo": ("_model", "GitInfo"),
    "GpuDevice": ("_model", "GpuDevice"),
    "GpuInfo": ("_model", "GpuInfo"),
    "Image": ("_model", "Image"),
    "Lock": ("_lock", "Lock"),
    "Header": ("_header", "Header"),
    "header": ("_header", "header"),
    "Meta": ("_model", "Meta"),
    "OsPackages": ("_model", "OsPackages"),
    "Package": ("_model", "Package"),
    "Platform": ("_model", "Platform"),
    "ProbeInfo": ("_model", "ProbeInfo"),
    "PythonInfo": ("_model", "PythonInfo"),
    "Seeds": ("_model", "Seeds"),
    "TorchBuild": ("_model", "TorchBuild"),
    "TorchInfo": ("_model", "TorchInfo"),
    "split_os_spec": ("_values", "split_os_spec"),
    "Policy": ("_policy", "Policy"),
    "Severity": ("_policy", "Severity"),
    "policies": ("_policy", "policies"),
    "severities": ("_policy", "severities"),
    "MAX_LOCK_BYTES": ("_text", "MAX_LOCK_BYTES"),
    "parse_toml": ("_text", "parse_toml"),
    "read_data": ("_text", "read_data"),
    "read_text": ("_text", "read_text"),
    "from_dict": ("_read", "from_dict"),
    "load": ("_read", "load"),
    "loads": ("_read", "loads"),
    "schema_reader": ("_read", "schema_reader"),
    "json_schema": ("_schema", "json_schema"),
    "schema_json": ("_schema", "schema_json"),
    "FINGERPRINT_EXCLUDE": ("_seal", "FINGERPRINT_EXCLUDE"),
    "canonical_form": ("_seal", "canonical_form"),
    "canonical_json": ("_seal", "canonical_json"),
    "check_seal": ("_seal", "check_seal"),
    "fingerprint": ("_seal", "fingerprint"),
    "integrity": ("_seal", "integrity"),
    "seal": ("_seal", "seal"),
    "toml_document": ("_toml", "document"),
    "toml_table": ("_toml", "table"),
    "toml_array_of_tables": ("_toml", "array_of_tables"),
    "check_clean": ("_values", "check_clean"),
    "LOCK_NAME": ("_find", "LOCK_NAME"),
    "find_lock": ("_find", "find_lock"),
    "project_root": ("_find", "project_root"),
    "search_top": ("_find", "search_top"),
    "PROTECTED_ENV": ("_write", "PROTECTED_ENV"),
    "REPLAY_DIR": ("_write", "REPLAY_DIR"),
    "file_head": ("_write", "file_head"),
    "looks_like_lock": ("_write", "looks_like_lock"),
    "STALE_TMP_SECONDS": ("_write", "STALE_TMP_SECONDS"),
    "TMP_SUFFIX": ("_write", "TMP_SUFFIX"),
    "atomic_write": ("_write", "atomic_write"),
    "dumps": ("_write", "dumps"),
    "remove_stale_temps": ("_write", "remove_stale_temps"),
    "save": ("_write", "save"),
    "write_target": ("_write", "write_target"),
}
__all__ = [
    "FINGERPRINT_EXCLUDE",
    "LOCK_NAME",
    "MAX_LOCK_BYTES",
    "PROTECTED_ENV",
    "REPLAY_DIR",
    "SCHEMA_VERSION",
    "STALE_TMP_SECONDS",
    "TMP_SUFFIX",
    "Canary",
    "CanaryResult",
    "Compile",
    "CompileCache",
    "Conda",
    "CondaPackage",
    "CudaLibrary",
    "Determinism",
    "Duplicate",
    "GitInfo",
    "GpuDevice",
    "GpuInfo",
    "Header",
    "Image",
    "Library",
    "Lock",
    "Meta",
    "Native",
    "OsPackages",
    "Package",
    "Platform",
    "Policy",
    "ProbeInfo",
    "PythonInfo",
    "Requires",
    "Runtime",
    "Seeds",
    "Severity",
    "TorchBuild",
    "TorchInfo",
    "atomic_write",
    "canonical_form",
    "canonical_json",
    "check_clean",
    "check_seal",
    "dumps",
    "file_head",
    "find_lock",
    "fingerprint",
    "from_dict",
    "header",
    "integrity",
    "json_schema",
    "load",
    "loads",
    "looks_like_lock",
    "parse_toml",
    "policies",
    "project_root",
    "read_data",
    "read_text",
    "remove_stale_temps",
    "save",
    "schema_json",
    "schema_reader",
    "seal",
    "search_top",
    "severities",
    "split_os_spec",
    "toml_array_of_tables",
    "toml_document",
    "toml_table",
    "write_target",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Pydantic scans every installed distribution's entry points for plugins when the first
    # model class is built; envlock's models need none, so the scan is skipped while they are
    # built, and the setting put back so that models a training script defines later get theirs.
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    try:
        value = getattr(importlib.import_module(f"{__name__}.{where[0]}"), where[1])
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
