"""The build context's text from a plan: Dockerfile, requirement files, labels, the cache key.

One plan, one renderer, two ways for the wheels and requirement files to reach pip/uv
(``Plan.mounts``): bind-mounted from the build context by ``RUN --mount`` (BuildKit, Buildah:
the engines' own clients, ``restore.clibuild``), so they never enter a layer; or, for the
classic builder of docker SDK builds (no ``RUN --mount``), copied into a build stage whose venv
the image then copies out. Everything else is the same text. No ``# syntax=`` line: it would
fetch a frontend image from a registry; the engines' built-in Dockerfile frontends read
``RUN --mount=type=bind``. Every ``RUN`` that carries a value from the lock is in exec (JSON)
form: no shell ever parses a lock value; a mount names only envlock's own paths. Every value
here was validated by ``context.plan``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from envlock._files import sha256_file
from envlock._version import __version__
from envlock.drift.result import RESTORED_FILE
from envlock.lock import SCHEMA_VERSION
from envlock.restore import ospackages, outdir, values
from envlock.restore.context import WHEELS_IN_IMAGE, Layer, Plan
from envlock.restore.image import (
    LABEL_FINGERPRINT,
    LABEL_SCHEMA,
    LABEL_SHORT_ID,
    WORKDIR,
    image_tag,
)

REQ_DIR_IN_IMAGE = "/usr/local/share/envlock-restore"
RESTORED_NAME = "restored.json"
BUILD_STAGE = "envlock-build"
DEFAULT_UID = 1000
IMAGE_USER = "user"
# The torch layer's image (``torch_layer_dockerfile``): its key, which names its inputs.
LABEL_TORCH_LAYER = "org.envlock.torch-layer"
TORCH_LAYER_DOCKERFILE = "torch-layer.Dockerfile"
TORCH_LAYER_ARG = "ENVLOCK_TORCH_LAYER"
TORCH_LAYER_REPO = "envlock/torch-layer"
# A build stage's last instruction labels it with an id of the build that made it, given as this
# build argument, so that build removes it when done (``ContainerEngine.remove_build_stage``).
BUILD_STAGE_ARG = "ENVLOCK_BUILD_STAGE"
LABEL_BUILD_STAGE = "org.envlock.build-stage"
UV_IN_CONTEXT = "tools/uv"
UV_DIR_IN_IMAGE = "/tmp/envlock-uv"
UV_IN_IMAGE = f"{UV_DIR_IN_IMAGE}/uv"
# With mounts: where a RUN sees its requirement files, and the base image given as a build
# argument (BuildKit reads an image id in FROM as a registry name; ``clibuild`` passes a local
# name for it). The mount points stay behind as empty directories; the image's last RUN removes
# them.
REQ_MOUNTED = "/tmp/envlock-requirements"
BASE_ARG = "ENVLOCK_BASE"
# In a RUN that mounts, set to the digest of what it mounts (``_mounted_run``).
MOUNTED_ENV = "ENVLOCK_MOUNTED"
MOUNT_POINTS = (WHEELS_IN_IMAGE, REQ_MOUNTED, UV_DIR_IN_IMAGE)


_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}


def _digest(path: Path) -> str:
    """``sha256_file``, once per file and process: a restore keys its context and its torch
    layer on the same wheels (the torch wheel alone is hundreds of MB, GBs with CUDA). Keyed by
    the file's identity and stat, so a file replaced in between is read again."""
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def dockerfile_exec(argv: Iterable[str]) -> str:
    """An exec-form (JSON array) argument list: no shell parses it, a newline stays ``\\n``."""
    return json.dumps(list(argv))


def dockerfile_env(name: str, value: str) -> str:
    """``NAME="VALUE"`` for an ``ENV`` line. A Dockerfile has no complete quoting for ENV (``$``
    expands, ``\\`` escapes, a newline ends the instruction), so the value must pass the
    allowlist of ``values.env_value``, the one rule for what an image's ENV may hold."""
    return f'{values.env_name(name)}="{values.env_value(value, name=name)}"'


