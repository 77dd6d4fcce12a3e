"""What `envlock export` costs and gives, for a torch lock, next to what a reader would run anyway.

    python benchmarks/export.py --wheelhouse DIR [--rounds 3]

A venv is filled by uv with torch (the +cpu wheel and its dependencies) from a local index
(DIR laid out as PEP 503, served on 127.0.0.1; nothing leaves the machine) and captured.
Reported: the size of each export and its time (cold and warm index cache), and the time of
`uv pip install -r pylock.toml` into an empty venv next to `uv pip install torch==VERSION` (the
command a reader without the export would type), both with a cold uv cache, interleaved.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from export_index import layout, serve  # noqa: E402  (tests/ helper: one index layout, not two)

FORMATS = ("pylock", "requirements", "cyclonedx", "intoto", "apptainer", "k8s", "slurm")
IMAGE = "registry.example/lab/train@sha256:" + "0" * 64


def uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def sh(*argv: str, env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--wheelhouse", required=True, type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--torch", default="2.13.0+cpu")
    args = p.parse_args()
    import os

    with tempfile.TemporaryDirectory(prefix="envlock-bench-export-") as tmp_s:
        tmp = Path(tmp_s)
        root = layout(args.wheelhouse, tmp / "index")
        layout(args.wheelhouse, root, simple="whl/cpu", only=("torch",))
        env = {**os.environ, "ENVLOCK_CACHE_DIR": str(tmp / "cache"), "UV_NO_CONFIG": "1"}
        with serve(root) as url:
            src = tmp / "src"
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(src)], check=True)
            sh(uv(), "pip", "install", "--python", str(src / "bin/python"), "--index-url", f"{url}/simple",
               f"torch=={args.torch}", env={**env, "UV_CACHE_DIR": str(tmp / "uv-src")})
            lock = tmp / "env.lock"
            sh(sys.executable, "-m", "envlock", "capture", "--python", str(src / "bin/python"), "-o", str(lock),
               env=env)
            idx = ["--index-url", f"{url}/simple", "--torch-index-url", f"{url}/whl/{{label}}"]
            rows = []
            for fmt in FORMATS:
                extra = {"pylock": idx, "requirements": idx, "intoto": [], "cyclonedx": [],
                         "apptainer": ["--image", IMAGE],
                         "k8s": ["--image", IMAGE, "--command", "python train.py"],
                         "slurm": ["--image", IMAGE, "--command", "python train.py"]}[fmt]
                out = tmp / ("pylock.toml" if fmt == "pylock" else f"export.{fmt}")
                base = [sys.executable, "-m", "envlock", "export", str(lock), "--to", fmt, "-o", str(out), *extra]
                shutil.rmtree(tmp / "cache", ignore_errors=True)
                cold = sh(*base, env=env)
                warm = sh(*base, env=env)
                rows.append((fmt, out.stat().st_size, cold, warm))
            pylock = tmp / "pylock.toml"
            timings: dict[str, list[float]] = {"pylock": [], "plain": []}
            for r in range(args.rounds):
                for kind in (("pylock", "plain") if r % 2 == 0 else ("plain", "pylock")):
                    target = tmp / f"t-{kind}-{r}"
                    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
                    cache = tmp / f"uv-{kind}-{r}"
                    what = (["-r", str(pylock)] if kind == "pylock"
                            else ["--index-url", f"{url}/simple", f"torch=={args.torch}"])
                    timings[kind].append(sh(uv(), "pip", "install", "--python", str(target / "bin/python"),
                                            *what, env={**env, "UV_CACHE_DIR": str(cache)}))
                    shutil.rmtree(target)
                    shutil.rmtree(cache)
        n_pkgs = sum(1 for line in lock.read_text().splitlines() if line == "[[packages]]")
        print(f"torch {args.torch} lock, {n_pkgs} packages, {args.rounds} rounds\n")
        print("| format | size (bytes) | export, cold cache (s) | export, warm cache (s) |")
        print("|---|---:|---:|---:|")
        for fmt, size, cold, warm in rows:
            print(f"| {fmt} | {size:,} | {cold:.2f} | {warm:.2f} |")
        a, b = statistics.median(timings["pylock"]), statistics.median(timings["plain"])
        print("\n| install into an empty venv, cold uv cache | median (s) | samples |")
        print("|---|---:|---|")
        print(f"| uv pip install -r pylock.toml | {a:.2f} | {', '.join(f'{x:.2f}' for x in timings['pylock'])} |")
        print(f"| uv pip install torch=={args.torch} (resolves) | {b:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in timings['plain'])} |")
        print(f"\nratio pylock / plain: {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
