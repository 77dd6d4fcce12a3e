"""Plan a restore: from a lock and the user's options to a validated ``Plan``.

``plan()`` decides (base image, interpreter, which package goes to which layer, what cannot be
restored) and validates every value on the way in, one named step each; ``dockerfile.render()``
turns a plan into the build context's text. Nothing here talks to an engine: ``envlock restore
--dockerfile-only`` works without one, and the engine-backed restore resolves unpinned bases
before calling ``plan()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from packaging.utils import canonicalize_name

from envlock._files import sha256_file
from envlock.drift.expected import TOOLING, Restored
from envlock.errors import WHEELHOUSE_HINT, NotRestorable, UnsafeValue, UsageError
from envlock.restore import ospackages, values
from envlock.restore.image import WORKDIR, BaseOrigin, Options, numerics_env
from envlock.restore.ownwheel import OWN_DIST
from envlock.restore.requirements import Requirement, requirement
from envlock.restore.tables import bases

if TYPE_CHECKING:
    from envlock.lock import Lock, Package

LayerName = Literal["torch", "torch-deps", "packages", "envlock", "tooling"]

# In install order. "torch-deps": offline, the packages the torch layer's wheels require (their
# METADATA's Requires-Dist, transitively), so a change to an unrelated small package does not
# reinstall them either.
LAYERS: tuple[LayerName, ...] = ("torch", "torch-deps", "packages", "envlock", "tooling")
WHEELS_IN_IMAGE = "/tmp/envlock-wheels"
# Set in CUDA images so the NVIDIA container runtime mounts the driver's compute libraries, as
# the nvidia/cuda images do.
CUDA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


@dataclass(frozen=True)
class BaseChoice:
    """The image to build FROM, where it came from, and whether it names immutable content."""

    ref: str
    origin: BaseOrigin
    pinned: bool
    display: str  # what a human would recognise (a tag), for comments and labels


@dataclass(frozen=True)
class Layer:
    name: LayerName
    requirements: tuple[Requirement, ...]
    index_args: tuple[str, ...]

    def files(self) -> dict[str, tuple[Requirement, ...]]:
        """Requirement file name -> its requirements: hashed and unhashed ones apart.

        pip switches to hash-checking mode for a whole invocation as soon as one requirement
        has a hash, and then refuses every requirement without one; so a lock with hashes for
        some packages only needs two invocations per layer.
        """
        hashed = tuple(r for r in self.requirements if r.hashes)
        plain = tuple(r for r in self.requirements if not r.hashes)
        out: dict[str, tuple[Requirement, ...]] = {}
        if plain:
            out[f"{self.name}.txt"] = plain
        if hashed:
            out[f"{self.name}-hashed.txt"] = hashed
        return out


@dataclass(frozen=True)
class Plan:
    lock: Lock
    base: BaseChoice
    python: str  # interpreter that installs and that the probe runs with, inside the image
    base_python: str  # the base image's interpreter (creates the venv)
    venv: str | None
    layers: tuple[Layer, ...]
    remove: tuple[str, ...]  # tooling the venv got from ensurepip but the lock does not have
    env: tuple[tuple[str, str], ...]
    skipped: tuple[str, ...]
    wheels: Mapping[str, tuple[Path, ...]]  # layer -> wheel files to copy into the context
    notes: tuple[str, ...]
    offline: bool
    # OS packages installed with the image's package manager (system-Python locks only).
    os_install: ospackages.OsInstall | None = None
    # vcs packages installed from a wheel of the same version (offline: no checkout reachable);
    # the image cannot show their commit, and verification knows why.
    from_wheel: tuple[str, ...] = ()
    # pip/setuptools/wheel with no wheel offline: the base's ensurepip copy stays, as `bundle`
    # announces, and verification reports its version as info.
    base_tooling: tuple[str, ...] = ()
    image_name: str = "env"  # Options.image_name
    # envlock itself (the lock holds it: training code imports it), installed from a wheel of
    # the envlock that restores (``ownwheel``); its origin cannot be the lock's, by design.
    own: str | None = None
    # A uv binary (``restore.uvbin``) that installs inside the build stages, which leave it
    # behind; pip installs where there is none or it does not run in the base.
    uv: Path | None = None
    torch_layer_image: bool = True  # Options.torch_layer_image
    mounts: bool = False  # Options.mounts

    @property
    def split_torch(self) -> bool:
        """Offline into a venv with a torch layer: that layer is an image of its own
        (``dockerfile.torch_layer``), built from the torch wheels alone and shared by every lock
        with the same torch pins; the rest installs on top of it. The torch wheels are then
        neither sent nor copied again when only a small package changes."""
        return (self.torch_layer_image and self.offline and self.venv is not None
                and self.os_install is None and any(layer.name == "torch" for layer in self.layers))

    @property
    def os_packages_restored(self) -> bool:
        """False when a venv goes onto another base: the image's OS packages are the base's."""
        return self.os_install is not None or self.base.origin == "lock"

    @property
    def short_id(self) -> str:
        return self.lock.short_id

    @property
    def restored(self) -> Restored:
        """What this restore changes on purpose: written into the image (``RESTORED_FILE``) and
        allowed for by every verify of the lock there, restore's own check included."""
        return Restored(fingerprint=self.lock.envlock.fingerprint or "", image_change=True,
                        skipped=self.skipped, from_wheel=self.from_wheel,
                        base_tooling=self.base_tooling,
                        os_packages_restored=self.os_packages_restored, own=self.own)