def _pip(plan: Plan, *args: str) -> list[str]:
    env = ["env", "PIP_ROOT_USER_ACTION=ignore", "PIP_NO_WARN_SCRIPT_LOCATION=1"]
    if not plan.venv:
        # Debian/Ubuntu mark their python externally managed (PEP 668); older pips ignore the
        # variable, where a command-line flag would be an error.
        env.append("PIP_BREAK_SYSTEM_PACKAGES=1")
    return [*env, plan.python, "-m", "pip", *args]


_PIP_INSTALL = ("install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-input")

# The install scripts define ``i``, which installs its arguments ("$@": --no-deps, the index
# flags, --require-hashes, -r FILE) into the interpreter "$0": the shell parses only this fixed
# text, never a value from the lock. pip's ``i``:
_PIP_I = ('i() { env PIP_ROOT_USER_ACTION=ignore PIP_NO_WARN_SCRIPT_LOCATION=1 "$0" -m pip install '
          '--no-cache-dir --disable-pip-version-check --no-input "$@"; }; ')
# uv's, when it runs in the base (pip's otherwise, said once). ``--compile-bytecode`` because
# pip compiles too (an image's user cannot write __pycache__ into the root-owned venv);
# ``--no-config``: no uv.toml or UV_ variable of the base changes what is installed.
# ``--link-mode=hardlink``: uv unpacks each wheel into its cache, a temporary directory in the
# build container's /tmp (``UV_NO_CACHE``), on the same file system as the venv, and links the
# files from there; the cache is removed when uv ends, so the venv's names are the only ones
# left and the layer holds each file once. Measured on overlay2 (docs/restore.md): torch's
# files linked in 0.25 s, copied in 1.9-3.5 s. Across file systems (a bind or cache mount as
# uv's cache) a link cannot be made, and uv copies instead.
_UV_I = (f'if {UV_IN_IMAGE} --version >/dev/null 2>&1; then i() {{ {UV_IN_IMAGE} pip install '
         '--no-config --no-progress --no-cache --link-mode=hardlink --compile-bytecode --python "$0" '
         '"$@"; }; else echo "envlock: the uv binary does not run in this base; installing with pip" '
         '>&2; ' + _PIP_I + 'fi; ')
_UV_OR_PIP = _UV_I + 'i "$@"'
# A word of an install script: envlock's own flags, paths and tool names, never a lock value.
_SCRIPT_WORD = re.compile(r"[A-Za-z0-9_./:=+-]+")
# A path a RUN --mount names, in envlock's own words (layer and requirement file names): the
# source relative, inside the build context; the target absolute, in the build container. The
# option list is comma-separated key=value pairs, so neither may hold a comma, an equals sign, a
# quote or a space; no part is `.` or `..` (a part begins with a letter or digit). envlock mounts
# only what it wrote into its context, named as the context's own relative paths, so a source
# never begins at a root and never climbs out of the context.
_MOUNT_PART = r"[a-z0-9][a-z0-9._-]*(?:/[a-z0-9][a-z0-9._-]*)*"
_MOUNT_SOURCE = re.compile(_MOUNT_PART)
_MOUNT_TARGET = re.compile("/" + _MOUNT_PART)


def _mount(source: str, target: str) -> str:
    """One read-only bind mount of a path of the build context (BuildKit's and Buildah's
    default is read-only)."""
    for path, rule in ((source, _MOUNT_SOURCE), (target, _MOUNT_TARGET)):
        if not rule.fullmatch(path):
            raise ValueError(f"unexpected path {path!r} in a RUN --mount")
    return f"--mount=type=bind,source={source},target={target}"


def _mounts(plan: Plan, files: Iterable[tuple[Layer, str]], *, uv: bool) -> list[str]:
    """The mounts of a RUN that installs ``files`` (layer, requirement file name): each file,
    each of their layers' wheel directories, the uv binary's directory."""
    out: list[str] = []
    for layer, fname in files:
        out.append(_mount(f"requirements/{fname}", f"{REQ_MOUNTED}/{fname}"))
        wheels = _mount(f"wheels/{layer.name}", f"{WHEELS_IN_IMAGE}/{layer.name}")
        if layer.name in plan.wheels and wheels not in out:
            out.append(wheels)
    if uv:
        out.append(_mount(UV_IN_CONTEXT.rsplit("/", 1)[0], UV_DIR_IN_IMAGE))
    return out


def _run(argv: Sequence[str], mounts: Sequence[str] = ()) -> str:
    return "RUN " + "".join(f"{m} " for m in mounts) + dockerfile_exec(argv)


