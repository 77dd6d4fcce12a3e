"""A corpus of induced causes: for each way a seeded run can diverge, does the replay diverge,
and does envlock's verdict name the cause among "lock differences that can explain it"?

    python benchmarks/divergence_corpus.py                     # every case (about 10 min on 2 cores)
    python benchmarks/divergence_corpus.py --cases omp_threads,edited_script
    python benchmarks/divergence_corpus.py --skip-compile      # leave out the torch.compile cases
    python benchmarks/divergence_corpus.py --numpy-alt DIR     # DIR: another numpy build (pip --target)
    python benchmarks/divergence_corpus.py --json FILE         # every verdict, as envlock printed it
    python benchmarks/divergence_corpus.py --twice             # again, the shared Inductor cache written
    python benchmarks/divergence_corpus.py --workers 2         # two baselines at a time

Run it with an interpreter that has torch and numpy and can import envlock (the repository root
is put on ``PYTHONPATH`` of every command). Each case starts from a sealed record of a seeded
run made once per baseline (``envlock record``, on this host), induces one cause, replays with
``envlock replay --json`` and undoes the cause. A baseline's own replay must reproduce it first:
otherwise the run is nondeterministic and no case of it means anything. Each cause is also
witnessed: the script run outside envlock with and without it. A cause that leaves this
machine's numbers alone (a thread count, a vector ISA: ``Case.machine``) is "no effect here",
and its replay must reproduce, naming nothing. Every line a diverged verdict lists beyond the
case's cause and what the change itself brings about (``Case.brings``) is a spurious cause.

The training script (``TRAIN`` below) is small but takes the paths through which causes reach
numbers in real runs: a convolution and large reductions on torch's intra-op pool (OpenMP,
MKL), a numpy dot product (OpenBLAS), a native library loaded by name (``LD_LIBRARY_PATH``), a
learning rate schedule through libm's ``cos`` (``LD_PRELOAD``), a data file, a Hugging Face
cache snapshot, a package of the environment, a module of the project, a seed; the compile
baseline adds ``torch.compile`` (Inductor's C++ backend), the ranks baseline two gloo ranks under
``torchrun``. A case whose cause is explained only by work not in this tree says so
(``depends``): its figure is what this tree explains, not what it will.

Prints a markdown table and "explained N of M, spurious causes K" (M: the causes that changed
the numbers). Exit 0 when it ran; the figure is the result, not a pass/fail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HF_REPO = "corpus/model"
REV1, REV2 = "1" * 40, "2" * 40
COMPILED = "compiled.cache"  # what the compile baseline saved (beside the project)

TRAIN = r'''
"""A seeded run whose numbers every cause of the corpus can reach."""
import ctypes
import json
import math
import os
import sys

import numpy as np
import torch

import corpuspkg
import envlock
from helpers import blocks

# Hyper-parameters as researchers keep them: a committed config, an untracked local override,
# a variable of the shell.
hp = json.load(open(os.path.join("config", "hparams.json")))
local = json.load(open("local.json")) if os.path.exists("local.json") else {}
LR = float(os.environ.get("CORPUS_LR", hp["lr"]))
torch.set_flush_denormal(bool(hp["flush_denormal"]))
seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
if os.environ.get("CORPUS_INTEROP_THREADS"):
    torch.set_num_interop_threads(int(os.environ["CORPUS_INTEROP_THREADS"]))
torch.manual_seed(seed)

# Data preparation: a data file, a model config from the Hugging Face cache, a package's
# constant, a native library found by name, numpy's BLAS.
data = np.load("data.npy")
hub = os.environ["HF_HUB_CACHE"]
folder = os.path.join(hub, "models--corpus--model")
rev = open(os.path.join(folder, "refs", "main")).read().strip()
scale = json.load(open(os.path.join(folder, "snapshots", rev, "config.json")))["scale"]
native = ctypes.CDLL("libblas_corpus.so")
# A custom op of the project, built outside the workspace: its name is no numerics library's.
op = ctypes.CDLL(os.path.join(os.environ["CORPUS_OPS"], "libcorpus_op.so"))
for lib in (native, op):
    lib.corpus_sum.restype = ctypes.c_double
    lib.corpus_sum.argtypes = [ctypes.c_void_p, ctypes.c_long]
flat = np.ascontiguousarray(data, dtype=np.float32).ravel()
summed = native.corpus_sum(flat.ctypes.data, flat.size) + op.corpus_sum(flat.ctypes.data, flat.size)
big = np.random.default_rng(0).standard_normal(4_000_000)
prep = float(big @ big) * 1e-6 + summed * 1e-3 + scale * corpuspkg.SCALE + float(data.mean())
# A pretrained checkpoint from torch's cache, outside the workspace; a float32 denormal, which
# flush-to-zero turns into 0.
backbone = torch.load(os.path.join(os.environ["TORCH_HOME"], "hub", "checkpoints", "backbone.pth"))
prep += float(backbone.sum()) + local.get("shift", 0.0) + float(torch.tensor(3e-39) * 2) * 1e38

x = torch.from_numpy(data).reshape(32, 8, 28, 28) * float(scale * corpuspkg.SCALE)
w = (torch.randn(16, 8, 3, 3) * 0.1).requires_grad_()
y = torch.randint(0, 16, (32,))


def loss_of(w, x):
    out = torch.tanh(torch.nn.functional.conv2d(x, w))
    return torch.nn.functional.cross_entropy(out.mean((2, 3)) * 4, y) + blocks(out) * 1e-4


step_loss = torch.compile(loss_of) if os.environ.get("CORPUS_COMPILE") else loss_of
for step in range(3):
    lr = LR * (1 + math.cos(math.pi * step / 6)) / 2
    loss = step_loss(w, x)
    loss.backward()
    with torch.no_grad():
        w -= lr * w.grad
        w.grad.zero_()
    envlock.record(step, loss=loss.detach(), lr=lr, prep=prep)
    if os.environ.get("CORPUS_WITNESS"):  # what was recorded, bit for bit, for a run outside envlock
        with open(os.environ["CORPUS_WITNESS"], "a") as out:
            out.write(f"{step} {float(loss.detach()).hex()} {lr.hex()} {float(prep).hex()}\n")
'''

HELPERS = '''
"""A module of the project: the training script imports it."""


def blocks(out):
    # A reduction over every element (hundreds of thousands): split across threads.
    return out.pow(2).sum()
'''

RANKS_TRAIN = r'''
"""Two gloo ranks: rank 0 records the loss of each rank and their sum."""
import os

import torch
import torch.distributed as dist

import envlock

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
x = torch.randn(2, 4_000_000)  # a sum over millions of elements is split across threads
w = torch.zeros(1, requires_grad=True)
for step in range(3):
    loss = ((x[rank] + w) ** 2).sum() * 1e-6
    loss.backward()
    dist.all_reduce(w.grad)
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad.zero_()
    each = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(each, loss.detach())
    envlock.record(step, loss=sum(each), rank_losses=torch.stack(each))
    if rank == 0 and os.environ.get("CORPUS_WITNESS"):  # rank 0 holds every rank's loss
        with open(os.environ["CORPUS_WITNESS"], "a") as out:
            out.write(" ".join([str(step), *(float(v).hex() for v in each)]) + "\n")
dist.destroy_process_group()
'''

# Sets a variable on rank 1 only, as a node's own environment or a per-rank wrapper does.
LAUNCH = """#!/bin/sh
if [ "$RANK" = "1" ] && [ -n "$CORPUS_RANK1_THREADS" ]; then export OMP_NUM_THREADS="$CORPUS_RANK1_THREADS"; fi
exec "$CORPUS_PYTHON" train.py
"""

NATIVE = """
/* A site's own BLAS-like kernel library, loaded by name (as a cluster module or Debian's
   alternatives provide libblas): the sum of n floats. The second build (-O3 -ffast-math)
   reassociates the sum into vector lanes: same source, other bits. */
