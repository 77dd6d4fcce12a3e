"""Node names in Slurm's hostlist form (``n[1-3,5]``), the form its own tools print."""

from __future__ import annotations

import re
from collections.abc import Sequence


def compress_names(names: Sequence[str]) -> str:
    """``n1,n2,n3,n5,gpu7`` -> ``gpu7,n[1-3,5]``: Slurm's hostlist form, so a thousand nodes
    with the same difference fit on one line."""
    plain: list[str] = []
    numbered: dict[tuple[str, int], list[int]] = {}
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            plain.append(name)
        else:
            digits = m.group(2)
            # n9 and n10 belong together; gpu007 keeps its zeros (and is not gpu7).
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
            numbered.setdefault((m.group(1), width), []).append(int(digits))
    parts = list(plain)
    for (prefix, width), nums in sorted(numbered.items()):
        nums = sorted(set(nums))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        runs: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(sorted(parts))
