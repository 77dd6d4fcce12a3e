"""`envlock bundle` of a lock whose wheels are partly on disk, against `pip download` of only
the missing ones.

    python benchmarks/bundle.py [--wheels 27] [--missing 9] [--size-kb 2048] [--repeat 5]

Synthetic wheels (incompressible payload of the given size, ``py3-none-any``) are written
into a directory laid out as a PEP 503 index and served by ``python -m http.server`` on
127.0.0.1 (nothing leaves the machine). ``--wheels - --missing`` of them are also in a
find-links directory (``PIP_FIND_LINKS``). Measured, interleaved, each a fresh process with
empty caches:

- ``envlock bundle LOCK -o DIR``: the find-links wheels copied and checked, the missing ones
  listed and downloaded in parallel, every file hash-checked against the lock;
- ``pip download --no-deps --no-cache-dir`` of only the missing ones from the same index: the
  least a user would run by hand, knowing which are missing.

A second row has every wheel missing (``--missing`` = ``--wheels``). The target is a ratio of
at most 1.2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from export_index import layout, serve  # noqa: E402  (the tests' index layout: one, not two)
from helpers import make_lock  # noqa: E402


def make_wheel(directory: Path, name: str, size: int) -> Path:
    import zipfile

    path = directory / f"{name}-1.0-py3-none-any.whl"
    payload = hashlib.shake_256(name.encode()).digest(size)  # incompressible, reproducible
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{name}/payload.bin", payload)
        zf.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr.strip()[-400:]}")
    return time.perf_counter() - t


def scenario(tmp: Path, url: str, names: list[str], missing: list[str], repeat: int) -> tuple[float, float]:
    disk = tmp / f"disk-{len(missing)}"
    disk.mkdir()
    for name in names:
        if name not in missing:
            whl = f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
            os.link(tmp / "house" / whl, disk / whl)
    lock = tmp / f"env-{len(missing)}.lock"
    make_lock(packages=[(n, "1.0") for n in names]).save(lock)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    envlock_t, pip_t = [], []
    for i in range(repeat):
        run = tmp / f"run-{len(missing)}-{i}"
        env = {**clean, "HOME": str(run / "home"), "XDG_CONFIG_DIRS": str(run / "xdg"),
               "PIP_CONFIG_FILE": os.devnull, "PIP_CACHE_DIR": str(run / "pip-cache"),
               "UV_CACHE_DIR": str(run / "uv-cache"), "UV_NO_CONFIG": "1",
               "ENVLOCK_CACHE_DIR": str(run / "envlock-cache"), "PYTHONPATH": str(ROOT)}
        envlock_t.append(timed([sys.executable, "-m", "envlock", "bundle", str(lock), "-o", str(run / "bundle")],
                               {**env, "PIP_FIND_LINKS": str(disk), "PIP_INDEX_URL": url + "/simple/"}))
        pip_t.append(timed([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                            "--disable-pip-version-check", "--progress-bar", "off", "-d", str(run / "pip"),
                            "--index-url", url + "/simple/", *[f"{n}==1.0" for n in missing]], env))
    return statistics.median(envlock_t), statistics.median(pip_t)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--wheels", type=int, default=27)
    p.add_argument("--missing", type=int, default=9)
    p.add_argument("--size-kb", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    names = [f"bench-{i:02d}" for i in range(args.wheels)]
    with tempfile.TemporaryDirectory(prefix="envlock-bench-bundle-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "house").mkdir()
        for name in names:
            make_wheel(tmp / "house", name.replace("-", "_"), args.size_kb << 10)
        root = layout(tmp / "house", tmp / "www")
        rows = []
        with serve(root) as url:
            for missing in (names[-args.missing:], names):
                e, pip = scenario(tmp, url, names, missing, args.repeat)
                rows.append((len(names), len(missing), e, pip))
    print(f"{args.wheels} wheels of {args.size_kb} KiB, median of {args.repeat}\n")
    print("| wheels | missing | envlock bundle | pip download --no-deps (missing only) | ratio |")
    print("|---|---|---|---|---|")
    for n, m, e, pip in rows:
        print(f"| {n} | {m} | {e:.2f} s | {pip:.2f} s | {e / pip:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