double corpus_sum(const float *x, long n) {
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += x[i];
    return s;
}
"""

# A preloaded library that overrides libm's cos (as a vendor's fast libm does), one ulp off.
PRELOAD = """
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
double cos(double x) {
    static double (*real)(double);
    if (!real) real = (double (*)(double))dlsym(RTLD_NEXT, "cos");
    return nextafter(real(x), 0.0);
}
"""


@dataclass
class Induced:
    """What a case changes for its replay: variables, the command after ``--``, options of
    ``envlock replay``, and how to put the files back."""

    env: dict[str, str | None] = field(default_factory=dict)
    command: list[str] | None = None
    undo: Callable[[], object] | None = None
    options: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    name: str
    cause: str
    baseline: str  # "main", "compile" or "ranks"
    induce: Callable[[Workspace], Induced]
    # What in the verdict names the cause: "file:PATH", "command", "ctx:KEY", "ctx:KEY@RANK",
    # "input:NAME" ("ctx:KEY." a family); any one of them is enough.
    expect: tuple[str, ...]
    depends: str = ""  # the work a cause needs to be explained, where this tree lacks it
    needs: str = ""    # "cc": a C compiler; "numpy-alt": --numpy-alt
    # Why the cause may leave the numbers alone on some machines (the thread count a CPU
    # already has, a vector ISA it already runs); empty: it changes them on every machine.
    machine: str = ""
    # What else the induced change itself brings about, in the spelling of ``expect``: the same
    # variable as the process saw it, the thread counts it sets, the working tree an edit
    # changes. Every other line a diverged verdict lists is a spurious cause.
    brings: tuple[str, ...] = ()


@dataclass
class Workspace:
    root: Path           # the project (a git repository)
    outside: Path        # beside it: libraries, the package, the hub cache
    env: dict[str, str]  # the baseline's environment
    baseline: str
    numpy_alt: Path | None = None

    def edit(self, rel: str, old: str, new: str) -> Callable[[], object]:
        path = self.root / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new))
        return lambda: path.write_text(text)


def _env(**changes: str | None) -> Callable[[Workspace], Induced]:
    return lambda ws: Induced(env=dict(changes))


def _edit(rel: str, old: str, new: str) -> Callable[[Workspace], Induced]:
    return lambda ws: Induced(undo=ws.edit(rel, old, new))


def _seed(ws: Workspace) -> Induced:
    return Induced(command=[sys.executable, "train.py", "--seed", "1"])


def _data(ws: Workspace) -> Induced:
    import numpy as np

    path = ws.root / "data.npy"
    before = path.read_bytes()
    arr = np.load(path)
    arr[0, 0] += np.float32(1e-3)
    np.save(path, arr)
    return Induced(undo=lambda: path.write_bytes(before))


def _write_json(ws: Workspace, rel: str, **changes: Any) -> Induced:
    path = ws.root / rel
    before = path.read_text()
    path.write_text(json.dumps({**json.loads(before), **changes}))
    return Induced(undo=lambda: path.write_text(before))


def _checkpoint(ws: Workspace) -> Induced:
    path = ws.outside / "torchhome" / "hub" / "checkpoints" / "backbone.pth"
    before = path.read_bytes()
    _save_backbone(path, 1.0001)
    return Induced(undo=lambda: path.write_bytes(before))


def _module_in_place(ws: Workspace) -> Induced:
    # The package's module edited, its version and RECORD unchanged (an editable install, a
    # directory on PYTHONPATH): nothing but the file itself says so.
    site = ws.outside / "site"
    _write_package(site, "1.0", "1.0000001")
    return Induced(undo=lambda: _write_package(site, "1.0", "1.0"))


def _hf_revision(ws: Workspace) -> Induced:
    hub = ws.outside / "hub"
    _hf_snapshot(hub, REV2, {"scale": 1.0001})
    ref = hub / "models--corpus--model" / "refs" / "main"
    ref.write_text(REV2)
    return Induced(undo=lambda: ref.write_text(REV1))


def _package(ws: Workspace) -> Induced:
    site = ws.outside / "site"
    _write_package(site, "1.1", "1.0000001")
    return Induced(undo=lambda: _write_package(site, "1.0", "1.0"))


def _ld_path(ws: Workspace) -> Induced:
    return Induced(env={"LD_LIBRARY_PATH": str(ws.outside / "lib-fast")})


def _ld_in_place(ws: Workspace) -> Induced:
    lib = ws.outside / "lib" / "libblas_corpus.so"
    before = lib.read_bytes()
    shutil.copyfile(ws.outside / "lib-fast" / "libblas_corpus.so", lib)
    return Induced(undo=lambda: lib.write_bytes(before))


def _op_in_place(ws: Workspace) -> Induced:
    lib = ws.outside / "ops" / "libcorpus_op.so"
    before = lib.read_bytes()
    shutil.copyfile(ws.outside / "ops-fast" / "libcorpus_op.so", lib)
    return Induced(undo=lambda: lib.write_bytes(before))


def _preload(ws: Workspace) -> Induced:
    return Induced(env={"LD_PRELOAD": str(ws.outside / "preload" / "libulpcos.so")})


def _numpy_alt(ws: Workspace) -> Induced:
    assert ws.numpy_alt is not None
    return Induced(env={"PYTHONPATH": os.pathsep.join([str(ws.numpy_alt), ws.env["PYTHONPATH"]])})


def _warm_cache(ws: Workspace) -> Induced:
    # The baseline compiled into an empty Inductor cache; this replay finds it filled by that
    # run (every other run of the compile baseline finds it emptied: `_cold`).
    return Induced(env={"TORCHINDUCTOR_CACHE_DIR": ws.env["TORCHINDUCTOR_CACHE_DIR"]})


def _loaded_cache(ws: Workspace) -> Induced:
    # The baseline compiled cold and saved what it compiled (record --save-compile-cache); this
    # replay starts warm from that file, loaded before train.py starts.
    return Induced(options=["--compile-cache", str(ws.outside / COMPILED)])


def _rank1(ws: Workspace) -> Induced:
    return Induced(env={"CORPUS_RANK1_THREADS": "2"})


INDUCTOR_DEPENDS = "issue 26 item 3: torch.compile state ([torch.compile] settings, variables, caches)"
NATIVE_DEPENDS = "issue 26 item 1: native libraries as loaded (/proc/self/maps, a sha256 for unowned ones)"
BLAS_DEPENDS = "issue 26 item 2: BLAS/OpenMP runtimes (threadpoolctl: implementation, version, threads)"
TRACE_DEPENDS = "issue 35 item 1: a trace of the files, variables and process state the run read"
UNOWNED_DEPENDS = "libraries no package vouches for, of any name, in a record's context (native.unowned)"
THREADS = "a sum split over other thread counts rounds otherwise only where the CPU has the cores to split it"
ISA = ("torch's kernels for another vector ISA round otherwise only where this CPU ran other kernels "
       "without it (AVX-512 hosts may keep the same reduction order)")

CASES = (
    # Controls: nothing changed. The replay must reproduce, naming nothing (``expect`` is empty);
    # in the second pass (``--twice``) another job has written the shared Inductor cache.
    Case("control", "nothing changed", "main", lambda ws: Induced(), ()),
    Case("control_compile", "nothing changed (torch.compile)", "compile", lambda ws: Induced(), ()),
    Case("control_ranks", "nothing changed (two ranks)", "ranks", lambda ws: Induced(), ()),
    Case("omp_threads", "OMP_NUM_THREADS=1 (OpenMP: torch's intra-op pool, OpenBLAS)", "main",
         _env(OMP_NUM_THREADS="1"), ("ctx:env.OMP_NUM_THREADS",), machine=THREADS,
         brings=("ctx:determinism.env.OMP_NUM_THREADS", "ctx:determinism.num_threads", "ctx:native.runtimes.")),
    Case("mkl_threads", "MKL_NUM_THREADS=1", "main", _env(MKL_NUM_THREADS="1"),
         ("ctx:env.MKL_NUM_THREADS",), machine=THREADS,
         brings=("ctx:determinism.env.MKL_NUM_THREADS", "ctx:determinism.num_threads", "ctx:native.runtimes.")),
    Case("openblas_threads", "OPENBLAS_NUM_THREADS=1 (numpy's dot product)", "main",
         _env(OPENBLAS_NUM_THREADS="1"), ("ctx:env.OPENBLAS_NUM_THREADS",), machine=THREADS,
         brings=("ctx:determinism.env.OPENBLAS_NUM_THREADS", "ctx:native.runtimes.")),
    Case("interop_threads", "torch's inter-op pool: 1 thread (the script's own setting)", "main",
         _env(CORPUS_INTEROP_THREADS="1"), ("ctx:determinism.num_interop_threads",), machine=THREADS),
    Case("aten_default", "ATEN_CPU_CAPABILITY=default (no vector kernels)", "main",
         _env(ATEN_CPU_CAPABILITY="default"), ("ctx:torch.cpu_capability", "ctx:env.ATEN_CPU_CAPABILITY"),
         machine=ISA, brings=("ctx:determinism.env.ATEN_CPU_CAPABILITY",)),
    Case("aten_avx2", "ATEN_CPU_CAPABILITY=avx2", "main", _env(ATEN_CPU_CAPABILITY="avx2"),
         ("ctx:torch.cpu_capability", "ctx:env.ATEN_CPU_CAPABILITY"), machine=ISA,
         brings=("ctx:determinism.env.ATEN_CPU_CAPABILITY",)),
    Case("ld_library_path", "LD_LIBRARY_PATH names another build of a library the run loads",
         "main", _ld_path, ("ctx:env.LD_LIBRARY_PATH", "ctx:native.libraries.libblas_corpus.so"), needs="cc"),
    Case("ld_library_path_in_place", "the library on LD_LIBRARY_PATH replaced in place (a module "
         "system's upgrade)", "main", _ld_in_place, ("ctx:native.libraries.libblas_corpus.so",),
         depends=NATIVE_DEPENDS, needs="cc"),
    Case("custom_op_in_place", "a custom op's library (no numerics library's name), loaded from "
         "outside the workspace, rebuilt in place", "main", _op_in_place,
         ("ctx:native.unowned.libcorpus_op.so",), depends=UNOWNED_DEPENDS, needs="cc"),
    Case("ld_preload", "LD_PRELOAD of a libm whose cos is one ulp off", "main", _preload,
         ("ctx:env.LD_PRELOAD", "ctx:native.unowned.libulpcos.so"), needs="cc",
         brings=("ctx:native.unowned_count",)),
    Case("seed", "another seed (--seed 1 after --)", "main", _seed,
         ("ctx:seeds.torch_initial_seed", "command")),
    Case("data_file", "one value of the data file changed", "main", _data, ("input:data.npy",),
         brings=("tree",)),
    Case("hf_revision", "the Hugging Face cache's main moved to another commit", "main",
         _hf_revision, ("input:hf:models/corpus/model@main",)),
    Case("package_version", "a package of the environment upgraded in place (1.0 -> 1.1)", "main",
         _package, ("ctx:packages.corpuspkg",),
         # Its module changed with it, and its RECORD is empty: nothing vouches for the file.
         brings=("read:corpuspkg/__init__.py",)),
    Case("edited_script", "the learning rate edited in train.py", "main",
         _edit("train.py", "lr = LR * (1", "lr = 1.2 * LR * (1"), ("file:train.py",), brings=("tree",)),
    Case("edited_module", "a module of the project edited (helpers.py)", "main",
         _edit("helpers.py", "out.pow(2).sum()", "out.pow(2).sum() * 1.0001"), ("file:helpers.py",),
         brings=("tree",)),
    # Causes only a trace of what the run read can name (issue 35 item 1): a variable the script
    # reads, a config file committed or not, a module outside the workspace, a checkpoint in a
    # cache, process-wide numeric state set at run time. "read:PATH" is a file the run read,
    # whatever root the verdict names it from.
    Case("env_hparam", "a hyper-parameter from an ordinary variable the script reads (CORPUS_LR=0.06)",
         "main", _env(CORPUS_LR="0.06"), ("ctx:env.CORPUS_LR",), depends=TRACE_DEPENDS),
    Case("config_committed", "the committed config/hparams.json edited (lr 0.05 -> 0.06)", "main",
         lambda ws: _write_json(ws, "config/hparams.json", lr=0.06), ("read:config/hparams.json",),
         depends=TRACE_DEPENDS, brings=("tree",)),
    Case("config_untracked", "an untracked local.json the script reads, edited", "main",
         lambda ws: _write_json(ws, "local.json", shift=0.001), ("read:local.json",), depends=TRACE_DEPENDS),
    Case("module_outside", "a module outside the workspace (a directory on PYTHONPATH) edited in place, "
         "its package's version unchanged", "main", _module_in_place, ("read:corpuspkg/__init__.py",),
         depends=TRACE_DEPENDS),
    Case("checkpoint", "a pretrained checkpoint under $TORCH_HOME replaced (torch.load)", "main", _checkpoint,
         ("read:hub/checkpoints/backbone.pth",), depends=TRACE_DEPENDS),
    Case("flush_denormal", "torch.set_flush_denormal(True), set by the script from its config", "main",
         lambda ws: _write_json(ws, "config/hparams.json", flush_denormal=True),
         ("ctx:determinism.flush_denormal",), depends=TRACE_DEPENDS,
         brings=("read:config/hparams.json", "tree")),
    Case("numpy_blas", "numpy from another build, with its own OpenBLAS (--numpy-alt)", "main",
         _numpy_alt, ("ctx:packages.numpy", "ctx:native.runtimes."), depends=BLAS_DEPENDS, needs="numpy-alt",
         brings=("ctx:env.PYTHONPATH", "ctx:native.", "ctx:env.GOTOBLAS_MAIN_FREE")),  # 1.26 reads it
    Case("inductor_setting", "an Inductor setting: TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG=fast",
         "compile", _env(TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG="fast"),
         ("ctx:env.TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG", "ctx:compile."),
         depends=INDUCTOR_DEPENDS),
    Case("compile_cache_warm", "a warm Inductor cache where the original compiled cold", "compile",
         _warm_cache, ("ctx:compile.",), depends=INDUCTOR_DEPENDS,
         machine="a warm cache holds the kernels a cold compile builds; only autotuning (on GPUs) may "
                 "have chosen others"),
    Case("compile_cache_loaded", "the original's own saved compile cache loaded before the replay "
         "(replay --compile-cache; the original compiled cold)", "compile", _loaded_cache,
         ("ctx:compile.loaded",)),
    Case("rank1_threads", "one rank of two: OMP_NUM_THREADS=2 on rank 1 only (torchrun sets 1)",
         "ranks", _rank1, ("ctx:env.OMP_NUM_THREADS@1",), machine=THREADS,
         brings=("ctx:determinism.env.OMP_NUM_THREADS@1", "ctx:determinism.num_threads@1",
                 "ctx:native.runtimes.@1")),
)


# -- the workspace ------------------------------------------------------------------------------


def _hf_snapshot(hub: Path, rev: str, config: dict[str, Any]) -> None:
    """A model in the cache as huggingface_hub lays it out: a blob named by its content, the
    snapshot's file a link to it."""
    folder = hub / "models--corpus--model"
    body = json.dumps(config).encode()
    blob = folder / "blobs" / hashlib.sha1(body).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(body)
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    link = snap / "config.json"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir(exist_ok=True)