def _install_run(plan: Plan, argv: Sequence[str], files: Sequence[tuple[Layer, str]], *, uv: bool) -> str:
    """The RUN of ``argv``, which installs ``files`` (layer, requirement file name). With mounts,
    it mounts them and names the digest of what it mounts in its own text
    (``ENVLOCK_MOUNTED=sha256:...``, a variable of that command alone): Buildah before 1.38
    (Podman 4) keys its layer cache on an instruction's text and never on the files a ``RUN
    --mount`` binds (containers/buildah#5400), so without it a lock with other pins or another
    wheel under the same name would get the layer built from the first. BuildKit keys on the
    mounted files itself; the digest changes only when they do, so its cache is kept too."""
    if not plan.mounts:
        return _run(argv)
    rendered = _requirement_files(plan)
    h = hashlib.sha256()
    for _, fname in files:
        h.update(f"requirements/{fname}".encode() + b"\0" + rendered[f"requirements/{fname}"].encode() + b"\0")
    for name in dict.fromkeys(layer.name for layer, _ in files):
        for wheel in sorted(plan.wheels.get(name, ())):
            h.update(f"wheels/{name}/{wheel.name}".encode() + b"\0" + _digest(wheel).encode() + b"\0")
    if uv and plan.uv:
        h.update(b"uv\0" + _digest(plan.uv).encode())
    return _run(["env", f"{MOUNTED_ENV}=sha256:{h.hexdigest()}", *argv], _mounts(plan, files, uv=uv))


def _req_dir(plan: Plan) -> str:
    return REQ_MOUNTED if plan.mounts else REQ_DIR_IN_IMAGE


def _install(plan: Plan, layer: Layer, fname: str, *, uv: bool) -> str:
    """The RUN that installs one requirement file of ``layer``: uv (where its binary does not
    stay in the image: mounted, or in a build stage that the image leaves behind) or pip."""
    hashed = ("--require-hashes",) if fname.endswith("-hashed.txt") else ()
    args = ("--no-deps", *hashed, *layer.index_args, "-r", f"{_req_dir(plan)}/{fname}")
    if uv:
        return _install_run(plan, ["/bin/sh", "-c", _UV_OR_PIP, plan.python, *args], [(layer, fname)], uv=uv)
    return _install_run(plan, _pip(plan, *_PIP_INSTALL, *hashed, *layer.index_args, "-r",
                                   f"{_req_dir(plan)}/{fname}"), [(layer, fname)], uv=uv)


def _version_check(plan: Plan) -> str:
    major, minor = (int(x) for x in plan.lock.python.version.split(".")[:2])
    code = (f"import sys; v = sys.version_info[:2]; sys.exit(0 if v == ({major}, {minor}) else "
            f"'envlock: the base image python is %d.%d, the lock needs {major}.{minor}; "
            f"pass --base with a python {major}.{minor} image' % v)")
    return "RUN " + dockerfile_exec([plan.base_python, "-c", code])


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


_COMMENTS = {
    "torch": "torch and its CUDA wheels first, in their own layer: a change to a small package "
             "must not rebuild or re-download them.",
    "torch-deps": "What the torch layer's wheels require, next: a change to an unrelated package "
                  "keeps them.",
    "packages": "Everything else, exact pins, no dependency resolution (the lock is the closure).",
    "envlock": "envlock itself (training code imports it), from a wheel of the envlock that "
               "restored this image.",
    "tooling": "pip/setuptools/wheel last, pinned to the lock's versions (the layers above used "
               "the base's pip).",
}


