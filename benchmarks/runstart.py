"""Start-up of ``envlock run`` on a restored image, next to ``docker run --rm IMAGE true``.

Side by side, through the same engine, on the same image, interleaved (the start of each round
rotates, so a burst of load from elsewhere hits every command alike):

  (a) ``envlock run LOCK <the restore's options> -- true``: the lock read, the engine asked for
      the image, the kept check inside it read back, the container run (the target:
      (a) <= 1.6 x (b));
  (b) ``docker run --rm IMAGE true``: the engine's own client, the least a user runs;
  (c) ``envlock restore LOCK <options>``, a cache hit with the check inside kept (the target:
      <= 5 s), and (d) the same with ``ENVLOCK_NO_CACHE=1``, which runs the check inside again:
      what the kept check saves;
  (e) ``python -c pass`` and (f) ``envlock --version`` of the same interpreter: what every
      command pays before it does anything;
  (g) the lock read through the models (``envlock.lock.load``), (i) its sealed header alone
      (``envlock.lock.header``, what ``run``'s fast path reads) and (h) ``import docker``: with
      (b) and (f), the least (a) can take, printed as the floor of (a)/(b);
  (j) a warm ``envlock verify`` of a lock of this interpreter (torch facts cached, the verify
      before it kept: nothing changed) and (k) ``python -c "import torch"`` (the target:
      (j) <= 0.06 x (k)).

The image is restored once before the rounds (a source image of the base with a venv of a few
small wheels from the wheelhouse, locked with ``capture --in-image``, restored with
``--wheelhouse``), and removed at the end; the source image stays for the next run. Usage:

    ENVLOCK_TEST_BASE_IMAGE=... ENVLOCK_TEST_WHEELHOUSE=... DOCKER_HOST=... \\
        python benchmarks/runstart.py [--rounds N] [--prefix NAME] [--python PY]

``--python`` runs envlock with another interpreter (a venv with envlock installed, not
editable, as users install it: an editable install's import finder costs every start); the
default is this one with the checkout on ``PYTHONPATH``. Prints a markdown table: medians, minima
and the children's CPU time, and the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # restore.py's imports
PACKAGES = ["six==1.16.0", "idna==3.10", "packaging==24.2"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one run; fails loudly."""
    c0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:5])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="", help="the commands to time, by letter (default: all)")
    parser.add_argument("--prefix", default="bench-runstart", help="image name prefix (yours alone)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs envlock (default: this one, checkout on PYTHONPATH)")
    args = parser.parse_args()
    import docker

    base = os.environ["ENVLOCK_TEST_BASE_IMAGE"]
    house = Path(os.environ["ENVLOCK_TEST_WHEELHOUSE"])
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise SystemExit("the docker command-line client is the comparison: it is not installed")
    client = docker.from_env(timeout=600)
    with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENVLOCK_")}
        env.update(XDG_CACHE_HOME=str(work / "cache"), ENVLOCK_PLAIN_PROGRESS="1")
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as users have it
        if args.python == sys.executable:
            env["PYTHONPATH"] = str(ROOT)
        else:
            env.pop("PYTHONPATH", None)
        envlock = [args.python, "-m", "envlock"]
        lock = work / "env.lock"
        from restore import source_image  # benchmarks/restore.py: one way to make a source image

        src = source_image(client, base, house, args.prefix, name="small", packages=PACKAGES)
        timed([*envlock, "capture", "--in-image", src, "-o", str(lock)], env, work)
        host_lock = work / "host.lock"  # this interpreter's environment, torch included
        timed([*envlock, "capture", "--python", args.python, "-o", str(host_lock)], env, work)
        options = ["--base", base, "--wheelhouse", str(house), "--name", f"{args.prefix}-small"]
        timed([*envlock, "restore", str(lock), *options], env, work)  # builds and keeps the check
        from envlock.lock import load

        tag = f"envlock/{args.prefix}-small:{load(lock).short_id}"
        commands = {
            "a": [*envlock, "run", str(lock), *options, "--", "true"],
            "b": [docker_cli, "run", "--rm", tag, "true"],
            "c": [*envlock, "restore", str(lock), *options],
            "d": [*envlock, "restore", str(lock), *options],
            "e": [args.python, "-c", "pass"],
            "f": [*envlock, "--version"],
            # What run cannot do without: reading the lock through the one reader (the models
            # validate it), and the docker SDK it talks to the engine with.
            "g": [args.python, "-c", "import sys; from envlock.lock import load; load(sys.argv[1])", str(lock)],
            "h": [args.python, "-c", "import docker"],
            "i": [args.python, "-c", "import sys; from envlock.lock import header; header(sys.argv[1])", str(lock)],
            "j": [*envlock, "verify", "--python", args.python, str(host_lock)],
            "k": [args.python, "-c", "import torch"],
        }
        if args.only:
            commands = {k: v for k, v in commands.items() if k in args.only}
        envs = {k: {**env, "ENVLOCK_NO_CACHE": "1"} if k == "d" else env for k in commands}
        wall: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        try:
            for key, argv in commands.items():  # warm: page cache, bytecode
                timed(argv, envs[key], work)
            keys = list(commands)
            for r in range(args.rounds):
                for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                    w, c = timed(commands[key], envs[key], work)
                    wall[key].append(w)
                    cpu[key].append(c)
                sys.stderr.write(f"round {r + 1}/{args.rounds}: "
                                 + " ".join(f"({k}) {wall[k][-1]:.2f}s" for k in keys) + "\n")
        finally:
            with contextlib.suppress(Exception):
                client.images.remove(tag)
    names = {"a": "(a) `envlock run LOCK -- true` (kept check)", "b": "(b) `docker run --rm IMAGE true`",
             "c": "(c) `envlock restore`, cache hit, check kept",
             "d": "(d) `envlock restore`, cache hit, ENVLOCK_NO_CACHE=1 (check runs)",
             "e": "(e) `python -c pass`", "f": "(f) `envlock --version`",
             "g": "(g) `python -c 'load(LOCK)'`: the lock read through the models",
             "h": "(h) `python -c 'import docker'`",
             "i": "(i) `python -c 'header(LOCK)'`: the sealed header alone",
             "j": "(j) warm `envlock verify` (torch facts cached, the answer kept)",
             "k": "(k) `python -c 'import torch'`"}
    med = {k: statistics.median(v) for k, v in wall.items()}
    low = {k: min(v) for k, v in wall.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    out = [f"{args.rounds} rounds, wall-clock and CPU (the process and its children) seconds\n",
           "| command | median | min | CPU (median) |", "|---|---:|---:|---:|"]
    out += [f"| {label} | {med[k]:.3f} | {low[k]:.3f} | {cpu_med[k]:.3f} |" for k, label in names.items() if k in med]
    out.append("")
    if {"a", "b"} <= med.keys():
        out.append(f"(a)/(b) = {med['a'] / med['b']:.2f} (median), {low['a'] / low['b']:.2f} (min); target <= 1.6\n")
    if {"c", "d"} <= med.keys():
        out.append(f"(c) = {med['c']:.2f} s (target <= 5 s); (c)/(d) = {med['c'] / med['d']:.2f}\n")
    # The least run can take: docker run's own time, plus the header's read and the SDK's import
    # in one interpreter (each of (i) and (h) pays the interpreter's start, counted once).
    for label, d in (("median", med), ("min", low)) if {"b", "e", "f", "g", "h", "i"} <= med.keys() else ():
        floor = d["b"] + d["f"] + (d["i"] - d["e"]) + (d["h"] - d["e"])
        models = d["b"] + d["f"] + (d["g"] - d["e"]) + (d["h"] - d["e"])
        out.append(f"floor ({label}) ((b) + (f) + (i) - (e) + (h) - (e)) / (b) = {floor / d['b']:.2f}: envlock's "
                   f"start, the sealed header and the SDK's import, before any request to the engine "
                   f"(through the models instead of the header: {models / d['b']:.2f})\n")
    if {"j", "k"} <= med.keys():
        out.append(f"(j)/(k) = {med['j'] / med['k']:.3f} (median), {low['j'] / low['k']:.3f} (min); target <= 0.06\n")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
