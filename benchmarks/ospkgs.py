"""OS packages: envlock's dpkg status parser next to ``dpkg-query -W``.

Every capture reads the OS package database, so its cost is paid at the start of every
training job; the target is <= 20 ms for ~500 packages. The tool a user would otherwise run is
``dpkg-query -W`` (name and version of every package). Usage:

    python benchmarks/ospkgs.py [--status FILE] [--sizes 500,ALL] [--repeat N]

For each size, a status file with the first N stanzas of FILE (default: this machine's
``/var/lib/dpkg/status``) is written to a temporary root and parsed in-process the way the probe
does it (read + parse + pins), median of N. ``dpkg-query -W --admindir=ROOT`` is timed on the
same root as a separate process (that is how a user or a shell script pays for it). A last row
times the OS-owned distribution lookup (``mark_system``) for this machine's system Python.
Prints a markdown table with the ratios.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envlock.probe import ospkgs


def _median(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU seconds of ``fn()``, this process plus the children it waited for.

    CPU time, not wall time: on a shared machine the wall clock measures the neighbours' load
    (it read 5-10x the CPU time while this was written); the README quotes both.
    """
    samples = []
    for _ in range(repeat):
        start = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime \
            + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
        wall = time.perf_counter()
        fn()
        WALL.append(time.perf_counter() - wall)
        end = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime \
            + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
        samples.append(end - start)
    return statistics.median(samples)


WALL: list[float] = []


def _wall() -> float:
    value = statistics.median(WALL)
    WALL.clear()
    return value


def _root_with(stanzas: list[str], where: Path) -> Path:
    root = where / f"root-{len(stanzas)}"
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("\n\n".join(stanzas) + "\n")
    for name in ("available", "diversions", "statoverride"):
        (root / "var/lib/dpkg" / name).write_text("")
    return root


def _system_owned(repeat: int) -> tuple[int, float, float] | None:
    site = "/usr/lib/python3/dist-packages"
    db = ospkgs.load("/")
    if db is None or db.manager != "dpkg" or not os.path.isdir(site):
        return None
    locations = {n.split("-", 1)[0].lower(): os.path.join(site, n) for n in os.listdir(site)
                 if n.endswith((".dist-info", ".egg-info"))}

    def run() -> int:
        pkgs: list[dict[str, object]] = [{"name": n, "version": "0", "source": "index"} for n in locations]
        return ospkgs.mark_system(pkgs, locations, db)

    marked = run()
    return marked, _median(run, repeat), _wall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--status", default="/var/lib/dpkg/status")
    parser.add_argument("--sizes", default="500,ALL")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    text = Path(args.status).read_text(encoding="utf-8", errors="replace")
    stanzas = [s for s in text.split("\n\n") if s.strip()]
    have_dpkg = shutil.which("dpkg-query") is not None
    print("| packages | status size | envlock parse, CPU (wall) | dpkg-query -W, CPU (wall) "
          "| envlock / dpkg-query (CPU) | same set | target <= 20 ms CPU |")
    print("|---:|---:|---:|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            n = len(stanzas) if size == "ALL" else min(int(size), len(stanzas))
            root = _root_with(stanzas[:n], Path(tmp))
            status = root / "var/lib/dpkg/status"

            def parse(root: Path = root) -> list[str]:
                db = ospkgs.load(str(root))
                assert db is not None
                return db.specs()

            ours = parse()
            t_ours = _median(parse, args.repeat)
            row = (f"| {len(ours)} | {status.stat().st_size / 1e3:.0f} kB | {t_ours * 1000:.1f} ms "
                   f"({_wall() * 1000:.1f} ms) ")
            if have_dpkg:
                argv = ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
                        "-f", "${Package}:${Architecture}=${Version} ${db:Status-Abbrev}\n"]
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                theirs = sorted(line.split()[0] for line in out.splitlines() if line.endswith("ii "))
                t_ref = _median(functools.partial(subprocess.run, argv, capture_output=True, check=True),
                                args.repeat)
                same = "yes" if theirs == ours else f"NO ({len(theirs)} vs {len(ours)})"
                row += f"| {t_ref * 1000:.1f} ms ({_wall() * 1000:.1f} ms) | {t_ours / t_ref:.2f}x | {same} "
            else:
                row += "| - | - | - "
            row += f"| {'PASS' if t_ours <= 0.020 else 'FAIL'} |"
            print(row)
    owned = _system_owned(args.repeat)
    if owned:
        print(f"\nOS-owned distribution lookup for the system Python (/usr/lib/python3/dist-packages): "
              f"{owned[0]} distributions attributed in {owned[1] * 1000:.1f} ms CPU "
              f"({owned[2] * 1000:.1f} ms wall), median of {args.repeat}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
