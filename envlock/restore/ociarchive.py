"""A docker-archive converted to an OCI archive with skopeo: the one conversion.

``pack`` writes the base image both ways (Docker and Podman load the docker-archive; umoci and
Charliecloud read the OCI one), and the Charliecloud target converts a pack made where skopeo
was missing. The file is local, written by envlock or proven by the pack's checksums, so there
is no signature to check: skopeo runs with a policy that accepts it, written for the one call
(the user's ``policy.json`` may refuse unsigned images, which would refuse every local file).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

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