# -- base --------------------------------------------------------------------------------------


def choose_base(lock: Lock, options: Options) -> BaseChoice:
    """The base named by --base, the lock's image, or the data table (in that order)."""
    if options.base:
        ref = values.image_ref(options.base, what="--base")
        display = values.image_ref(options.base_display) if options.base_display else ref
        return BaseChoice(ref, options.base_origin or "--base", values.is_pinned(ref), display)
    img = lock.image
    if img.digest:
        dig = values.digest(img.digest)
        if not img.reference:
            raise NotRestorable(
                "the lock's image has a digest but no repository name to pull it from",
                hint="pass --base REF@" + dig)
        repo, tag, _ = values.split_ref(img.reference)
        if not repo:
            raise NotRestorable("the lock's image reference names no repository", hint="pass --base")
        display = f"{repo}:{tag}" if tag else repo
        return BaseChoice(f"{repo}@{dig}", "lock", True, display)
    if img.id:
        ident = values.digest(img.id)
        display = img.reference or ident
        if img.reference:
            values.image_ref(img.reference)
        # Only an image id: the image exists on the machine that captured it (a local build).
        return BaseChoice(ident, "lock", True, display)
    minor = ".".join(lock.python.version.split(".")[:2])
    image = bases().python_base(minor)
    if image is None:
        raise NotRestorable(f"no base image known for python {minor}",
                            hint="pass --base REF@sha256:... with that python")
    ref = values.image_ref(image)
    return BaseChoice(ref, "table", values.is_pinned(ref), ref)


def require_pinned(base: BaseChoice, options: Options) -> None:
    if base.pinned or options.allow_unpinned_base:
        return
    raise UsageError(
        f"the base image {base.ref} is not pinned: a tag can point at other content tomorrow",
        hint="pass --base REF@sha256:<digest>, restore with an engine (it resolves the tag), "
             "or accept the risk with --allow-unpinned-base")


# -- packages ----------------------------------------------------------------------------------


def torch_label(lock: Lock) -> str | None:
    torch = lock.package("torch")
    if torch is None:
        return None
    return values.local_label(values.version(torch.version, name="torch"))


def _env(lock: Lock) -> tuple[tuple[str, str], ...]:
    out = numerics_env(lock, process=False)
    if lock.torch and lock.torch.cuda:
        for key, value in CUDA_ENV.items():
            out.setdefault(key, value)
    return tuple(out.items())


# `python -m venv /usr/local` in a python image would replace the image's own interpreter and
# pip; a venv at a home or shared root would be mixed with everything else there.
NOT_A_VENV = frozenset({"/usr", "/usr/local", "/usr/share", "/usr/include", "/root", "/home", "/opt",
                        "/var", "/tmp", "/srv", "/mnt", "/media"})


def _venv_path(raw: str, *, what: str) -> str:
    venv = values.abs_path(raw, what=what)
    if venv in NOT_A_VENV:
        raise UnsafeValue(f"refusing {what} {venv!r}: a system or shared directory, not a place for "
                          "a virtual environment", hint="pass --venv /opt/venv")
    return venv


# -- plan, step by step --------------------------------------------------------------------------