def _on_top_of_torch(plan: Plan) -> list[str]:
    """The layers after the torch layer's image: torch's own requirements in their layer, then
    the rest in one step: their requirement files and wheels (the only wheels this build is
    sent besides torch-deps') and one RUN that installs them in layer order and removes
    ensurepip's extra tools. They are small, and what a step costs the engine (a container, a
    commit) is much of their time; a change to any of them reinstalls them all, torch and its
    requirements never. The shell reads only this fixed text: the interpreter is "$0", every
    other word is envlock's own (flags, paths, tool names). uv installs them where it is
    mounted (its binary stays out of the image); copied in, it would stay, so pip does."""
    lines: list[str] = []
    uv = plan.mounts and plan.uv is not None
    rest = [layer for layer in plan.layers if layer.name not in ("torch", "torch-deps")]
    for layer in plan.layers:
        if layer.name == "torch-deps":
            lines += _layer_lines(plan, layer, uv=uv)
    steps = []
    copies = []
    files = [(layer, fname) for layer in rest for fname in layer.files()]
    for layer, fname in files:
        hashed = ("--require-hashes",) if fname.endswith("-hashed.txt") else ()
        steps.append(["i", "--no-deps", *hashed, *layer.index_args, "-r", f"{_req_dir(plan)}/{fname}"])
    if not plan.mounts:
        copies = _copies(plan, files)
    if plan.remove:
        steps.append(["\"$0\"", "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check",
                      *plan.remove])
    for step in steps:
        for word in step[1:]:
            if not _SCRIPT_WORD.fullmatch(word):  # never a lock value here
                raise ValueError(f"unexpected word {word!r} in the install script")
    if not steps:
        return lines
    script = ("export PIP_ROOT_USER_ACTION=ignore PIP_NO_WARN_SCRIPT_LOCATION=1; " + (_UV_I if uv else _PIP_I)
              + " && ".join(" ".join(step) for step in steps))
    return [*lines, "", "# The rest in one step, in layer order: the other packages, envlock itself, "
                        "pip/setuptools/wheel last.",
            *copies, _install_run(plan, ["/bin/sh", "-c", script, plan.python], files, uv=uv)]


def _copies(plan: Plan, files: Sequence[tuple[Layer, str]]) -> list[str]:
    """Without mounts: COPY each requirement file, then each of their layers' wheels, into the
    image (a build stage's, where it has one)."""
    lines = [f"COPY {dockerfile_exec(['requirements/' + fname, f'{REQ_DIR_IN_IMAGE}/{fname}'])}"
             for _, fname in files]
    for name in dict.fromkeys(layer.name for layer, _ in files):
        if name in plan.wheels:
            lines.append(f"COPY {dockerfile_exec([f'wheels/{name}/', f'{WHEELS_IN_IMAGE}/{name}/'])}")
    return lines


def _layer_lines(plan: Plan, layer: Layer, *, uv: bool) -> list[str]:
    lines = ["", f"# {_COMMENTS[layer.name]}"]
    files = layer.files()
    if not plan.mounts:
        lines += _copies(plan, [(layer, fname) for fname in files])
    lines += [_install(plan, layer, fname, uv=uv) for fname in files]
    return lines


def _from(plan: Plan, stage: str | None = None) -> list[str]:
    """FROM the base. With mounts, by a build argument whose default is the base: BuildKit
    reads an image id in FROM as a Docker Hub name, so restore passes a local name for it
    (``clibuild``); a build stage is never needed there."""
    if plan.mounts:
        return [f"ARG {BASE_ARG}={plan.base.ref}", f"FROM ${{{BASE_ARG}}}"]
    return [f"FROM {plan.base.ref}" + (f" AS {stage}" if stage else "")]


def _prelude(plan: Plan, stage: str | None) -> list[str]:
    """FROM the base, root, the python check, the venv: what every build starts with."""
    lines = [
        *_from(plan, stage),
        # The base may end with a non-root USER (a lock captured in an image that runs as its
        # researcher, as most workstation images do): installing needs root.
        "USER root",
        "",
        "# Fail early, with a clear message, when the base's python is not the lock's.",
        _version_check(plan),
    ]
    if plan.venv:
        lines += ["", f"# The lock was captured in a virtual environment at {plan.venv}.",
                  "RUN " + dockerfile_exec([plan.base_python, "-m", "venv", plan.venv]),
                  f"ENV VIRTUAL_ENV={plan.venv} PATH={plan.venv}/bin:$PATH"]
    if plan.uv and not plan.mounts:
        lines += ["", "# uv installs (pip where it does not run); this stage is left behind.",
                  f"COPY {dockerfile_exec([UV_IN_CONTEXT, UV_IN_IMAGE])}"]
    return lines


