"""Human output: text for terminals, markdown for papers and pull requests, JSON for machines.

Rendering only; nothing here decides what counts as drift (that is ``compare``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from envlock.text.escape import markdown_code, markdown_text
from envlock.text.terminal import agree, dash, plural, safe

if TYPE_CHECKING:
    from envlock.drift.result import Comparison, Difference
    from envlock.lock import Canary, Lock

_SEVERITY_LABEL = {"breaking": "BREAKING", "warning": "warning", "info": "info"}
def _flag(value: bool | None) -> str:
    return "-" if value is None else ("on" if value else "off")


def summary_rows(lock: Lock) -> list[tuple[str, str]]:
    """(label, value) pairs shared by the text and markdown summaries."""
    py = lock.python
    plat = lock.platform
    rows = [
        ("id", f"{lock.short_id}  ({lock.envlock.fingerprint or 'unsealed'})"),
        ("captured", f"{lock.envlock.created_at:%Y-%m-%d %H:%M:%S %Z} by envlock {lock.envlock.tool_version}"),
        ("python", f"{py.version} {py.implementation} ({py.prefix_kind})"),
        ("platform", " ".join(x for x in (
            plat.os_pretty_name or plat.os, plat.machine,
            f"{plat.libc} {plat.libc_version}" if plat.libc else None) if x)),
    ]
    if lock.torch:
        t = lock.torch
        rows.append(("torch", f"{t.version}  CUDA {dash(t.cuda)}  cuDNN {dash(t.cudnn)}  NCCL {dash(t.nccl)}"
                     + (f"  HIP {t.hip}" if t.hip else "")))
    else:
        rows.append(("torch", "not captured"))
    if lock.gpu and lock.gpu.devices:
        names: dict[str, int] = {}
        for dev in lock.gpu.devices:
            names[dev.name] = names.get(dev.name, 0) + 1
        gpus = ", ".join(f"{n} x {name}" for name, n in names.items())
        rows.append(("gpu", f"{gpus} (driver {dash(lock.gpu.driver)}, CUDA driver {dash(lock.gpu.cuda_driver)})"))
    else:
        rows.append(("gpu", "none"))
    img = lock.image
    if img.digest or img.id or img.reference:
        ref = img.reference or ""
        pin = img.digest or img.id or ""
        rows.append(("image", f"{ref}{'@' + pin if pin else ''} (from {img.source})"))
    else:
        rows.append(("image", "not in a known container" if not img.in_container else "container, image unknown"))
    sources: dict[str, int] = {}
    for p in lock.packages:
        if p.source != "index":
            sources[p.source] = sources.get(p.source, 0) + 1
    extra = ", ".join(f"{n} {s}" for s, n in sorted(sources.items()))
    rows.append(("packages", f"{len(lock.packages)}" + (f" ({extra})" if extra else "")))
    if lock.conda is not None:
        subdirs = sorted({p.subdir for p in lock.conda.packages if p.subdir})
        rows.append(("conda", f"{len(lock.conda.packages)} packages" + (f" ({', '.join(subdirs)})" if subdirs else "")))
    if lock.os_packages is not None:
        rows.append(("os packages", f"{len(lock.os_packages.packages)} ({lock.os_packages.manager})"))
    rows += native_rows(lock)
    d = lock.determinism
    if d.torch_loaded:
        rows.append(("determinism",
                     f"deterministic_algorithms {_flag(d.deterministic_algorithms)}, "
                     f"cudnn.deterministic {_flag(d.cudnn_deterministic)}, "
                     f"cudnn.benchmark {_flag(d.cudnn_benchmark)}, "
                     f"tf32 matmul {_flag(d.cuda_matmul_allow_tf32)}, "
                     f"float32_matmul_precision {dash(d.float32_matmul_precision)}"))
    if d.env:
        rows.append(("numerics env", ", ".join(f"{k}={v}" for k, v in d.env.items())))
    s = lock.seeds
    seed_bits = [f"seed {s.seed}" if s.seed is not None else "seed not set through envlock"]
    seed_bits.append(f"PYTHONHASHSEED={s.python_hash_seed}" if s.python_hash_seed is not None else "hash randomization on")
    rows.append(("seeds", ", ".join(seed_bits)))
    if lock.canary:
        rows.append(("canary", f"{plural(len(lock.canary.results), 'kernel')} hashed"))
    if lock.git:
        g = lock.git
        state = []
        if g.dirty:
            state.append("dirty")
        if g.untracked:
            state.append(f"{g.untracked} untracked")
        rows.append(("git", f"{dash(g.branch)} @ {(g.commit or '-')[:12]}" + (f" ({', '.join(state)})" if state else "")))
    if lock.probe.errors:
        rows.append(("not captured", "; ".join(f"{k}: {v}" for k, v in sorted(lock.probe.errors.items()))))
    if lock.unreadable:
        # Names and reasons are cut to inert characters when captured (probe.rules.unreadable).
        rows.append(("unreadable", f"{len(lock.unreadable)} (verify fails): " + "; ".join(
            f"{u.section} {u.item or ''}".strip() for u in lock.unreadable[:5])
            + ("; ..." if len(lock.unreadable) > 5 else "")))
    if lock.envlock.note:
        rows.append(("note", lock.envlock.note))
    return rows


def native_rows(lock: Lock) -> list[tuple[str, str]]:
    """The native code the capturing process ran, torch.compile's state and what a host needs."""
    rows = []
    if lock.native is not None:
        libs = lock.native.libraries
        unowned = sum(1 for lib in libs if lib.sha256 or lib.deleted)
        rows.append(("libraries", f"{len(libs)} loaded" + (
            f" ({unowned} no package vouches for)" if unowned else "")))
        for rt in lock.native.runtimes:
            bits = [b for b in (rt.version, rt.architecture, rt.threading_layer,
                                f"{rt.num_threads} threads" if rt.num_threads is not None else None) if b]
            rows.append((rt.api, f"{rt.implementation} {rt.library}" + (f" ({', '.join(bits)})" if bits else "")))
    if lock.compile is not None:
        c = lock.compile
        caches = ", ".join(f"{x.kind} {x.files} files" for x in c.caches)
        rows.append(("compile", ", ".join(x for x in (
            f"triton {c.triton}" if c.triton else None,
            f"{len(c.settings)} settings read" if c.settings else "settings not read (not imported)",
            f"caches: {caches}" if caches else None) if x)))
    if lock.requires is not None:
        r = lock.requires
        rows.append(("requires", ", ".join(x for x in (
            f"driver CUDA >= {r.cuda_driver}" if r.cuda_driver else None,
            f"glibc >= {r.glibc}" if r.glibc else None,
            f"GPU {' '.join(r.gpu_archs)}" if r.gpu_archs else None,
            f"CPU {' '.join(r.cpu_features)}" if r.cpu_features else None) if x) or "nothing declared"))
    return rows


