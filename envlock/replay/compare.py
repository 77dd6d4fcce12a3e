"""Comparing two replay records: the first diverging step, metric or output, the inputs that
changed, and what can explain a divergence: the code the two commands ran (an edited script,
another commit, another command line) and the facts of the two processes, rank by rank. A
replay whose command failed before it recorded anything is a failed command, not a divergence.

Bit-identical by default: two floats are equal when ``float.hex`` is (so ``-0.0`` differs from
``0.0``, and NaN equals a NaN), two tensors when their sha256 is. With a tolerance
(``rtol``/``atol``, numpy's ``allclose`` rule ``|replay - original| <= atol + rtol *
|original|``) numbers are compared by value and tensors by dtype, shape and mean.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envlock.drift.native import context_form, distributions_named, learnt_by_both, runtime_field
from envlock.probe.rules import COMPILE_ENV_PREFIXES, canonicalize_name, recorded_name
from envlock.replay.reads import STATE_KEYS
from envlock.replay.record import (
    CONTEXT_KEY,
    FileRead,
    Input,
    Record,
    Step,
    TensorDigest,
    holds,
    rank_contexts,
    unrecordable,
)
from envlock.text.terminal import plural

# Which facts of a process can change numbers while every version matches: what the record's
# [context] keeps from the process's capture, as prefixes of flat ``table.field`` keys.
CONTEXT_PREFIXES = (
    # Which interpreter and environment the process ran in (sys.executable, sys.prefix).
    "python.executable", "python.prefix",
    "platform.machine", "platform.cpu_model", "platform.cpu_count",
    "torch.version", "torch.cpu_capability", "torch.cuda", "torch.cudnn", "torch.mkl",
    "torch.mkldnn", "torch.openmp", "torch.build.blas", "torch.build.lapack",
    "torch.build.mkl_version", "torch.build.onednn_version", "torch.build.openmp_version",
    "torch.build.parallel_backend", "torch.build.cuda_runtime", "torch.build.cudnn_version",
    "gpu.driver", "gpu.devices.",
    "determinism.", "seeds.", "env.", "process.",
    "torch.cuda_libraries.", "native.libraries.", "native.content.", "native.unowned",
    "native.runtimes.", "compile.",
    # Each distribution's version, as ``packages.<name>`` (see ``context_of``): on a host the
    # environment a replay runs in is not rebuilt from the lock, and a package upgraded since
    # is a cause no other fact shows.
    "packages.",
)
# The families of keys a record may lack, each as its prefixes (the first names it). Such a
# family is compared only when both records have it. Most were added to records after the first
# ones: a record written before one was kept is not a process without it. The compile caches and
# the compile cache loaded into one are recorded only by a process that compiled
# (``probe.compilestate.compiled_here``), and an older record has them for every torch process:
# what the user's shared cache directories held (another job fills them) is no cause for a
# process that never compiled, nor a cache loaded for one whose replay did not compile. They come
# before "compile.", which holds what every torch process records (Triton, settings).
_OPTIONAL_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("python.",), ("packages.",), ("native.libraries.",), ("native.content.",), ("native.unowned",),
    ("native.runtimes.",),
    ("compile.caches.", "compile.loaded"), ("compile.",), ("torch.cuda_libraries.",),
    # The process facts a trace of the run takes (``replay.reads``): a record made without one.
    tuple(STATE_KEYS.values()))
# A record keeps every variable the lock records (``rules.recorded_name``) and says so with this
# key. Records written before kept only the variables below (the rule they were written with,
# frozen here, not a rule of today's): against such a record the others are a family it lacks,
# compared only when both records hold the mark, so that a PYTHONPATH an older record could not
# keep is no cause.
ENV_MARK = "process.env_recorded"
_ENV_BEFORE_MARK = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "ONEDNN_", "DNNL_", "ATEN_",
                          "CUBLAS", "CUDNN_", "NVIDIA_TF32", "TORCH_", "PYTORCH_", "NCCL_", "XLA_",
                          "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "PYTHONHASHSEED",
                          "ENVLOCK_SEED", "LD_LIBRARY_PATH", "LD_PRELOAD", *COMPILE_ENV_PREFIXES)
_NOT_CONTEXT = ("determinism.process_env", "determinism.torch_loaded", "gpu.devices.*.uuid_sha256",
                "gpu.devices.*.index", "seeds.seed_source")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "l": [{"x": 2}]}`` -> ``{"a.b": 1, "l.0.x": 2}``; a list of scalars is
    one value (joined), as the context stores scalars only."""
    out: dict[str, Any] = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list) and any(isinstance(v, (Mapping, list)) for v in data):
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
    elif isinstance(data, list):
        out[prefix[:-1]] = ",".join(str(v) for v in data)
    elif data is not None:
        out[prefix[:-1]] = data
    return out


