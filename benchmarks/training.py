"""What envlock adds to a training process, side by side with the ``import torch`` it pays anyway.

    python benchmarks/training.py [--venv DIR] [--repeats N] [--json FILE]
    python benchmarks/training.py --venv DIR --tree before=SRC1 --tree after=SRC2   # side by side

``--tree NAME=SRC`` runs the children of each tree in the same rounds with ``PYTHONPATH=SRC``
(a checkout's root: its ``envlock`` is imported instead of the venv's), so that two versions of
envlock are compared under the same load; without it the venv's installed envlock is measured.

The targets (issue 26): the first ``envlock.record()`` call and ``envlock.capture()`` in a
training process each add at most 10 % to ``import torch``; cold ``envlock capture --no-cache``
stays within 1.15x ``python -c "import torch"``. Each round runs, interleaved and each in a
fresh interpreter (``inproc.py first``, which times the calls inside the process, so the
ratio's two figures come from the same process and the same moment of load):

* ``import torch``, then ``import envlock; envlock.capture()``, then the first ``record()``;
* ``import torch``, then the first ``record()`` alone (what ``envlock run --record`` costs);
* ``import torch``, then ``torch.utils.collect_env.get_env_info()``: the Python peer, PyTorch's
  own report of the environment (info, beside the targets);
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

IMPORT_TORCH = '`python -c "import torch"`'
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


def children(venv: Path, tmp: Path, tree: str = "", src: Path | None = None) -> list[Child]:
    """The children of one version of envlock (``src``: a checkout put first on PYTHONPATH;
    None: the venv's own), keyed ``tree:kind``."""
    py, el = str(venv / "bin" / "python"), str(venv / "bin" / "envlock")
    inproc = [py, str(HERE / "inproc.py"), "first"]
    extra = {"ENVLOCK_CACHE_DIR": str(tmp / f"cache-{tree}")}
    if src is not None:
        extra["PYTHONPATH"] = str(src)
    warm = run.child_env(venv, **extra)
    cold = run.child_env(venv, **extra, ENVLOCK_NO_CACHE="1")
    return [
        Child(f"{tree}:import_torch", 'python -c "import torch"', [py, "-c", "import torch"], warm),
        Child(f"{tree}:capture_record", "capture(), then record()", [*inproc, "capture", "record"], warm),
        Child(f"{tree}:record", "record() alone", [*inproc, "record"], warm),
        Child(f"{tree}:collect_env", "torch.utils.collect_env.get_env_info() (the peer)",
              [*inproc, "collect_env"], warm),
        Child(f"{tree}:capture_record_cold", "capture(), then record(); ENVLOCK_NO_CACHE=1",
              [*inproc, "capture", "record"], cold),
        Child(f"{tree}:record_cold", "record() alone; ENVLOCK_NO_CACHE=1", [*inproc, "record"], cold),
        Child(f"{tree}:capture_no_cache", "envlock capture --no-cache",
              [el, "capture", "--no-cache", "-o", str(tmp / f"cold-{tree}.lock")], warm),
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


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def render(kids: dict[str, Child], trees: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """One table of in-process figures, one of processes and one of targets, with a row per
    tree in each."""
    def name(tree: str, label: str) -> str:
        return f"{tree}: {label}" if tree else label

    lines = ["| process | import torch | capture() | first record() | record() / import torch "
             "| capture() / import torch |", "|---|---:|---:|---:|---:|---:|"]
    for key in ("capture_record", "record", "capture_record_cold", "record_cold"):
        for tree in trees:
            kid = kids[f"{tree}:{key}"]
            lines.append(f"| {name(tree, kid.label)} | {_ms(kid.median('import torch_s'))} | "
                         f"{_ms(kid.median('capture_s'))} | {_ms(kid.median('record_s'))} | "
                         f"{_x(kid.ratio('record_s'))} | {_x(kid.ratio('capture_s'))} |")
    lines += ["", "| process | median | vs import torch |", "|---|---:|---:|"]
    targets = []
    for tree in trees:
        torch_p = statistics.median(kids[f"{tree}:import_torch"].wall)
        cold_p = statistics.median(kids[f"{tree}:capture_no_cache"].wall)
        torch_label, cold_label = name(tree, IMPORT_TORCH), name(tree, "`envlock capture --no-cache`")
        lines += [f"| {torch_label} | {_ms(torch_p)} | 1.000x |",
                  f"| {cold_label} | {_ms(cold_p)} | {_x(cold_p / torch_p)} |"]
        targets += [
            (name(tree, "capture() <= 0.10 x import torch (warm)"),
             kids[f"{tree}:capture_record"].ratio("capture_s"), LIMIT_INPROC),
            (name(tree, "first record() <= 0.10 x import torch (warm)"),
             kids[f"{tree}:record"].ratio("record_s"), LIMIT_INPROC),
            (name(tree, "capture --no-cache <= 1.15 x import torch"), cold_p / torch_p, LIMIT_CAPTURE),
            (name(tree, "(info) the peer, torch.utils.collect_env.get_env_info()"),
             kids[f"{tree}:collect_env"].ratio("collect_env_s"), None),
            (name(tree, "(info) capture() / the peer (medians in their own processes)"),
             _over(kids[f"{tree}:capture_record"].median("capture_s"),
                   kids[f"{tree}:collect_env"].median("collect_env_s")), None),
            (name(tree, "(info) capture() with ENVLOCK_NO_CACHE=1"),
             kids[f"{tree}:capture_record_cold"].ratio("capture_s"), None),
            (name(tree, "(info) first record() with ENVLOCK_NO_CACHE=1"),
             kids[f"{tree}:record_cold"].ratio("record_s"), None),
        ]
    lines += ["", "| target | median | limit | verdict |", "|---|---:|---:|---|"]
    judged = []
    for label, value, limit in targets:
        verdict = "info" if limit is None or value is None else ("PASS" if value <= limit else "MISS")
        lines.append(f"| {label} | {_x(value)} | {_x(limit)} | {verdict} |")
        judged.append({"target": label, "value": value, "limit": limit, "verdict": verdict})
    return "\n".join(lines) + "\n", judged


def _tree(text: str) -> tuple[str, Path]:
    label, sep, src = text.partition("=")
    if not sep or not label or not (Path(src) / "envlock" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=DIR, DIR holding envlock/")
    return label, Path(src).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, help="use this venv as is (torch and envlock installed)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter to create the benchmark venv with")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--json", type=Path, help="write every sample here")
    parser.add_argument("--tree", type=_tree, action="append", default=[],
                        help="NAME=DIR: measure the envlock of checkout DIR (repeat to compare)")
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
        trees = args.tree or [("", None)]
        kids = [kid for tree, src in trees for kid in children(venv, tmp, tree, src)]
        started = time.perf_counter()
        measure(kids, project, args.repeats)
        by_key = {k.key: k for k in kids}
        report, judged = render(by_key, [tree for tree, _ in trees])
        doc = {"machine": run.machine_info(), "venv": run.venv_info(venv),
               "repeats": args.repeats, "duration_s": round(time.perf_counter() - started, 1),
               "trees": {tree: str(src) if src else None for tree, src in trees},
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