def _write_package(site: Path, version: str, scale: str) -> None:
    (site / "corpuspkg").mkdir(parents=True, exist_ok=True)
    (site / "corpuspkg" / "__init__.py").write_text(f"SCALE = {scale}\n")
    for old in site.glob("corpuspkg-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"corpuspkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: corpuspkg\nVersion: {version}\n")
    (info / "RECORD").write_text("")


def _save_backbone(path: Path, value: float) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torch.full((4,), value), path)


def _cc(source: str, out: Path, *flags: str) -> bool:
    """Build a shared library with the C compiler; False when there is none."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", *flags, "-o", str(out), str(src), "-lm"], check=True)
    return True


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=corpus", "-c", "user.email=corpus@localhost", *args],
                   cwd=root, check=True, stdout=subprocess.DEVNULL)


# The variables a case induces: the baseline runs without them, whatever the caller's shell has.
_INDUCED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY",
            "LD_PRELOAD", "CORPUS_INTEROP_THREADS", "CORPUS_RANK1_THREADS", "CORPUS_COMPILE", "CORPUS_WITNESS",
            "CORPUS_LR")


def make_workspace(where: Path, baseline: str, numpy_alt: Path | None = None) -> Workspace:
    """A git repository holding the training script, its module and its data, and beside it
    the libraries, the package and the hub cache the run reads."""
    import numpy as np

    root, outside = where / "project", where / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    if baseline == "ranks":
        (root / "train.py").write_text(RANKS_TRAIN)
        (root / "launch.sh").write_text(LAUNCH)
        (root / "launch.sh").chmod(0o755)
    else:
        (root / "train.py").write_text(TRAIN)
        (root / "helpers.py").write_text(HELPERS)
        np.save(root / "data.npy", np.random.default_rng(7).standard_normal((32, 8 * 28 * 28)).astype(np.float32))
        (root / "config").mkdir()
        (root / "config" / "hparams.json").write_text(json.dumps({"lr": 0.05, "flush_denormal": False}))
    (root / ".gitignore").write_text("*.record\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "the experiment")
    if baseline != "ranks":
        (root / "local.json").write_text(json.dumps({"shift": 0.0}))  # untracked, never committed
    _save_backbone(outside / "torchhome" / "hub" / "checkpoints" / "backbone.pth", 1.0)
    hub = outside / "hub"
    _hf_snapshot(hub, REV1, {"scale": 1.0})
    (hub / "models--corpus--model" / "refs" / "main").write_text(REV1)
    _write_package(outside / "site", "1.0", "1.0")
    lib = outside / "lib" / "libblas_corpus.so"
    if _cc(NATIVE, lib, "-O2"):
        _cc(NATIVE, outside / "lib-fast" / "libblas_corpus.so", "-O3", "-ffast-math")
        _cc(NATIVE, outside / "ops" / "libcorpus_op.so", "-O2")
        _cc(NATIVE, outside / "ops-fast" / "libcorpus_op.so", "-O3", "-ffast-math")
        _cc(PRELOAD, outside / "preload" / "libulpcos.so", "-O2")
    env = {k: v for k, v in os.environ.items() if k not in _INDUCED}
    # Temporary files, and with them the user's shared default Inductor cache
    # (``$TMPDIR/torchinductor_<user>``, which any job of the user may fill), stay in the corpus.
    (where / "tmp").mkdir()
    env.update(PYTHONPATH=os.pathsep.join([str(outside / "site"), str(REPO)]), HF_HUB_CACHE=str(hub),
               LD_LIBRARY_PATH=str(lib.parent), ENVLOCK_CACHE_DIR=str(where / "cache"),
               CORPUS_PYTHON=sys.executable, TMPDIR=str(where / "tmp"),
               CORPUS_OPS=str(outside / "ops"), TORCH_HOME=str(outside / "torchhome"))
    for name in ("ENVLOCK_RECORD", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    if baseline == "compile":
        # A cache of its own, which the warm case hands to its replay.
        env.update(CORPUS_COMPILE="1", TORCHINDUCTOR_CACHE_DIR=str(where / "inductor"))
    return Workspace(root, outside, env, baseline, numpy_alt)


def shared_cache(ws: Workspace) -> Path:
    """The Inductor cache the workspace's runs use when they name none: torch's own default."""
    code = "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())"
    env = {k: v for k, v in ws.env.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def another_job_writes(cache: Path, n: int) -> None:
    """What another job of the user leaves in the shared cache: kernels and graphs of its own."""
    for kind in ("fxgraph", "aotautograd", "kernels"):
        name = hashlib.sha256(f"{kind}-{n}".encode()).hexdigest()
        path = cache / kind / name[:2] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 4)


def _command(baseline: str) -> list[str]:
    if baseline == "ranks":
        return [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node=2", "--no-python",
                "./launch.sh"]
    return [sys.executable, "train.py"]


def _envlock(ws: Workspace, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envlock", *args], cwd=ws.root, env=env,
                          capture_output=True, text=True)


def record(ws: Workspace) -> None:
    inputs = [] if ws.baseline == "ranks" else ["--input", "data.npy", "--input", f"hf:{HF_REPO}"]
    if ws.baseline == "compile":
        inputs += ["--save-compile-cache", str(ws.outside / COMPILED)]
    done = _envlock(ws, ["record", "base.record", *inputs, "--", *_command(ws.baseline)], ws.env)
    if done.returncode != 0:
        raise RuntimeError(f"the {ws.baseline} baseline failed to record:\n{done.stderr[-3000:]}")


@contextmanager
def _cold(ws: Workspace, induced: Induced) -> Iterator[None]:
    """A run of the compile baseline starts cold, in the cache directory its record named: the
    warm cache the record left is moved aside for the run and put back after, so that the
    directory's name is the same in every run and only its contents differ. A cause that hands
    the replay the warm cache on purpose (``_warm_cache``) keeps it."""
    if ws.baseline != "compile" or "TORCHINDUCTOR_CACHE_DIR" in induced.env:
        yield
        return
    cache = Path(ws.env["TORCHINDUCTOR_CACHE_DIR"])
    aside = cache.with_name(cache.name + ".warm")
    if cache.exists():
        cache.rename(aside)
    cache.mkdir()
    try:
        yield
    finally:
        shutil.rmtree(cache)
        if aside.exists():
            aside.rename(cache)


def _induced_env(ws: Workspace, induced: Induced) -> dict[str, str]:
    """The baseline's environment with the cause's variables."""
    env = dict(ws.env)
    for name, value in induced.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def witness(ws: Workspace, induced: Induced) -> list[str] | None:
    """The numbers the training script prints when run outside envlock, with the cause in place
    (``Induced()``: without it); None for a cause only envlock's own options bring about.

    This is how the corpus learns, on the machine it runs on, whether a cause changes the
    numbers at all: the same computation with and without it, no envlock in between. A cause
    that does not (``OMP_NUM_THREADS=1`` on one core, ``ATEN_CPU_CAPABILITY=avx2`` where AVX2 is
    what torch runs anyway) is no divergence to explain, and its replay must name nothing."""
    if induced.options:
        return None
    command = induced.command or _command(ws.baseline)
    with tempfile.TemporaryDirectory(prefix="witness-", dir=ws.outside) as tmp, _cold(ws, induced):
        out = Path(tmp) / "numbers"
        env = {**_induced_env(ws, induced), "CORPUS_WITNESS": str(out)}
        done = subprocess.run(command, cwd=ws.root, env=env, capture_output=True, text=True)
        lines = out.read_text().splitlines() if out.exists() else []
    return [f"exit {done.returncode}", *lines]


def replay(ws: Workspace, induced: Induced) -> dict[str, Any]:
    """The verdict of a replay with the cause in place, as ``replay --json`` prints it."""
    env = _induced_env(ws, induced)
    extra = ["--", *induced.command] if induced.command else []
    with _cold(ws, induced):
        done = _envlock(ws, ["replay", "base.record", "--json", *induced.options, *extra], env)
    try:
        verdict: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"replay printed no verdict (exit {done.returncode}):\n{done.stderr[-3000:]}") from None
    verdict["exit"] = done.returncode
    return verdict


# -- judging a verdict --------------------------------------------------------------------------


def named(verdict: dict[str, Any]) -> list[str]:
    """Everything the verdict lists as a possible cause, in the corpus's spelling."""
    out = []
    for c in verdict.get("code", []):
        out.append(f"file:{c['name']}" if c["what"] == "file" else c["what"])
    for c in verdict.get("context", []):
        ranks = c.get("ranks") or []
        out.append(f"ctx:{c['key']}" + "".join(f"@{r}" for r in ranks))
    out += [f"input:{d['name']}" for d in verdict.get("inputs", [])]
    out += [f"read:{r['name']}" if r["what"] == "file" else f"ctx:env.{r['name']}"
            for r in verdict.get("reads", [])]
    return out


