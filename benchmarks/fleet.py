"""How does ``envlock verify --fleet`` grow with the number of nodes?

    SLURM_CONF=.../slurm.conf python benchmarks/fleet.py [--repeat 7] [--nodes 1 2 4] [--out FILE]

Needs a running Slurm cluster (``scripts/test.sh`` starts a four-node one; ``scripts/slurm.sh``
alone does too). Measured, each as a separate process, interleaved round-robin so that load
from elsewhere on the machine hits every size alike:

- ``srun --ntasks-per-node=1 -N K true``: the launcher alone, the floor any preflight pays;
- ``envlock verify LOCK --fleet --nodes K``: the whole preflight (allocation, one verify per
  node, gathering, the table), against a lock captured from a small venv.

The medians are fitted with a least-squares line (seconds = a + b * nodes); b is the measured
growth per node and a + 1000 b the estimate for a thousand nodes. Separately, in-process, the
gathering and the table (``check.protocol.gather`` + ``check.fleetreport.fleet_text``) on
synthetic output of 1,000 and 10,000 nodes: the part of the cost that is envlock's own and runs
on one machine however many nodes there are. On a single machine the "nodes" share its cores, so
every node's own verify competes for them: there the slope is an upper bound of what separate
machines would show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(PYTHONPATH=str(REPO), VIRTUAL_ENV=str(venv))
    return env


def _time(argv: list[str], env: dict[str, str], *, want: int) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode != want:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return took


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares: (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def gather_cost(nodes: int, repeat: int) -> float:
    """Median seconds of gathering and rendering ``nodes`` verdicts (one in ten drifted)."""
    sys.path.insert(0, str(REPO))
    from envlock.check.fleetreport import fleet_text
    from envlock.check.protocol import MARKER, gather
    from envlock.check.verdicts import FleetResult

    lines = []
    for task in range(nodes):
        name = f"node{task + 1:05d}"
        diffs = [] if task % 10 else [{"category": "packages", "path": "packages.numpy.version",
                                       "old": "2.1.0", "new": "2.0.2", "severity": "breaking",
                                       "message": "numpy 2.1.0 -> 2.0.2"}]
        for kind, extra in (("hello", {}), ("verdict", {"result": {"ok": not diffs, "differences": diffs}})):
            lines.append(f"{task}: " + json.dumps({MARKER: kind, "node": name, **extra},
                                                  separators=(",", ":")))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        verdicts, _ = gather(lines, nodes, timed_out=False, timeout=120)
        fleet_text(FleetResult("env.lock", "abc", verdicts, 120))
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", help="write every sample as JSON here")
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("set SLURM_CONF to a running cluster's slurm.conf (see scripts/slurm.sh)")
    with tempfile.TemporaryDirectory(prefix="envlock-fleet-bench-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        env = _env(venv)
        lock = Path(tmp) / "env.lock"
        subprocess.run([sys.executable, "-m", "envlock", "capture", "--python", str(venv),
                        "--no-torch", "-o", str(lock)], env=env, cwd=tmp, check=True,
                       capture_output=True)
        def srun_true(k: int) -> list[str]:
            return ["srun", f"--nodes={k}", "--ntasks-per-node=1", "true"]

        def fleet(k: int) -> list[str]:
            return [sys.executable, "-m", "envlock", "verify", str(lock), "--fleet", "--nodes", str(k)]

        commands: dict[str, Callable[[int], list[str]]] = {"srun true": srun_true,
                                                            "verify --fleet": fleet}
        for cmd in commands.values():  # warm-up: page cache, bytecode, the controller
            _time(cmd(args.nodes[-1]), env, want=0)
        samples: dict[str, dict[int, list[float]]] = {n: {k: [] for k in args.nodes} for n in commands}
        sizes = list(args.nodes)
        for r in range(args.repeat):
            order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
            for k in order:
                for name, cmd in commands.items():
                    samples[name][k].append(_time(cmd(k), env, want=0))
    report: dict[str, object] = {"repeat": args.repeat, "cpus": os.cpu_count(), "commands": {}}
    print(f"{args.repeat} runs per size, {os.cpu_count()} CPUs; medians in seconds\n")
    print("| command | " + " | ".join(f"{k} node(s)" for k in args.nodes)
          + " | growth per node | 1,000 nodes (fit) |")
    print("|---|" + "---|" * (len(args.nodes) + 2))
    for name in commands:
        med = [statistics.median(samples[name][k]) for k in args.nodes]
        a, b = fit([float(k) for k in args.nodes], med)
        print(f"| `{name}` | " + " | ".join(f"{m:.3f}" for m in med)
              + f" | {b * 1000:+.0f} ms | {a + 1000 * b:.1f} s |")
        report["commands"][name] = {"samples": samples[name], "medians": med,  # type: ignore[index]
                                    "intercept_s": a, "slope_s_per_node": b,
                                    "estimate_1000_s": a + 1000 * b}
    g1000, g10000 = gather_cost(1000, args.repeat), gather_cost(10000, max(3, args.repeat // 2))
    print(f"\ngathering + table in-process: 1,000 nodes {g1000 * 1000:.1f} ms, "
          f"10,000 nodes {g10000 * 1000:.1f} ms")
    report["gather_s"] = {"1000": g1000, "10000": g10000}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
