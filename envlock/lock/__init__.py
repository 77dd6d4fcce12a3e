"""The lock and nothing else: its models, each field's policy, the seal, the reader, the writer
and the JSON Schema. Callers import from here; the ``_`` modules are its inside.

=============  ====================================================================
``_model``     the typed, frozen models, with each field's policy beside its type
``_values``    the character rules for strings that may come from outside
``_policy``    what a policy is, and what is derived from the policies
``_seal``      fingerprint and integrity over the canonical form
``_read``      the one reader (tomllib, then the models, then the seal)
``_write``     the TOML text of a lock and its atomic write
``_toml``      a linear-time TOML writer for the shapes a lock has
``_schema``    the JSON Schema generated from the models (``python -m envlock.lock``)
=============  ====================================================================
"""

from __future__ import annotations

import os as _os

# Pydantic scans every installed distribution's entry points for plugins when the first model
# class is built; envlock's models need none, so the scan is skipped while they are built, and
# the setting put back so that models a training script defines later get their plugins.
_previous = _os.environ.get("PYDANTIC_DISABLE_PLUGINS")
_os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
try:
    from envlock.lock._model import (
        SCHEMA_VERSION,
        Canary,
        CanaryResult,
        Conda,
        CondaPackage,
        Determinism,
        Duplicate,
        GitInfo,
        GpuDevice,
        GpuInfo,
        Image,
        Lock,
        Meta,
        OsPackages,
        Package,
        Platform,
        ProbeInfo,
        PythonInfo,
        Seeds,
        TorchBuild,
        TorchInfo,
        split_os_spec,
    )
    from envlock.lock._policy import Policy, Severity, policies, severities
    from envlock.lock._read import from_dict, load, loads, read_text
    from envlock.lock._schema import json_schema, schema_json
    from envlock.lock._seal import FINGERPRINT_EXCLUDE, check_seal, fingerprint, integrity, seal
    from envlock.lock._toml import document as toml_document
    from envlock.lock._write import (
        STALE_TMP_SECONDS,
        TMP_SUFFIX,
        atomic_write,
        dumps,
        remove_stale_temps,
        save,
        write_target,
    )
finally:
    if _previous is None:
        del _os.environ["PYDANTIC_DISABLE_PLUGINS"]
    else:
        _os.environ["PYDANTIC_DISABLE_PLUGINS"] = _previous
    del _previous

__all__ = [
    "FINGERPRINT_EXCLUDE", "SCHEMA_VERSION", "STALE_TMP_SECONDS", "TMP_SUFFIX", "Canary",
    "CanaryResult", "Conda", "CondaPackage", "Determinism", "Duplicate", "GitInfo", "GpuDevice",
    "GpuInfo", "Image", "Lock", "Meta", "OsPackages", "Package", "Platform", "Policy", "ProbeInfo",
    "PythonInfo", "Seeds", "Severity", "TorchBuild", "TorchInfo", "atomic_write", "check_seal",
    "dumps", "fingerprint", "from_dict", "integrity", "json_schema", "load", "loads", "policies",
    "read_text", "remove_stale_temps", "save", "schema_json", "seal", "severities",
    "split_os_spec", "toml_document", "write_target",
]
