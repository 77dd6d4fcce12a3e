"""Human output: text for terminals, markdown for papers and pull requests, JSON for machines.

Rendering only; nothing here decides what counts as drift (that is ``compare``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from envlock.drift import Comparison, Difference
from envlock.model import Lock

_SEVERITY_LABEL = {"breaking": "BREAKING", "warning": "warning", "info": "info"}
# What a lock may hold but a terminal must never receive raw: C0 controls (ESC starts escape
# sequences that retitle windows, rewrite lines or fake hyperlinks), DEL, C1 controls (CSI and
# OSC have one-byte forms), line and paragraph separators, and the Unicode bidi controls that
# display text in another order than it is stored. JSON output is escaped by json already.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe(value: Any) -> str:
    """``value`` as text a terminal shows literally: every control character escaped, a
    newline in a value included (it would otherwise forge a line of output)."""
    text = str(value)
    return _UNSAFE_RE.sub(_escape, text) if _UNSAFE_RE.search(text) else text


def _dash(value: Any) -> str:
    return "-" if value in (None, "", []) else safe(value)


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
        rows.append(("torch", f"{t.version}  CUDA {_dash(t.cuda)}  cuDNN {_dash(t.cudnn)}  NCCL {_dash(t.nccl)}"
                     + (f"  HIP {t.hip}" if t.hip else "")))
    else:
        rows.append(("torch", "not captured"))
    if lock.gpu and lock.gpu.devices:
        names: dict[str, int] = {}
        for dev in lock.gpu.devices:
            names[dev.name] = names.get(dev.name, 0) + 1
        gpus = ", ".join(f"{n} x {name}" for name, n in names.items())
        rows.append(("gpu", f"{gpus} (driver {_dash(lock.gpu.driver)}, CUDA driver {_dash(lock.gpu.cuda_driver)})"))
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
    if lock.os_packages is not None:
        rows.append(("os packages", f"{len(lock.os_packages.packages)} ({lock.os_packages.manager})"))
    d = lock.determinism
    if d.torch_loaded:
        rows.append(("determinism",
                     f"deterministic_algorithms {_flag(d.deterministic_algorithms)}, "
                     f"cudnn.deterministic {_flag(d.cudnn_deterministic)}, "
                     f"cudnn.benchmark {_flag(d.cudnn_benchmark)}, "
                     f"tf32 matmul {_flag(d.cuda_matmul_allow_tf32)}, "
                     f"float32_matmul_precision {_dash(d.float32_matmul_precision)}"))
    if d.env:
        rows.append(("numerics env", ", ".join(f"{k}={v}" for k, v in d.env.items())))
    s = lock.seeds
    seed_bits = [f"seed {s.seed}" if s.seed is not None else "seed not set through envlock"]
    seed_bits.append(f"PYTHONHASHSEED={s.python_hash_seed}" if s.python_hash_seed is not None else "hash randomization on")
    rows.append(("seeds", ", ".join(seed_bits)))
    if lock.canary:
        rows.append(("canary", f"{len(lock.canary.results)} kernels hashed"))
    if lock.git:
        g = lock.git
        state = []
        if g.dirty:
            state.append("dirty")
        if g.untracked:
            state.append(f"{g.untracked} untracked")
        rows.append(("git", f"{_dash(g.branch)} @ {(g.commit or '-')[:12]}" + (f" ({', '.join(state)})" if state else "")))
    if lock.probe.errors:
        rows.append(("not captured", "; ".join(f"{k}: {v}" for k, v in sorted(lock.probe.errors.items()))))
    if lock.envlock.note:
        rows.append(("note", lock.envlock.note))
    return rows


def show_text(lock: Lock, name: str = "env.lock") -> str:
    rows = summary_rows(lock)
    width = max(len(k) for k, _ in rows)
    return "\n".join([safe(name)] + [f"  {k.ljust(width)}  {safe(v)}" for k, v in rows]) + "\n"


def _md_cell(value: Any) -> str:
    return safe(value).replace("|", "\\|")


def show_markdown(lock: Lock, name: str = "env.lock") -> str:
    out = [f"#### Environment `envlock:{lock.short_id}`", "", "| | |", "|---|---|"]
    out += [f"| {k} | {_md_cell(v)} |" for k, v in summary_rows(lock) if k != "id"]
    out += ["", f"<details><summary>{len(lock.packages)} packages</summary>", "",
            "| package | version | source |", "|---|---|---|"]
    out += [f"| {p.name} | {_md_cell(p.version)} | {p.source} |" for p in lock.packages]
    out += ["", "</details>", "",
            f"Fingerprint `{lock.envlock.fingerprint}`. Check an environment against it with "
            f"`envlock verify {_md_cell(name)}`; rebuild it with `envlock restore {_md_cell(name)}`.", ""]
    return "\n".join(out)


def show_json(lock: Lock) -> str:
    return json.dumps(lock.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def differences_text(differences: Iterable[Difference]) -> str:
    rows = [(_SEVERITY_LABEL[d.severity], safe(d.path), safe(d.describe())) for d in differences]
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"  {r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows) + "\n"


def counts_line(cmp: Comparison) -> str:
    return f"{cmp.count('breaking')} breaking, {cmp.count('warning')} warning, {cmp.count('info')} info"


# Beyond this many lines a verify report leads with a summary and lists the first DETAIL_LINES.
SUMMARY_AFTER = 12
DETAIL_LINES = 15
_HEADLINE = ("python", "torch", "gpu", "image", "packages")


def _short(value: Any) -> str:
    text = _dash(value)
    return text[:19] + "…" if text.startswith("sha256:") and len(text) > 20 else text


def _change(cmp: Comparison, path: str, recorded: Any) -> str:
    for d in cmp.differences:
        if d.path == path:
            return f"{_short(d.old)} -> {_short(d.new)}"
    return f"{_short(recorded)} (unchanged)"


def _severity_counts(diffs: Iterable[Difference]) -> str:
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.severity] = counts.get(d.severity, 0) + 1
    return ", ".join(f"{counts[s]} {s}" for s in ("breaking", "warning", "info") if s in counts)


def verify_summary(cmp: Comparison, lock: Lock) -> str:
    """The few facts that decide whether two environments are the same stack, then counts."""
    rows = [("python", _change(cmp, "python.version", lock.python.version))]
    t = lock.torch
    stack = [("", "torch.version", t.version if t else None), ("CUDA ", "torch.cuda", t.cuda if t else None),
             ("cuDNN ", "torch.cudnn", t.cudnn if t else None)]
    changed = {d.path: d for d in cmp.differences if d.path in ("torch", *(p for _, p, _ in stack))}
    if "torch" in changed:
        rows.append(("torch", f"{_short(changed['torch'].old)} -> {_short(changed['torch'].new)}"))
    elif not changed:
        rows.append(("torch", ", ".join(f"{label}{_dash(v)}" for label, _, v in stack) + " (unchanged)"
                     if t else "not in the lock"))
    else:
        rows.append(("torch", ", ".join(
            f"{label}{_short(changed[p].old)} -> {_short(changed[p].new)}" if p in changed
            else f"{label}{_dash(v)}" for label, p, v in stack)))
    if lock.gpu or cmp.by_category("gpu"):
        rows.append(("driver", _change(cmp, "gpu.driver", lock.gpu.driver if lock.gpu else None)))
    img = lock.image
    if img.digest or img.id or cmp.by_category("image"):
        path = "image.id" if any(d.path == "image.id" for d in cmp.differences) else "image.digest"
        rows.append(("image", _change(cmp, path, img.digest or img.id)))
    pkgs = cmp.by_category("packages")
    if pkgs:
        added = sum(1 for d in pkgs if d.old is None)
        removed = sum(1 for d in pkgs if d.new is None)
        kinds = [f"{n} {what}" for n, what in ((added, "added"), (removed, "removed"),
                                                (len(pkgs) - added - removed, "changed")) if n]
        rows.append(("packages", f"{_severity_counts(pkgs)} ({', '.join(kinds)})"))
    else:
        rows.append(("packages", f"{len(lock.packages)} (unchanged)"))
    # Every other category (platform, OS packages, determinism variables, ...) as counts.
    seen: list[str] = []
    for d in cmp.differences:
        if d.category not in _HEADLINE and d.category not in seen:
            seen.append(d.category)
    rows += [(c.replace("_", " "), _severity_counts(cmp.by_category(c))) for c in seen]
    width = max(len(k) for k, _ in rows)
    return "  summary:\n" + "".join(f"    {k.ljust(width)}  {v}\n" for k, v in rows)


def image_hint(cmp: Comparison, lock: Lock, name: str) -> str:
    """A lock of an image, checked somewhere else: point at the way to check the image."""
    img = lock.image
    if not (img.digest or img.id) or not cmp.by_category("image"):
        return ""
    ref = safe(img.reference or "") + ("@" if img.reference else "") + _short(img.digest or img.id)
    name = safe(name)
    return (f"  {name} describes the image {ref}, and this is not that image: "
            f"`envlock restore {name}` rebuilds it and checks it from inside\n")


# The process state a reader looks for first; everything else follows in lock order.
_PROCESS_FIRST = ("seed", "deterministic_algorithms", "deterministic_warn_only",
                  "cudnn_deterministic", "cudnn_benchmark")


def _process_items(cmp: Comparison) -> list[str]:
    items: dict[str, str] = {}
    precision: dict[str, int] = {}  # fp32_precision / allow_tf32 knobs move together: one item
    for d in cmp.process:
        key = d.path.rsplit(".", 1)[-1]
        if d.old is None or key in items or key in ("seed_source", "late", "process_env", "ENVLOCK_SEED_WORKERS"):
            continue
        if key == "seed":
            items[key] = f"seed {d.old}"
        elif key in ("torch_initial_seed", "ENVLOCK_SEED"):
            items.setdefault("seed", f"seed {d.old}")
        elif d.path.startswith(("env.", "determinism.env.")):
            items[key] = f"{safe(key)}={safe(d.old)}"
        elif key.endswith("fp32_precision") or key.endswith("allow_tf32"):
            label = f"{'TF32' if key.endswith('allow_tf32') else 'fp32 precision'} {_value(d.old)}"
            precision[label] = precision.get(label, 0) + 1
        else:
            items[key] = f"{key.replace('_', ' ')} {_value(d.old)}"
    first = [items.pop(k) for k in _PROCESS_FIRST if k in items]
    grouped = [f"{label} ({n} settings)" if n > 1 else label for label, n in precision.items()]
    return first + list(items.values()) + grouped


def _value(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else safe(value)


def process_state_text(cmp: Comparison) -> str:
    """What the lock's process set (seeds, flags, variables), which a fresh process lacks."""
    items = _process_items(cmp)
    if not items:
        return ""
    more = f", and {len(items) - 6} more" if len(items) > 6 else ""
    return (f"  process state recorded (not compared: only the capturing process had it): "
            f"{', '.join(items[:6])}{more} - replay with envlock.apply() or `envlock run`\n")