def show_text(lock: Lock, name: str = "env.lock") -> str:
    """``envlock show``: the summary rows of a lock, escaped for a terminal."""
    rows = summary_rows(lock)
    width = max(len(k) for k, _ in rows)
    return "\n".join([safe(name)] + [f"  {k.ljust(width)}  {safe(v)}" for k, v in rows]) + "\n"


def capture_summary(lock: Lock, path: str, locked: str | None, *,
                    verbose: bool = False) -> tuple[str, str]:
    """What ``envlock capture`` prints after writing ``path``: the summary (stdout) and the
    notes (stderr). torch, gpu and git are often absent on purpose (``--no-torch``, a CPU box,
    no repository), so their absence is noted only with ``verbose``; any other section is."""
    # Every value is a lock's (a sealed lock may carry anything its model allows): escaped, so
    # a newline in torch.cuda cannot forge a line of the summary.
    t = lock.torch
    torch_part = (f"torch {safe(t.version)} (CUDA {dash(t.cuda)}, cuDNN {dash(t.cudnn)})" if t
                  else "torch not captured")
    gpu = lock.gpu
    gpu_part = f"{plural(len(gpu.devices), 'GPU')}, driver {dash(gpu.driver)}" if gpu and gpu.devices else "no GPU"
    n = len(lock.packages)
    summary = (f"wrote {safe(path)}  id {lock.short_id}\n"
               + (f"  {safe(locked)}\n" if locked else "")
               + f"  python {safe(lock.python.version)} ({safe(lock.python.prefix_kind)}), {torch_part}, "
               f"{gpu_part}, {plural(n, 'package')}\n")
    notes = []
    changed = [safe(p.name) for p in lock.packages if p.files_changed]
    if changed:
        notes.append(f"  note: files differ from RECORD in {plural(len(changed), 'distribution')} "
                     f"({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}): "
                     "see files_changed\n")
    notes += [f"  note: {safe(section)} not captured: {safe(reason)}\n"
              for section, reason in sorted(lock.probe.errors.items())
              if section not in ("torch", "gpu", "git") or verbose]
    if lock.unreadable:
        items = [f"{u.section} {u.item}: {u.error}" if u.item else f"{u.section}: {u.error}"
                 for u in lock.unreadable]
        notes.append(f"  warning: {plural(len(items), 'thing')} could not be captured, so verify fails "
                     f"until they can ([[unreadable]]): {'; '.join(items[:3])}"
                     f"{'; ...' if len(items) > 3 else ''}\n")
    return summary, "".join(notes)


