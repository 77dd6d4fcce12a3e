"""Hashing wheels: envlock's ``sha256_file`` (bundle, restore cache key) next to ``sha256sum``.

``envlock bundle`` hash-checks every wheel it collects and ``envlock restore`` hashes the wheels
it copies into a build context; the tool a user would otherwise run is ``sha256sum``. Usage:

    python benchmarks/hashing.py FILE [FILE ...] [--repeat N]

Each measurement is a separate process (interpreter start and envlock's imports included, as
sha256sum pays its own start), warm page cache, median of N runs: one row per file, then one
row for all files in a single call (``sha256sum F1 F2 ...`` against one envlock process
hashing them all, which is how ``bundle`` works). Prints a markdown table with the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENVLOCK_HASH = ("import sys, pathlib; from envlock._files import sha256_file; "
                "print('\\n'.join(sha256_file(pathlib.Path(p)) for p in sys.argv[1:]))")


def _time(argv: list[str], repeat: int) -> tuple[float, str]:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout  # warm-up
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="interpreter that has envlock")
    args = parser.parse_args()
    if shutil.which("sha256sum") is None:
        print("sha256sum not found", file=sys.stderr)
        return 2
    print("| file | size | sha256sum | envlock sha256_file | envlock / sha256sum | same digest |")
    print("|---|---:|---:|---:|---:|---|")
    for path in args.files:
        size = path.stat().st_size
        t_ref, ref = _time(["sha256sum", str(path)], args.repeat)
        t_el, ours = _time([args.python, "-c", ENVLOCK_HASH, str(path)], args.repeat)
        same = ours.strip() == "sha256:" + ref.split()[0]
        print(f"| {path.name} | {size / 1e6:.1f} MB | {t_ref * 1000:.0f} ms | {t_el * 1000:.0f} ms "
              f"| {t_el / t_ref:.2f}x | {'yes' if same else 'NO'} |")
    if len(args.files) > 1:
        names = [str(p) for p in args.files]
        total = sum(p.stat().st_size for p in args.files)
        t_ref, ref = _time(["sha256sum", *names], args.repeat)
        t_el, ours = _time([args.python, "-c", ENVLOCK_HASH, *names], args.repeat)
        same = ours.split() == ["sha256:" + line.split()[0] for line in ref.splitlines()]
        print(f"| all {len(names)} in one call | {total / 1e6:.1f} MB | {t_ref * 1000:.0f} ms "
              f"| {t_el * 1000:.0f} ms | {t_el / t_ref:.2f}x | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
