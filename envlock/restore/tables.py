"""The data tables restore decides with (``envlock/data/*.toml``), read once and typed.

Bases, wheel indexes and driver minima change with every PyTorch and CUDA release; keeping them
as data means a release is a one-line edit reviewed against NVIDIA's or PyTorch's notes, not a
code change.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from packaging.version import Version

from envlock.errors import IndexUnavailable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def _load(name: str) -> dict[str, Any]:
    text = resources.files("envlock").joinpath("data", name).read_text(encoding="utf-8")
    data: dict[str, Any] = tomllib.loads(text)
    return data


# PyTorch's wheel index is configuration: envlock writes no registry address of its own, and
# a mirror or proxy is the usual setup where builds cannot reach the internet.
TORCH_INDEX_ENV = "ENVLOCK_TORCH_INDEX_URL"


def torch_index_base() -> str | None:
    """``ENVLOCK_TORCH_INDEX_URL``, if set: the base of PyTorch's wheel index."""
    return os.environ.get(TORCH_INDEX_ENV, "").strip() or None


@dataclass(frozen=True)
class TorchIndex:
    labels: tuple[re.Pattern[str], ...]
    layer: frozenset[str]
    layer_prefixes: tuple[str, ...]

    def has_index(self, label: str | None) -> bool:
        """Whether wheels with local label ``label`` (``cu121``) live on PyTorch's own index."""
        return bool(label) and any(p.match(label or "") for p in self.labels)

    def index_for(self, label: str | None, base: str | None = None, *, hint: str = "") -> str | None:
        """The PyTorch index serving wheels with local label ``label``, if the label is one of
        PyTorch's: ``base`` (else ``ENVLOCK_TORCH_INDEX_URL``) with ``{label}`` replaced by the
        label, or the label appended. Raises ``IndexUnavailable`` when none is configured:
        such a wheel is on no default index, so installing without it fails later, in a build.
        """
        if not label or not self.has_index(label):
            return None
        base = base or torch_index_base()
        if not base:
            raise IndexUnavailable(
                f"torch builds with the local label +{label} come from PyTorch's wheel index, and "
                "none is configured",
                hint=f"set {TORCH_INDEX_ENV} to its base URL (the label is appended, or replaces "
                     "{label})" + (f", {hint}" if hint else ""))
        if "{label}" in base:
            return base.replace("{label}", label)
        return f"{base.rstrip('/')}/{label}"

    def in_layer(self, name: str) -> bool:
        return name in self.layer or name.startswith(self.layer_prefixes)


@dataclass(frozen=True)
class Bases:
    python_image: str
    python_minors: tuple[str, ...]
    torch: TorchIndex

    def python_base(self, minor: str) -> str | None:
        if minor not in self.python_minors:
            return None
        return self.python_image.format(minor=minor)


@lru_cache(maxsize=1)
def bases() -> Bases:
    data = _load("bases.toml")
    t = data["torch"]
    return Bases(
        python_image=data["python"]["image"],
        python_minors=tuple(data["python"]["minors"]),
        torch=TorchIndex(labels=tuple(re.compile(p) for p in t["labels"]),
                         layer=frozenset(t["layer"]), layer_prefixes=tuple(t["layer_prefixes"])),
    )


@dataclass(frozen=True)
class DriverRequirement:
    cuda: str
    min_driver: str
    toolkit_driver: str | None


def _driver_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


@lru_cache(maxsize=1)
def _cuda_rows() -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = _load("cuda.toml")["cuda"]
    return rows


def driver_requirement(cuda: str) -> DriverRequirement | None:
    """Driver minima for the CUDA version torch was built with (``12.1``), or None if unknown."""
    m = re.match(r"^(\d+)\.(\d+)", cuda or "")
    if not m:
        return None
    key = f"{int(m.group(1))}.{int(m.group(2))}"
    rows = _cuda_rows()
    if key in rows:
        return DriverRequirement(key, rows[key]["min_driver"], rows[key].get("toolkit_driver"))
    same_major = [k for k in rows if k.split(".")[0] == m.group(1)]
    if not same_major:
        return None
    best = max(same_major, key=Version)
    return DriverRequirement(key, rows[best]["min_driver"], None)


def driver_older(have: str, need: str) -> bool:
    """True when driver version ``have`` (``550.54.14``) is older than ``need``."""
    return _driver_key(have) < _driver_key(need)