def _check_options(base: BaseChoice, options: Options) -> None:
    values.image_ref(base.ref)
    require_pinned(base, options)
    if options.index_url:
        values.url(options.index_url, what="--index-url", allow_http=options.allow_http, index=True)


def _venv(lock: Lock, options: Options, base: BaseChoice) -> str | None:
    """Where the packages go: the lock's venv path (or --venv), or None for the image's python."""
    prefix_kind = lock.python.prefix_kind
    if prefix_kind == "conda" and base.origin != "lock":
        raise NotRestorable("the lock was captured in a conda environment; conda packages can only "
                            "be restored from the lock's own image", hint="restore without --base")
    if prefix_kind != "venv":
        return _venv_path(options.venv, what="--venv") if options.venv else None
    raw = options.venv or lock.python.prefix
    if not raw:
        raise NotRestorable("the lock was captured in a virtual environment but does not record "
                            "its path", hint="pass --venv /opt/venv")
    venv = _venv_path(raw, what="--venv" if options.venv else "virtual environment path")
    if venv == WORKDIR or venv.startswith(WORKDIR + "/"):
        raise NotRestorable(f"the lock's virtual environment {venv} lies under {WORKDIR}, where "
                            "`envlock run` mounts the workspace", hint="pass --venv /opt/venv")
    return venv


@dataclass
class _Sorted:
    """The lock's packages, sorted: requirements per layer, and what is left out and why."""

    layers: dict[LayerName, list[Requirement]] = field(
        default_factory=lambda: {name: [] for name in LAYERS})
    skipped: list[str] = field(default_factory=list)
    from_wheel: list[str] = field(default_factory=list)


def unproven(packages: Iterable[Package]) -> list[str]:
    """``name version`` of the rows nothing in the lock can check a file against: no hash, no
    archive hash, no record_sha256 (a lock from an environment whose RECORD was missing). A
    VCS row is pinned by its commit. Whatever file an index or a wheelhouse gives for the
    others is installed unchecked, so restore and bundle name them."""
    return [f"{p.name} {p.version}" for p in packages
            if not (p.hashes or p.archive_hash or p.record_sha256) and p.source != "vcs"]


def unproven_warning(rows: Sequence[str]) -> str:
    return (f"warning: nothing in the lock checks the files installed for {', '.join(rows)} (no hash, no "
            "record_sha256): a swapped wheel would go unnoticed")


def _layer_of(name: str) -> LayerName:
    if name == OWN_DIST:
        return "envlock"
    if name in TOOLING:
        return "tooling"
    return "torch" if bases().torch.in_layer(name) else "packages"


def _skipped_by_pip(pkg: Package, owned_by_os: bool, os_install: ospackages.OsInstall | None,
                    base: BaseChoice) -> bool:
    """For a package pip does not install (an OS package's, conda's): True when the restore
    does not bring it back either, so verification leaves it out; conda needs the lock's image."""
    if owned_by_os:
        return os_install is None
    if base.origin != "lock":
        raise NotRestorable(f"{pkg.name} {pkg.version} was installed by conda")
    return True


def _own_requirement(pkg: Package, wheel: Path, notes: list[str]) -> Requirement:
    """envlock itself, from the wheel of the envlock that restores: pinned to that wheel's
    version and hash (verification then compares it with the lock's, like any package)."""
    version = values.version(wheel.name.split("-")[1], name=OWN_DIST)
    if version != pkg.version:
        notes.append(f"{OWN_DIST}: the lock has {pkg.version}, this envlock is {version}; the image "
                     f"gets {version} (verification reports the difference)")
    notes.append(f"{OWN_DIST} {version}: installed from a wheel of the envlock that restores "
                 f"({pkg.source} in the lock)")
    return Requirement(OWN_DIST, version, f"{OWN_DIST}=={version}", (sha256_file(wheel),))


