"""What tracing a recorded run's reads costs (``probe.trace``, ``replay.reads``).

    python benchmarks/trace.py [--files 10000] [--repeats 3]

A small training run (a torch MLP on CPU) whose data loader opens one file per sample,
``--files`` of them, is recorded with ``envlock record`` traced and with ``--no-trace``,
alternately. Two figures, as medians:

* the run: the training process's own wall time from its first line to its exit (measured
  inside it, so envlock's start and the record's writing are apart): what the audit hook and
  the traced ``os.environ`` cost the training. Budget: +5 %;
* the whole ``envlock record``: adds joining the traces and hashing what was read (the stat
  cache is warm after the first run, as on a researcher's second run).

Run it with an interpreter that has torch and can import envlock (the repository root is put
on ``PYTHONPATH``).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN = r'''
import json, os, sys, time
t0 = time.perf_counter()
import torch
import envlock

torch.manual_seed(0)
files = sorted(os.listdir("data"))
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("LR", "0.01")))
batch = []
for step, name in enumerate(files):
    with open(os.path.join("data", name), "rb") as fh:
        batch.append(torch.frombuffer(bytearray(fh.read()), dtype=torch.float32))
    if len(batch) == 50:
        x = torch.stack(batch)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        batch = []
        if step % 1000 == 999:
            envlock.record(step, loss=loss.detach())
with open(sys.argv[1], "w") as out:
    out.write(repr(time.perf_counter() - t0))
'''


def _project(root: Path, files: int) -> None:
    import random

    (root / "data").mkdir(parents=True)
    rng = random.Random(0)
    for i in range(files):
        (root / "data" / f"{i:06d}.bin").write_bytes(bytes(rng.getrandbits(8) for _ in range(256)))
    (root / "train.py").write_text(TRAIN)


def _record(root: Path, traced: bool) -> tuple[float, float]:
    """(the run's own seconds, the whole command's seconds)."""
    own = root / "own.txt"
    cmd = [sys.executable, "-m", "envlock", "record", "run.record", *([] if traced else ["--no-trace"]),
           "--", sys.executable, "train.py", str(own)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=root, env=env, check=True, stderr=subprocess.DEVNULL)
    whole = time.perf_counter() - t0
    return float(own.read_text()), whole


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envlock-trace-bench-") as tmp:
        root = Path(tmp) / "proj"
        _project(root, args.files)
        _record(root, True)  # warm: bytecode, the stat cache, the page cache
        _record(root, False)
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for traced in (False, True):
                runs[traced].append(_record(root, traced))
        from envlock.replay.record import load

        reads = load(root / "run.record").reads
        files_read = len(reads.files) if reads else 0
    med = {t: (statistics.median(r[0] for r in runs[t]), statistics.median(r[1] for r in runs[t]))
           for t in runs}
    doc = {"files": args.files, "files_in_record": files_read, "repeats": args.repeats,
           "run_untraced_s": med[False][0], "run_traced_s": med[True][0],
           "run_ratio": med[True][0] / med[False][0],
           "record_untraced_s": med[False][1], "record_traced_s": med[True][1],
           "record_ratio": med[True][1] / med[False][1]}
    print(json.dumps(doc, indent=2))
    print(f"traced/untraced: the run {doc['run_ratio']:.3f}x, the whole record {doc['record_ratio']:.3f}x "
          f"({args.files} files opened, {files_read} in the record)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
