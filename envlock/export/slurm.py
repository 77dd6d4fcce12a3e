"""``export --to slurm``: an sbatch script that runs the command in the locked image.

Apptainer pulls ``docker://REF@sha256:...`` (never a tag), ``--nv`` brings in the host driver,
``--cleanenv`` keeps the login shell's variables out, and the locked numerics variables are
passed explicitly, so the job sees the environment of the lock and nothing else.

The variables are ``export APPTAINERENV_NAME='value'`` lines, not ``--env NAME=value``:
Apptainer's ``--env`` and srun split their lists on commas, so one value could set a second
variable (``:4096:8,LD_PRELOAD=/tmp/x.so``) and an honest ``XLA_FLAGS=a,b`` arrived cut in two.
``APPTAINERENV_*`` passes through ``--cleanenv`` unsplit; ``srun --export=ALL`` forwards it even
when the job was submitted with ``sbatch --export=NONE``.

With ``--venv`` (a restored virtual environment on a filesystem every node mounts) the job
checks before it trains: ``envlock verify --fleet`` judges every node against the lock and the
job stops with its exit code (1 drift, 3 a node without a verdict) before anything runs; then
``srun`` runs the command once per node with the venv first on PATH, and each node's exit code
is written to ``$ENVLOCK_STATUS_DIR/NODE.rc`` and printed as a line of the job's output.
"""

from __future__ import annotations

from envlock.export.common import environment, gpu_count, job_name, pinned_image
from envlock.lock import Lock
from envlock.text import escape


def render(lock: Lock, *, argv: list[str], image: str | None = None, gpus: int | None = None,
           venv: str | None = None, lock_path: str | None = None, nodes: int | None = None) -> str:
    if venv is not None:
        return render_venv(lock, argv=argv, venv=venv, lock_path=lock_path or "env.lock",
                           gpus=gpus, nodes=nodes or 1)
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


# Each node's part of the replay: run the command, record its exit code under the node's name.
# A constant (the command arrives as "$@"), so nothing of the lock or the command is in it.
_NODE_STEP = ('name="${SLURMD_NODENAME:-$(hostname)}"; rc=0; "$@" || rc=$?; '
              'echo "$rc" > "$ENVLOCK_STATUS_DIR/$name.rc"; '
              'echo "envlock: node $name: exit $rc"; exit "$rc"')


def render_venv(lock: Lock, *, argv: list[str], venv: str, lock_path: str, gpus: int | None,
                nodes: int) -> str:
    """The job for a restored venv: the preflight on every node, then the command on every node."""
    n = gpu_count(lock, gpus)
    sbatch = [f"--job-name={job_name(lock)}", "--output=%x-%j.out", f"--nodes={nodes}",
              "--ntasks-per-node=1"]
    if n:
        sbatch.append(f"--gpus-per-node={n}")
    exports = "".join(escape.shell_export(k, v) + "\n" for k, v in environment(lock))
    command = " ".join(escape.shell(a, what="--command") for a in argv)
    return (
        "#!/bin/bash\n"
        + "".join(f"#SBATCH {s}\n" for s in sbatch)
        + f"# envlock {escape.comment(lock.short_id)} ({escape.comment(lock.envlock.fingerprint)})\n"
        "set -euo pipefail\n"
        "# The restored environment, on a filesystem every node mounts; each node verifies and\n"
        "# runs the environment VIRTUAL_ENV names.\n"
        f"export VIRTUAL_ENV={escape.shell(venv, what='--venv')}\n"
        f"LOCK={escape.shell(lock_path, what='lock path')}\n"
        'if [[ -n "${ENVLOCK_LOCK:-}" ]]; then LOCK="$ENVLOCK_LOCK"; fi\n'
        'WORKSPACE="${ENVLOCK_WORKSPACE:-$PWD}"\n'
        'export ENVLOCK_STATUS_DIR="${ENVLOCK_STATUS_DIR:-$WORKSPACE/envlock-status-${SLURM_JOB_ID:-0}}"\n'
        + ("# The lock's numerics variables.\n" + exports if exports else "")
        + "# 1. Preflight: every node against the lock, before anything trains; a node that differs\n"
        "#    (exit 1) or gives no verdict in time (exit 3) ends the job here.\n"
        'envlock verify "$LOCK" --fleet --timeout "${ENVLOCK_PREFLIGHT_TIMEOUT:-120}"\n'
        "# 2. The command on every node in the restored environment; each node's exit code is\n"
        "#    recorded in $ENVLOCK_STATUS_DIR/NODE.rc and as a line of this output.\n"
        'export PATH="$VIRTUAL_ENV/bin:$PATH"\n'
        'mkdir -p "$ENVLOCK_STATUS_DIR"\n'
        "rc=0\n"
        "# shellcheck disable=SC2016  # expanded by each node's bash, not here\n"
        'srun --export=ALL --kill-on-bad-exit=0 --chdir="$WORKSPACE" '
        f"bash -c {escape.shell(_NODE_STEP)} envlock-node {command} || rc=$?\n"
        'echo "envlock: node outcomes in $ENVLOCK_STATUS_DIR"\n'
        'exit "$rc"\n'
    )