def _stage_end() -> list[str]:
    """The last lines of a build stage. The stage holds the wheels and the venv built from them
    (over 1 GB with torch, several with CUDA); once the image below has copied the venv out, a
    restore removes it by this label rather than leaving it to the engine's cache. Only this
    step misses the cache on a rebuild: the argument is the build's own id."""
    return ["", "# Names this stage for the restore that builds it, which removes it when done.",
            f"ARG {BUILD_STAGE_ARG}",
            f"LABEL {json.dumps(LABEL_BUILD_STAGE)}=\"${{{BUILD_STAGE_ARG}}}\""]


def staged(plan: Plan) -> bool:
    """Whether the image's own Dockerfile has a build stage (``dockerfile``); the torch
    layer's has one too unless the wheels are mounted."""
    return plan.offline and plan.venv is not None and not plan.split_torch and not plan.mounts


def _torch_layer_body(plan: Plan) -> str:
    """The torch layer's Dockerfile without its label: nothing of the lock but the base, the
    python version, the venv path and the torch layer's own pins."""
    torch = next(layer for layer in plan.layers if layer.name == "torch")
    head = ["# The torch layer of an envlock restore: an image of its own, shared by every lock with",
            "# the same base, venv and torch pins; do not edit."]
    if plan.mounts:  # the wheels and uv are mounted: the layer is the base plus the venv, as built
        return "\n".join([*head, *_prelude(plan, None), *_layer_lines(plan, torch, uv=plan.uv is not None)])
    lines = [
        *head,
        *_prelude(plan, BUILD_STAGE),
        *_layer_lines(plan, torch, uv=plan.uv is not None),
        *_stage_end(),
        "",
        "# The layer itself: the base plus the venv built above, without the wheels.",
        f"FROM {plan.base.ref}",
        "USER root",
        f"COPY --from={BUILD_STAGE} {dockerfile_exec([plan.venv or '', plan.venv or ''])}",
        f"ENV VIRTUAL_ENV={plan.venv} PATH={plan.venv}/bin:$PATH",
    ]
    return "\n".join(lines)


def torch_layer_key(plan: Plan) -> str:
    """sha256 over everything the torch layer is built from (instructions, requirement files,
    wheels, the uv binary), comments left out: its image's label, and its tag."""
    h = hashlib.sha256()
    body = [line for line in _torch_layer_body(plan).splitlines() if not line.startswith("#")]
    h.update("\n".join(body).encode() + b"\0")
    rendered = _requirement_files(plan)
    for rel in sorted(torch_layer_files(plan)):
        if rel in rendered:  # the torch layer's own requirement files, not torch-deps'
            h.update(rel.encode() + b"\0" + hashlib.sha256(rendered[rel].encode()).digest())
    for wheel in sorted(plan.wheels.get("torch", ())):
        h.update(wheel.name.encode() + b"\0" + _digest(wheel).encode())
    if plan.uv:
        h.update(b"uv\0" + _digest(plan.uv).encode())
    return "sha256:" + h.hexdigest()


def torch_layer_tag(key: str) -> str:
    return f"{TORCH_LAYER_REPO}:{key.removeprefix('sha256:')[:16]}"


def torch_layer_dockerfile(plan: Plan, key: str | None = None) -> str:
    key = key or torch_layer_key(plan)
    return (_torch_layer_body(plan) + "\n" + f"LABEL {_label(LABEL_TORCH_LAYER, key)}\n")


def torch_layer_files(plan: Plan) -> list[str]:
    """What the torch layer's build is sent (relative to the context): nothing of the rest."""
    torch = next(layer for layer in plan.layers if layer.name == "torch")
    out = [TORCH_LAYER_DOCKERFILE, *(f"requirements/{f}" for f in torch.files())]
    if plan.wheels.get("torch"):
        out.append("wheels/torch")
    if plan.uv:
        out.append(UV_IN_CONTEXT)
    return out


def main_build_excludes(plan: Plan) -> tuple[str, ...]:
    """What the image's own build is not sent: the torch layer's inputs (an image already),
    the uv binary where no stage of this build uses it, the build log."""
    out = ["build.log"]
    if plan.split_torch:
        out += ["wheels/torch", TORCH_LAYER_DOCKERFILE]
        if not plan.mounts:  # mounted, uv installs the layers on top of the torch layer too
            out.append(UV_IN_CONTEXT.split("/")[0])
    return tuple(out)


