"""A replay as a page to look at (``replay --report``, ``run --replay ... --report``) and a
record's own page (``show RECORD --format html``), in the style of ``report/page``: the verdict
in ``replay/report``'s words, the first divergence with both values exact and in hex, what can
explain it with its category, one plot per metric (``report/plot``: the original and the
replay, the divergence marked, the difference on a log scale), outputs and inputs with their
digests, the environment, and the lock folded in or named by its id.

Also the plots alone (``show RECORD --format svg|png``) for a place that takes an image.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from typing import Any

from envlock.replay.compare import PACKAGES, ContextChange, ReplayComparison
from envlock.replay.record import Record, TensorDigest
from envlock.replay.report import replay_text
from envlock.report import page as p
from envlock.report.plot import MAX_DRAWN, Series, is_downsampled
from envlock.text.terminal import plural


def _number(value: Any) -> float:
    """A metric as a plot draws it: a tensor by its mean; NaN where there is no finite number."""
    if type(value) is float:  # nearly every value: the rest below
        return value if math.isfinite(value) else math.nan
    if isinstance(value, TensorDigest):
        value = value.mean
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return float(value)
    return math.nan


def _columns(rec: Record) -> dict[str, tuple[list[int], list[float]]]:
    """Each metric's steps and values, in one pass over the record, in the order first recorded."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for s in rec.steps:
        for name, value in s.metrics.items():
            column = out.get(name)
            if column is None:
                column = out[name] = ([], [])
            column[0].append(s.step)
            column[1].append(_number(value))
    return out


def series(original: Record, replay: Record | None = None, cmp: ReplayComparison | None = None) -> list[Series]:
    """One ``Series`` per metric, in the order the runs first recorded them; a replay's curve
    where it recorded steps, and the first divergence's step marked on every plot."""
    first = cmp.first if cmp is not None else None
    marked = first.step if first is not None else None
    ours = _columns(original)
    theirs = _columns(replay) if replay is not None and replay.steps else None
    out = []
    for name in [*ours, *(n for n in theirs or () if n not in ours)]:
        steps, values = ours.get(name, ([], []))
        rsteps, rvalues = theirs.get(name, ([], [])) if theirs is not None else (None, None)
        out.append(Series(name, steps, values, rsteps, rvalues, marked,
                          first is not None and first.metric == name))
    return out


def image(fmt: str, runs: Sequence[Series]) -> bytes:
    """``svg`` or ``png`` of every metric in one figure."""
    from envlock.report import plot

    if fmt == "svg":
        return ('<?xml version="1.0" encoding="utf-8" standalone="no"?>\n'
                + plot.svg(runs) + "\n").encode("utf-8")
    return plot.png(runs)


def _plots(runs: Sequence[Series]) -> list[str]:
    from envlock.report import plot

    if not runs:
        return [p.heading(2, "Metrics"), p.para("No step was recorded: there is nothing to plot.")]
    out = [p.heading(2, f"Metrics ({plural(len(runs), 'plot')}, one per metric)")]
    if is_downsampled(runs):
        out.append(p.para(f"Every step was compared; the curves are drawn from at most {MAX_DRAWN} "
                          "buckets each (each bucket's lowest and highest value, and the difference's "
                          "highest), so a run of any length draws quickly. The values and the verdict "
                          "above are exact.", "note"))
    for i, s in enumerate(runs):
        # Each figure's own salt: the ids inside one inlined <svg> never clash with another's.
        out.append(f"<figure>{plot.svg([s], salt=f'envlock-{i}')}</figure>")
    return out


def category(change: ContextChange) -> str:
    """What kind of fact a process difference is, by its key's table."""
    key = change.key
    kinds = (("env.", "variable"), ("packages.", "package"), ("torch.version", "package"),
             ("native.", "library"), ("torch.cuda_libraries.", "library"), ("torch.build.", "library"),
             ("torch.", "library"), ("determinism.", "setting"), ("seeds.", "setting"),
             ("compile.", "setting"), ("process.", "setting"), ("gpu.", "hardware"),
             ("platform.", "hardware"), ("python.", "interpreter"))
    return next((kind for prefix, kind in kinds if key.startswith(prefix)), "setting")


def _ranks(change: ContextChange) -> str:
    if not change.ranks:
        return change.key
    return f"{change.key} ({'rank' if len(change.ranks) == 1 else 'ranks'} {', '.join(map(str, change.ranks))})"


def causes(cmp: ReplayComparison) -> list[tuple[str, str, Any, Any]]:
    """(category, what, original, replay) of every difference that can explain a divergence:
    the code, what the runs read, the facts of the two processes."""
    rows: list[tuple[str, str, Any, Any]] = []
    rows += [("code" if c.what != "command" else "command", c.name if c.what == "file" else c.what,
              c.original, c.replay) for c in cmp.code]
    rows += [("file read" if r.what == "file" else "variable read", r.name, r.original, r.replay)
             for r in cmp.reads]
    rows += [(category(c), _ranks(c), c.original, c.replay) for c in cmp.context]
    return rows


