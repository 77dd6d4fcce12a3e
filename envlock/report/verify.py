"""The parts of a verify report beyond the list of differences.

A summary that leads when many things differ (so the report reads in one screen), the pointer
to ``envlock restore`` for a lock of an image checked elsewhere, and the one line of recorded
process state (seeds, flags) that a fresh process does not have; and the lines of a
``--deep`` check (what was hashed, what was trusted on its stat) and of the torch-facts cache.
``render.verify_text`` and the verify command put them together; nothing here decides what
counts as drift.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from envlock.drift.result import Comparison, Difference, counts_text
from envlock.text.terminal import agree, dash, plural, safe

if TYPE_CHECKING:
    from envlock.lock import Lock

# Beyond this many lines a verify report leads with a summary and lists the first DETAIL_LINES.
SUMMARY_AFTER = 12
DETAIL_LINES = 15
_HEADLINE = ("python", "torch", "gpu", "image", "packages")


def _short(value: Any) -> str:
    text = dash(value)
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
    return counts_text(counts, zeros=False)


def _package_changes(pkgs: Iterable[Difference]) -> str:
    """What the package differences are, by what changed: "1 package removed, url removed in
    1 package, installer changed in 24 packages". A whole package added or removed is said so;
    a field is named ("1 removed" read as a missing package where a URL was removed)."""
    kinds: dict[tuple[str, str], int] = {}
    for d in pkgs:
        how = "added" if d.old is None else "removed" if d.new is None else "changed"
        table, _, rest = d.path.partition(".")
        field = rest.partition(".")[2]  # packages.NAME.FIELD; a package name holds no dot
        what = "shadowed copy" if table == "duplicates" else field or "package"
        kinds[(what, how)] = kinds.get((what, how), 0) + 1
    parts = []
    # Whole packages first, then shadowed copies, then the fields that changed most often.
    order = {"package": 0, "shadowed copy": 1}
    for (what, how), n in sorted(kinds.items(), key=lambda kv: (order.get(kv[0][0], 2), -kv[1])):
        if what == "shadowed copy":
            parts.append(f"{plural(n, what, 'shadowed copies')} {'gone' if how == 'removed' else 'appeared'}")
        elif what == "package":
            parts.append(f"{plural(n, 'package')} {how}")
        else:
            parts.append(f"{what} {how} in {plural(n, 'package')}")
    return ", ".join(parts)


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
        rows.append(("torch", ", ".join(f"{label}{dash(v)}" for label, _, v in stack) + " (unchanged)"
                     if t else "not in the lock"))
    else:
        rows.append(("torch", ", ".join(
            f"{label}{_short(changed[p].old)} -> {_short(changed[p].new)}" if p in changed
            else f"{label}{dash(v)}" for label, p, v in stack)))
    if lock.gpu or cmp.by_category("gpu"):
        rows.append(("driver", _change(cmp, "gpu.driver", lock.gpu.driver if lock.gpu else None)))
    img = lock.image
    if img.digest or img.id or cmp.by_category("image"):
        path = "image.id" if any(d.path == "image.id" for d in cmp.differences) else "image.digest"
        rows.append(("image", _change(cmp, path, img.digest or img.id)))
    pkgs = cmp.by_category("packages")
    if pkgs:
        rows.append(("packages", f"{_severity_counts(pkgs)} ({_package_changes(pkgs)})"))
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


def deep_summary(report: dict[str, Any] | None) -> str:
    """One line: what was checked, and how much of it was read again or taken on its stat."""
    if not report:
        return ""
    secs = max(report.get("seconds", 0.0), 1e-6)
    files = report.get("files", 0)
    gb = report.get("bytes", 0) / 1e9
    cached = report.get("cached_files", 0)
    bad = len(report.get("dists", {}))
    if cached:
        # Said in full: a user who suspects more than an edit needs to know what was trusted.
        head = (f"deep: {plural(files, 'file')} ({gb:.2f} GB) in {secs:.2f}s; "
                f"{report.get('hashed_files', files - cached)} re-hashed, {cached} unchanged "
                f"since the last check by size/mtime/ctime (--no-cache re-hashes all); ")
    else:
        head = (f"deep: {plural(files, 'file')}, {gb:.2f} GB hashed in {secs:.2f}s "
                f"({gb / secs:.2f} GB/s, {plural(report.get('workers', 1), 'worker')}); ")
    return head + (f"{plural(bad, 'distribution')} {agree(bad, 'differs', 'differ')} from RECORD" if bad
                   else "every file matches RECORD") + "\n"


def torch_facts_line(lock: Lock) -> str:
    """Whether the torch facts were imported live or taken from the cache, so a user who
    suspects the cache knows what to rerun with."""
    facts = lock.probe.torch_facts
    if facts == "cached":
        return "torch facts: cached (nothing torch depends on changed; --no-cache re-imports)\n"
    if facts == "live":
        return "torch facts: live (torch imported)\n"
    return ""
