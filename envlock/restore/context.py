"""Render a build context (Dockerfile + requirement files + wheels) from a lock.

``plan()`` decides (base image, interpreter, which package goes to which layer, what cannot be
restored) and validates every value on the way in; ``render()`` turns a plan into file texts and
``write_context()`` writes them. Nothing here talks to an engine: ``envlock restore
--dockerfile-only`` works without one, and the engine-backed restore resolves unpinned bases
before calling ``plan()``.

The Dockerfile is written for the classic builder that docker SDK builds use (no ``RUN
--mount``, no heredocs), so the same text builds on Docker with or without BuildKit and on
Podman. Every ``RUN`` that carries a value from the lock is in exec (JSON) form: no shell ever
parses a lock value.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from envlock import __version__
from envlock.errors import NotRestorable, UnsafeValue, UsageError
from envlock.model import SCHEMA_VERSION, Lock, Package
from envlock.probe.rules import NUMERICS_ENV
from envlock.restore import ospackages, values
from envlock.restore.tables import bases

LayerName = Literal["torch", "packages", "tooling"]
BaseOrigin = Literal["lock", "--base", "table"]

TOOLING = ("pip", "setuptools", "wheel")
REQ_DIR_IN_IMAGE = "/usr/local/share/envlock-restore"
WHEELS_IN_IMAGE = "/tmp/envlock-wheels"
BUILD_STAGE = "envlock-build"
DEFAULT_UID = 1000
IMAGE_USER = "user"
WORKDIR = "/workspace"
LABEL_FINGERPRINT = "org.envlock.fingerprint"
LABEL_SCHEMA = "org.envlock.schema-version"
LABEL_SHORT_ID = "org.envlock.short-id"
LABEL_CONTEXT = "org.envlock.context"
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


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    line: str  # the requirement-file line, without hashes
    hashes: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.hashes:
            return self.line
        return " \\\n    ".join([self.line, *(f"--hash={h}" for h in self.hashes)])


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

    @property
    def expected_image_change(self) -> bool:
        # The restored image is always a new image (FROM the lock's, plus layers); its identity
        # differs from the lock's by construction.
        return True

    @property
    def os_packages_restored(self) -> bool:
        """False when a venv goes onto another base: the image's OS packages are the base's."""
        return self.os_install is not None or self.base.origin == "lock"

    @property
    def short_id(self) -> str:
        return self.lock.short_id


# -- base --------------------------------------------------------------------------------------


def choose_base(lock: Lock, options: Options) -> BaseChoice:
    """The base named by --base, the lock's image, or the data table (in that order)."""
    if options.base:
        ref = values.image_ref(options.base, what="--base")
        return BaseChoice(ref, "--base", values.is_pinned(ref), ref)
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


def _hashes(pkg: Package, options: Options) -> tuple[str, ...]:
    found = [values.package_hash(h, name=pkg.name) for h in pkg.hashes]
    if pkg.source == "url" and pkg.archive_hash and pkg.archive_hash.startswith(("sha256", "sha384", "sha512")):
        found.append(values.package_hash(pkg.archive_hash, name=pkg.name))
    if not found:
        found = [values.package_hash(h, name=pkg.name) for h in options.extra_hashes.get(pkg.name, ())]
    return tuple(dict.fromkeys(found))


def _weak_hash_note(pkg: Package, offline: bool) -> str | None:
    """Say what happens to an archive hash pip cannot check (md5 from old indexes)."""
    if not pkg.archive_hash or pkg.archive_hash.startswith(("sha256", "sha384", "sha512")):
        return None
    algo = re.split(r"[=:]", pkg.archive_hash, maxsplit=1)[0]
    checked = ("checked by envlock against the wheelhouse file" if offline
               else "not checked at install; the build is checked inside the image (record_sha256)")
    return f"{pkg.name}: the lock's archive hash is {algo}, which pip cannot check: {checked}"