def _names(item: str, want: str) -> bool:
    """Whether a listed ``item`` is ``want``. ``ctx:KEY`` matches KEY on every rank or any;
    ``ctx:KEY@R`` only a change listed for rank R; a key ending in "." is a family
    (``ctx:native.``)."""
    key, _, rank = want.partition("@")
    name, *ranks = item.split("@")
    if key.startswith("read:"):  # a file read, named from whichever root the verdict chose
        hit = name.startswith("read:") and (name == key or name.endswith("/" + key[5:]))
    else:
        hit = name.startswith(key) if key.endswith(".") else name == key
    return hit and (not rank or rank in ranks)


def explained(verdict: dict[str, Any], expect: tuple[str, ...]) -> bool:
    """Whether one of ``expect`` is among what the verdict names."""
    return any(_names(item, want) for item in named(verdict) for want in expect)


def spurious(case: Case, verdict: dict[str, Any]) -> list[str]:
    """What a diverged verdict lists that neither names the case's cause nor follows from it
    (``Case.brings``): a false cause. A replay that reproduced lists no cause at all."""
    if not verdict.get("divergences"):
        return []
    return [item for item in named(verdict) if not any(_names(item, w) for w in case.expect + case.brings)]


# What became of a case. The cause changed the numbers outside envlock (or could not be run
# there: a cause made by envlock's own options), and the replay:
#   "explained"      diverged, and its verdict names the cause;
#   "not explained"  diverged, and names something else or nothing;
#   "missed"         reproduced the record although the numbers changed.
# The cause left this machine's numbers alone, and the replay:
#   "no effect here" reproduced the record, naming nothing: what it must do;
#   "false divergence" diverged all the same.
# "no divergence": a cause not witnessed (envlock's options) whose replay reproduced.
DIVERGED = ("explained", "not explained", "missed")


