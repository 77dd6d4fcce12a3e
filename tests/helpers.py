"""Small builders shared by the core tests: fake distributions, minimal locks, CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def make_dist(
    site: Path,
    name: str,
    version: str,
    *,
    installer: str | None = "pip",
    requested: bool = True,
    direct_url: dict[str, Any] | None = None,
    files: int = 3,
    script: str | None = None,
) -> Path:
    """Write a ``*.dist-info`` directory the way pip leaves one."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test\n\nLong text.\n"
    )
    record = [f"{name.replace('-', '_')}/f{i}.py,sha256=abc{i},{10 + i}" for i in range(files)]
    record.append(f"{dist.name}/METADATA,sha256=def,42")
    if installer:
        (dist / "INSTALLER").write_text(installer + "\n")
        record.append(f"{dist.name}/INSTALLER,sha256=xyz,4")
    if requested:
        (dist / "REQUESTED").write_text("")
        record.append(f"{dist.name}/REQUESTED,,")
    if direct_url is not None:
        (dist / "direct_url.json").write_text(json.dumps(direct_url))
        record.append(f"{dist.name}/direct_url.json,sha256=q,9")
    if script:
        record.append(f"../../../bin/{name},sha256={script},100")
    record.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(record) + "\n")
    return dist


def probe_doc(**sections: Any) -> dict[str, Any]:
    """A minimal probe document; keyword arguments replace whole sections."""
    doc: dict[str, Any] = {
        "image": {"source": "none"},
        "platform": {"os": "Linux", "machine": "x86_64", "libc": "glibc", "libc_version": "2.36",
                     "os_id": "debian", "os_version_id": "12"},
        "python": {"version": "3.11.7", "implementation": "cpython", "prefix_kind": "venv",
                   "soabi": "cpython-311-x86_64-linux-gnu"},
        "determinism": {"torch_loaded": False},
        "seeds": {"hash_randomization": True},
        "env": {},
        "packages": [
            {"name": "numpy", "version": "2.1.0", "installer": "pip", "requested": True},
            {"name": "six", "version": "1.16.0", "installer": "pip", "requested": False},
        ],
        "probe": {"version": 1, "errors": {}},
    }
    doc.update(sections)
    return doc


def make_lock(**sections: Any) -> Any:
    """A sealed Lock built from ``probe_doc(**sections)`` with a fixed timestamp."""
    from envlock.capturing import build_lock
    from envlock.lockfile import seal

    lock = build_lock(probe_doc(**sections))
    meta = lock.envlock.model_copy(update={"created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)})
    return seal(lock.model_copy(update={"envlock": meta}))


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m envlock ARGS`` as a user would, capturing text output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [python or sys.executable, "-m", "envlock", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False,
    )
