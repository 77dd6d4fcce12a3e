"""A restored image as ``run`` and ``restore`` find it: the options a restore was given, the
tag and labels that name its image, its working directory, and the numerics variables it and its
process get from the lock.

Kept apart from the restore's planning (``context``) and rendering (``dockerfile``) because
``envlock run`` on an image already restored needs these and nothing else: the plan's modules
(``packaging``, the wheel and OS package readers, the tables) are a fifth of ``run``'s start-up
beside ``docker run`` (benchmarks/runstart.py), and a proven image asks none of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from envlock.errors import UnsafeValue
from envlock.probe.rules import numerics_variable
from envlock.restore import values

if TYPE_CHECKING:
    from envlock.lock import Header, Lock

BaseOrigin = Literal["lock", "--base", "table"]

# Where ``run`` mounts the workspace, and the image's working directory.
WORKDIR = "/workspace"

LABEL_FINGERPRINT = "org.envlock.fingerprint"
LABEL_SCHEMA = "org.envlock.schema-version"
LABEL_SHORT_ID = "org.envlock.short-id"
# Set by restore on the build (not in the Dockerfile): the cache key, see ``restore.context_key``.
LABEL_CONTEXT = "org.envlock.context"
# Also set on the build: a digest of the options the user chose (``options_key``), so a failed
# restore can tell whether an image of the lock was restored with other options.
LABEL_OPTIONS = "org.envlock.options"

@dataclass(frozen=True)
class Options:
    """Everything a user can choose about a restore; defaults restore the lock as captured."""

    base: str | None = None
    allow_unpinned_base: bool = False
    skip_local: bool = False
    wheelhouse: Path | None = None
    index_url: str | None = None
    venv: str | None = None
    python: str | None = None
    # Hashes known from elsewhere (a bundle's manifest), used where the lock has none.
    extra_hashes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Plain http:// package URLs and indexes: refused unless the user accepts the risk.
    allow_http: bool = False
    # Local (sdist or directory) packages whose wheel, rebuilt from the installed files and
    # proven equal to the lock's record_sha256, is in the wheelhouse (an `envlock pack`).
    local_wheels: frozenset[str] = frozenset()
    # The wheels a pack's checked SHA256SUMS lists, with their sha256 (``Pack.checked_wheels``):
    # the only files uv's binary is taken from (``restore.uvbin``), since it runs before
    # anything is proven against the lock.
    checked_wheels: Mapping[Path, str] = field(default_factory=dict)
    # Where ``base`` came from when envlock chose it (a pack restores the image it saved of the
    # lock's own base by its id): the comparison then treats it as that origin.
    base_origin: BaseOrigin | None = None
    base_display: str | None = None
    # The <name> of the envlock/<name>:<id> tag restore builds (``image_name``), so the
    # Dockerfile's rebuild line names the tag that is built.
    image_name: str = "env"
    # The torch layer as an image of its own (``Plan.split_torch``): only for a builder that keeps
    # images and builds FROM one by id. Charliecloud's target turns each build into its directory
    # image, so it builds the torch layer as a stage of the one build instead.
    torch_layer_image: bool = True
    # How the wheels and requirement files reach pip/uv (``dockerfile``): bind-mounted by a
    # ``RUN --mount`` (BuildKit, Buildah: a builder that reads it, ``restore.clibuild``), or
    # copied into a build stage whose venv the image copies out (the classic builder).
    mounts: bool = False
    # A pack's .deb files of the lock's OS package pins (``ospackages.with_debs``): a system-Python
    # lock's OS packages are installed from them, with the network off, when every pin has one.
    debs: Path | None = None

    @property
    def offline(self) -> bool:
        """A restore from a wheelhouse (``--wheelhouse``, a bundle, a pack) installs from its
        files alone: no index, and nothing fetched to build envlock's own wheel (``ownwheel``)."""
        return self.wheelhouse is not None


def numerics_env(lock: Lock | Header, *, process: bool) -> dict[str, str]:
    """The lock's numerics variables, validated: those set before the capturing process started
    (``process=False``: the image's ``ENV``) or those it set itself (``process=True``: process
    state, which ``envlock run`` passes to the command and the image does not carry)."""
    set_by_process = set(lock.determinism.process_env)
    out: dict[str, str] = {}
    for key, value in sorted(lock.determinism.env.items()):
        if (key in set_by_process) != process:
            continue
        values.env_name(key)
        if not numerics_variable(key):
            raise UnsafeValue(
                f"refusing determinism variable {key!r}: not one of the variables that change "
                "numerics (envlock.probe.rules.numerics_variable)",
                hint="the lock was edited or crafted; restore only sets known numerics variables")
        out[key] = values.env_value(value, name=key)
    return out


def options_key(options: Options) -> str:
    """A digest of what the user chose for a restore (base, wheelhouse, index, venv, python,
    --skip-local, ...): equal for the same options, whatever the context they produced.

    A digest, not the values: an image's labels travel with it when it is pushed, and a
    wheelhouse's path is this machine's."""
    chosen = {"base": options.base, "allow_unpinned_base": options.allow_unpinned_base,
              "skip_local": options.skip_local,
              "wheelhouse": str(Path(options.wheelhouse).resolve()) if options.wheelhouse else None,
              "index_url": options.index_url, "venv": options.venv, "python": options.python,
              "allow_http": options.allow_http}
    return "sha256:" + hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


def image_name(lock_path: Path | None, name: str | None = None) -> str:
    """``<name>`` of ``envlock/<name>``: given, else the lock's directory, made tag-safe."""
    raw = name or (Path(lock_path).resolve().parent.name if lock_path else "") or "env"
    clean = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:64].strip("-")
    return clean or "env"


def image_tag(name: str, short_id: str) -> str:
    """``envlock/<name>:<id>``: the tag of a lock's restored image, which restore builds and
    finds in the cache, ``run`` looks up, the Dockerfile's rebuild line and ``--dockerfile-only``
    name, and a failure's hint points at; written here once."""
    return f"envlock/{name}:{short_id}"
