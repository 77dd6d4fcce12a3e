"""Multi-rank drift check: does every rank of a ``torch.distributed`` job run the same stack?

One node with another driver, cuDNN, ``OMP_NUM_THREADS`` or a flag flipped by a stray import
makes its rank compute different numbers, and the job only diverges much later. ``check()``
runs the probe on every rank, compares each with rank 0 (or with a lock) *on that rank*, and
gathers only the differences, so the traffic stays small however many packages there are:
one broadcast of rank 0's probe document (none when a lock is the reference) and one
``all_gather_object`` of short difference lists.

Works with any backend that supports object collectives: gloo on CPU, NCCL on GPU (there, as
for every object collective, ``torch.cuda.set_device(local_rank)`` must have been called).
Every rank returns the same result and, with ``raise_on_mismatch``, every rank raises, so no
rank is left waiting in the next collective for a peer that stopped.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envlock.drift.result import Difference, difference_lines
from envlock.errors import EXIT_DRIFT, EnvlockError, UsageError
from envlock.text.terminal import plural, safe

if TYPE_CHECKING:
    from envlock.lock import Lock

log = logging.getLogger("envlock.distributed")


@dataclass(frozen=True)
class RankReport:
    """One rank that differs from the reference: where it runs and what differs."""

    rank: int
    host: str
    differences: tuple[Difference, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host,
                "differences": [d.to_dict() for d in self.differences]}


@dataclass(frozen=True)
class CheckResult:
    """The same on every rank: who was compared with what, and every rank that differs."""

    world_size: int
    reference: str
    hosts: tuple[str, ...]
    fingerprints: tuple[str, ...]
    mismatches: tuple[RankReport, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def describe(self) -> str:
        if self.ok:
            return (f"envlock: all {self.world_size} ranks match {safe(self.reference)} "
                    f"({plural(len(set(self.hosts)), 'host')})")
        lines = [f"envlock: {len(self.mismatches)} of {self.world_size} ranks differ from "
                 f"{safe(self.reference)}:"]
        # Every host name, path and value came from another rank's process: shown literally.
        for m in self.mismatches:
            lines.append(f"  rank {m.rank} on {safe(m.host)}:")
            lines += [f"    {line}" for line in difference_lines(m.differences)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "world_size": self.world_size, "reference": self.reference,
                "hosts": list(self.hosts), "fingerprints": list(self.fingerprints),
                "mismatches": [m.to_dict() for m in self.mismatches]}


def _canary(torch: Any, label_cuda: bool) -> dict[str, Any]:
    """The canary on the CPU and this rank's own GPU only (not every GPU of the node).

    Against rank 0 the GPU is labelled plain ``cuda`` so rank 3's cuda:3 meets rank 0's cuda:0;
    against a lock it keeps its index, to meet the lock's entry for the same device.
    """
    from envlock.runtime import canary_module

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append(f"cuda:{torch.cuda.current_device()}")
    doc: dict[str, Any] = canary_module().run(torch, devices)
    if label_cuda:
        for result in doc["results"]:
            if result["device"].startswith("cuda"):
                result["device"] = "cuda"
    return doc



class RankMismatch(EnvlockError):
    """Raised on every rank by ``distributed.check(raise_on_mismatch=True)``; ``result`` has
    the report. Exit code 1, like any drift: the ranks run different stacks."""

    exit_code = EXIT_DRIFT

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.describe())
        self.result = result


def check(
    lock: Lock | str | os.PathLike[str] | None = None,
    *,
    canary: bool = False,
    raise_on_mismatch: bool = False,
    include_info: bool = False,
    group: Any = None,
) -> CheckResult:
    """Compare every rank's environment with rank 0's (or with ``lock``); collective call.

    Every rank of ``group`` must call it. Differences are those of ``envlock.compare``
    (breaking and warning; info too with ``include_info``), so ranks on different hosts do not
    differ merely by kernel or CPU model. With ``canary`` each rank also hashes the canary on
    the CPU and its own GPU, which catches numeric drift that no version shows. Rank 0 logs the
    report (logger ``envlock.distributed``).
    """
    import torch
    import torch.distributed as dist

    from envlock.drift.compare import compare
    from envlock.probe.collect import collect
    from envlock.probing.capture import build_lock

    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError("envlock.distributed.check() needs an initialised torch.distributed process group")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    reference: Lock | None = None
    if lock is not None:
        if isinstance(lock, (str, os.PathLike)):
            from envlock.lock import load

            reference = load(lock)
        else:
            reference = lock
    doc = collect(torch="auto")
    if canary:
        doc["canary"] = _canary(torch, label_cuda=reference is None)
    mine = build_lock(doc)
    if reference is None:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        box: list[Any] = [doc if rank == 0 else None]
        dist.broadcast_object_list(box, src=src, group=group)
        reference = build_lock(box[0])
        label = "rank 0"
    else:
        label = f"lock {reference.short_id}"
    cmp = compare(reference, mine)
    keep = [d for d in cmp.differences if include_info or d.severity != "info"]
    payload = {"rank": rank, "host": socket.gethostname(), "fingerprint": mine.envlock.fingerprint,
               "differences": [d.to_dict() for d in keep]}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, payload, group=group)
    mismatches = []
    for item in gathered:
        diffs = tuple(map(Difference.from_dict, item["differences"]))
        if diffs:
            mismatches.append(RankReport(item["rank"], item["host"], diffs))
    result = CheckResult(
        world_size=world,
        reference=label,
        hosts=tuple(item["host"] for item in gathered),
        fingerprints=tuple(item["fingerprint"] or "" for item in gathered),
        mismatches=tuple(mismatches),
    )
    if rank == 0:
        if result.ok:
            log.info(result.describe())
        else:
            log.warning(result.describe())
    if raise_on_mismatch and not result.ok:
        raise RankMismatch(result)
    return result


__all__ = ["CheckResult", "RankMismatch", "RankReport", "check"]
