"""fmt, show and verify on the largest lock envlock accepts (just under the 16 MiB limit).

Every command must stay linear up to the size limit: before the linear writer, ``fmt`` went
through tomlkit, which is quadratic in a table's size (5,000 ``[env]`` keys took 6 s, 20,000
over 100 s, a 7.5 MB lock never finished). The lock built here has both large tables: tens of
thousands of ``[env]`` keys and of ``[[packages]]`` rows. Each envlock command runs as a user
runs it (``python -m envlock ...`` in a fresh process), side by side with what the same work
costs without envlock: parsing the file with ``tomllib`` (the floor for any reader) and, for
``fmt``, a tomlkit round trip (what ``fmt`` did before; stopped after ``--tomlkit-limit``).

    python benchmarks/biglock.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def build(path: Path, limit: int) -> dict[str, int]:
    """Write a sealed lock of just under ``limit`` bytes; returns its table sizes."""
    sys.path.insert(0, str(REPO))
    from envlock import lock as lockio
    from envlock.lock import Lock

    def make(n_env: int, n_pkg: int) -> str:
        doc: dict[str, Any] = {
            "envlock": {"tool_version": "bench", "created_at": datetime(2026, 1, 1, tzinfo=timezone.utc)},
            "platform": {"os": "Linux", "machine": "x86_64"},
            "python": {"version": "3.11.7", "implementation": "cpython"},
            "env": {f"CUDA_BENCH_{i:06d}": f"value-{i}" for i in range(n_env)},
            "packages": [{"name": f"synth-pkg-{i:06d}", "version": f"1.{i % 100}.{i % 7}",
                          "installer": "pip", "requested": i % 3 == 0,
                          "record_sha256": f"{i:064x}"} for i in range(n_pkg)],
        }
        return lockio.dumps(lockio.seal(Lock.model_validate(doc)))

    # Scale both tables together until the next step would cross the limit.
    n_env, n_pkg = 20_000, 20_000
    text = make(n_env, n_pkg)
    while True:
        factor = 0.985 * limit / len(text.encode())
        if factor < 1.002:
            break
        n_env, n_pkg = int(n_env * factor), int(n_pkg * factor)
        text = make(n_env, n_pkg)
    path.write_text(text, encoding="utf-8")
    return {"bytes": len(text.encode()), "env_keys": n_env, "packages": n_pkg}


def timed(argv: list[str], *, timeout: float, cwd: Path) -> tuple[float | None, float | None, int | None]:
    """(wall seconds, CPU seconds of the command and its children, exit code).

    CPU time is what to compare on a shared machine: wall time there includes waiting for a core.
    """
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, None, None
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tomlkit-limit", type=float, default=60.0, help="seconds before the tomlkit "
                        "round trip is stopped and reported as '> limit'")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="envlock-biglock-") as tmp:
        work = Path(tmp)
        lock = work / "env.lock"
        sizes = build(lock, 16 * 1024 * 1024)
        # A hand edit, so fmt really re-seals and writes the whole file every round.
        original = lock.read_text(encoding="utf-8")
        edited = original.replace('version = "1.0.0"', 'version = "1.0.1"', 1)
        load = f"import tomllib; tomllib.load(open({str(lock)!r}, 'rb'))"
        roundtrip = f"import tomlkit; tomlkit.dumps(tomlkit.parse(open({str(lock)!r}).read()))"
        commands = {
            "envlock fmt": [py, "-m", "envlock", "fmt", str(lock)],
            "envlock show": [py, "-m", "envlock", "show", str(lock)],
            "envlock verify --no-torch": [py, "-m", "envlock", "verify", str(lock), "--no-torch"],
            "tomllib.load (floor)": [py, "-c", load],
            "tomlkit parse+dumps (old fmt)": [py, "-c", roundtrip],
        }
        results: dict[str, dict[str, Any]] = {}
        for name, cmd in commands.items():
            runs: list[float] = []
            cpus: list[float] = []
            code = None
            limit = args.tomlkit_limit if "tomlkit" in name else 600.0
            for _ in range(1 if "tomlkit" in name else args.repeats):
                if name == "envlock fmt":
                    lock.write_text(edited, encoding="utf-8")
                seconds, cpu, code = timed(cmd, timeout=limit, cwd=work)
                if seconds is None or cpu is None:
                    break
                runs.append(seconds)
                cpus.append(cpu)
            results[name] = {"best_s": min(runs) if runs else None, "best_cpu_s": min(cpus) if cpus else None,
                             "exit": code, "timed_out_after_s": None if runs else limit}
    floor = results["tomllib.load (floor)"]["best_cpu_s"]
    print(f"lock: {sizes['bytes'] / 2**20:.2f} MiB, {sizes['env_keys']:,} [env] keys, "
          f"{sizes['packages']:,} packages; best of {args.repeats} (tomlkit: one run)\n")
    print("| command | CPU s | wall s | exit | CPU / tomllib.load |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        if r["best_s"] is None:
            print(f"| {name} | - | > {r['timed_out_after_s']:.0f} | - | - |")
        else:
            ratio = f"{r['best_cpu_s'] / floor:.1f}x" if floor else "-"
            print(f"| {name} | {r['best_cpu_s']:.2f} | {r['best_s']:.2f} | {r['exit']} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps({"lock": sizes, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
