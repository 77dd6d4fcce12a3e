"""``export --to apptainer``: a definition file that rebuilds the locked image for HPC sites.

The base is the image by digest (a tag can move between the paper and the rebuild); the
locked numerics variables go in ``%environment`` so every ``apptainer run/exec`` gets them.
"""

from __future__ import annotations

import shlex

from envlock.export.common import environment, pinned_image
from envlock.lock import Lock


def render(lock: Lock, *, image: str | None = None, argv: list[str] | None = None) -> str:
    ref = pinned_image(lock, image)
    env = "".join(f"    export {k}={shlex.quote(v)}\n" for k, v in environment(lock))
    labels = [("org.envlock.id", lock.short_id), ("org.envlock.fingerprint", lock.envlock.fingerprint or ""),
              ("org.envlock.python", lock.python.version)]
    if lock.torch:
        labels += [("org.envlock.torch", lock.torch.version), ("org.envlock.cuda", lock.torch.cuda or "none")]
    run = f"    exec {shlex.join(argv)} \"$@\"\n" if argv else '    exec "$@"\n'
    return (
        f"# Apptainer definition for envlock {lock.short_id}; build: apptainer build env.sif THIS_FILE\n"
        "Bootstrap: docker\n"
        f"From: {ref}\n\n"
        "%environment\n" + (env or "    :\n") + "\n"
        "%labels\n" + "".join(f"    {k} {v}\n" for k, v in labels) + "\n"
        "%runscript\n" + run
    )