def verify_text(cmp: Comparison, lock: Lock, name: str, *, show_info: bool = False,
                environment: str | None = None, captured_from: str | None = None) -> str:
    """The verify report. ``environment`` says what was checked and why ("./.venv
    (VIRTUAL_ENV)"); ``captured_from`` is the lock's own environment when it exists here but
    another one was checked: the one line that explains a wall of drift."""
    shown = [d for d in cmp.differences if show_info or d.severity != "info"]
    against = f" against {safe(environment)}" if environment else ""
    head = f"{safe(name)} (id {lock.short_id}){against}: {counts_line(cmp)}\n"
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
        tail = f"  ({left} more differences; --all lists every one)\n" if left else ""
    else:
        body = differences_text(shown)
        tail = f"  ({hidden} info differences hidden; --all shows them)\n" if hidden and body else ""
    tail += image_hint(cmp, lock, name) + process_state_text(cmp)
    if cmp.ok:
        verdict = "OK: the environment matches the lock\n"
    elif cmp.breaking:
        verdict = f"DRIFT: {len(cmp.breaking)} breaking difference(s)\n"
    else:
        verdict = f"DRIFT: {cmp.count('warning')} warning(s), which count as drift with --strict\n"
    return head + body + tail + verdict


def diff_text(cmp: Comparison, a: str, b: str) -> str:
    if not cmp.differences:
        return f"{safe(a)} and {safe(b)} describe the same environment\n"
    return f"{safe(a)} -> {safe(b)}: {counts_line(cmp)}\n" + differences_text(cmp.differences)


def diff_markdown(cmp: Comparison, a: Lock, b: Lock, a_name: str, b_name: str) -> str:
    out = [f"#### Environment diff `envlock:{a.short_id}` → `envlock:{b.short_id}`", ""]
    if not cmp.differences:
        return "\n".join([*out, "No differences.", ""])
    out += [f"{counts_line(cmp)} ({_md_cell(a_name)} → {_md_cell(b_name)})", "",
            "| severity | what | before | after |", "|---|---|---|---|"]
    for d in cmp.differences:
        out.append(f"| {d.severity} | `{_md_cell(d.path)}` | {_md_cell(_dash(d.old))} | {_md_cell(_dash(d.new))} |")
    out.append("")
    return "\n".join(out)


def comparison_json(cmp: Comparison, **extra: Any) -> str:
    return json.dumps({**extra, **cmp.to_dict()}, indent=2, default=str) + "\n"