def _environment(rec: Record) -> list[tuple[str, Any]]:
    ctx = rec.context
    gpus = sorted({v for k, v in ctx.items() if k.startswith("gpu.devices.") and k.endswith(".name")}, key=str)
    fp = rec.record.lock_fingerprint
    return [("lock", f"{rec.record.lock or '-'}" + (f" (id {fp.split(':', 1)[1][:12]})" if fp else "")),
            ("torch", ctx.get("torch.version")), ("CUDA", ctx.get("torch.cuda")),
            ("cuDNN", ctx.get("torch.cudnn")), ("GPU", ", ".join(map(str, gpus)) or None),
            ("CPU", ctx.get("platform.cpu_model")),
            ("packages", sum(1 for k in ctx if k.startswith("packages.")) or None),
            ("where", rec.record.where), ("recorded", f"{rec.record.created_at:%Y-%m-%d %H:%M:%S %Z} by "
                                                      f"envlock {rec.record.tool_version}")]


def _files(rec: Record, who: str) -> list[str]:
    out = [p.heading(3, f"Outputs of the {who}"),
           p.table(((o.path, o.sha256 or "not produced", o.size) for o in rec.outputs),
                   ("path", "sha256", "bytes"), mono=(0, 1))] if rec.outputs else []
    if rec.inputs:
        out += [p.heading(3, f"Inputs of the {who}"),
                p.table(((i.kind, i.name, i.sha256 or i.revision, i.files_sha256) for i in rec.inputs),
                        ("kind", "name", "sha256 or revision", "files sha256"), mono=(1, 2, 3))]
    return out


def _lock(rec: Record, lock_text: str | None) -> list[str]:
    if lock_text is not None:
        return [p.embedded(f"the lock, {rec.record.lock}: save this text as {rec.record.lock}", lock_text)]
    if rec.record.lock:
        fp = rec.record.lock_fingerprint or "no fingerprint"
        return [p.para(f"The lock is {rec.record.lock}, fingerprint {fp}; it was not found beside the "
                       "record, so it is named here rather than embedded.", "note")]
    return []


def lock_beside(rec: Record, record_path: str) -> str | None:
    """The text of the lock ``rec`` names, where it is beside the record (as a replay finds it),
    for the page to carry; None when it is not there or not a lock's text."""
    from envlock.errors import EnvlockError
    from envlock.lock import read_text

    if not rec.record.lock:
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(record_path)), rec.record.lock)
    if not os.path.isfile(path):
        return None
    try:
        return read_text(path)
    except EnvlockError:
        return None


def _command(rec: Record) -> str:
    return shlex.join(rec.record.command)


def record_page(rec: Record, name: str, lock_text: str | None = None) -> str:
    """``envlock show RECORD --format html``: one run as recorded, its metrics plotted."""
    body = [p.heading(1, f"Replay record {name}"),
            p.table((("command", _command(rec)), ("exit code", rec.record.exit_code),
                     ("steps", len(rec.steps))), mono=()),
            *_plots(series(rec)), p.heading(2, "Outputs and inputs"), *_files(rec, "run"),
            p.heading(2, "Environment"), p.table(_environment(rec)), *_lock(rec, lock_text),
            p.para(f"Replay it with: envlock replay {name}", "mono")]
    return p.page(f"envlock record: {name}", body)


def replay_page(cmp: ReplayComparison, original: Record, replay: Record, name: str,
                stderr_tail: Sequence[str] = (), lock_text: str | None = None) -> str:
    """``replay --report``: the replay against ``original`` (the record ``name``)."""
    words = replay_text(cmp, name, stderr_tail)
    head, _, _ = words.partition("\n")
    kind = "ok" if cmp.same else "warn" if cmp.failed is None and not cmp.divergences else "bad"
    body = [p.heading(1, f"Replay of {name}"), p.verdict(head, kind), p.pre(words.rstrip("\n"))]
    first = cmp.first
    if first is not None:
        rows: list[tuple[str, Any]] = [("where", first.where)]
        if first.step is not None:
            rows += [("step", first.step), ("metric", first.metric)]
        rows += [("original (exact, hex)", first.original), ("replay (exact, hex)", first.replay)]
        body += ["<section id=\"first-divergence\">", p.heading(2, "First divergence"),
                 p.table(rows, mono=(1,)), "</section>"]
    if cmp.divergences:
        rows_ = causes(cmp)
        body.append(p.heading(2, "What can explain it"))
        body.append(p.table(rows_, ("category", "what", "original", "replay"), mono=(1, 2, 3)) if rows_ else
                    p.para("No difference in what was compared: a nondeterministic operation or a changed "
                           "input (see the verdict above for what was not looked at)."))
    if cmp.divergences and cmp.packages_not_read:
        # Installed for something else between the runs: the trace saw no file of them read.
        body += [p.heading(2, "Changed, never read by the run (not causes)"),
                 p.table([(c.key[len(PACKAGES):], c.original, c.replay) for c in cmp.packages_not_read],
                         ("package", "original", "replay"), mono=(1, 2))]
    if cmp.failed is not None:
        body.append(p.para(f"The replayed command exited with {cmp.failed} before it recorded a step; "
                           "the plots show the original alone.", "note"))
    body += _plots(series(original, replay if cmp.failed is None else None, cmp))
    body += [p.heading(2, "Commands"),
             p.table((("original", _command(original), original.record.exit_code),
                      ("replay", _command(replay), replay.record.exit_code)),
                     ("run", "command", "exit code"), mono=(1,)),
             p.heading(2, "Outputs and inputs"), *_files(original, "original"), *_files(replay, "replay"),
             p.heading(2, "Environment"),
             p.table([(k, a, b) for (k, a), (_, b) in zip(_environment(original), _environment(replay),
                                                          strict=True)], ("what", "original", "replay")),
             *_lock(original, lock_text)]
    return p.page(f"envlock replay: {name}", body)
