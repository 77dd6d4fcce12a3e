"""envlock.distributed.check across real gloo ranks, spawned as separate processes.

The test file doubles as the rank program (``python test_distributed.py --rank N ...``), so the
ranks run exactly the code under test, each in a fresh interpreter like a torchrun rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORLD = 2
ODD_RANK = 1


def _rank_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    import envlock
    from envlock import distributed

    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)
    out = Path(args.out)
    try:
        if args.rank == ODD_RANK:
            # The one knob this rank gets wrong: a flag that a stray import might flip.
            torch.backends.cudnn.benchmark = True
        against_rank0 = distributed.check()
        lock_path = out.parent / "rank0.lock"
        if args.rank == 0:
            # The public name, as a training script writes it, after check() ran.
            envlock.capture(canary=True).save(lock_path)
        dist.barrier()
        try:
            distributed.check(envlock.load(lock_path), canary=True, raise_on_mismatch=True)
            raised = None
        except distributed.RankMismatch as exc:
            raised = exc.result.to_dict()
        (out / f"rank{args.rank}.json").write_text(json.dumps({
            "against_rank0": against_rank0.to_dict(), "raised": raised}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _differences(report: dict[str, object]) -> dict[int, list[str]]:
    mismatches = report["mismatches"]
    assert isinstance(mismatches, list)
    return {m["rank"]: [d["path"] for d in m["differences"]] for m in mismatches}


@pytest.mark.slow
def test_check_names_exactly_the_rank_and_field_that_differ(tmp_path: Path) -> None:
    import torch.distributed as dist

    # The pinned CPU torch on Linux has gloo: without it this test would check nothing, so fail.
    assert dist.is_available() and dist.is_gloo_available(), "torch.distributed with gloo is not available"
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--world", str(WORLD), "--init", init,
             "--out", str(tmp_path)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(WORLD)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for rank, (p, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    # Every rank returns the same verdict, so any rank can act on it.
    assert reports[0]["against_rank0"] == reports[1]["against_rank0"]
    result = reports[0]["against_rank0"]
    assert result["ok"] is False and result["reference"] == "rank 0"
    assert result["world_size"] == WORLD
    assert _differences(result) == {ODD_RANK: ["determinism.cudnn_benchmark"]}
    odd = result["mismatches"][0]
    assert odd["host"] == socket.gethostname()
    assert odd["differences"][0]["old"] is False and odd["differences"][0]["new"] is True
    assert odd["differences"][0]["severity"] == "breaking"
    # One stack has one id: cudnn_benchmark is process state, outside the fingerprint, and the
    # check names it all the same.
    assert result["fingerprints"][0] == result["fingerprints"][ODD_RANK]

    # Against a lock (with the canary on each rank): every rank raised, naming the same rank
    # and field. The canary itself agrees across ranks, so it adds nothing.
    for report in reports:
        raised = report["raised"]
        assert raised is not None and raised["reference"].startswith("lock ")
        assert _differences(raised) == {ODD_RANK: ["determinism.cudnn_benchmark"]}


def test_check_outside_a_process_group_is_a_usage_error() -> None:
    import torch  # noqa: F401 - a pinned dev dependency: without it this test would check nothing, so fail

    from envlock import distributed
    from envlock.errors import UsageError

    with pytest.raises(UsageError, match="process group"):
        distributed.check()


def test_rank_mismatch_is_an_envlock_error_with_the_drift_exit_code() -> None:
    from envlock import distributed, errors
    from envlock.drift.result import Difference

    diff = Difference("determinism", "determinism.cudnn_benchmark", False, True, "breaking")
    result = distributed.CheckResult(
        world_size=2, reference="rank 0", hosts=("a", "b"), fingerprints=("", ""),
        mismatches=(distributed.RankReport(1, "b", (diff,)),))
    exc = distributed.RankMismatch(result)
    assert isinstance(exc, errors.EnvlockError)
    assert exc.exit_code == errors.EXIT_DRIFT == 1
    assert exc.result is result
    assert str(exc) == result.describe()
    assert "rank 1 on b:" in str(exc) and "determinism.cudnn_benchmark: False -> True" in str(exc)


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))


def test_what_other_ranks_send_reaches_the_log_literally() -> None:
    # A rank's host name and its differences come from another machine's process: an ANSI
    # escape or a newline in them must not recolour the terminal or forge a line of the report,
    # as in verify --fleet's table (one function writes both lists).
    from envlock import distributed
    from envlock.drift.result import Difference

    hostile = Difference("env", "env.NCCL_DEBUG", "INFO", "\x1b[2J\x1b[32mOK\nenvlock: all 2 ranks match",
                         "breaking")
    result = distributed.CheckResult(
        world_size=2, reference="rank 0", hosts=("a", "b"), fingerprints=("", ""),
        mismatches=(distributed.RankReport(1, "node\x1b]0;owned\x07", (hostile,)),))
    text = result.describe()
    assert "\x1b" not in text and "\x07" not in text
    assert text.splitlines() == [
        "envlock: 1 of 2 ranks differ from rank 0:",
        "  rank 1 on node\\x1b]0;owned\\x07:",
        "    breaking env.NCCL_DEBUG: INFO -> \\x1b[2J\\x1b[32mOK\\nenvlock: all 2 ranks match",
    ]
