"""``envlock.record(step, w=tensor)`` of a large tensor, next to ``hashlib.sha256`` of its bytes.

A tensor metric is recorded as the sha256 of its bytes with its dtype, shape and mean, so the
floor of a call is hashing those bytes once. Usage:

    python benchmarks/tensor_record.py [--mb 100] [--repeat 5] [--old-mb 2]

In one process, warm (the first ``record`` call writes the process's capture, which is timed
by ``training.py``, not here): for each dtype, the median of N ``record`` calls of a tensor of
``--mb`` MB, against the median of N ``hashlib.sha256`` over the same bytes already in a
``bytes`` object, and their ratio, in wall time and in the process's CPU time. ``--old-mb`` also times the digest records were made with
before (``bytes`` of a clone's storage) on a smaller tensor, for scale (0: skip it).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _median(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds (every thread of the process) of ``fn``: on a shared
    machine the CPU time is the steadier figure, the wall time what a training loop waits."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-mb", type=float, default=2.0)
    args = parser.parse_args()
    import torch

    import envlock
    from envlock.runtime import recorder

    with tempfile.TemporaryDirectory() as tmp:
        os.environ[recorder.RECORD_ENV] = str(Path(tmp) / "journal.jsonl")
        envlock.record(0, warm=1.0)  # the capture line, once per process
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
        print("| tensor | size | record() | sha256 of the bytes | record / sha256 | CPU: record / sha256 |")
        print("|---|---:|---:|---:|---:|---:|")
        size = int(args.mb * 1e6)
        gen = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            n = size // torch.empty((), dtype=dtype).element_size()
            t = torch.randn(n, generator=gen).to(dtype)
            data = bytes(t.view(torch.uint8).numpy())
            t_rec, c_rec = _median(lambda: envlock.record(1, w=t), args.repeat)  # noqa: B023
            t_sha, c_sha = _median(lambda: hashlib.sha256(data).hexdigest(), args.repeat)  # noqa: B023
            name = str(dtype).removeprefix("torch.")
            print(f"| {name} [{n}] | {size / 1e6:.0f} MB | {t_rec * 1000:.0f} ms | {t_sha * 1000:.0f} ms "
                  f"| {t_rec / t_sha:.2f}x | {c_rec / c_sha:.2f}x |")
        if args.old_mb:
            t = torch.randn(int(args.old_mb * 1e6) // 4, generator=gen)
            start = time.perf_counter()
            hashlib.sha256(bytes(t.clone().untyped_storage())).hexdigest()
            t_old = time.perf_counter() - start
            t_new, _ = _median(lambda: envlock.record(2, w=t), args.repeat)
            print(f"\nfloat32 of {args.old_mb:g} MB: bytes(clone's storage) then sha256 "
                  f"{t_old * 1000:.0f} ms (once), record() now {t_new * 1000:.1f} ms")
        recorder._state["fh"].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