def main_build_files(plan: Plan, rendered: Mapping[str, str]) -> list[str]:
    """What the image's own build is sent: its files, without ``main_build_excludes``."""
    skip = set(main_build_excludes(plan))
    paths = [*rendered, *context_binaries(plan)]
    return [p for p in paths if p not in skip and p.split("/")[0] not in skip]


def dockerfile(plan: Plan) -> str:
    # Offline into a venv, the wheels (hundreds of MB for torch, GBs with CUDA) must stay out of
    # the image. With mounts they are bind-mounted into the RUNs that install them. Without
    # (the classic builder has no `RUN --mount`) the installs run in a build stage and only the
    # venv is copied out. With a torch layer, that layer is an image of its own
    # (``torch_layer_dockerfile``) and the rest installs on top of it in this image directly:
    # copying a venv out of a stage would copy torch again (a layer of GBs) whenever a small
    # package changes.
    split = plan.split_torch
    in_stage = staged(plan)
    how = "with BuildKit or Podman: " if plan.mounts else ""
    header = [
        f"# Generated by envlock {__version__} from a lock with id {plan.short_id}; do not edit.",
        f"# Rebuild: envlock restore env.lock   (or, {how}docker build -t "
        f"{image_tag(image_tag_name(plan), plan.short_id)} .)",
        f"# Base: {plan.base.display} ({plan.base.origin})",
    ]
    if plan.mounts and plan.base.ref.startswith("sha256:"):
        header.append(f"# BuildKit reads an image id in FROM as a registry name: add --build-arg {BASE_ARG}=REPO:TAG.")
    if split:
        tag = torch_layer_tag(torch_layer_key(plan))
        header[1] = (f"# Rebuild: envlock restore env.lock   (or, {how}tar -c "
                     + " ".join(torch_layer_files(plan)) + f" | docker build -f {TORCH_LAYER_DOCKERFILE}"
                     f" -t {tag} - && docker build -t {image_tag(image_tag_name(plan), plan.short_id)} .)")
        lines = [*header,
                 "# The torch layer: an image built from torch-layer.Dockerfile (restore passes its id).",
                 f"ARG {TORCH_LAYER_ARG}={tag}",
                 f"FROM ${{{TORCH_LAYER_ARG}}}",
                 "USER root"]
    else:
        # uv installs where it does not stay in the image: mounted, or in the build stage.
        lines = [*header, *_prelude(plan if in_stage or plan.mounts else replace(plan, uv=None),
                                   BUILD_STAGE if in_stage else None)]
    if plan.os_install:
        lines += ospackages.dockerfile_lines(plan.os_install, plan.base_python, REQ_DIR_IN_IMAGE)
    if split:
        lines += _on_top_of_torch(plan)
    for layer in plan.layers if not split else ():
        lines += _layer_lines(plan, layer, uv=(in_stage or plan.mounts) and plan.uv is not None)
    if plan.remove and not split:
        lines += ["", "# ensurepip's tools the lock does not have (uninstalling an absent one is a no-op).",
                  _run(_pip(plan, "uninstall", "--yes", "--disable-pip-version-check", *plan.remove))]
    if in_stage:
        lines += [*_stage_end(),
                  "", "# The image itself: the base plus the venv built above, without the wheels.",
                  f"FROM {plan.base.ref}",
                  "USER root",
                  f"COPY --from={BUILD_STAGE} {dockerfile_exec([plan.venv or '', plan.venv or ''])}",
                  f"COPY --from={BUILD_STAGE} {dockerfile_exec([REQ_DIR_IN_IMAGE, REQ_DIR_IN_IMAGE])}",
                  f"ENV VIRTUAL_ENV={plan.venv} PATH={plan.venv}/bin:$PATH"]
    lines += [
        "",
        "# A non-root user; `envlock run` runs as the caller's uid:gid instead. An unprivileged",
        "# builder (ch-image) cannot chown to a uid it does not map; there the caller runs anyway.",
        *(["# The mount points of the installs above go too."] if plan.mounts else []),
        f"RUN (command -v useradd >/dev/null && useradd --uid {DEFAULT_UID} --user-group "
        f"--create-home --shell /bin/sh {IMAGE_USER}) || (command -v adduser >/dev/null && adduser -D "
        f"-u {DEFAULT_UID} {IMAGE_USER}) || true; mkdir -p {WORKDIR} && (chown {DEFAULT_UID}:{DEFAULT_UID} "
        f"{WORKDIR} 2>/dev/null || true)" + (f"; rm -rf {' '.join(MOUNT_POINTS)}" if plan.mounts else ""),
    ]
    lines += ["", "# What this restore changed on purpose, for every verify of the lock in this image.",
              f"COPY {dockerfile_exec([RESTORED_NAME, RESTORED_FILE])}"]
    if plan.env:
        lines += ["", "# Variables that change numerics, as captured."]
        lines.append("ENV " + " ".join(dockerfile_env(k, v) for k, v in plan.env))
    image_labels = labels(plan)
    if split:
        image_labels[LABEL_TORCH_LAYER] = ""  # the image is not the torch layer it starts from
    lines += ["", "LABEL " + " \\\n      ".join(_label(k, v) for k, v in sorted(image_labels.items())),
              f"USER {DEFAULT_UID}:{DEFAULT_UID}", f"WORKDIR {WORKDIR}", ""]
    return "\n".join(lines)


