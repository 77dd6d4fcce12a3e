"""Which container and image this process runs in, as far as it can know from inside.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Optional, Tuple

from .files import read_text

_CID_RE = re.compile(r"(?:docker|libpod|containers|crio|cri-containerd)[-/]([0-9a-f]{64})")


def _container_id() -> Tuple[Optional[str], Optional[str]]:
    text = read_text("/proc/self/mountinfo", 1 << 20) or ""
    match = _CID_RE.search(text)
    if match:
        return match.group(1), "mountinfo"
    text = read_text("/proc/self/cgroup", 1 << 16) or ""
    match = _CID_RE.search(text)
    if match:
        return match.group(1), "cgroup"
    return None, None


def split_digest(ref: str) -> Tuple[str, Optional[str]]:
    # imageref compiles its patterns on import: only for a reference given or found.
    from .imageref import split_digest

    return split_digest(ref)


def collect_image(cli_ref: Optional[str]) -> Dict[str, Any]:
    info: Dict[str, Any] = {"in_container": False, "source": "none"}
    containerenv = read_text("/run/.containerenv")
    if containerenv is not None:
        info.update({"in_container": True, "engine": "podman", "source": "containerenv"})
        fields = dict(
            (k.strip(), v.strip().strip('"'))
            for k, _, v in (line.partition("=") for line in containerenv.splitlines()) if v
        )
        # Podman fills these only for --privileged containers.
        if fields.get("image"):
            info["reference"], digest = split_digest(fields["image"])
            if digest:
                info["digest"] = digest
        if fields.get("imageid"):
            iid = fields["imageid"]
            info["id"] = iid if iid.startswith("sha256:") else "sha256:" + iid
        if fields.get("id"):
            info["container_id"] = fields["id"]
    elif os.path.exists("/.dockerenv"):
        info.update({"in_container": True, "engine": "docker", "source": "dockerenv"})
    cid, cid_source = _container_id()
    if cid:
        info["in_container"] = True
        info.setdefault("container_id", cid)
        if info["source"] == "none":
            info["source"] = cid_source
    # Values injected by `envlock restore/run` (or by a CI job) win: inside a container there
    # is no reliable way to learn one's own image otherwise.
    env_ref = os.environ.get("ENVLOCK_IMAGE")
    env_digest = os.environ.get("ENVLOCK_IMAGE_DIGEST")
    env_id = os.environ.get("ENVLOCK_IMAGE_ID")
    if env_ref or env_digest or env_id:
        info["source"] = "env"
        if env_ref:
            info["reference"], digest = split_digest(env_ref)
            if digest:
                info["digest"] = digest
        if env_digest:
            info["digest"] = env_digest
        if env_id:
            info["id"] = env_id
    if cli_ref:
        info["source"] = "cli"
        info["reference"], digest = split_digest(cli_ref)
        if digest:
            info["digest"] = digest
    return info