def _sort_packages(lock: Lock, options: Options, base: BaseChoice, offline: bool,
                   os_install: ospackages.OsInstall | None, notes: list[str],
                   own_wheel: Path | None = None) -> _Sorted:
    """Each package into its layer, or out (OS-owned, conda, local); local ones refuse the
    restore, all named at once, unless --skip-local."""
    from_os = set(ospackages.system_dists(lock, os_install, notes))
    out = _Sorted()
    local: list[str] = []
    for pkg in lock.packages:
        if pkg.name in from_os or pkg.installer == "conda":
            if _skipped_by_pip(pkg, pkg.name in from_os, os_install, base):
                out.skipped.append(pkg.name)
            continue
        if pkg.name == OWN_DIST and own_wheel is not None:
            out.layers["envlock"].append(_own_requirement(pkg, own_wheel, notes))
            continue
        if offline and pkg.source == "local" and pkg.name in options.local_wheels:
            # Its wheel was rebuilt from the installed files and proven to be the lock's build.
            req, note = requirement(pkg.model_copy(update={"source": "index", "url": None}),
                                    offline=True, extra_hashes=options.extra_hashes.get(pkg.name, ()))
            out.from_wheel.append(pkg.name)
        else:
            req, note = requirement(pkg, offline=offline, allow_http=options.allow_http,
                                    extra_hashes=options.extra_hashes.get(pkg.name, ()))
        if note:
            notes.append(note)
        if req is None:
            if not options.skip_local:
                where = f" ({pkg.url})" if pkg.url else ""
                local.append(f"{pkg.name} {pkg.version} [{pkg.source}{where}]")
            out.skipped.append(pkg.name)
            continue
        if pkg.source == "vcs" and offline:
            out.from_wheel.append(pkg.name)
        out.layers[_layer_of(pkg.name)].append(req)
    if local:
        raise NotRestorable(
            "not restorable: installed from a local directory or file that is not in the lock: "
            + "; ".join(local),
            hint="publish them (index, URL or git commit) and capture again, or pass --skip-local "
                 "to restore without them (verification then ignores them)")
    return out


def _torch_deps(sorted_: _Sorted, wheels_for: Mapping[str, tuple[Path, ...]]) -> None:
    """Move the packages the torch layer's wheels require (transitively, among the packages
    layer's) into the torch-deps layer (the wheels' reader imported here: only planning with
    wheels needs it)."""
    from envlock.restore.wheelhouse import wheel_requires

    packages: dict[str, Requirement] = {canonicalize_name(r.name): r for r in sorted_.layers["packages"]}
    pending = [r.name for r in sorted_.layers["torch"]]
    deps: set[str] = set()
    while pending:
        for wheel in wheels_for.get(pending.pop(), ()):
            for name in wheel_requires(wheel) & packages.keys() - deps:
                deps.add(name)
                pending.append(packages[name].name)
    sorted_.layers["torch-deps"] = [r for r in sorted_.layers["packages"] if canonicalize_name(r.name) in deps]
    sorted_.layers["packages"] = [r for r in sorted_.layers["packages"] if canonicalize_name(r.name) not in deps]


def _index_args(layer: LayerName, options: Options, offline: bool, torch_index: str | None
                ) -> tuple[str, ...]:
    if offline or layer == "envlock":
        return ("--no-index", "--find-links", f"{WHEELS_IN_IMAGE}/{layer}")
    # The default index is the installer's own (pip's configuration inside the image): only
    # what the user or the lock's torch build asks for is written.
    main = ("--index-url", options.index_url) if options.index_url else ()
    if layer == "torch" and torch_index:
        return (*main, "--extra-index-url", torch_index)
    return main


def _layers(sorted_: _Sorted, options: Options, offline: bool, lock: Lock) -> list[Layer]:
    torch_index = None
    if not offline and sorted_.layers["torch"]:
        torch_index = bases().torch.index_for(torch_label(lock), hint=f"or restore with {WHEELHOUSE_HINT}")
    return [Layer(name, tuple(sorted_.layers[name]), _index_args(name, options, offline, torch_index))
            for name in LAYERS if sorted_.layers[name]]


def _ensurepip_leftovers(venv: str | None, sorted_: _Sorted) -> tuple[str, ...]:
    """ensurepip seeds every venv with pip (and setuptools before Python 3.12); whatever of that
    the lock does not list must go, or verification sees extra packages."""
    if not venv:
        return ()
    have = {r.name for r in sorted_.layers["tooling"]}
    return tuple(t for t in reversed(TOOLING) if t not in have)