def _requirement(pkg: Package, options: Options, offline: bool) -> tuple[Requirement | None, str | None]:
    """(requirement, note) for one package; raises when it cannot be expressed safely."""
    name = values.dist_name(pkg.name)
    ver = values.version(pkg.version, name=name)
    pin = f"{name}=={ver}"
    if pkg.source in ("index", "unknown"):
        return Requirement(name, ver, pin, _hashes(pkg, options)), _weak_hash_note(pkg, offline)
    if pkg.source == "url":
        if offline:
            return Requirement(name, ver, pin, _hashes(pkg, options)), _weak_hash_note(pkg, offline)
        if not pkg.url:
            raise NotRestorable(f"{name} {ver} was installed from a URL the lock does not record")
        link = values.url(pkg.url, what=f"URL of {name}", allow_http=options.allow_http)
        return (Requirement(name, ver, f"{name} @ {link}", _hashes(pkg, options)),
                _weak_hash_note(pkg, offline))
    if pkg.source == "vcs":
        vcs = pkg.vcs or ""
        if vcs not in values.VCS_SCHEMES:
            raise NotRestorable(f"{name} {ver} comes from {vcs or 'an unknown VCS'}; only git and hg "
                                "sources can be restored")
        if not pkg.url or not pkg.commit:
            raise NotRestorable(f"{name} {ver} comes from {vcs} without a recorded URL and commit")
        commit = values.vcs_commit(pkg.commit, vcs=vcs)
        if offline:
            return (Requirement(name, ver, pin, ()),
                    f"{name}: vcs source replaced by a wheel of {ver} from the wheelhouse")
        link = values.url(pkg.url, schemes=values.VCS_SCHEMES[vcs], what=f"{vcs} URL of {name}",
                          allow_http=options.allow_http)
        # pip cannot hash a checkout; the full commit id is the pin.
        return Requirement(name, ver, f"{name} @ {vcs}+{link}@{commit}", ()), None
    return None, None  # editable / local: the caller decides


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


def numerics_env(lock: Lock, *, process: bool) -> dict[str, str]:
    """The lock's numerics variables, validated: those set before the capturing process started
    (``process=False``: the image's ``ENV``) or those it set itself (``process=True``: process
    state, which ``envlock run`` passes to the command and the image does not carry)."""
    allowed = set(NUMERICS_ENV)
    set_by_process = set(lock.determinism.process_env)
    out: dict[str, str] = {}
    for key, value in sorted(lock.determinism.env.items()):
        if (key in set_by_process) != process:
            continue
        values.env_name(key)
        if key not in allowed:
            raise UnsafeValue(
                f"refusing determinism variable {key!r}: not one of the variables that change "
                "numerics (envlock.probe.rules.NUMERICS_ENV)",
                hint="the lock was edited or crafted; restore only sets known numerics variables")
        out[key] = values.env_value(value, name=key)
    return out


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


