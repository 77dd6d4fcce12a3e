"""``export --to slurm``: an sbatch script that runs the command in the locked image.

Apptainer pulls ``docker://REF@sha256:...`` (never a tag), ``--nv`` brings in the host driver,
``--cleanenv`` keeps the login shell's variables out, and the locked numerics variables are
passed explicitly, so the job sees the environment of the lock and nothing else.

The variables are ``export APPTAINERENV_NAME='value'`` lines, not ``--env NAME=value``:
Apptainer's ``--env`` and srun split their lists on commas, so one value could set a second
variable (``:4096:8,LD_PRELOAD=/tmp/x.so``) and an honest ``XLA_FLAGS=a,b`` arrived cut in two.
``APPTAINERENV_*`` passes through ``--cleanenv`` unsplit; ``srun --export=ALL`` forwards it even
when the job was submitted with ``sbatch --export=NONE``.
"""

from __future__ import annotations

from envlock import _escape as escape
from envlock.export.common import environment, gpu_count, job_name, pinned_image
from envlock.lock import Lock


def render(lock: Lock, *, argv: list[str], image: str | None = None, gpus: int | None = None) -> str:
    ref = pinned_image(lock, image)
    n = gpu_count(lock, gpus)
    sbatch = [f"--job-name={job_name(lock)}", "--output=%x-%j.out", "--nodes=1", "--ntasks=1"]
    if n:
        sbatch.append(f"--gpus={n}")
    exports = "".join(escape.apptainer_env_export(k, v) + "\n" for k, v in environment(lock))
    command = " ".join(escape.shell(a, what="--command") for a in argv)
    nv = "--nv " if n else ""
    return (
        "#!/bin/bash\n"
        + "".join(f"#SBATCH {s}\n" for s in sbatch)
        + f"# envlock {escape.comment(lock.short_id)} ({escape.comment(lock.envlock.fingerprint)})\n"
        "set -euo pipefail\n"
        f"IMAGE={escape.shell('docker://' + ref, what='image')}\n"
        'WORKSPACE="${ENVLOCK_WORKSPACE:-$PWD}"\n'
        + ("# The lock's numerics variables; Apptainer sets each NAME from APPTAINERENV_NAME.\n"
           + exports if exports else "")
        + f"srun --export=ALL apptainer exec {nv}--cleanenv "
        '--bind "$WORKSPACE:/workspace" --pwd /workspace '
        f'"$IMAGE" {command}\n'
    )
