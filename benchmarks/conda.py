"""A conda environment's capture, pack and restore, beside what py-rattler and conda-lock do.

    python benchmarks/conda.py [--records 300] [--runs 5]

Needs py-rattler, conda-lock, gcc and patchelf (as the tests do: ``scripts/test.sh``). Builds
the tests' local channel (``tests/condapkgs.py``) and a prefix from it, then measures:

* reading a 300-record ``conda-meta`` (the test prefix's records plus synthetic copies of
  libfoo's with other names): the probe's ``collect_conda`` (what ``capture`` adds for conda)
  against py-rattler's ``PrefixRecord.from_path`` of every record, and conda-lock's parser on
  the same 300 packages exported as conda-lock.yml;
* ``envlock capture --no-torch`` of that prefix, as a process;
* ``envlock pack --no-image`` of the test prefix's lock, ``envlock restore PACK --target prefix``
  (verify in place included, and with ``--no-verify``), against py-rattler's own ``install`` of
  the same records from the same channel into a fresh prefix with a fresh cache.

Medians of ``--runs`` runs, printed as a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def _median(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _run(*argv: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "envlock", *argv], cwd=cwd, check=True, capture_output=True,
                   timeout=600)


def _synthetic(prefix: Path, records: int) -> None:
    """``records`` conda-meta entries in ``prefix``: copies of libfoo's under other names."""
    meta = prefix / "conda-meta"
    template = json.loads(next(meta.glob("libfoo-*.json")).read_text())
    for i in range(records - len(list(meta.glob("*.json")))):
        name = f"synth{i:03d}"
        record = {**template, "name": name, "fn": f"{name}-1.0-h0_0.tar.bz2",
                  "url": template["url"].replace("libfoo-", f"{name}-")}
        (meta / f"{name}-1.0-h0_0.json").write_text(json.dumps(record))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    import condapkgs
    from rattler import PrefixRecord, install

    from envlock.export.conda import conda_lock
    from envlock.lock import load
    from envlock.restore.condatarget import rattler_module, repodata_records

    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="envlock-bench-conda-") as tmp:
        root = Path(tmp)
        chan = condapkgs.make_channel(root / "fixture")
        _run("capture", "--python", str(chan.prefix / "bin" / "python"), "--no-torch", "-o", "env.lock", cwd=root)
        synth = root / "synth"
        shutil.copytree(chan.prefix, synth, symlinks=True)
        _synthetic(synth, args.records)
        files = sorted((synth / "conda-meta").glob("*.json"))

        from envlock.probe import packages

        saved, sys.prefix = sys.prefix, str(synth)  # collect_conda reads sys.prefix's conda-meta
        try:
            rows.append((f"probe `collect_conda` of {len(files)} records", _median(packages.collect_conda, args.runs)))
        finally:
            sys.prefix = saved
        rows.append((f"py-rattler `PrefixRecord.from_path` of {len(files)} records",
                     _median(lambda: [PrefixRecord.from_path(f) for f in files], args.runs)))
        _run("capture", "--python", str(synth / "bin" / "python"), "--no-torch", "-o", "synth.lock", cwd=root)
        synth_lock = load(root / "synth.lock")
        yml = root / "conda-lock.yml"
        yml.write_text(conda_lock(synth_lock))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from conda_lock.lockfile import parse_conda_lock_file
        rows.append((f"conda-lock `parse_conda_lock_file` of the same {len(files)} packages",
                     _median(lambda: parse_conda_lock_file(yml), args.runs)))
        rows.append((f"`envlock capture --no-torch` of the {len(files)}-record prefix (process)",
                     _median(lambda: _run("capture", "--python", str(synth / "bin" / "python"), "--no-torch",
                                          "-o", "synth.lock", "--force", cwd=root), args.runs)))

        n = [0]

        def pack() -> None:
            n[0] += 1
            _run("pack", "env.lock", "-o", f"pack{n[0]}", "--no-image", "--no-download", cwd=root)

        rows.append((f"`envlock pack --no-image` of the test prefix ({len(chan.packages)} archives)",
                     _median(pack, args.runs)))

        def restore(*extra: str) -> Callable[[], None]:
            def go() -> None:
                n[0] += 1
                _run("restore", "pack1", "--target", "prefix", f"prefix{n[0]}", *extra, cwd=root)
            return go

        rows.append(("`envlock restore PACK --target prefix` (checks, install, verify in place)",
                     _median(restore(), args.runs)))
        rows.append(("the same with `--no-verify`", _median(restore("--no-verify"), args.runs)))
        lock = load(root / "env.lock")
        rattler = rattler_module()

        def rattler_install() -> None:
            n[0] += 1
            records = repodata_records(rattler, lock)
            asyncio.run(install(records, target_prefix=str(root / f"direct{n[0]}"),
                                cache_dir=root / f"cache{n[0]}", show_progress=False))

        rows.append(("py-rattler `install` of the same records, fresh cache", _median(rattler_install, args.runs)))
    print("| what | median s |\n|---|---|")
    for what, secs in rows:
        print(f"| {what} | {secs:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
