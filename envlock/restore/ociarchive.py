"""The OCI archive of a pack's base image: made from its docker-archive, and read back.

``pack`` writes the base image both ways (Docker and Podman load the docker-archive; umoci and
Charliecloud read the OCI one), and the Charliecloud target converts a pack made where skopeo
was missing: one conversion, ``to_oci``. The Charliecloud target then unpacks the archive
(``extract_oci``), so what an OCI archive holds is read beside where it is written.

The file is local, written by envlock or proven by the pack's checksums, so there is no
signature to check: skopeo runs with a policy that accepts it, written for the one call (the
user's ``policy.json`` may refuse unsigned images, which would refuse every local file).
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from envlock.errors import UsageError
from envlock.restore import values
from envlock.restore.packdir import extract_data

ACCEPT_LOCAL = '{"default":[{"type":"insecureAcceptAnything"}]}\n'

# Runs one argv, answers (exit status, output): each caller's own runner (a subprocess with a
# deadline, Charliecloud's tool runner) so the call is the caller's like its other tools.
Run = Callable[[Sequence[str]], tuple[int, str]]


def to_oci(skopeo: str, docker_archive: Path, oci_archive: Path, run: Run) -> tuple[int, str]:
    """``skopeo copy docker-archive:A oci-archive:B``; (exit status, output) as ``run`` gave them."""
    with tempfile.TemporaryDirectory(prefix="envlock-skopeo-") as tmp:
        policy = Path(tmp) / "policy.json"
        policy.write_text(ACCEPT_LOCAL, encoding="utf-8")
        return run([skopeo, "--policy", str(policy), "copy", "--quiet",
                    f"docker-archive:{docker_archive}", f"oci-archive:{oci_archive}"])


# The name the one image of an unpacked archive gets (umoci unpacks by name; skopeo's archives
# have none).
OCI_REF = "envlock-base"
MAX_JSON = 4 << 20


def _read_json(path: Path) -> object:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_JSON:
        raise UsageError(f"the base image's OCI archive lacks a readable {path.name}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UsageError(f"the base image's OCI archive has a bad {path.name}: {exc}") from None


def _blob(layout: Path, digest: object) -> Path:
    return layout / "blobs" / "sha256" / values.digest(str(digest)).split(":", 1)[1]


def extract_oci(archive: Path, layout: Path) -> list[str]:
    """Unpack an OCI archive into ``layout``, name its one image ``OCI_REF`` (umoci unpacks by
    name; skopeo's archives have none) and return the image config's ``Env``."""
    try:
        # A layout is plain files and directories; anything else is not an OCI archive.
        extract_data(archive, layout, not_what=f"{archive.name} is not an OCI archive")
    except (tarfile.TarError, OSError) as exc:
        raise UsageError(f"{archive.name} is not a readable OCI archive: {exc}") from None
    index_path = layout / "index.json"
    index = _read_json(index_path)
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
        raise UsageError(f"{archive.name} is not an OCI archive of one image")
    manifests[0].setdefault("annotations", {})["org.opencontainers.image.ref.name"] = OCI_REF
    index_path.write_text(json.dumps(index), encoding="utf-8")
    manifest = _read_json(_blob(layout, manifests[0].get("digest")))
    config_ref = manifest.get("config") if isinstance(manifest, dict) else None
    config = _read_json(_blob(layout, config_ref.get("digest") if isinstance(config_ref, dict) else None))
    env = ((config.get("config") or {}).get("Env") if isinstance(config, dict) else None) or []
    if not isinstance(env, list):
        raise UsageError(f"{archive.name}: the image config's Env is not a list")
    return [str(e) for e in env]


__all__ = ["OCI_REF", "extract_oci", "to_oci"]