@dataclass
class Result:
    case: Case
    status: str  # one of the above, or "not run"
    why: str = ""
    verdict: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    effect: bool | None = None  # what the witness said: the cause changed the numbers outside envlock
    shared: bool = False        # the second pass: another job wrote the shared cache before the replay


def _missing(case: Case, have_cc: bool, numpy_alt: Path | None) -> str:
    if case.needs == "cc" and not have_cc:
        return "no C compiler to build the libraries"
    if case.needs == "numpy-alt" and numpy_alt is None:
        return ("needs a second numpy build: give --numpy-alt DIR (for example "
                "`pip install --target DIR numpy==1.26.4`, which bundles an older OpenBLAS)")
    return ""


def judge(case: Case, verdict: dict[str, Any], effect: bool | None, seconds: float = 0.0) -> Result:
    """A case's result from its replay's verdict and its witness (``effect``: whether the
    cause changed the numbers outside envlock; None: not witnessed)."""
    diverged = bool(verdict.get("divergences"))
    if effect is False:
        if diverged:
            return Result(case, "false divergence", "the cause leaves this machine's numbers alone outside "
                          "envlock, yet the replay diverged; named: " + (", ".join(named(verdict)) or "nothing"),
                          verdict, seconds)
        return Result(case, "no effect here", "the cause leaves this machine's numbers alone (witnessed "
                      "outside envlock); the replay reproduced and named nothing", verdict, seconds)
    if not diverged:
        if effect:
            return Result(case, "missed", "the cause changes the numbers outside envlock, yet the replay "
                          "reproduced the record", verdict, seconds)
        return Result(case, "no divergence", "the replay reproduced the record: nothing to explain",
                      verdict, seconds)
    if explained(verdict, case.expect):
        return Result(case, "explained", ", ".join(named(verdict)), verdict, seconds)
    why = "named: " + (", ".join(named(verdict)) or "nothing")
    if case.depends:
        why += f"; needs {case.depends}"
    return Result(case, "not explained", why, verdict, seconds)


