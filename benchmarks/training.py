"""What envlock adds to a training process, side by side with the ``import torch`` it pays anyway.

    python benchmarks/training.py [--venv DIR] [--repeats N] [--json FILE]

The targets (issue 26): the first ``envlock.record()`` call and ``envlock.capture()`` in a
training process each add at most 10 % to ``import torch``; cold ``envlock capture --no-cache``
stays within 1.15x ``python -c "import torch"``. Each round runs, interleaved and each in a
fresh interpreter (``inproc.py first``, which times the calls inside the process, so the
ratio's two figures come from the same process and the same moment of load):

* ``import torch``, then ``import envlock; envlock.capture()``, then the first ``record()``;
* ``import torch``, then the first ``record()`` alone (what ``envlock run --record`` costs);
* both again with ``ENVLOCK_NO_CACHE=1``: nothing remembered of files (info: the first run on
  a fresh host; any capture or verify of the environment fills the cache);
* ``python -c "import torch"`` and ``envlock capture --no-cache`` as processes.

Warm means the file caches a previous run of this environment left (``ENVLOCK_CACHE_DIR`` of
the run's own, filled by the warm-up run). Stdlib only; the venv, the settling and the
process runner are ``run.py``'s. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (beside this file, not an installed package)

LIMIT_INPROC = 0.10
LIMIT_CAPTURE = 1.15


@dataclass
class Child:
    """One kind of fresh interpreter, and the timings each run of it printed."""

    key: str
    label: str
    argv: list[str]
    env: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def run(self, cwd: Path, keep: bool) -> None:
        cmd = run.Command(self.key, self.label, self.argv, self.env, cwd)
        wall, _cpu, rc, out, err = run.run_once(cmd)
        if rc != 0:
            raise RuntimeError(f"{self.label}: exit {rc}: {err.decode(errors='replace')[-600:]}")
        if keep:
            self.wall.append(wall)
            if "first" in self.argv:  # inproc.py first: its timings on stdout
                self.rows.append(json.loads(out))

    def median(self, name: str) -> float | None:
        values = [r[name] for r in self.rows if name in r]
        return statistics.median(values) if values else None

    def ratio(self, name: str) -> float | None:
        """The median, over runs, of ``name`` / ``import torch`` in the same process."""
        values = [r[name] / r["import torch_s"] for r in self.rows if name in r]
        return statistics.median(values) if values else None


def children(venv: Path, tmp: Path) -> list[Child]:
    py, el = str(venv / "bin" / "python"), str(venv / "bin" / "envlock")
    inproc = [py, str(HERE / "inproc.py"), "first"]
    warm = run.child_env(venv, ENVLOCK_CACHE_DIR=str(tmp / "cache"))
    cold = run.child_env(venv, ENVLOCK_CACHE_DIR=str(tmp / "cache"), ENVLOCK_NO_CACHE="1")
    return [
        Child("import_torch", 'python -c "import torch"', [py, "-c", "import torch"], warm),
        Child("capture_record", "capture(), then record()", [*inproc, "capture", "record"], warm),
        Child("record", "record() alone", [*inproc, "record"], warm),
        Child("capture_record_cold", "capture(), then record(); ENVLOCK_NO_CACHE=1",
              [*inproc, "capture", "record"], cold),
        Child("record_cold", "record() alone; ENVLOCK_NO_CACHE=1", [*inproc, "record"], cold),
        Child("capture_no_cache", "envlock capture --no-cache",
              [el, "capture", "--no-cache", "-o", str(tmp / "cold.lock")], warm),
    ]


def measure(kids: list[Child], cwd: Path, repeats: int) -> None:
    for kid in kids:  # warm-up: page cache, bytecode, and the file caches of the warm runs
        kid.run(cwd, keep=False)
    for r in range(repeats):
        run.SETTLE.wait()
        k = r % len(kids)
        for kid in kids[k:] + kids[:k]:
            kid.run(cwd, keep=True)
        run.log(f"  round {r + 1}/{repeats} done (CPU busy before it: "
                f"{run.SETTLE.busy_before_round[-1]})")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def render(kids: dict[str, Child]) -> tuple[str, list[dict[str, Any]]]:
    lines = ["| process | import torch | capture() | first record() | record() / import torch "
             "| capture() / import torch |", "|---|---:|---:|---:|---:|---:|"]
    for key in ("capture_record", "record", "capture_record_cold", "record_cold"):
        kid = kids[key]
        lines.append(f"| {kid.label} | {_ms(kid.median('import torch_s'))} | "
                     f"{_ms(kid.median('capture_s'))} | {_ms(kid.median('record_s'))} | "
                     f"{_x(kid.ratio('record_s'))} | {_x(kid.ratio('capture_s'))} |")
    torch_p = statistics.median(kids["import_torch"].wall)
    cold_p = statistics.median(kids["capture_no_cache"].wall)
    lines += ["", "| process | median | vs import torch |", "|---|---:|---:|",
              f"| `python -c \"import torch\"` | {_ms(torch_p)} | 1.000x |",
              f"| `envlock capture --no-cache` | {_ms(cold_p)} | {_x(cold_p / torch_p)} |"]
    targets = [
        ("capture() <= 0.10 x import torch (warm)", kids["capture_record"].ratio("capture_s"), LIMIT_INPROC),
        ("first record() <= 0.10 x import torch (warm)", kids["record"].ratio("record_s"), LIMIT_INPROC),
        ("capture --no-cache <= 1.15 x import torch", cold_p / torch_p, LIMIT_CAPTURE),
        ("(info) capture() with ENVLOCK_NO_CACHE=1", kids["capture_record_cold"].ratio("capture_s"), None),
        ("(info) first record() with ENVLOCK_NO_CACHE=1", kids["record_cold"].ratio("record_s"), None),
    ]
    lines += ["", "| target | median | limit | verdict |", "|---|---:|---:|---|"]
    judged = []
    for label, value, limit in targets:
        verdict = "info" if limit is None or value is None else ("PASS" if value <= limit else "MISS")
        lines.append(f"| {label} | {_x(value)} | {_x(limit)} | {verdict} |")
        judged.append({"target": label, "value": value, "limit": limit, "verdict": verdict})
    return "\n".join(lines) + "\n", judged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, help="use this venv as is (torch and envlock installed)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter to create the benchmark venv with")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--json", type=Path, help="write every sample here")
    parser.add_argument("--settle", type=float, default=run.SETTLE.max_wait,
                        help="wait up to this many seconds for quiet CPUs before each round")
    args = parser.parse_args(argv)
    run.SETTLE.max_wait = args.settle
    venv = (args.venv or run.DEFAULT_VENV).absolute()
    if args.venv is None:
        venv.parent.mkdir(parents=True, exist_ok=True)
        run.ensure_venv(venv, args.python)
    with tempfile.TemporaryDirectory(prefix="envlock-training-") as name:
        tmp = Path(name)
        project = run.make_project(tmp, run.child_env(venv))
        kids = children(venv, tmp)
        started = time.perf_counter()
        measure(kids, project, args.repeats)
        by_key = {k.key: k for k in kids}
        report, judged = render(by_key)
        doc = {"machine": run.machine_info(), "venv": run.venv_info(venv),
               "repeats": args.repeats, "duration_s": round(time.perf_counter() - started, 1),
               "settle": run.SETTLE.busy_before_round, "targets": judged,
               "children": {k.key: {"label": k.label, "rows": k.rows, "wall_s": k.wall}
                            for k in kids}}
    head = (f"{doc['machine']['cpus']} CPUs ({doc['machine']['cpu_model']}); torch "
            f"{doc['venv'].get('torch')}, {doc['venv'].get('distributions')} distributions; "
            f"{args.repeats} rounds, medians\n\n")
    sys.stdout.write(head + report)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
