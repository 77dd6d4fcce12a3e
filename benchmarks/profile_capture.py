"""Where does ``envlock capture`` spend its time?  Run under the venv that has envlock.

    python benchmarks/profile_capture.py [--repeats N] [--cwd DIR] [--json]

Why this exists: the targets compare capture with ``import torch`` and ``pip freeze``, and a
ratio alone does not say what to change. Four views, each answering a different question:

1. **timeline** of the real CLI (``envlock.commands.main(["capture", ...])``) with timers wrapped
   around the functions it calls (probe spawn, wait, ``build_lock``, ``seal``, ``dumps``,
   ``atomic_write``): what is on the critical path, and does the parent's pydantic import
   really overlap the probe's torch import?
2. **probe sections**: the real ``probe.collect()`` with each collector wrapped: what the probe
   adds on top of ``import torch``.
3. **cProfile** of ``probe.collect()`` with torch already imported: the hottest functions.
4. **-X importtime** of the parent's imports and of ``import torch``.

Wrapping module attributes, instead of copying the CLI's code here, keeps the timeline honest
when the CLI changes; only the names wrapped must keep existing (a missing one is reported).
Fresh processes are used throughout so that every run pays its imports like a user's does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


# -- children (run in fresh interpreters) --------------------------------------------------


def _wrap(module: Any, name: str, label: str, events: list[tuple[str, float, float]]) -> bool:
    fn = getattr(module, name, None)
    if fn is None:
        return False

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((label, t0, time.perf_counter()))

    setattr(module, name, timed)
    return True


def child_timeline(no_torch: bool, out_path: str) -> None:
    """Run the real ``envlock capture`` in this process with timers around its steps."""
    t_start = time.perf_counter()
    import builtins
    import importlib

    import envlock.commands

    t_cli = time.perf_counter()
    cap: Any = None
    for modname in ("envlock.probing.capture", "envlock.capturing"):  # renamed during 0.1 development
        try:
            cap = importlib.import_module(modname)
            break
        except ImportError:
            continue
    if cap is None:
        raise SystemExit("cannot find envlock's capture module")
    events: list[tuple[str, float, float]] = []
    probe_ms: list[float | None] = []
    missing = []
    for name, label in (("build_lock", "build_lock (validate + seal)"),):
        if not _wrap(cap, name, label, events):
            missing.append(f"{cap.__name__}.{name}")
    proc_cls = cap.ProbeProcess
    orig_init, orig_result = proc_cls.__init__, proc_cls.result

    def init(self: Any, *a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        orig_init(self, *a, **k)
        events.append(("spawn probe", t0, time.perf_counter()))

    def result(self: Any) -> Any:
        t0 = time.perf_counter()
        doc = orig_result(self)
        events.append(("wait for probe", t0, time.perf_counter()))
        # The probe's own timing is in its document only: the lock leaves timings out.
        probe_ms.append((doc.get("probe") or {}).get("duration_ms"))
        return doc

    proc_cls.__init__ = init
    proc_cls.result = result
    # envlock.lock._write is imported by the CLI at a moment this profile must not move, so its
    # functions are wrapped right after that import happens, whenever it happens.
    real_import = builtins.__import__
    patched: dict[str, bool] = {}

    def hooked_import(name: str, *a: Any, **k: Any) -> Any:
        mod = real_import(name, *a, **k)
        lf = sys.modules.get("envlock.lock._write")
        spec = getattr(lf, "__spec__", None)
        # Present in sys.modules but still executing its body: wait for the import to finish.
        if lf is not None and not patched and not getattr(spec, "_initializing", False):
            patched["done"] = True
            events.append(("envlock.lock imported", time.perf_counter(), time.perf_counter()))
            for fname in ("seal", "dumps", "atomic_write"):
                if not _wrap(lf, fname, f"lock.{fname}", events):
                    missing.append(f"envlock.lock._write.{fname}")
        return mod

    builtins.__import__ = hooked_import
    lock_path = os.path.join(tempfile.mkdtemp(prefix="envlock-prof-"), "env.lock")
    argv = ["capture", "-o", lock_path] + (["--no-torch"] if no_torch else [])
    devnull = open(os.devnull, "w")  # noqa: SIM115 - stdout of the CLI is not part of this
    saved, sys.stdout = sys.stdout, devnull
    try:
        rc = envlock.commands.main(argv)
    finally:
        sys.stdout = saved
        builtins.__import__ = real_import
    t_end = time.perf_counter()
    final = list(events)
    doc = {"rc": rc, "missing": missing, "probe_collect_ms": probe_ms[0] if probe_ms else None,
           "cli_import_ms": (t_cli - t_start) * 1000, "total_ms": (t_end - t_start) * 1000,
           "events": [(lbl, (a - t_start) * 1000, (b - t_start) * 1000) for lbl, a, b in final]}
    Path(out_path).write_text(json.dumps(doc))


def child_probe_sections(no_torch: bool, out_path: str) -> None:
    """The real ``probe.collect()`` with every collector timed."""
    t_start = time.perf_counter()
    from envlock.probe import collect as probe
    from envlock.probe import scrub

    t_import = time.perf_counter()
    events: list[tuple[str, float, float]] = []
    names = ("collect_image", "collect_platform", "collect_python", "collect_packages",
             "collect_conda", "want_torch", "collect_torch", "collect_gpu",
             "collect_determinism", "collect_seeds", "collect_env", "secret_values",
             "scrub_document")
    # Each name is wrapped where collect() looks it up; scrub_document is called from scrub.
    missing = [n for n in names if not _wrap(scrub if n == "scrub_document" else probe, n, n, events)]
    from envlock.probe.git import GitJob as job
    orig_init, orig_collect = job.__init__, job.collect

    def init(self: Any, *a: Any, **k: Any) -> None:
        t0 = time.perf_counter()
        orig_init(self, *a, **k)
        events.append(("git: start 4 processes", t0, time.perf_counter()))

    def collect(self: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig_collect(self)
        finally:
            events.append(("git: collect", t0, time.perf_counter()))

    # Wrapped in place so the probe's own calls are timed; this process only runs this profile.
    job.__init__ = init  # type: ignore[method-assign]  # a deliberate patch, see above
    job.collect = collect  # type: ignore[method-assign]  # a deliberate patch, see above
    t0 = time.perf_counter()
    doc = probe.collect(torch="no" if no_torch else "auto")
    t1 = time.perf_counter()
    json.dumps(doc, sort_keys=True)
    t2 = time.perf_counter()
    renamed = {"want_torch": "import torch (want_torch)"}
    sections: dict[str, float] = {}
    for label, a, b in events:
        key = renamed.get(label, label)
        sections[key] = sections.get(key, 0.0) + (b - a) * 1000
    out = {"import_probe_ms": (t_import - t_start) * 1000, "collect_ms": (t1 - t0) * 1000,
           "json_ms": (t2 - t1) * 1000, "sections_ms": sections, "missing": missing,
           "packages": len(doc.get("packages", []))}
    Path(out_path).write_text(json.dumps(out))


def child_cprofile(out_path: str) -> None:
    """cProfile of ``probe.collect()`` once torch is imported (and warm)."""
    import cProfile
    import pstats

    from envlock.probe import collect as probe

    probe.collect()  # imports torch; the profile below is of the probe's own work
    prof = cProfile.Profile()
    prof.enable()
    probe.collect()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]  # typeshed leaves Stats.stats out
        where = f"{Path(filename).name}:{line}({func})" if line else func
        rows.append({"function": where, "ncalls": ncalls, "tottime_ms": tottime * 1000,
                     "cumtime_ms": cumtime * 1000})
    rows.sort(key=lambda r: r["tottime_ms"], reverse=True)
    total = sum(r["tottime_ms"] for r in rows)
    Path(out_path).write_text(json.dumps({"total_ms": total, "top": rows[:15]}))


# -- parent ----------------------------------------------------------------------------------


def _child(mode: str, args: list[str], cwd: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="envlock-prof-") as tmp:
        out = os.path.join(tmp, "out.json")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE), "--child", mode, "--child-out", out,
                               *args], cwd=cwd, capture_output=True, text=True, check=False)
        wall = (time.perf_counter() - t0) * 1000
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{mode} child failed: {proc.stderr.strip()[-600:]}")
        doc: dict[str, Any] = json.loads(Path(out).read_text())
        doc["wall_ms"] = wall
        return doc


def _timeline_stages(doc: dict[str, Any]) -> dict[str, float]:
    """Turn the events of one run into consecutive stages (ms) on the parent's critical path."""
    ev = {lbl: (a, b) for lbl, a, b in doc["events"]}
    # The profiler has already imported the stdlib modules envlock.commands shares with it.
    st: dict[str, float] = {"import envlock.commands (after interpreter start)": doc["cli_import_ms"]}
    spawn = ev.get("spawn probe")
    wait = ev.get("wait for probe")
    imported = ev.get("envlock.lock imported")
    if spawn and wait:
        before = spawn[0] - doc["cli_import_ms"]
        if imported and imported[0] < spawn[0]:
            st["before spawn (incl. pydantic/model import)"] = before
        else:
            st["before spawn"] = before
        st["spawn probe"] = spawn[1] - spawn[0]
        st["parent imports while probe runs"] = wait[0] - spawn[1]
        st["waiting for probe"] = wait[1] - wait[0]
        last = wait[1]
        for label in ("build_lock (validate + seal)", "lock.seal", "lock.dumps",
                      "lock.atomic_write"):
            spans = [(a, b) for lbl, a, b in doc["events"] if lbl == label and a >= wait[1]]
            if label == "lock.seal":
                # seal also runs inside build_lock; count only the one in save().
                bl = ev.get("build_lock (validate + seal)")
                spans = [s for s in spans if not bl or s[0] > bl[1]]
            if spans:
                st[label + (" (in save)" if label == "lock.seal" else "")] = sum(
                    b - a for a, b in spans)
                last = max(last, max(b for _, b in spans))
        st["rest (summary, exit)"] = doc["total_ms"] - last
    st["probe wall (spawn to JSON)"] = (wait[1] - spawn[0]) if spawn and wait else float("nan")
    st["probe's own collect()"] = doc.get("probe_collect_ms") or float("nan")
    return st