def run_case(ws: Workspace, case: Case, plain: list[str], first: Result | None = None) -> Result:
    """Induce the case's cause, witness it outside envlock against ``plain`` (the baseline's own
    numbers there), replay it, and put everything back. ``first``: the case's result of the
    first pass, whose witness holds (same machine, same cause)."""
    start = time.monotonic()
    induced = case.induce(ws)
    try:
        effect = first.effect if first is not None else None
        if first is None:
            seen = witness(ws, induced)
            effect = None if seen is None else seen != plain
        verdict = replay(ws, induced)
    finally:
        if induced.undo is not None:
            induced.undo()
    result = judge(case, verdict, effect, time.monotonic() - start)
    result.effect, result.shared = effect, first is not None
    return result


@contextmanager
def baseline(kind: str, where: Path,
             numpy_alt: Path | None) -> Iterator[tuple[Workspace | None, str, list[str], dict[str, Any]]]:
    """A workspace with its record, checked to replay bit-identically and to print the same
    numbers twice outside envlock (which it yields, as the witness of "no cause", with the
    verdict of that replay); (None, why, [], {}) otherwise."""
    ws = make_workspace(where / kind, kind, numpy_alt)
    record(ws)
    control = replay(ws, Induced())
    plain, again = witness(ws, Induced()), witness(ws, Induced())
    if control.get("divergences"):
        yield None, "the baseline does not reproduce itself: " + ", ".join(named(control)), [], {}
    elif plain != again or not plain or plain[0] != "exit 0" or len(plain) < 2:
        yield None, "the baseline's numbers outside envlock are not reproducible: " + " | ".join(plain or []), [], {}
    else:
        yield ws, "", plain or [], control


