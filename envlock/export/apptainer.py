"""``export --to apptainer``: a definition file that rebuilds the locked image for HPC sites.

The base is the image by digest (a tag can move between the paper and the rebuild); the
locked numerics variables go in ``%environment`` so every ``apptainer run/exec`` gets them.

Apptainer opens a section at any line that starts with ``%``, and ``%post`` runs as root at
build time, so every value passes ``escape.apptainer_label`` or ``escape.apptainer_shell``: a
value on one line, shell-quoted where a shell reads it, or the export is refused (exit 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envlock.export.common import environment, pinned_image
from envlock.lock import Lock
from envlock.text import escape

if TYPE_CHECKING:
    from envlock.restore.context import Plan


def render(lock: Lock, *, image: str | None = None, argv: list[str] | None = None) -> str:
    ref = escape.apptainer_line(pinned_image(lock, image), "image")  # checked by the reference grammar too
    env = "".join(f"    export {k}={escape.apptainer_shell(v, what=f'value of {k}')}\n"
                  for k, v in environment(lock))
    labels = [("org.envlock.id", lock.short_id, "id"),
              ("org.envlock.fingerprint", lock.envlock.fingerprint or "", "envlock.fingerprint"),
              ("org.envlock.python", lock.python.version, "python.version")]
    if lock.torch:
        labels += [("org.envlock.torch", lock.torch.version, "torch.version"),
                   ("org.envlock.cuda", lock.torch.cuda or "none", "torch.cuda")]
    label_lines = "".join(f"    {escape.apptainer_label(k, v, what=what)}\n" for k, v, what in labels)
    words = [escape.apptainer_shell(a, what="--command") for a in argv or []]
    run = f"    exec {' '.join(words)} \"$@\"\n" if words else '    exec "$@"\n'
    return (
        f"# Apptainer definition for envlock {escape.comment(lock.short_id)}; build: apptainer build env.sif THIS_FILE\n"
        "Bootstrap: docker\n"
        f"From: {ref}\n\n"
        "%environment\n" + (env or "    :\n") + "\n"
        "%labels\n" + label_lines + "\n"
        "%runscript\n" + run
    )


# -- a definition that builds from a pack, offline ------------------------------------------------

PACK_DIR = "apptainer"  # inside the pack: the definition and the files its %files section copies
DEFINITION = f"{PACK_DIR}/env.def"
WHEELS_IN_BUILD = "/tmp/envlock-wheels"  # removed at the end of %post: the image keeps no wheel


def pack_definition(plan: Plan, *, archive: str | None, wheels_dir: str,
                    own_wheels: tuple[str, ...] = ()) -> dict[str, str]:
    """Path in the pack -> text: ``apptainer/env.def`` and the requirement files it installs.

    The plan is a restore's (``restore.prepare`` of the pack's wheels), so the definition
    installs what a container restore installs, layer by layer, with the same hashes, from
    the pack's own wheels and nothing else (``--no-index``). ``archive``: the pack's
    docker-archive of the base (``Bootstrap: docker-archive``, no registry); None bootstraps
    from the registry by the base's digest. Relative paths (``From``, ``%files``) are read from
    the directory the build runs in: the pack's root.
    """
    from envlock.restore.dockerfile import REQ_DIR_IN_IMAGE, labels

    sh = escape.apptainer_shell
    out: dict[str, str] = {}
    files = [f"    {sh(wheels_dir)} {WHEELS_IN_BUILD}/pack"]
    files += [f"    {sh(f'{PACK_DIR}/wheels/{w}')} {WHEELS_IN_BUILD}/own/{sh(w)}" for w in own_wheels]
    pip_env = "env PIP_ROOT_USER_ACTION=ignore PIP_NO_WARN_SCRIPT_LOCATION=1 PIP_DISABLE_PIP_VERSION_CHECK=1"
    if not plan.venv:
        pip_env += " PIP_BREAK_SYSTEM_PACKAGES=1"
    links = f"--no-index --find-links {WHEELS_IN_BUILD}/pack" + (f" --find-links {WHEELS_IN_BUILD}/own" if own_wheels else "")
    major, minor = plan.lock.python.version.split(".")[:2]
    check = (f"import sys; sys.exit(0 if sys.version_info[:2] == ({int(major)}, {int(minor)}) else "
             f"'the base image python is not {int(major)}.{int(minor)}')")
    post = ["set -eu", f"{sh(plan.base_python)} -c {sh(check)}"]
    if plan.venv:
        post.append(f"{sh(plan.base_python)} -m venv {sh(plan.venv)}")
    if plan.os_install:
        post.append("# the lock's OS packages are not installed here: a container restore installs them with apt")
    for layer in plan.layers:
        for fname, reqs in layer.files().items():
            out[f"{PACK_DIR}/requirements/{fname}"] = "".join(r.text() + "\n" for r in reqs)
            files.append(f"    {sh(f'{PACK_DIR}/requirements/{fname}')} {REQ_DIR_IN_IMAGE}/{sh(fname)}")
            hashed = " --require-hashes" if fname.endswith("-hashed.txt") else ""
            post.append(f"{pip_env} {sh(plan.python)} -m pip install --no-deps --no-cache-dir --no-input"
                        f"{hashed} {links} -r {REQ_DIR_IN_IMAGE}/{sh(fname)}")
    if plan.remove:
        post.append(f"{pip_env} {sh(plan.python)} -m pip uninstall --yes "
                    + " ".join(sh(n) for n in plan.remove))
    post.append(f"rm -rf {WHEELS_IN_BUILD}")
    env = [(k, v) for k, v in plan.env]
    if plan.venv:
        env = [("VIRTUAL_ENV", plan.venv), *env]
    env_lines = "".join(f"    export {k}={sh(v, what=f'value of {k}')}\n" for k, v in env)
    if plan.venv:
        env_lines += f"    export PATH={sh(plan.venv + '/bin')}:\"$PATH\"\n"
    label_lines = "".join(f"    {escape.apptainer_label(k, v)}\n" for k, v in sorted(labels(plan).items()))
    if archive is not None:
        head = f"Bootstrap: docker-archive\nFrom: {escape.apptainer_line(archive, 'archive')}\n"
    else:
        head = f"Bootstrap: docker\nFrom: {escape.apptainer_line(plan.base.ref, 'image')}\n"
    out[DEFINITION] = (
        f"# Apptainer definition for envlock {escape.comment(plan.short_id)}, from its pack: no network.\n"
        f"# build, in the pack's directory: apptainer build ../env.sif {DEFINITION} (the pack holds only its own files)\n"
        + head + "\n"
        "%files\n" + "".join(line + "\n" for line in files) + "\n"
        "%post\n" + "".join(f"    {line}\n" for line in post) + "\n"
        "%environment\n" + (env_lines or "    :\n") + "\n"
        "%labels\n" + label_lines + "\n"
        "%runscript\n" + '    exec "$@"\n'
    )
    return out
