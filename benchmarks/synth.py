"""Synthetic site-packages: N realistic ``*.dist-info`` directories for scaling benchmarks.

Why synthetic: a real environment with 5,000 distributions cannot be installed offline in
minutes, yet large monorepo and research images do reach thousands. What dominates the cost of
listing distributions is file system work and metadata parsing, so the generated directories
copy the shape of what pip leaves behind rather than a minimal stub:

* ``METADATA`` with the usual headers, classifiers, ``Requires-Dist`` lines and a multi-KB
  long description (the part ``pip freeze`` parses in full and envlock's probe must skip);
* ``RECORD`` with ~20 hashed module entries plus their ``__pycache__`` entries, the dist-info
  files, and for some distributions a console script under ``../../../bin``;
* ``INSTALLER``, ``WHEEL``, ``REQUESTED`` for about a third, ``entry_points.txt`` for some,
  and PEP 610 ``direct_url.json`` for one in ten (archive URL with hash, VCS commit, local
  archive, and a rare editable directory).

Names are spelled in the ways real METADATA spells them (``Foo_Bar``, ``foo.bar``, ``foo-bar``)
so name normalisation is exercised, and versions include local labels, pre- and post-releases.
Output is deterministic for a given ``count`` and ``seed``.

Use from the command line: ``python benchmarks/synth.py DIR COUNT``; then put DIR on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

# Names of the generated distributions all match this, in any spelling, so a benchmark can
# count them in the output of pip freeze, importlib.metadata or a lock.
NAME_RE = re.compile(r"synth[-_.]pkg[-_.](\d+)", re.IGNORECASE)
_WORDS = (
    "tensor", "model", "training", "data", "loader", "gradient", "optimizer", "batch", "layer",
    "kernel", "cuda", "device", "precision", "checkpoint", "dataset", "pipeline", "transform",
    "feature", "vector", "matrix", "sparse", "dense", "distributed", "parallel", "inference",
    "export", "runtime", "graph", "compile", "cache", "memory", "stream", "benchmark", "metric",
    "evaluation", "reproducible", "seed", "deterministic", "config", "schema", "install",
)
_CLASSIFIERS = (
    "Development Status :: 5 - Production/Stable",
    "Intended Audience :: Developers",
    "Intended Audience :: Science/Research",
    "License :: OSI Approved :: Apache Software License",
    "Operating System :: OS Independent",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
    "Topic :: Software Development :: Libraries :: Python Modules",
)


@dataclass(frozen=True)
class SynthDist:
    """What was written for one distribution, for checks against what scanners report."""

    index: int
    name: str  # as spelled in METADATA
    canonical: str
    version: str
    requested: bool
    direct_url: str | None  # "archive", "vcs", "local", "editable" or None


def canonical(name: str) -> str:
    """PEP 503 normalisation (duplicated here so the generator needs nothing but stdlib)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _b64_sha256(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _name(i: int) -> str:
    style = i % 3
    if style == 0:
        return f"synth-pkg-{i:05d}"
    if style == 1:
        return f"Synth_Pkg_{i:05d}"
    return f"synth.pkg.{i:05d}"


def _version(i: int) -> str:
    if i % 13 == 0:
        return f"2.{i % 9}.0+cu121"
    if i % 17 == 0:
        return f"1.{i % 5}.0rc1"
    if i % 19 == 0:
        return f"3.1.post{i % 4}"
    if i % 23 == 0:
        return f"0.{i % 11}.dev3"
    return f"1.{i % 50}.{i % 7}"


def _direct_url_kind(i: int) -> str | None:
    # Editables are rare in real environments and make pip freeze probe for a VCS checkout,
    # so keep them to a handful even at 5,000 distributions.
    if i % 500 == 250:
        return "editable"
    if i % 10 != 5:
        return None
    return ("archive", "vcs", "local")[(i // 10) % 3]


def _description(rng: random.Random, min_bytes: int, max_bytes: int) -> str:
    target = rng.randint(min_bytes, max_bytes)
    lines = ["Synthetic package", "=================", ""]
    size = 0
    while size < target:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 14))]
        line = " ".join(words).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
        if rng.random() < 0.12:
            lines += ["", "```python", f"import synth_pkg  # {rng.choice(_WORDS)}", "```", ""]
    return "\n".join(lines) + "\n"