def _requirement_files(plan: Plan) -> dict[str, str]:
    out = {}
    for layer in plan.layers:
        for fname, reqs in layer.files().items():
            # No lock id here: COPY caches on the file's bytes, so the torch layer's file must
            # depend only on the torch layer's pins, or a lock that differs by one small
            # package would rebuild (and re-download) torch.
            head = f"# {layer.name} layer of an envlock restore: exact pins, installed with --no-deps\n"
            out[f"requirements/{fname}"] = head + "".join(r.text() + "\n" for r in reqs)
    return out


def render(plan: Plan) -> dict[str, str]:
    """Relative path -> text of every generated file of the build context."""
    out = {"Dockerfile": dockerfile(plan)}
    if plan.split_torch:
        out[TORCH_LAYER_DOCKERFILE] = torch_layer_dockerfile(plan)
    out.update(_requirement_files(plan))
    if plan.os_install:
        out.update(ospackages.files(plan.os_install))
    out[RESTORED_NAME] = plan.restored.to_json()
    # For a hand-run `docker build .`: what restore leaves out of that build (the torch layer's
    # build gets exactly its own files, see torch_layer_files).
    out[".dockerignore"] = "".join(f"{p}\n" for p in main_build_excludes(plan))
    return out


def context_binaries(plan: Plan) -> dict[str, tuple[Path, ...]]:
    """Directory in the context -> the files copied there as they are (wheels, uv)."""
    out = {f"wheels/{layer}": files for layer, files in plan.wheels.items()}
    if plan.os_install and plan.os_install.debs:
        out[ospackages.DEBS_IN_CONTEXT] = plan.os_install.debs
    if plan.uv:
        out[UV_IN_CONTEXT.rsplit("/", 1)[0]] = (plan.uv,)
    return out


def context_key(plan: Plan, rendered: Mapping[str, str] | None = None) -> str:
    """sha256 over everything that goes into the build: the image cache key."""
    rendered = rendered if rendered is not None else render(plan)
    h = hashlib.sha256()
    for rel in sorted(rendered):
        h.update(rel.encode() + b"\0" + hashlib.sha256(rendered[rel].encode()).digest())
    binaries = context_binaries(plan)
    for where in sorted(binaries):
        for path in sorted(binaries[where]):
            h.update(f"{where}/{path.name}".encode() + b"\0" + _digest(path).encode())
    return "sha256:" + h.hexdigest()


def write_context(plan: Plan, directory: Path, rendered: Mapping[str, str] | None = None,
                  *, force: bool = False, say: Callable[[str], None] | None = None) -> Path:
    """Write the build context to ``directory``: new, empty, or (with ``force``) one envlock made.

    See ``envlock.restore.outdir``: nothing is written through a link, nothing of the user's is
    removed (``say`` hears which of the user's files were kept). The wheels are hashed through
    ``_digest``, once per process with the context's key.
    """
    rendered = rendered if rendered is not None else render(plan)
    return outdir.write(Path(directory), rendered, context_binaries(plan), force=force, digest=_digest,
                        say=say)


def image_tag_name(plan: Plan) -> str:
    """The tag's <name> for the rebuild comment; only tag-safe characters ever reach the file."""
    name = plan.image_name
    return name if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name) else "env"