def shared_rows(lock: Lock) -> list[tuple[str, str]]:
    """Summary rows for what is shared (PRs, papers): probe errors by section, never raw text."""
    rows = [(k, v) for k, v in summary_rows(lock) if k != "id"]
    if lock.probe.errors:
        rows = [(k, ", ".join(sorted(lock.probe.errors)) + " (details: envlock show)")
                if k == "not captured" else (k, v) for k, v in rows]
    return rows


def replay_lines(name: str) -> tuple[str, str]:
    """How a reader replays the environment: with envlock, and with only uv or pip."""
    return (f"envlock restore {name}",
            f"envlock export {name} --to pylock -o pylock.toml && uv pip install -r pylock.toml")


def show_markdown(lock: Lock, name: str = "env.lock") -> str:
    """``envlock show --format markdown``: the environment as a pull request or a paper shows
    it, every value of the lock written as inert markdown."""
    out = [f"#### Environment `envlock:{lock.short_id}`", "", "| what | value |", "|---|---|"]
    # Every value is the lock's (a note, an OS name, a version): inert markdown that reads as written.
    out += [f"| {k} | {markdown_text(v, inline=True)} |" for k, v in shared_rows(lock)]
    out += ["", f"<details><summary>{plural(len(lock.packages), 'package')}</summary>", "",
            "| package | version | source |", "|---|---|---|"]
    out += [f"| {markdown_text(p.name, inline=True)} | {markdown_text(p.version, inline=True)} "
            f"| {markdown_text(p.source, inline=True)} |" for p in lock.packages]
    with_envlock, without = replay_lines(name)
    out += ["", "</details>", "",
            f"Fingerprint `{lock.envlock.fingerprint}`. Check an environment against it with "
            f"`envlock verify {markdown_code(name, table=False)}`. Replay it with "
            f"`{markdown_code(with_envlock, table=False)}` (a container), or without envlock: "
            f"`{markdown_code(without, table=False)}`.", ""]
    return "\n".join(out)