def plan(lock: Lock, options: Options, base: BaseChoice | None = None,
         wheels_for: Mapping[str, tuple[Path, ...]] | None = None) -> Plan:
    """Decide and validate everything the build needs. ``base`` overrides ``choose_base``.

    ``wheels_for`` maps a package name to its wheel files (from ``wheelhouse.select``); it is
    required with ``options.wheelhouse``.
    """
    base = base or choose_base(lock, options)
    values.image_ref(base.ref)
    require_pinned(base, options)
    notes: list[str] = []
    offline = options.wheelhouse is not None
    if options.index_url:
        values.url(options.index_url, what="--index-url", allow_http=options.allow_http)

    prefix_kind = lock.python.prefix_kind
    if prefix_kind == "conda" and base.origin != "lock":
        raise NotRestorable("the lock was captured in a conda environment; conda packages can only "
                            "be restored from the lock's own image", hint="restore without --base")
    venv: str | None = None
    if prefix_kind == "venv":
        raw = options.venv or lock.python.prefix
        if not raw:
            raise NotRestorable("the lock was captured in a virtual environment but does not record "
                                "its path", hint="pass --venv /opt/venv")
        venv = _venv_path(raw, what="--venv" if options.venv else "virtual environment path")
        if venv == WORKDIR or venv.startswith(WORKDIR + "/"):
            raise NotRestorable(f"the lock's virtual environment {venv} lies under {WORKDIR}, where "
                                "`envlock run` mounts the workspace", hint="pass --venv /opt/venv")
    elif options.venv:
        venv = _venv_path(options.venv, what="--venv")
    base_python = values.interpreter(options.python) if options.python else "python3"
    python = f"{venv}/bin/python" if venv else base_python
    os_install = ospackages.plan_os(lock, venv, notes)
    from_os = set(ospackages.system_dists(lock, os_install, notes))

    table = bases().torch
    label = torch_label(lock)
    torch_index = table.index_for(label)
    by_layer: dict[LayerName, list[Requirement]] = {"torch": [], "packages": [], "tooling": []}
    skipped: list[str] = []
    local: list[str] = []
    from_wheel: list[str] = []
    for pkg in lock.packages:
        if pkg.name in from_os:
            if os_install is None:
                skipped.append(pkg.name)
            continue
        if pkg.installer == "conda":
            if base.origin == "lock":
                skipped.append(pkg.name)
                continue
            raise NotRestorable(f"{pkg.name} {pkg.version} was installed by conda")
        req, note = _requirement(pkg, options, offline)
        if note:
            notes.append(note)
        if req is not None and pkg.source == "vcs" and offline:
            from_wheel.append(pkg.name)
        if req is None:
            where = f" ({pkg.url})" if pkg.url else ""
            if not options.skip_local:
                local.append(f"{pkg.name} {pkg.version} [{pkg.source}{where}]")
            skipped.append(pkg.name)
            continue
        if pkg.name in TOOLING:
            by_layer["tooling"].append(req)
        elif table.in_layer(pkg.name):
            by_layer["torch"].append(req)
        else:
            by_layer["packages"].append(req)
    if local:
        raise NotRestorable(
            "not restorable: installed from a local directory or file that is not in the lock: "
            + "; ".join(local),
            hint="publish them (index, URL or git commit) and capture again, or pass --skip-local "
                 "to restore without them (verification then ignores them)")

    pypi = options.index_url or bases().pypi
    layers: list[Layer] = []
    for name in ("torch", "packages", "tooling"):
        reqs = tuple(by_layer[name])
        if not reqs:
            continue
        if offline:
            args: tuple[str, ...] = ("--no-index", "--find-links", f"{WHEELS_IN_IMAGE}/{name}")
        elif name == "torch" and torch_index:
            args = ("--index-url", torch_index, "--extra-index-url", pypi)
        elif options.index_url:
            args = ("--index-url", options.index_url)
        else:
            args = ()
        layers.append(Layer(name, reqs, args))
    remove: tuple[str, ...] = ()
    if venv:
        have = {r.name for r in by_layer["tooling"]}
        # ensurepip seeds every venv with pip (and setuptools before Python 3.12); whatever of
        # that the lock does not list must go, or verification sees extra packages.
        remove = tuple(t for t in ("wheel", "setuptools", "pip") if t not in have)
    wheels: dict[str, tuple[Path, ...]] = {}
    base_tooling: list[str] = []
    if offline:
        wheels_for = wheels_for or {}
        kept: list[Layer] = []
        for layer in layers:
            if layer.name == "tooling":
                reqs = tuple(r for r in layer.requirements if wheels_for.get(r.name))
                for r in layer.requirements:
                    if not wheels_for.get(r.name):
                        base_tooling.append(r.name)
                        notes.append(f"{r.name}=={r.version}: no wheel in the wheelhouse; the base "
                                     f"image's ensurepip {r.name} stays (its version is reported as info)")
                layer = replace(layer, requirements=reqs)
                if not reqs:
                    continue
            kept.append(layer)
        layers = kept
        for layer in layers:
            files: list[Path] = []
            for req in layer.requirements:
                files.extend(wheels_for.get(req.name, ()))
            wheels[layer.name] = tuple(files)
        # pip would stop at the first missing wheel, after minutes of earlier layers (torch);
        # naming every missing one now costs nothing and saves a build per missing wheel.
        missing = [f"{r.name}=={r.version}" for layer in layers for r in layer.requirements
                   if not wheels_for.get(r.name)]
        if missing:
            raise NotRestorable(
                f"no wheel in the wheelhouse {options.wheelhouse} for: " + ", ".join(missing),
                hint="add them (pip download --no-deps --only-binary=:all: NAME==VERSION -d DIR), "
                     "or collect every wheel with `envlock bundle env.lock -o DIR`")
    return Plan(lock=lock, base=base, python=python, base_python=base_python, venv=venv,
                layers=tuple(layers), remove=remove, env=_env(lock), skipped=tuple(skipped),
                from_wheel=tuple(from_wheel), wheels=wheels, notes=tuple(notes), offline=offline,
                base_tooling=tuple(base_tooling),
                os_install=os_install)