def _median_dicts(rows: list[dict[str, float]]) -> dict[str, float]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    return {k: statistics.median([r[k] for r in rows if k in r]) for k in keys}


def importtime(code: str, top: int = 8) -> dict[str, Any]:
    """``-X importtime`` of ``code``: total, and the modules with the most self time."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, check=False)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, raw = line[len("import time:"):].split("|")
        depth = (len(raw) - len(raw.lstrip())) // 2  # one space after "|", two per level
        rows.append((raw.strip(), int(self_us), int(cum_us), depth))
    roots = [r for r in rows if r[3] == 0]
    total = sum(r[2] for r in roots) / 1000
    by_self = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    by_cum = sorted(roots, key=lambda r: r[2], reverse=True)[:top]
    return {"code": code, "total_ms": total,
            "top_self_ms": [(n, s / 1000) for n, s, _, _ in by_self],
            "top_level_cumulative_ms": [(n, c / 1000) for n, _, c, _ in by_cum]}


def run_bare(code: list[str], repeats: int, cwd: str | None) -> float:
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *code], cwd=cwd, capture_output=True, check=False)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples[1:])


def profile(repeats: int, cwd: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": repeats}
    for mode, flag in (("torch", []), ("no_torch", ["--no-torch"])):
        _child("timeline", flag, cwd)  # warm
        runs = [_child("timeline", flag, cwd) for _ in range(repeats)]
        out[f"timeline_{mode}"] = _median_dicts([_timeline_stages(r) for r in runs])
        out[f"timeline_{mode}"]["wall of the whole run"] = statistics.median(
            r["wall_ms"] for r in runs)
        missing = sorted({m for r in runs for m in r.get("missing", [])})
        if missing:
            out[f"timeline_{mode}_missing_hooks"] = missing
        sec = [_child("probe", flag, cwd) for _ in range(repeats)]
        out[f"probe_{mode}"] = {
            "wall_ms": statistics.median(s["wall_ms"] for s in sec),
            "import_probe_ms": statistics.median(s["import_probe_ms"] for s in sec),
            "collect_ms": statistics.median(s["collect_ms"] for s in sec),
            "json_ms": statistics.median(s["json_ms"] for s in sec),
            "sections_ms": _median_dicts([s["sections_ms"] for s in sec]),
            "packages": sec[0]["packages"],
        }
    out["bare_ms"] = {"python -c pass": run_bare(["-c", "pass"], repeats, cwd),
                      "python -c 'import torch'": run_bare(["-c", "import torch"], repeats, cwd)}
    out["cprofile_probe"] = _child("cprofile", [], cwd)
    out["importtime_parent"] = importtime(
        "import envlock.commands, envlock.lock, tomlkit")
    out["importtime_torch"] = importtime("import torch")
    out["markdown"] = render(out)
    return out


def render(p: dict[str, Any]) -> str:
    lines = ["### Profile: where capture time goes", "",
             f"Medians of {p['repeats']} fresh runs. Bare interpreter start "
             f"{p['bare_ms']['python -c pass']:.0f} ms; bare `import torch` process "
             f"{p['bare_ms']['python -c ' + repr('import torch')]:.0f} ms.", ""]
    for mode in ("torch", "no_torch"):
        tl = p[f"timeline_{mode}"]
        lines += [f"#### CLI timeline, `envlock capture{' --no-torch' if mode == 'no_torch' else ''}`"
                  " (parent process, critical path in order)", "",
                  "| stage | ms |", "|---|---:|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in tl.items()]
        pr = p[f"probe_{mode}"]
        lines += ["", f"#### Probe alone{' --no-torch' if mode == 'no_torch' else ''} "
                      f"({pr['packages']} packages): child process {pr['wall_ms']:.0f} ms, "
                      f"`import envlock.probe` {pr['import_probe_ms']:.1f} ms, collect() "
                      f"{pr['collect_ms']:.1f} ms, JSON {pr['json_ms']:.1f} ms", "",
                  "| section | ms |", "|---|---:|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in
                  sorted(pr["sections_ms"].items(), key=lambda kv: -kv[1])]
        lines.append("")
    cp = p["cprofile_probe"]
    lines += [f"#### cProfile of probe.collect() with torch already imported "
              f"(total {cp['total_ms']:.0f} ms under the profiler)", "",
              "| function | calls | self ms | cumulative ms |", "|---|---:|---:|---:|"]
    lines += [f"| `{r['function']}` | {r['ncalls']} | {r['tottime_ms']:.1f} | "
              f"{r['cumtime_ms']:.1f} |" for r in cp["top"][:10]]
    for key, title in (("importtime_parent", "parent imports"), ("importtime_torch", "torch")):
        it = p[key]
        lines += ["", f"#### -X importtime, {title}: {it['total_ms']:.0f} ms in all "
                      "(importtime itself inflates this)", "",
                  "| top-level import | cumulative ms |", "|---|---:|"]
        lines += [f"| `{n}` | {ms:.1f} |" for n, ms in it["top_level_cumulative_ms"]]
        lines += ["", "| module (self time) | ms |", "|---|---:|"]
        lines += [f"| `{n}` | {ms:.1f} |" for n, ms in it["top_self_ms"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cwd", help="directory to capture in (a git repository, ideally)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--child", choices=("timeline", "probe", "cprofile"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--no-torch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "timeline":
        child_timeline(args.no_torch, args.child_out)
        return 0
    if args.child == "probe":
        child_probe_sections(args.no_torch, args.child_out)
        return 0
    if args.child == "cprofile":
        child_cprofile(args.child_out)
        return 0
    result = profile(args.repeats, args.cwd)
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(result["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