def show_json(lock: Lock) -> str:
    """``envlock show --json``: the lock's own fields, as its models dump them."""
    return json.dumps(lock.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def differences_text(differences: Iterable[Difference]) -> str:
    """The differences as aligned rows (severity, path, what changed), the one table every
    text report lists them in."""
    rows = [(_SEVERITY_LABEL[d.severity], safe(d.path), safe(d.describe())) for d in differences]
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"  {r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows) + "\n"


def counts_line(cmp: Comparison) -> str:
    # Imported here: `show` renders no comparison and does not load the comparison types.
    """How many differences of each severity: the line that leads a verify and a diff."""
    from envlock.drift.result import SEVERITIES, counts_text

    return counts_text({s: cmp.count(s) for s in SEVERITIES})


def _verify_head(cmp: Comparison, lock: Lock, name: str, environment: str | None = None) -> str:
    against = f" against {safe(environment)}" if environment else ""
    return f"{safe(name)} (id {lock.short_id}){against}: {counts_line(cmp)}\n"


def verify_brief(cmp: Comparison, lock: Lock, name: str) -> str:
    """A check that passed, in verify's words and short (``run`` prints it before its command's
    output): the head line and every difference that counts, each named; a count of warnings
    alone left the reader to guess which."""
    return _verify_head(cmp, lock, name) + differences_text(d for d in cmp.differences if d.severity != "info")


def verify_text(cmp: Comparison, lock: Lock, name: str, *, show_info: bool = False,
                environment: str | None = None, captured_from: str | None = None,
                restored: bool = False) -> str:
    """The verify report. ``environment`` says what was checked and why ("./.venv
    (VIRTUAL_ENV)"); ``captured_from`` is the lock's own environment when it exists here but
    another one was checked: the one line that explains a wall of drift. ``restored``: the
    check of a restore, which is another image than the lock's by design, so the hint to
    restore is not given (it would name "LOCK inside TAG" as a lock to restore)."""
    from envlock.report.verify import (
        DETAIL_LINES,
        SUMMARY_AFTER,
        image_hint,
        process_state_text,
        verify_summary,
    )

    shown = [d for d in cmp.differences if show_info or d.severity != "info"]
    head = _verify_head(cmp, lock, name, environment)
    elsewhere = captured_from is not None and not cmp.ok
    if elsewhere:
        name, captured_from = safe(name), safe(captured_from)
        head += (f"  {name} was captured from {captured_from}, not from the environment checked "
                 f"here: run `envlock verify {name} --python {captured_from}`\n")
    hidden = cmp.count("info") if not show_info else 0
    if len(shown) > SUMMARY_AFTER or elsewhere:
        head += verify_summary(cmp, lock)
        limit = len(shown) if show_info else (0 if elsewhere else DETAIL_LINES)
        body = differences_text(shown[:limit])
        if body:
            body = f"  details ({min(limit, len(shown))} of {len(shown)}):\n" + body
        left = len(shown) - limit + hidden
        tail = f"  ({plural(left, 'more difference')}; --all lists every one)\n" if left else ""
    else:
        body = differences_text(shown)
        tail = f"  ({plural(hidden, 'info difference')} hidden; --all shows them)\n" if hidden and body else ""
    tail += ("" if restored else image_hint(cmp, lock, name)) + process_state_text(cmp)
    if cmp.ok:
        verdict = "OK: the environment matches the lock\n"
    elif cmp.breaking:
        verdict = f"DRIFT: {plural(len(cmp.breaking), 'breaking difference')}\n"
    else:
        verdict = f"DRIFT: {plural(cmp.count('warning'), 'warning')}, which {agree(cmp.count('warning'), 'counts', 'count')} as drift with --strict\n"
    return head + body + tail + verdict


def diff_text(cmp: Comparison, a: str, b: str) -> str:
    """``envlock diff``: what changed from ``a`` to ``b``, and apart from it the process state
    that differs, which is reported but not counted."""
    process = ""
    if cmp.process:
        process = (f"process state differs (seeds, flags, variables the process set; not compared, "
                   f"--process-state compares it): {len(cmp.process)}\n" + differences_text(cmp.process))
    if not cmp.differences:
        return f"{safe(a)} and {safe(b)} describe the same environment\n" + process
    return f"{safe(a)} -> {safe(b)}: {counts_line(cmp)}\n" + differences_text(cmp.differences) + process


def diff_markdown(cmp: Comparison, a: Lock, b: Lock, a_name: str, b_name: str) -> str:
    """``envlock diff --format markdown``: the differences as a table a pull request shows,
    every value written as inert markdown."""
    out = [f"#### Environment diff `envlock:{a.short_id}` → `envlock:{b.short_id}`", ""]
    if not cmp.differences:
        return "\n".join([*out, "No differences.", ""])
    out += [f"{counts_line(cmp)} ({markdown_text(a_name, inline=True)} → {markdown_text(b_name, inline=True)})", "",
            "| severity | what | before | after |", "|---|---|---|---|"]
    for d in cmp.differences:
        out.append(f"| {d.severity} | `{markdown_code(d.path)}` | "
                   f"{markdown_text(dash(d.old), inline=True)} | {markdown_text(dash(d.new), inline=True)} |")
    out.append("")
    return "\n".join(out)


def comparison_payload(cmp: Comparison, **extra: Any) -> dict[str, Any]:
    """``verify --json``'s document; also each node's verdict under ``verify --fleet``."""
    return {**extra, **cmp.to_dict()}


def comparison_json(cmp: Comparison, **extra: Any) -> str:
    """The JSON document of a verify or a diff, from the one payload both commands build."""
    return json.dumps(comparison_payload(cmp, **extra), indent=2, default=str) + "\n"


def canary_text(canary: Canary) -> str:
    """``envlock canary``: one line per kernel result, then failures and settings."""
    devices = sorted({r.device for r in canary.results})
    duration = f" in {canary.duration_ms:.0f} ms" if canary.duration_ms is not None else ""
    lines = [f"canary v{canary.version}, torch {canary.torch or '-'}: {len(canary.results)} "
             f"results on {', '.join(devices) or 'no device'}{duration}"]
    if canary.results:
        wn = max(len(r.name) for r in canary.results)
        wd = max(len(r.device) for r in canary.results)
        wt = max(len(r.dtype) for r in canary.results)
        lines += [f"  {r.name.ljust(wn)}  {r.device.ljust(wd)}  {r.dtype.ljust(wt)}  {r.sha256[:16]}"
                  for r in canary.results]
    for key, why in sorted(canary.errors.items()):
        lines.append(f"  failed: {key}: {why}")
    if canary.settings:
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in canary.settings.items()))
    return "\n".join(lines) + "\n"


def canary_check_text(cmp: Comparison, name: str) -> str:
    """``envlock canary --against``: the differences from the lock's canary, and the verdict."""
    shown = [d for d in cmp.differences if d.severity != "info"]
    if not shown:
        return f"OK: same bytes as the canary in {name}\n"
    body = "".join(f"  {d.severity.upper() if d.severity == 'breaking' else d.severity}  "
                   f"{d.describe()}\n" for d in shown)
    verdict = (f"NUMERIC DRIFT: {plural(len(cmp.breaking), 'kernel')} {agree(len(cmp.breaking), 'differs', 'differ')} from {name}\n"
               if cmp.breaking else "OK: no breaking difference\n")
    return body + verdict


def canary_json(canary: Canary, cmp: Comparison | None) -> str:
    """``envlock canary --json``: the canary, and the comparison with a lock's when asked for."""
    payload: dict[str, object] = {"canary": canary.model_dump(mode="json", exclude_none=True)}
    if cmp is not None:
        payload["comparison"] = cmp.to_dict()
    return json.dumps(payload, indent=2, default=str) + "\n"