def control_result(ws: Workspace, case: Case, control: dict[str, Any]) -> Result | None:
    """A control's first pass (nothing induced, nothing expected), as the baseline ran it: its
    witness is the baseline's second run outside envlock, which printed the same numbers as the
    first (effect: False), and its replay the baseline's own replay, with nothing induced. Running
    them again would repeat the same commands on the same files. None for any other case."""
    if case.expect or case.induce(ws) != Induced():
        return None
    result = judge(case, control, False)
    result.effect = False
    return result


# The baselines, the longest first. Measured on 2 cores: the compile one (every run of it
# compiles cold) took 107 s to record and check and 36 s a case (4 cases), the main one 16 s and
# 6 s a case (24 cases), the ranks one 30 s and 11 s a case (2 cases).
BASELINES = ("compile", "main", "ranks")


def _units(cases: list[Case]) -> list[tuple[str, list[Case]]]:
    """The independent pieces of work: (baseline, its cases), the longest first. Cases of one
    baseline run one after the other in its workspace (a case edits the workspace's files and
    puts them back); the workspaces share nothing (each has its own project, libraries, caches
    and ``TMPDIR``), so they may run at the same time."""
    return [(kind, part) for kind in BASELINES if (part := [c for c in cases if c.baseline == kind])]


def _run_unit(kind: str, cases: list[Case], where: Path, numpy_alt: Path | None, twice: bool) -> list[Result]:
    """One workspace's cases, in order (then again with the shared cache written: ``twice``)."""
    results: list[Result] = []
    with baseline(kind, where, numpy_alt) as (ws, why, plain, control):
        if ws is None:
            return [Result(c, "not run", why) for c in cases]
        firsts = []
        for case in cases:
            firsts.append(control_result(ws, case, control) or run_case(ws, case, plain))
            sys.stderr.write(f"{case.name}: {firsts[-1].status}\n")
        results += firsts
        if twice:
            cache = shared_cache(ws)
            for n, first in enumerate(firsts):
                another_job_writes(cache, n)
                results.append(run_case(ws, first.case, plain, first))
                sys.stderr.write(f"{first.case.name} (shared cache written): {results[-1].status}\n")
    return results


