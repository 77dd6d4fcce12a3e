"""In-process timings, run by ``benchmarks/run.py`` under the benchmark venv's interpreter.

Why a separate script: ``run.py`` may run under any Python (it only starts processes), while
these measurements need envlock importable and must exclude interpreter start-up and imports,
which process-level timings cannot separate. Each subcommand prints one JSON document.

    python benchmarks/inproc.py load LOCK [--repeats N]
    python benchmarks/inproc.py scan DIR [DIR ...] [--repeats N]
    python benchmarks/inproc.py canary [--repeats N]
    python benchmarks/inproc.py record [--repeats N]    # a fresh interpreter each time
    python benchmarks/inproc.py first capture record    # one fresh interpreter (training.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _stats(samples: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples_s": samples}


def _time(fn: Callable[[], object], repeats: int) -> dict[str, Any]:
    fn()  # warm: first call pays lazy imports and cold caches, which a warm benchmark excludes
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return _stats(samples)


def cmd_load(path: Path, repeats: int) -> dict[str, Any]:
    """``envlock.lock.load`` as a whole (the read ``verify`` and ``show`` take), then its stages,
    to show where the time goes."""
    from envlock import lock as lockio
    from envlock.lock import Lock

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    text = lockio.read_text(path)
    data = tomllib.loads(text)
    lock = Lock.model_validate(data)
    out: dict[str, Any] = {
        "packages": len(lock.packages),
        "bytes": len(text.encode("utf-8")),
        "load": _time(lambda: lockio.load(path), repeats),
        "stages": {
            "read_text": _time(lambda: lockio.read_text(path), repeats),
            "tomllib.loads": _time(lambda: tomllib.loads(text), repeats),
            "Lock.model_validate": _time(lambda: Lock.model_validate(data), repeats),
            "check_seal": _time(lambda: lockio.check_seal(lock), repeats),
        },
    }
    return out


def cmd_scan(dirs: list[Path], repeats: int) -> dict[str, Any]:
    """Listing distributions of one directory: envlock's probe vs importlib.metadata.

    ``sys.path`` is narrowed to the directory so the figures are the per-distribution cost
    alone, free of the venv's own packages and of interpreter start-up.
    """
    import importlib.metadata as md

    from envlock.probe import packages as probe

    results: dict[str, Any] = {}
    saved = list(sys.path)
    for d in dirs:
        sys.path[:] = [str(d)]
        try:
            probe_count = len(probe.collect_packages()[0])

            def names_versions(d: Path = d) -> list[tuple[str, str]]:
                # What pip freeze needs from each distribution: the parsed METADATA.
                return [(x.metadata["Name"], x.version) for x in md.distributions(path=[str(d)])]

            def listing(d: Path = d) -> list[Any]:
                return list(md.distributions(path=[str(d)]))

            results[str(d)] = {
                "probe_count": probe_count,
                "importlib_count": len(names_versions()),
                "probe.collect_packages": _time(probe.collect_packages, repeats),
                "importlib.metadata name+version": _time(names_versions, repeats),
                "importlib.metadata list": _time(listing, repeats),
            }
        finally:
            sys.path[:] = saved
    return results


def cmd_canary(repeats: int) -> dict[str, Any]:
    """The numeric canary on CPU, beside one ``torch.matmul`` of its largest shape: what
    ``capture --canary`` adds to a training job's start."""
    import torch

    from envlock import runtime

    a = torch.randn(256, 256)
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "canary(cpu)": _time(lambda: runtime.canary(["cpu"]), repeats),
            "matmul 256x256": _time(lambda: torch.matmul(a, a), repeats)}


def cmd_first(calls: list[str]) -> dict[str, Any]:
    """What a training process pays, in this fresh interpreter: ``import torch``, then each of
    ``calls`` in order, timed apart: "capture" is ``import envlock; envlock.capture()``,
    "collect_env" PyTorch's ``torch.utils.collect_env.get_env_info()`` (the peer), "record" the
    first ``envlock.record()`` (the in-process probe and the hash of the
    workspace files the process loaded), with ``ENVLOCK_RECORD`` set for that call alone."""
    import os
    import tempfile

    t0 = time.perf_counter()
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "modules_loaded": len(sys.modules),
                           "import torch_s": time.perf_counter() - t0}
    with tempfile.TemporaryDirectory() as tmp:
        for call in calls:
            t0 = time.perf_counter()
            import envlock

            if call == "capture":
                envlock.capture()
            elif call == "collect_env":
                # The Python peer: PyTorch's own environment report, what an issue template asks
                # a researcher to paste (envlock is imported above only to keep the timing alike).
                from torch.utils.collect_env import get_env_info

                get_env_info()  # type: ignore[no-untyped-call]
            else:
                os.environ["ENVLOCK_RECORD"] = os.path.join(tmp, "journal.jsonl")
                envlock.record(0, loss=1.0)
                del os.environ["ENVLOCK_RECORD"]
            out[f"{call}_s"] = time.perf_counter() - t0
    return out


def cmd_record(repeats: int) -> dict[str, Any]:
    """``cmd_first(["record", "capture"])``, and, warm, the part the workspace files take
    (``probe.code.workspace_files``: the walk of ``sys.modules`` and the hashing). Run in a
    fresh interpreter: the first two happen once per process."""
    import os

    from envlock.probe.code import workspace_files

    out = cmd_first(["record", "capture"])
    files = workspace_files(os.getcwd())
    out.update({"workspace_files": len(files["files"]),
                "workspace_files (warm)": _time(lambda: workspace_files(os.getcwd()), repeats)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("load")
    p.add_argument("lock", type=Path)
    p.add_argument("--repeats", type=int, default=20)
    p = sub.add_parser("scan")
    p.add_argument("dirs", type=Path, nargs="+")
    p.add_argument("--repeats", type=int, default=5)
    p = sub.add_parser("canary")
    p.add_argument("--repeats", type=int, default=10)
    p = sub.add_parser("record")
    p.add_argument("--repeats", type=int, default=20)
    p = sub.add_parser("first")
    p.add_argument("calls", nargs="+", choices=("capture", "record", "collect_env"))
    args = parser.parse_args(argv)
    if args.cmd == "load":
        doc = cmd_load(args.lock, args.repeats)
    elif args.cmd == "scan":
        doc = cmd_scan(args.dirs, args.repeats)
    elif args.cmd == "record":
        doc = cmd_record(args.repeats)
    elif args.cmd == "first":
        doc = cmd_first(args.calls)
    else:
        doc = cmd_canary(args.repeats)
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