def _metadata(name: str, version: str, i: int, rng: random.Random, desc: str) -> str:
    headers = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: Synthetic distribution number {i} for envlock benchmarks",
        f"Home-page: https://example.invalid/synth/{i}",
        "Author: envlock benchmarks",
        "Author-email: bench@example.invalid",
        "License: Apache-2.0",
        "Project-URL: Source, https://example.invalid/synth",
    ]
    headers += [f"Classifier: {c}" for c in rng.sample(_CLASSIFIERS, 7)]
    headers.append("Requires-Python: >=3.8")
    headers += [f"Requires-Dist: synth-pkg-{rng.randrange(100000):05d} (>=1.0)" for _ in range(3)]
    headers.append('Requires-Dist: pytest ; extra == "test"')
    headers += ["Provides-Extra: test", "Description-Content-Type: text/markdown"]
    return "\n".join(headers) + "\n\n" + desc


def _direct_url(kind: str, i: int, site: Path) -> dict[str, object]:
    if kind == "archive":
        return {
            "url": f"https://files.example.invalid/synth_pkg_{i:05d}-1.0-py3-none-any.whl",
            "archive_info": {"hashes": {"sha256": hashlib.sha256(b"%d" % i).hexdigest()}},
        }
    if kind == "vcs":
        return {
            "url": f"https://git.example.invalid/org/synth-{i:05d}.git",
            "vcs_info": {"vcs": "git", "commit_id": hashlib.sha1(b"%d" % i).hexdigest(),
                         "requested_revision": "main"},
        }
    if kind == "local":
        return {"url": f"file:///wheels/synth_pkg_{i:05d}-1.0-py3-none-any.whl",
                "archive_info": {"hashes": {"sha256": hashlib.sha256(b"L%d" % i).hexdigest()}}}
    src = site / "_editable_src" / f"synth_pkg_{i:05d}"
    src.mkdir(parents=True, exist_ok=True)
    return {"url": src.as_uri(), "dir_info": {"editable": True}}


def write_dist(site: Path, i: int, rng: random.Random, *, min_desc: int = 2048,
               max_desc: int = 8192) -> SynthDist:
    """Write distribution number ``i`` into ``site`` the way pip would have installed it."""
    name, version = _name(i), _version(i)
    # Wheel file names escape runs of - and . to _, but keep the case (Jinja2-..., PyYAML-...).
    stem = re.sub(r"[-.]+", "_", name)
    dist = site / f"{stem}-{version}.dist-info"
    dist.mkdir(parents=True)
    module = f"synth_pkg_{i:05d}"
    record: list[str] = []
    for j in range(rng.randint(16, 24)):
        rel = f"{module}/mod_{j:02d}.py" if j else f"{module}/__init__.py"
        body = f"# {module} {j} {rng.random()}\n".encode()
        record.append(f"{rel},sha256={_b64_sha256(body)},{len(body) + rng.randint(200, 40000)}")
        pyc = rel.rsplit("/", 1)
        record.append(f"{pyc[0]}/__pycache__/{pyc[1][:-3]}.cpython-311.pyc,,")
    if i % 7 == 0:
        script = f"#!/venv/bin/python\nfrom {module} import main\nmain()\n".encode()
        record.append(f"../../../bin/synth-{i:05d},sha256={_b64_sha256(script)},{len(script)}")

    def put(fname: str, text: str, hashed: bool = True) -> None:
        data = text.encode("utf-8")
        (dist / fname).write_bytes(data)
        entry = f"{dist.name}/{fname}"
        record.append(f"{entry},sha256={_b64_sha256(data)},{len(data)}" if hashed else f"{entry},,")

    put("METADATA", _metadata(name, version, i, rng, _description(rng, min_desc, max_desc)))
    put("WHEEL", "Wheel-Version: 1.0\nGenerator: bdist_wheel (0.43.0)\nRoot-Is-Purelib: true\n"
                 "Tag: py3-none-any\n")
    put("INSTALLER", "pip\n")
    if i % 4 == 0:
        put("entry_points.txt", f"[console_scripts]\nsynth-{i:05d} = {module}:main\n")
    requested = i % 3 == 0
    if requested:
        put("REQUESTED", "")
    kind = _direct_url_kind(i)
    if kind is not None:
        put("direct_url.json", json.dumps(_direct_url(kind, i, site)))
    record.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return SynthDist(i, name, canonical(name), version, requested, kind)


def generate(site: Path, count: int, *, seed: int = 0) -> list[SynthDist]:
    """Create ``site`` (if needed) holding ``count`` distributions numbered 1..count."""
    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    return [write_dist(site, i, rng) for i in range(1, count + 1)]


def synth_indices(text: str) -> set[int]:
    """Numbers of the synthetic distributions named anywhere in ``text`` (any spelling)."""
    return {int(m.group(1)) for m in NAME_RE.finditer(text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("directory", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    dists = generate(args.directory, args.count, seed=args.seed)
    print(f"wrote {len(dists)} distributions into {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