def run_corpus(names: list[str] | None = None, *, skip_compile: bool = False,
               numpy_alt: Path | None = None, keep: Path | None = None, twice: bool = False,
               workers: int = 1) -> list[Result]:
    """Every case of ``names`` (default: all). ``twice``: then a second pass of the same cases,
    another job writing the user's shared Inductor cache before each replay (``Result.shared``):
    a cache no run of the case used must change no verdict. ``workers``: how many baselines'
    workspaces run at the same time (``_units``); every case is judged against its own
    baseline and witness either way."""
    cases = [c for c in CASES if (names is None or c.name in names)
             and not (skip_compile and c.baseline == "compile")]
    where = keep or Path(tempfile.mkdtemp(prefix="divergence-corpus-"))
    have_cc = shutil.which(os.environ.get("CC", "cc")) is not None or shutil.which("gcc") is not None
    runnable = [c for c in cases if not _missing(c, have_cc, numpy_alt)]
    results = [Result(c, "not run", _missing(c, have_cc, numpy_alt)) for c in cases if c not in runnable]
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            done = [pool.submit(_run_unit, kind, part, where, numpy_alt, twice) for kind, part in _units(runnable)]
            for unit in done:
                results += unit.result()
    finally:
        if keep is None:
            shutil.rmtree(where, ignore_errors=True)
    order = {c.name: i for i, c in enumerate(CASES)}
    return sorted(results, key=lambda r: (r.shared, order[r.case.name]))


def figure(results: list[Result]) -> tuple[int, int]:
    """(explained, diverged): of the causes that changed the numbers, how many were named."""
    diverged = [r for r in results if r.status in DIVERGED]
    return sum(r.status == "explained" for r in diverged), len(diverged)


def spurious_count(results: list[Result]) -> int:
    """The false causes every verdict listed, together."""
    return sum(len(spurious(r.case, r.verdict)) for r in results)


def _figure_line(results: list[Result]) -> str:
    n, m = figure(results)
    others = ("missed", "no effect here", "false divergence", "no divergence", "not run")
    count = {status: sum(r.status == status for r in results) for status in others}
    rest = ", ".join(f"{k} {v}" for k, v in count.items() if v)
    return (f"explained {n} of {m}, spurious causes {spurious_count(results)} "
            f"(of {len(results)} causes{': ' + rest if rest else ''})")


def report(results: list[Result]) -> str:
    """The markdown table, then the figure (of each pass, where there were two)."""
    first = [r for r in results if not r.shared]
    second = [r for r in results if r.shared]
    lines = [
        "| case | cause | replay | named in the verdict | spurious |", "|---|---|---|---|---|",
        *(f"| `{r.case.name}`{' (shared cache written)' if r.shared else ''} | {r.case.cause} | {r.status} | "
          f"{r.why} | {', '.join(spurious(r.case, r.verdict)) or '-'} |" for r in results), "",
        _figure_line(first)]
    if second:
        lines.append("second pass, another job writing the shared Inductor cache before each replay: "
                     + _figure_line(second))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile cases")
    parser.add_argument("--numpy-alt", type=Path, help="a directory holding another numpy build")
    parser.add_argument("--keep", type=Path, help="build the workspaces here and keep them")
    parser.add_argument("--json", type=Path, help="write every case's verdict to this file")
    parser.add_argument("--twice", action="store_true", help="a second pass, another job writing the "
                        "user's shared Inductor cache before each replay")
    parser.add_argument("--workers", type=int, default=1, help="baselines run at the same time (default 1)")
    args = parser.parse_args(argv)
    names = args.cases.split(",") if args.cases else None
    unknown = sorted(set(names or ()) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    results = run_corpus(names, skip_compile=args.skip_compile,
                         numpy_alt=args.numpy_alt.resolve() if args.numpy_alt else None, keep=args.keep,
                         twice=args.twice, workers=args.workers)
    sys.stdout.write(report(results))
    if args.json:
        args.json.write_text(json.dumps([{"case": r.case.name, "shared_cache": r.shared, "status": r.status,
                                          "why": r.why,
                                          "spurious": spurious(r.case, r.verdict),
                                          "seconds": round(r.seconds, 1), "verdict": r.verdict}
                                         for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