# -- rendering ---------------------------------------------------------------------------------


def _exec(argv: Iterable[str]) -> str:
    return json.dumps(list(argv))


def _pip(plan: Plan, *args: str) -> str:
    env = ["env", "PIP_ROOT_USER_ACTION=ignore", "PIP_NO_WARN_SCRIPT_LOCATION=1"]
    if not plan.venv:
        # Debian/Ubuntu mark their python externally managed (PEP 668); older pips ignore the
        # variable, where a command-line flag would be an error.
        env.append("PIP_BREAK_SYSTEM_PACKAGES=1")
    return "RUN " + _exec([*env, plan.python, "-m", "pip", *args])


_PIP_INSTALL = ("install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-input")


def _version_check(plan: Plan) -> str:
    major, minor = (int(x) for x in plan.lock.python.version.split(".")[:2])
    code = (f"import sys; v = sys.version_info[:2]; sys.exit(0 if v == ({major}, {minor}) else "
            f"'envlock: the base image python is %d.%d, the lock needs {major}.{minor}; "
            f"pass --base with a python {major}.{minor} image' % v)")
    return "RUN " + _exec([plan.base_python, "-c", code])


def _label(key: str, value: str) -> str:
    return f"{json.dumps(key)}={json.dumps(value)}"


def labels(plan: Plan) -> dict[str, str]:
    lock = plan.lock
    fp = lock.envlock.fingerprint
    out = {LABEL_SCHEMA: str(SCHEMA_VERSION), LABEL_SHORT_ID: plan.short_id,
           "org.opencontainers.image.base.name": values.image_ref(plan.base.display)}
    if fp:
        out[LABEL_FINGERPRINT] = values.digest(fp)
    _, _, dig = values.split_ref(plan.base.ref)
    if dig and "@" in plan.base.ref:
        out["org.opencontainers.image.base.digest"] = dig
    return out


