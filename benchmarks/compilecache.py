"""What a compile cache costs and saves: a compiled training step (forward and backward of
``--layers`` blocks) run four ways, wall time of the whole process each, side by side.

    python benchmarks/compilecache.py [--layers N] [--repeats N] [--json FILE]

* ``cold``: ``python train.py`` into an empty Inductor cache (what every fresh container does);
* ``by hand``: the same, the script loading the saved artifacts itself first
  (``torch.compiler.load_cache_artifacts``, what a user would otherwise write);
* ``envlock``: ``envlock replay REC --compile-cache FILE``: the loader (the command's own
  interpreter) loads the file and then becomes ``python train.py``;
* ``envlock cold``: ``envlock replay REC`` into an empty cache, to separate envlock's own cost
  (the replay record, its probe) from the loader's.

Run it with an interpreter that has torch and a C++ compiler on PATH; the repository root is put
on PYTHONPATH. Prints a markdown table with the medians and the ratios.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]

TRAIN = """
import os, sys, torch
import envlock

if os.environ.get("BY_HAND"):
    with open(os.environ["BY_HAND"], "rb") as fh:
        fh.readline(); fh.readline()  # envlock's two header lines; the rest is torch's bytes
        torch.compiler.load_cache_artifacts(fh.read())

torch.manual_seed(0)
layers = int(os.environ.get("LAYERS", "1"))
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
                                                  torch.nn.GELU()) for _ in range(layers)])


def step(x):
    loss = model(x).pow(2).mean()
    loss.backward()  # forward and backward graphs: what a training step compiles
    return loss


loss = torch.compile(step)(torch.ones(32, 64))
envlock.record(0, loss=loss.detach())
"""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(repeats: int, layers: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="compilecache-bench-"))
    (root / "train.py").write_text(TRAIN)
    base = {**os.environ, "PYTHONPATH": str(REPO), "LAYERS": str(layers)}
    base.pop("ENVLOCK_RECORD", None)
    envlock = [sys.executable, "-m", "envlock"]
    cache = root / "compiled.cache"
    subprocess.run([*envlock, "record", "run.rec", "--save-compile-cache", str(cache), "--",
                    sys.executable, "train.py"], cwd=root, check=True,
                   env={**base, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=root)})

    def fresh(**extra: str) -> dict[str, str]:
        return {**base, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=root), **extra}

    ways: dict[str, Callable[[], float]] = {
        "cold": lambda: _run([sys.executable, "train.py"], root, fresh()),
        "by hand": lambda: _run([sys.executable, "train.py"], root, fresh(BY_HAND=str(cache))),
        "envlock": lambda: _run([*envlock, "replay", "run.rec", "--compile-cache", str(cache)], root, fresh()),
        "envlock cold": lambda: _run([*envlock, "replay", "run.rec"], root, fresh()),
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):  # interleaved, so that the shared machine's load falls on all alike
        for name, way in ways.items():
            samples[name].append(way())
    return {"repeats": repeats, "layers": layers, "bytes": cache.stat().st_size,
            "median_s": {k: statistics.median(v) for k, v in samples.items()}, "samples_s": samples}


def report(result: dict[str, Any]) -> str:
    m = result["median_s"]
    rows = ["| run | median s | vs cold |", "|---|---|---|"]
    rows += [f"| {name} | {m[name]:.1f} | {m[name] / m['cold']:.2f}x |" for name in m]
    rows.append("")
    rows.append(f"envlock (warm) / by hand (warm): {m['envlock'] / m['by hand']:.2f}x; "
                f"envlock (warm) / envlock cold: {m['envlock'] / m['envlock cold']:.2f}x "
                f"({result['layers']} layers, {result['repeats']} runs each, cache {result['bytes'] / 1e3:.0f} kB)")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=1, help="blocks in the compiled training step")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args.repeats, args.layers)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
