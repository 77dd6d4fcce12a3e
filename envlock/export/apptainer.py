"""``export --to apptainer``: a definition file that rebuilds the locked image for HPC sites.

The base is the image by digest (a tag can move between the paper and the rebuild); the
locked numerics variables go in ``%environment`` so every ``apptainer run/exec`` gets them.

Apptainer opens a section at any line that starts with ``%``, and ``%post`` runs as root at
build time, so every value passes ``escape.apptainer_label`` or ``escape.apptainer_shell``: a
value on one line, shell-quoted where a shell reads it, or the export is refused (exit 2).
"""

from __future__ import annotations

from envlock import _escape as escape
from envlock.export.common import environment, pinned_image
from envlock.lock import Lock


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