def dockerfile(plan: Plan) -> str:
    # Offline into a venv: install in a build stage and copy only the venv out, so the wheels
    # COPY'd in for pip (hundreds of MB for torch, GBs with CUDA) stay out of the final image.
    # The classic builder has no `RUN --mount`; a stage is the portable way.
    staged = plan.offline and plan.venv is not None
    lines = [
        f"# Generated by envlock {__version__} from a lock with id {plan.short_id}; do not edit.",
        f"# Rebuild: envlock restore env.lock   (or: docker build -t envlock/env:{plan.short_id} .)",
        f"# Base: {plan.base.display} ({plan.base.origin})",
        f"FROM {plan.base.ref}" + (f" AS {BUILD_STAGE}" if staged else ""),
        # The base may end with a non-root USER (a lock captured in an image that runs as its
        # researcher, as most workstation images do): installing needs root.
        "USER root",
        "",
        "# Fail early, with a clear message, when the base's python is not the lock's.",
        _version_check(plan),
    ]
    if plan.venv:
        lines += ["", f"# The lock was captured in a virtual environment at {plan.venv}.",
                  "RUN " + _exec([plan.base_python, "-m", "venv", plan.venv]),
                  f"ENV VIRTUAL_ENV={plan.venv} PATH={plan.venv}/bin:$PATH"]
    if plan.os_install:
        lines += ospackages.dockerfile_lines(plan.os_install, plan.base_python, REQ_DIR_IN_IMAGE)
    comments = {
        "torch": "torch and its CUDA wheels first, in their own layer: a change to a small package "
                 "must not rebuild or re-download them.",
        "packages": "Everything else, exact pins, no dependency resolution (the lock is the closure).",
        "tooling": "pip/setuptools/wheel last, pinned to the lock's versions (the layers above used "
                   "the base's pip).",
    }
    for layer in plan.layers:
        lines += ["", f"# {comments[layer.name]}"]
        files = layer.files()
        for fname in files:
            lines.append(f"COPY {_exec(['requirements/' + fname, f'{REQ_DIR_IN_IMAGE}/{fname}'])}")
        if plan.offline:
            lines.append(f"COPY {_exec([f'wheels/{layer.name}/', f'{WHEELS_IN_IMAGE}/{layer.name}/'])}")
        for fname in files:
            hashed = fname.endswith("-hashed.txt")
            lines.append(_pip(plan, *_PIP_INSTALL, *(("--require-hashes",) if hashed else ()),
                              *layer.index_args, "-r", f"{REQ_DIR_IN_IMAGE}/{fname}"))
    if plan.remove:
        lines += ["", "# ensurepip's tools the lock does not have (uninstalling an absent one is a no-op).",
                  _pip(plan, "uninstall", "--yes", "--disable-pip-version-check", *plan.remove)]
    if staged:
        lines += ["", "# The image itself: the base plus the venv built above, without the wheels.",
                  f"FROM {plan.base.ref}",
                  "USER root",
                  f"COPY --from={BUILD_STAGE} {_exec([plan.venv or '', plan.venv or ''])}",
                  f"COPY --from={BUILD_STAGE} {_exec([REQ_DIR_IN_IMAGE, REQ_DIR_IN_IMAGE])}",
                  f"ENV VIRTUAL_ENV={plan.venv} PATH={plan.venv}/bin:$PATH"]
    lines += [
        "",
        "# A non-root user; `envlock run` runs as the caller's uid:gid instead.",
        "RUN (command -v useradd >/dev/null && useradd --uid 1000 --user-group --create-home "
        f"--shell /bin/sh {IMAGE_USER}) || (command -v adduser >/dev/null && adduser -D -u 1000 "
        f"{IMAGE_USER}) || true; mkdir -p {WORKDIR} && chown {DEFAULT_UID}:{DEFAULT_UID} {WORKDIR}",
    ]
    if plan.env:
        lines += ["", "# Variables that change numerics, as captured."]
        lines.append("ENV " + " ".join(f'{k}="{v}"' for k, v in plan.env))
    lines += ["", "LABEL " + " \\\n      ".join(_label(k, v) for k, v in sorted(labels(plan).items())),
              f"USER {DEFAULT_UID}:{DEFAULT_UID}", f"WORKDIR {WORKDIR}", ""]
    return "\n".join(lines)


def render(plan: Plan) -> dict[str, str]:
    """Relative path -> text of every generated file of the build context."""
    out = {"Dockerfile": dockerfile(plan)}
    for layer in plan.layers:
        for fname, reqs in layer.files().items():
            head = (f"# {layer.name} layer of envlock lock {plan.short_id}: exact pins, installed "
                    "with --no-deps\n")
            out[f"requirements/{fname}"] = head + "".join(r.text() + "\n" for r in reqs)
    if plan.os_install:
        out.update(ospackages.files(plan.os_install))
    out[".dockerignore"] = "build.log\n"
    return out


def context_key(plan: Plan, rendered: Mapping[str, str] | None = None) -> str:
    """sha256 over everything that goes into the build: the image cache key."""
    from envlock.restore.wheelhouse import sha256_file  # wheelhouse imports this module

    rendered = rendered if rendered is not None else render(plan)
    h = hashlib.sha256()
    for rel in sorted(rendered):
        h.update(rel.encode() + b"\0" + hashlib.sha256(rendered[rel].encode()).digest())
    for layer in sorted(plan.wheels):
        for wheel in sorted(plan.wheels[layer]):
            h.update(f"wheels/{layer}/{wheel.name}".encode() + b"\0" + sha256_file(wheel).encode())
    return "sha256:" + h.hexdigest()


def write_context(plan: Plan, directory: Path, rendered: Mapping[str, str] | None = None,
                  *, force: bool = False) -> Path:
    """Write the build context to ``directory``: new, empty, or (with ``force``) one envlock made.

    See ``envlock.restore.outdir``: nothing is written through a link, nothing of the user's is
    removed.
    """
    from envlock.restore import outdir

    rendered = rendered if rendered is not None else render(plan)
    return outdir.write(Path(directory), rendered, plan.wheels, force=force)