def _tooling_from_base(layers: list[Layer], wheels_for: Mapping[str, tuple[Path, ...]],
                       notes: list[str]) -> tuple[list[Layer], tuple[str, ...]]:
    """Offline, pip/setuptools/wheel without a wheel stay the base's ensurepip copies (as
    ``bundle`` announces): (the layers without them, their names)."""
    kept: list[Layer] = []
    from_base: list[str] = []
    for layer in layers:
        if layer.name == "tooling":
            for r in layer.requirements:
                if not wheels_for.get(r.name):
                    from_base.append(r.name)
                    notes.append(f"{r.name}=={r.version}: no wheel in the wheelhouse; the base "
                                 f"image's ensurepip {r.name} stays (its version is reported as info)")
            layer = replace(layer, requirements=tuple(r for r in layer.requirements
                                                      if wheels_for.get(r.name)))
            if not layer.requirements:
                continue
        kept.append(layer)
    return kept, tuple(from_base)


def _wheels(layers: list[Layer], wheels_for: Mapping[str, tuple[Path, ...]],
            wheelhouse: Path | None) -> dict[str, tuple[Path, ...]]:
    """Layer -> the wheel files to copy into the context; every missing wheel named at once."""
    # pip would stop at the first missing wheel, after minutes of earlier layers (torch);
    # naming every missing one now costs nothing and saves a build per missing wheel.
    missing = [f"{r.name}=={r.version}" for layer in layers for r in layer.requirements
               if not wheels_for.get(r.name)]
    if missing:
        raise NotRestorable(
            f"no wheel in the wheelhouse {wheelhouse} for: " + ", ".join(missing),
            hint="add them (pip download --no-deps --only-binary=:all: NAME==VERSION -d DIR), "
                 "or collect every wheel with `envlock bundle env.lock -o DIR`")
    return {layer.name: tuple(f for r in layer.requirements for f in wheels_for.get(r.name, ()))
            for layer in layers}


def plan(lock: Lock, options: Options, base: BaseChoice | None = None,
         wheels_for: Mapping[str, tuple[Path, ...]] | None = None,
         own_wheel: Path | None = None, uv: Path | None = None) -> Plan:
    """Decide and validate everything the build needs. ``base`` overrides ``choose_base``.

    ``wheels_for`` maps a package name to its wheel files (from ``wheelhouse.select``); it is
    required with ``options.wheelhouse``. ``own_wheel``: a wheel of the running envlock, which
    replaces the lock's envlock whatever its source (``ownwheel``). ``uv``: a uv binary for
    the build stages of an offline venv restore (``restore.uvbin``).
    """
    base = base or choose_base(lock, options)
    _check_options(base, options)
    notes: list[str] = []
    offline = options.offline
    venv = _venv(lock, options, base)
    base_python = values.interpreter(options.python) if options.python else "python3"
    os_install = ospackages.with_debs(ospackages.plan_os(lock, venv, notes), options.debs, notes)
    sorted_ = _sort_packages(lock, options, base, offline, os_install, notes, own_wheel)
    installed = {r.name for reqs in sorted_.layers.values() for r in reqs}
    unchecked = unproven(p for p in lock.packages if p.name in installed)
    if unchecked:
        notes.append(unproven_warning(unchecked))
    if offline and wheels_for:
        _torch_deps(sorted_, wheels_for)
    layers = _layers(sorted_, options, offline, lock)
    wheels: dict[str, tuple[Path, ...]] = {}
    base_tooling: tuple[str, ...] = ()
    own = OWN_DIST if sorted_.layers["envlock"] else None
    if offline:
        wheels_for = {**(wheels_for or {}), **({OWN_DIST: (own_wheel,)} if own and own_wheel else {})}
        layers, base_tooling = _tooling_from_base(layers, wheels_for, notes)
        wheels = _wheels(layers, wheels_for, options.wheelhouse)
    elif own and own_wheel:
        wheels = {"envlock": (own_wheel,)}
    return Plan(lock=lock, base=base, python=f"{venv}/bin/python" if venv else base_python,
                base_python=base_python, venv=venv, layers=tuple(layers),
                remove=_ensurepip_leftovers(venv, sorted_), env=_env(lock),
                skipped=tuple(sorted_.skipped), from_wheel=tuple(sorted_.from_wheel), wheels=wheels,
                notes=tuple(notes), offline=offline, base_tooling=base_tooling, os_install=os_install,
                image_name=options.image_name, own=own,
                uv=uv if offline and venv is not None else None,
                torch_layer_image=options.torch_layer_image, mounts=options.mounts)
