"""What the cluster and attestation exports share: the pinned image, the numerics environment,
the command, and the facts that identify the lock."""

from __future__ import annotations

import re
import shlex
from typing import Any

from envlock.errors import EnvlockError, UsageError
from envlock.lock import Lock


def facts(lock: Lock) -> dict[str, Any]:
    """The envlock facts every export carries: identity and the stack pip does not see."""
    out: dict[str, Any] = {"id": lock.short_id, "fingerprint": lock.envlock.fingerprint or "",
                           "python": lock.python.version}
    if lock.torch:
        t = lock.torch
        out["torch"] = {k: v for k, v in (("version", t.version), ("cuda", t.cuda), ("cudnn", t.cudnn),
                                          ("nccl", t.nccl), ("hip", t.hip)) if v}
    if lock.gpu and lock.gpu.devices:
        out["gpu"] = {"driver": lock.gpu.driver or "", "devices": [d.name for d in lock.gpu.devices]}
    if lock.image.digest:
        out["image"] = f"{lock.image.reference or ''}@{lock.image.digest}".lstrip("@")
    if lock.determinism.env:
        out["env"] = dict(lock.determinism.env)
    return out


def pinned_image(lock: Lock, override: str | None) -> str:
    """``REF@sha256:...`` a cluster can pull: ``--image``, else the lock's own image by digest."""
    from envlock.restore import values

    if override:
        try:
            values.image_ref(override)
        except EnvlockError as exc:
            raise UsageError(f"--image: {exc.message}") from None
        if "@sha256:" not in override:
            raise UsageError(f"--image {override} is not pinned by digest",
                             hint="pass REF@sha256:... (a tag can move under a running job)")
        repo, _, dig = values.split_ref(override)
        return f"{repo}@{dig}"
    img = lock.image
    if img.reference and img.digest:
        try:
            repo = values.split_ref(img.reference)[0]
            values.digest(img.digest)
        except EnvlockError:
            repo = ""
        if repo:  # the tag is dropped: the digest alone names the content
            return f"{repo}@{img.digest}"
    raise UsageError("the lock names no pullable image digest",
                     hint="rebuild it with `envlock restore` and push it to a registry, then pass "
                          "--image REGISTRY/REPO@sha256:...")


def environment(lock: Lock) -> list[tuple[str, str]]:
    """Variables the job must set: the locked numerics variables and PYTHONHASHSEED."""
    from envlock.restore import values
    from envlock.restore.image import numerics_env  # the validated set restore uses

    # Not restore's image ENV: that adds CUDA_ENV for Docker's NVIDIA hook, while on a cluster
    # the device plugin or --nv decides which GPUs a job sees (NVIDIA_VISIBLE_DEVICES=all would
    # bypass a Kubernetes limit).
    out = numerics_env(lock, process=False)
    seed = lock.seeds.python_hash_seed
    if seed is not None:
        out["PYTHONHASHSEED"] = values.env_value(seed, name="PYTHONHASHSEED")
    return sorted(out.items())


def command(value: str | None, *, required: bool) -> list[str] | None:
    if not value:
        if required:
            raise UsageError("this format needs --command 'python train.py ...'")
        return None
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise UsageError(f"--command: {exc}") from None
    if not argv:
        raise UsageError("--command is empty")
    return argv


def gpu_count(lock: Lock, override: int | None) -> int:
    if override is not None:
        if override < 0:
            raise UsageError("--gpus must be 0 or more")
        return override
    return len(lock.gpu.devices) if lock.gpu else 0


def job_name(lock: Lock) -> str:
    return "envlock-" + re.sub(r"[^a-z0-9]", "", lock.short_id.lower())


# ---------------------------------------------------------------------------------------------
# Proof of authorship. ``export -o FILE`` replaces FILE without --force only when envlock can
# prove it wrote it: a line of its own, in the output's comment syntax, naming the format and the
# lock ("# envlock-export format=slurm lock=0123456789ab"). A pyproject.toml depending on
# envlock-ml, a job script running ``envlock verify`` or a README never holds that line. JSON has
# no comments: a CycloneDX SBOM carries the same text as a metadata property, an in-toto
# statement envlock's own predicate type.
# ---------------------------------------------------------------------------------------------

MARKER_WORD = "envlock-export"
COMMENTED = ("pylock", "requirements", "apptainer", "k8s", "slurm", "conda-explicit", "conda-lock", "pixi")
MARKER_PROPERTY = "envlock:export"
_MARKER_RE = re.compile(r"# envlock-export format=([a-z0-9-]+) lock=([0-9a-z]+)(?: .*)?")
_HEAD_LINES = 8


def marker(fmt: str, lock: Lock) -> str:
    """The proof's text, without comment syntax."""
    return f"{MARKER_WORD} format={fmt} lock={lock.short_id}"


def stamp(fmt: str, lock: Lock, text: str) -> str:
    """``text`` with the marker line near its top (after a ``#!`` line), for formats whose
    language has ``#`` comments; JSON formats carry their proof themselves."""
    if fmt not in COMMENTED:
        return text
    line = f"# {marker(fmt, lock)} (envlock export -o replaces this file only while this line is here)\n"
    if text.startswith("#!"):
        first, _, rest = text.partition("\n")
        return f"{first}\n{line}{rest}"
    return line + text


def has_marker(head: str) -> bool:
    """True when one of the first lines of ``head`` is envlock's marker line."""
    return any(_MARKER_RE.fullmatch(line) for line in head.splitlines()[:_HEAD_LINES])


def marker_property(value: object) -> bool:
    """True for the value of a JSON export's marker property."""
    return isinstance(value, str) and _MARKER_RE.fullmatch("# " + value) is not None