def _wild(key: str) -> str:
    parts = key.split(".")
    return ".".join("*" if p.isdigit() else p for p in parts)


def context_of(form: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The explanatory facts of a lock's canonical form (``extra``: ``process.*`` facts); a
    text the record cannot hold is kept as its mark (``unrecordable``).

    Every variable the lock records (``rules.recorded_name``), as the capture scrubbed it: a
    record that kept fewer than the lock (a list of its own) could not name NVTE_FUSED_ATTN or
    PYTHONPATH as the cause of a divergence the lock itself would have shown."""
    flat = flatten(context_form(form))
    flat.update({f"packages.{p['name']}": p["version"] for p in form.get("packages", ())
                 if isinstance(p, Mapping) and p.get("name") and p.get("version")})
    flat.update({f"process.{k}": v for k, v in (extra or {}).items()})
    flat[ENV_MARK] = "lock"
    return {k: v if not isinstance(v, str) or holds(v) else unrecordable(v)
            for k, v in sorted(flat.items())
            if k.startswith(CONTEXT_PREFIXES) and not _wild(k).startswith(_NOT_CONTEXT)
            and (not k.startswith("env.") or recorded_name(k[4:]))
            and isinstance(v, (bool, int, float, str)) and v != "" and CONTEXT_KEY.fullmatch(k)}


@dataclass(frozen=True)
class Tolerance:
    """How far a replayed metric may be from the recorded one (``rtol``, ``atol``); zero is
    bit-identical, the default, since a replay is meant to reproduce."""

    rtol: float = 0.0
    atol: float = 0.0

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0


@dataclass(frozen=True)
class Divergence:
    """One place where the replay differs: ``what`` is "step", "output", "exit code" or
    "steps" (a count); ``where`` names it (``step 12, loss``; ``model.pt``)."""

    what: str
    where: str
    original: str
    replay: str
    # A step's divergence: the step and the metric, for what marks it (a report's plots).
    step: int | None = None
    metric: str | None = None


@dataclass(frozen=True)
class ContextChange:
    """A fact of the processes that differs. ``ranks``: the ranks it differs on, when not on
    every rank both records kept (empty: on all of them, or a single-process run)."""

    key: str
    original: Any
    replay: Any
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class CodeChange:
    """The code the two commands ran differs. ``what``: "file" (``name`` is its path relative
    to the workspace; a side that did not load it is None), "commit", "tree" (the working
    tree's changes against its commit) or "command" (the command line, its first word as the
    program it ran)."""

    what: str
    name: str
    original: str | None
    replay: str | None


@dataclass(frozen=True)
class ReadChange:
    """Something the two runs read differs: ``what`` is "file" (``name`` as the record shows
    its path) or "variable"; each side is its digest (``sha256 <hex>``, ``sample_sha256
    <hex>``, ``missing``) or value (``(unset)``), None when that run did not read it."""

    what: str
    name: str
    original: str | None
    replay: str | None


@dataclass(frozen=True)
class InputDrift:
    """One input that is not what the record read: which, how it changed, and both values, so a
    divergence can be explained by its data."""

    name: str
    what: str  # "revision", "content", "missing", "snapshot"
    original: str
    now: str


@dataclass(frozen=True)
class ReplayComparison:
    """``failed``: the replay's exit code when its command failed before it recorded a step
    (nothing was compared: there is nothing to compare, and the two processes' facts would
    explain nothing). ``exit_code``: the replay's own, so that a failure both runs share is
    said, not left behind an "OK"."""

    divergences: tuple[Divergence, ...] = ()
    inputs: tuple[InputDrift, ...] = ()
    context: tuple[ContextChange, ...] = ()
    steps_compared: int = 0
    tolerance: Tolerance = field(default_factory=Tolerance)
    failed: int | None = None
    code: tuple[CodeChange, ...] = ()
    exit_code: int = 0
    # The families of facts one record kept and the other did not (``native.libraries``: a
    # process whose libraries could not be read, or a record written before they were kept):
    # not compared, and said so, rather than counted as no difference.
    not_compared: tuple[str, ...] = ()
    # What the two runs read that differs (``[reads]``), and what of the runs' reading was not
    # looked at (a record without a trace, children not traced, files sampled), said so that
    # "no difference" is never claimed over what was not seen.
    reads: tuple[ReadChange, ...] = ()
    not_seen: tuple[str, ...] = ()
    # The ``packages.<name>`` differences of distributions neither run read a file of, where both
    # records know which they read (``packages_read``): no cause, kept out of ``context``.
    packages_not_read: tuple[ContextChange, ...] = ()

    @property
    def same(self) -> bool:
        return not self.divergences and not self.inputs and self.failed is None

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "failed": self.failed,
            "exit_code": self.exit_code,
            "steps_compared": self.steps_compared,
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "divergences": [vars(d) for d in self.divergences],
            "inputs": [vars(d) for d in self.inputs],
            "code": [vars(c) for c in self.code],
            "context": [{"key": c.key, "original": c.original, "replay": c.replay,
                         "ranks": list(c.ranks)} for c in self.context],
            "not_compared": list(self.not_compared),
            "reads": [vars(r) for r in self.reads],
            "not_seen": list(self.not_seen),
            "packages_not_read": [{"key": c.key, "original": c.original, "replay": c.replay,
                                   "ranks": list(c.ranks)} for c in self.packages_not_read],
        }


def show(value: Any) -> str:
    """A metric as a reader checks bits: repr and float.hex for floats."""
    if isinstance(value, TensorDigest):
        mean = f", mean {value.mean!r}" if value.mean is not None else ""
        return f"{value.dtype}{list(value.shape)} sha256 {value.sha256[:12]}{mean}"
    if isinstance(value, float):
        return f"{value!r} ({value.hex()})"
    return repr(value)


def _close(a: float, b: float, tol: Tolerance) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(b - a) <= tol.atol + tol.rtol * abs(a)


def metric_equal(a: Any, b: Any, tol: Tolerance) -> bool:
    """Whether two recorded values of one metric agree under ``tol``: a tensor by its bytes, or
    within tolerance by its mean when shape and dtype agree; a bool only equals a bool."""
    if isinstance(a, TensorDigest) or isinstance(b, TensorDigest):
        if not (isinstance(a, TensorDigest) and isinstance(b, TensorDigest)):
            return False
        if a.sha256 == b.sha256:
            return True
        if tol.exact or a.dtype != b.dtype or a.shape != b.shape or a.mean is None or b.mean is None:
            return False
        return _close(a.mean, b.mean, tol)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if tol.exact:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, float) and isinstance(b, float) and a.hex() == b.hex()
        return bool(a == b)
    return _close(float(a), float(b), tol)


def _steps(original: list[Step], replay: list[Step], tol: Tolerance) -> list[Divergence]:
    for i, (a, b) in enumerate(zip(original, replay)):  # noqa: B905 - lengths compared below
        if a.step != b.step:
            return [Divergence("step", f"row {i + 1}", f"step {a.step}", f"step {b.step}")]
        for name in list(a.metrics) + [n for n in b.metrics if n not in a.metrics]:
            if name not in b.metrics:
                return [Divergence("step", f"step {a.step}, {name}", show(a.metrics[name]), "not recorded",
                                   a.step, name)]
            if name not in a.metrics:
                return [Divergence("step", f"step {b.step}, {name}", "not recorded", show(b.metrics[name]),
                                   b.step, name)]
            if not metric_equal(a.metrics[name], b.metrics[name], tol):
                return [Divergence("step", f"step {a.step}, {name}", show(a.metrics[name]),
                                   show(b.metrics[name]), a.step, name)]
    if len(original) != len(replay):
        n = min(len(original), len(replay))
        nxt = original[n] if len(original) > n else replay[n]
        return [Divergence("steps", f"step {nxt.step} (row {n + 1})",
                           f"{plural(len(original), 'step')} recorded", f"{plural(len(replay), 'step')} recorded")]
    return []


def _outputs(original: Record, replay: Record) -> list[Divergence]:
    found = {o.path: o for o in replay.outputs}
    out = []
    for o in original.outputs:
        r = found.get(o.path)
        a = o.sha256 or "missing"
        b = (r.sha256 or "missing") if r is not None else "not declared"
        if a != b:
            out.append(Divergence("output", o.path, a, b))
    return out


def input_drift(recorded: Iterable[Input], now: Mapping[str, Input | str]) -> list[InputDrift]:
    """Recorded inputs against the same inputs read now (an ``Input``, or why it could not be
    read); one not read now is left out (``--input`` chose others)."""
    out = []
    for rec in recorded:
        cur = now.get(rec.name)
        if cur is None:
            continue
        if isinstance(cur, str):
            out.append(InputDrift(rec.name, "missing", rec.sha256 or rec.revision or "?", cur))
        elif rec.kind == "hf" and rec.revision != cur.revision:
            out.append(InputDrift(rec.name, "revision", rec.revision or "not cached",
                                  cur.revision or "not cached"))
        elif rec.kind == "hf" and rec.files_sha256 != cur.files_sha256:
            out.append(InputDrift(rec.name, "snapshot", rec.files_sha256 or "missing",
                                  cur.files_sha256 or "missing"))
        elif rec.kind == "path" and rec.sha256 != cur.sha256:
            out.append(InputDrift(rec.name, "content", rec.sha256 or "?", cur.sha256 or "?"))
    return out


def recorded_input_drift(original: Record, other: Record) -> list[InputDrift]:
    """The inputs two records read, each as it was recorded: changed, or read by one only."""
    theirs = {i.name: i for i in other.inputs}
    ours = {i.name for i in original.inputs}
    out = input_drift(original.inputs, theirs)
    out += [InputDrift(i.name, "missing", i.sha256 or i.revision or "?", "not recorded")
            for i in original.inputs if i.name not in theirs]
    out += [InputDrift(i.name, "added", "not recorded", i.sha256 or i.revision or "?")
            for i in other.inputs if i.name not in ours]
    return out


def command_failed(original: Record, replay: Record) -> bool:
    """The replay's command failed before it recorded a step (a missing module, a bad
    interpreter, a crash at start), where the original did not end the same way."""
    code = replay.record.exit_code
    return code != 0 and not replay.steps and code != original.record.exit_code


def _family(key: str) -> str:
    """The family a record may lack that ``key`` belongs to, by its first prefix ("" for the
    keys every record has); the variables records kept only since ``ENV_MARK`` are "env." with
    the mark."""
    if key == ENV_MARK or (key.startswith("env.") and not key[4:].startswith(_ENV_BEFORE_MARK)):
        return "env."
    return next((f[0] for f in _OPTIONAL_FAMILIES if key.startswith(f)), "")


def _context_changes(original: Mapping[str, Any], replay: Mapping[str, Any]) -> list[ContextChange]:
    """The keys whose values differ; a family a record may lack is compared only when both
    have it (``_OPTIONAL_FAMILIES``), and a runtime's field only when both processes learnt it
    (``drift.native.learnt_by_both``, verify's rule)."""
    kept = {_family(k) for k in original} & {_family(k) for k in replay} | {""}
    keys = sorted(set(original) | set(replay))
    return [ContextChange(k, original.get(k), replay.get(k)) for k in keys
            if original.get(k) != replay.get(k) or type(original.get(k)) is not type(replay.get(k))
            if _family(k) in kept
            if not runtime_field(k) or learnt_by_both(original.get(k), replay.get(k))]


def context_changes(original: Record, replay: Record) -> list[ContextChange]:
    """The process facts that differ, rank by rank, over the ranks both records kept: a
    change found on every one of them is listed once, plainly; another with its ranks (a
    variable set on rank 1 only)."""
    ours, theirs = rank_contexts(original), rank_contexts(replay)
    ranks = sorted(set(ours) & set(theirs))
    found: dict[tuple[str, str, str], tuple[ContextChange, list[int]]] = {}
    for rank in ranks:
        for change in _context_changes(ours[rank], theirs[rank]):
            mark = (change.key, repr(change.original), repr(change.replay))
            found.setdefault(mark, (change, []))[1].append(rank)
    out = [ContextChange(c.key, c.original, c.replay, () if len(on) == len(ranks) else tuple(on))
           for c, on in found.values()]
    return sorted(out, key=lambda c: (c.key, c.ranks))


PACKAGES = "packages."
_NATIVE_OWNED = ("native.libraries.", "native.content.")


def packages_read(rec: Record) -> set[str] | None:
    """The distributions the run read a file of (``[reads].distributions``), and those vouching
    for a native library a process of it loaded (its context's ``native.libraries.*`` and
    ``native.content.*``, on every rank): the ``packages.<name>`` that can be a cause. None
    where the record does not know (written before, a container's run, a late trace)."""
    if rec.reads is None or rec.reads.distributions is None:
        return None
    found = {canonicalize_name(n) for n in rec.reads.distributions}
    for context in rank_contexts(rec).values():
        for key, value in context.items():
            if key.startswith(_NATIVE_OWNED) and isinstance(value, str):
                found |= {canonicalize_name(n) for n in distributions_named(value)}
    return found


def split_unread(changes: Iterable[ContextChange], original: Record, replay: Record
                 ) -> tuple[list[ContextChange], list[ContextChange]]:
    """``changes`` as (causes, the ``packages.<name>`` of a distribution neither run read): a
    package installed or upgraded for something else (a plotting library the script never
    imports) changes no number of the run. Where a record does not know what it read, every
    change stays a cause."""
    ours, theirs = packages_read(original), packages_read(replay)
    if ours is None or theirs is None:
        return list(changes), []
    read = ours | theirs
    causes: list[ContextChange] = []
    unread: list[ContextChange] = []
    for change in changes:
        unused = change.key.startswith(PACKAGES) and change.key[len(PACKAGES):] not in read
        (unread if unused else causes).append(change)
    return causes, unread


def families_not_compared(original: Record, replay: Record) -> list[str]:
    """The families a record may lack (``_OPTIONAL_FAMILIES``, as ``native.libraries``) that one record
    kept on a rank both records have and the other did not: ``_context_changes`` skips them."""
    ours, theirs = rank_contexts(original), rank_contexts(replay)
    found: set[str] = set()
    for rank in set(ours) & set(theirs):
        found |= {_family(k) for k in ours[rank]} ^ {_family(k) for k in theirs[rank]}
    return sorted(f.rstrip(".") for f in found if f)


def _commands(original: Record, replay: Record) -> tuple[list[str], list[str]]:
    """The two commands as run: the first word as the program it found where both records
    know it (``python`` and the venv's ``bin/python`` given after ``--`` are one command)."""
    ran, runs = list(original.record.command), list(replay.record.command)
    if ran and runs and original.record.program and replay.record.program:
        ran[0], runs[0] = original.record.program, replay.record.program
    return ran, runs


def _differ(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ, a key one side lacks among them, in order."""
    return [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]


def code_changes(original: Record, replay: Record) -> list[CodeChange]:
    """What differs in the code the two commands ran: each workspace file the processes loaded
    (changed, or loaded by one only), the commit, the working tree's changes, the command
    line. A record written before ``[code]`` compares its command only."""
    out: list[CodeChange] = []
    a, b = original.code, replay.code
    if a is not None and b is not None:
        if a.files_known and b.files_known:
            ours, theirs = a.files or {}, b.files or {}
            out += [CodeChange("file", path, ours.get(path), theirs.get(path)) for path in _differ(ours, theirs)]
        if a.commit and b.commit and a.commit != b.commit:
            out.append(CodeChange("commit", "", a.commit, b.commit))
        if a.tree_sha256 and b.tree_sha256 and a.tree_sha256 != b.tree_sha256:
            out.append(CodeChange("tree", "", a.tree_sha256, b.tree_sha256))
    ran, runs = _commands(original, replay)
    if ran != runs:
        out.append(CodeChange("command", "", shlex.join(ran), shlex.join(runs)))
    return out


def _file_value(f: FileRead) -> str:
    if f.sha256:
        return f"sha256 {f.sha256}"
    if f.sample_sha256:
        return f"sample_sha256 {f.sample_sha256}"
    return "missing"


UNSET = "(unset)"


def read_changes(original: Record, replay: Record) -> list[ReadChange]:
    """The files and variables the two runs read that differ, or that one run read only; none
    when a record has no trace (``not_seen`` says so)."""
    a, b = original.reads, replay.reads
    if a is None or b is None:
        return []
    out: list[ReadChange] = []
    ours = {k: _file_value(v) for k, v in a.files.items()}
    theirs = {k: _file_value(v) for k, v in b.files.items()}
    out += [ReadChange("file", k, ours.get(k), theirs.get(k)) for k in _differ(ours, theirs)]
    ours = {**dict.fromkeys(a.unset or (), UNSET), **a.variables}
    theirs = {**dict.fromkeys(b.unset or (), UNSET), **b.variables}
    out += [ReadChange("variable", k, ours.get(k), theirs.get(k)) for k in _differ(ours, theirs)]
    return out


def not_seen(original: Record, replay: Record) -> list[str]:
    """What of the two runs' reading no comparison covered, in words."""
    out: list[str] = []
    sides = (("original", original), ("replay", replay))
    lacking = [name for name, rec in sides if rec.reads is None]
    if lacking:
        out.append("what the run read: no trace in the " + " and the ".join(lacking)
                   + (" record" if len(lacking) == 1 else " records"))
        return out
    untraced = sorted(set((original.reads and original.reads.untraced) or ())
                      | set((replay.reads and replay.reads.untraced) or ()))
    if untraced:
        out.append("what these programs read, not Python, not traced: " + ", ".join(untraced))
    late = [name for name, rec in sides if rec.reads and rec.reads.late]
    if late:
        out.append("what the run read before its first envlock.record() call: traced only from there in the "
                   + " and the ".join(late) + " (no start-up hook, as in a container's run)")
    unhashed = [f"{rec.reads.unhashed} in the {name}" for name, rec in sides if rec.reads and rec.reads.unhashed]
    if unhashed:
        out.append("files read inside the container, outside its workspace and environment, which only the "
                   "container holds: " + ", ".join(unhashed))
    sampled = sorted({k for rec in (original, replay) for k, v in (rec.reads.files if rec.reads else {}).items()
                      if v.sample_sha256})
    if sampled:
        out.append("files over the hashing cap, compared by a sample (first and last MiB): " + ", ".join(sampled))
    left = sum((rec.reads.left_out or 0) for rec in (original, replay) if rec.reads)
    if left:
        out.append(f"{plural(left, 'file')} whose path a record cannot hold")
    return out


def compare_records(original: Record, replay: Record, tol: Tolerance | None = None,
                    inputs_now: Mapping[str, Input | str] | None = None) -> ReplayComparison:
    """The replay against the original: steps first (the first divergence only: everything
    after it follows from it), then the exit code, then every output. The inputs are the
    original's read again (``inputs_now``), or without it the two records' own."""
    tol = tol or Tolerance()
    drift = (input_drift(original.inputs, inputs_now) if inputs_now is not None
             else recorded_input_drift(original, replay))
    if command_failed(original, replay):
        return ReplayComparison(inputs=tuple(drift), tolerance=tol, failed=replay.record.exit_code,
                                exit_code=replay.record.exit_code)
    div = _steps(original.steps, replay.steps, tol)
    if original.record.exit_code != replay.record.exit_code:
        div.append(Divergence("exit code", "the command", str(original.record.exit_code),
                              str(replay.record.exit_code)))
    div += _outputs(original, replay)
    causes, unread = split_unread(context_changes(original, replay), original, replay)
    return ReplayComparison(tuple(div), tuple(drift), tuple(causes),
                            min(len(original.steps), len(replay.steps)), tol,
                            code=tuple(code_changes(original, replay)), exit_code=replay.record.exit_code,
                            not_compared=tuple(families_not_compared(original, replay)),
                            reads=tuple(read_changes(original, replay)),
                            not_seen=tuple(not_seen(original, replay)), packages_not_read=tuple(unread))
