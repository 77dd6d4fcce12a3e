"""``export --to slurm``: an sbatch script that runs the command in the locked image.

Apptainer pulls ``docker://REF@sha256:...`` (never a tag), ``--nv`` brings in the host driver,
``--cleanenv`` keeps the login shell's variables out, and the locked numerics variables are
passed explicitly, so the job sees the environment of the lock and nothing else.
"""

from __future__ import annotations

import shlex

from envlock.export.common import environment, gpu_count, job_name, pinned_image
from envlock.lock import Lock


def render(lock: Lock, *, argv: list[str], image: str | None = None, gpus: int | None = None) -> str:
    ref = pinned_image(lock, image)
    n = gpu_count(lock, gpus)
    sbatch = [f"--job-name={job_name(lock)}", "--output=%x-%j.out", "--nodes=1", "--ntasks=1"]
    if n:
        sbatch.append(f"--gpus={n}")
    envs = " ".join(f"--env {shlex.quote(f'{k}={v}')}" for k, v in environment(lock))
    nv = "--nv " if n else ""
    return (
        "#!/bin/bash\n"
        + "".join(f"#SBATCH {s}\n" for s in sbatch)
        + f"# envlock {lock.short_id} ({lock.envlock.fingerprint})\n"
        "set -euo pipefail\n"
        f"IMAGE={shlex.quote('docker://' + ref)}\n"
        'WORKSPACE="${ENVLOCK_WORKSPACE:-$PWD}"\n'
        f"srun apptainer exec {nv}--cleanenv {envs + ' ' if envs else ''}"
        '--bind "$WORKSPACE:/workspace" --pwd /workspace '
        f'"$IMAGE" {shlex.join(argv)}\n'
    )
