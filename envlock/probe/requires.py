"""``[requires]``: what a host needs to run this environment, derived at capture.

Detection says what the capturing host *has* (its driver, its GPUs, its CPU); a requirement
says what *any* host needs (the CUDA version the driver must support, the glibc the wheels were
built for, the GPU architectures the torch build has kernels for; CPU features only as a user
declares them, see ``derive``). Kept apart so that a lock made on one machine can be judged on
another, a CPU-only CI runner included, by ``envlock verify --requirements``; a user may edit
them by hand (``envlock fmt`` checks the edit) or set them with ``--require``.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .files import read_text
from .rules import parse_arch

# manylinux's legacy aliases (PEP 600): the glibc each stands for.
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_of_tag(platform: str) -> Optional[Tuple[int, int]]:
    """(2, 28) of ``manylinux_2_28_x86_64`` (or a legacy alias); None for any other platform."""
    m = re.match(r"^manylinux_(\d+)_(\d+)_", platform)
    if m:
        return int(m.group(1)), int(m.group(2))
    return _LEGACY_MANYLINUX.get(platform.split("_", 1)[0])


def wheel_glibc(dists: Iterable[Tuple[str, str, str]],
                libraries_of: Callable[[str], Optional[List[str]]]) -> Optional[str]:
    """The newest glibc a wheel with native code here was built for, as "2.28", or None.

    A wheel runs where any one of its platform tags does, so each wheel needs the oldest glibc
    among its manylinux tags; the environment needs the newest of those. Pure-Python wheels
    (whose RECORD lists no shared object) are not read.
    """
    need: Optional[Tuple[int, int]] = None
    for _name, site, info in dists:
        if not libraries_of(os.path.join(site, info, "RECORD")):
            continue
        text = read_text(os.path.join(site, info, "WHEEL"), 1 << 16) or ""
        found = []
        for line in text.splitlines():
            if line.startswith("Tag:"):
                for platform in line[4:].strip().rsplit("-", 1)[-1].split("."):
                    glibc = glibc_of_tag(platform)
                    if glibc:
                        found.append(glibc)
        if found and (need is None or min(found) > need):
            need = min(found)
    return "%d.%d" % need if need else None


def derive(torch: Optional[Dict[str, Any]], glibc: Optional[str]) -> Dict[str, Any]:
    """``[requires]`` from a probe document's (or a lock's) ``torch`` table and the wheels' glibc,
    with ``derived`` naming the keys it set.

    Only what the build needs, never what the capturing host has. So no ``cpu_features``:
    ``torch.cpu_capability`` is the kernel set ATen's dispatcher *chose* on the capturing CPU
    (DEFAULT, AVX2, AVX512 on x86-64; DEFAULT, SVE256 on Arm; the best the CPU has, at run
    time), and a torch wheel carries every one of them, so on a CPU without AVX-512 it runs its
    AVX2 or DEFAULT kernels. The build itself needs only its platform's baseline ISA, which
    ``platform.machine`` already says; what it was compiled with beyond that (a source build
    with ``-march=native``) is not written anywhere a probe can read. That the numbers of
    other kernels can differ is a fact of the run, compared as ``torch.cpu_capability`` by
    ``verify`` and named by a replay; a user who needs the same kernels declares it
    (``--require cpu_features=avx512f``).
    """
    out: Dict[str, Any] = {}
    if torch:
        cuda = re.match(r"^(\d+)\.(\d+)", str(torch.get("cuda") or ""))
        if cuda:
            out["cuda_driver"] = "%s.%s" % (cuda.group(1), cuda.group(2))
        archs = [a for a in torch.get("arch_list") or [] if parse_arch(a)]
        if archs:
            out["gpu_archs"] = archs
    if glibc:
        out["glibc"] = glibc
    if out:
        out["derived"] = sorted(out)
    return out
