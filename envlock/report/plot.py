"""The metric plots of a report page, and the one module of envlock that imports the plotting
library: matplotlib, the ``report`` extra (``pip install 'envlock-ml[report]'``).

matplotlib draws through its SVG backend without a display, a browser or a network: the
``<svg>`` it writes holds the curves as paths and the words as ``<text>`` (``svg.fonttype``
"none"), which a page inlines and a reader opens years later. The same figure through Agg is
the PNG the GitHub Action puts in its job summary. Without the extra the command that asks
for a plot stops with exit 2 and names the extra; everything else in envlock works without it
(a test checks that no other module imports it).

A run of 100,000 steps is drawn from at most ``MAX_DRAWN`` buckets per curve, each as its
lowest and highest value (a spike survives; a mean would hide it), and the difference as each
bucket's largest: the page says so. The verdict is never made from what is drawn.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envlock.errors import UsageError
from envlock.text.terminal import safe

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

EXTRA = "envlock-ml[report]"
# Buckets a curve is drawn from: twice as many points (each bucket's lowest and highest), a few
# hundred KiB of SVG per metric at most, a page of five metrics well under 2 MiB.
MAX_DRAWN = 1000
ORIGINAL, REPLAY, MARK = "#1f5fa8", "#d9480f", "#c92a2a"


@dataclass(frozen=True)
class Series:
    """One metric over its steps: the original's values, the replay's (absent when a page
    shows one record), and the step of the first divergence to mark (None: no mark). A value
    that is no finite number is NaN (a gap in the curve)."""

    name: str
    steps: Sequence[int]
    original: Sequence[float]
    replay_steps: Sequence[int] | None = None
    replay: Sequence[float] | None = None
    marked: int | None = None
    diverged_here: bool = False  # this metric is the one the first divergence names


def missing() -> UsageError:
    """The error of a plot asked for without the extra: exit 2, with what to install."""
    return UsageError(f"drawing the metric plots needs the extra {EXTRA} (matplotlib), which is "
                      "not installed here",
                      hint=f"pip install '{EXTRA}' (or add matplotlib to this environment)")


def require() -> Any:
    """matplotlib, or the error that names the extra (exit 2)."""
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError:
        raise missing() from None
    return matplotlib


def downsampled(steps: Sequence[int], values: Sequence[float], limit: int = MAX_DRAWN,
                keep: str = "range") -> tuple[list[float], list[float]]:
    """At most ``2 * limit`` points of a curve, in step order: each of ``limit`` buckets as its
    lowest and highest finite value (``keep="range"``) or its highest alone (``"max"``, the
    difference panel); NaN kept as one gap per bucket that has no number. Short curves whole."""
    import numpy as np

    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    n = len(y)
    if n <= 2 * limit:
        return x.tolist(), y.tolist()
    size = math.ceil(n / limit)
    pad = size * math.ceil(n / size) - n
    xs = np.concatenate([x, np.full(pad, np.nan)]).reshape(-1, size)
    ys = np.concatenate([y, np.full(pad, np.nan)]).reshape(-1, size)
    finite = np.isfinite(ys)
    has = finite.any(axis=1)
    hi = np.where(finite, ys, -np.inf).argmax(axis=1)
    rows = np.arange(len(ys))
    if keep == "max":
        idx = hi[:, None]
    else:
        lo = np.where(finite, ys, np.inf).argmin(axis=1)
        idx = np.sort(np.stack([lo, hi], axis=1), axis=1)
    px = xs[rows[:, None], idx]
    py = np.where(has[:, None], ys[rows[:, None], idx], np.nan)
    px[~has] = xs[~has, :1]  # a bucket with no number: one gap at its first step
    return px.ravel().tolist(), py.ravel().tolist()


def is_downsampled(series: Sequence[Series], limit: int = MAX_DRAWN) -> bool:
    return any(len(s.steps) > 2 * limit or len(s.replay_steps or ()) > 2 * limit for s in series)


def _difference(s: Series) -> tuple[list[int], list[float]]:
    """|replay - original| over the rows both runs recorded at the same step."""
    assert s.replay is not None and s.replay_steps is not None
    steps, diff = [], []
    for a_step, b_step, a, b in zip(s.steps, s.replay_steps, s.original, s.replay, strict=False):
        if a_step == b_step:
            steps.append(a_step)
            diff.append(abs(b - a))
    return steps, diff


def _mark(ax: Axes, s: Series) -> None:
    if s.marked is not None:
        ax.axvline(s.marked, color=MARK, linestyle=":", linewidth=1.2,
                   label=f"first divergence (step {s.marked})")


def _curves(ax: Axes, s: Series, limit: int) -> None:
    x, y = downsampled(s.steps, s.original, limit)
    ax.plot(x, y, color=ORIGINAL, linewidth=1.0, label="original")
    if s.replay is not None and s.replay_steps is not None:
        x, y = downsampled(s.replay_steps, s.replay, limit)
        ax.plot(x, y, color=REPLAY, linewidth=1.0, linestyle="--", label="replay")
    _mark(ax, s)
    # A metric name is the user's: shown as written, never read as mathtext ($...$) or TeX, a
    # control character as its escape (XML cannot hold one; a font has no glyph for it).
    title = safe(s.name) + ("  (the first divergence)" if s.diverged_here else "")
    ax.set_title(title, loc="left", fontsize=10, parse_math=False)
    ax.set_xlabel("step")
    ax.legend(loc="best", fontsize=8, frameon=False)


def _difference_panel(ax: Axes, s: Series, limit: int) -> None:
    steps, diff = _difference(s)
    positive = [d for d in diff if d > 0 and math.isfinite(d)]
    ax.set_title("|replay - original|, log scale", loc="left", fontsize=10)
    ax.set_xlabel("step")
    if not positive:
        ax.text(0.5, 0.5, "no difference at any step", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, parse_math=False)
        ax.set_yticks([])
        ax.set_xticks([])
        return
    x, y = downsampled(steps, [d if d > 0 else math.nan for d in diff], limit, keep="max")
    ax.plot(x, y, color=MARK, linewidth=1.0)
    ax.set_yscale("log")
    _mark(ax, s)


def figure(series: Sequence[Series], limit: int = MAX_DRAWN) -> Figure:
    """One row per metric: its curves, and beside them the difference on a log scale (when a
    replay is drawn)."""
    figure_class: type[Figure] = require().figure.Figure
    pairs = any(s.replay is not None for s in series)
    rows = max(len(series), 1)
    fig = figure_class(figsize=(11 if pairs else 7, 2.9 * rows), layout="constrained")
    axes = fig.subplots(rows, 2 if pairs else 1, squeeze=False)
    for row, s in zip(axes, series, strict=False):
        _curves(row[0], s, limit)
        if pairs and s.replay is not None:
            _difference_panel(row[1], s, limit)
        elif pairs:
            row[1].set_axis_off()
    if is_downsampled(series, limit):
        fig.suptitle(f"every step was compared; drawn from at most {limit} buckets per curve "
                     "(each bucket's lowest and highest value; the difference's highest)",
                     x=0.01, ha="left", fontsize=7, color="#555555", parse_math=False)
    return fig


_RC = {"text.usetex": False, "svg.fonttype": "none", "font.family": "sans-serif",
       "axes.spines.top": False, "axes.spines.right": False}


def svg(series: Sequence[Series], *, salt: str = "envlock", limit: int = MAX_DRAWN) -> str:
    """The figure as an ``<svg>`` element (no XML prolog: it is inlined in a page, or a file
    of its own). ``salt``: what matplotlib derives the element ids from, distinct per figure
    of a page so two inlined figures never share an id; fixed, so a page is the same bytes
    every time it is written from the same record."""
    with require().rc_context({**_RC, "svg.hashsalt": salt}):
        fig = figure(series, limit)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def png(series: Sequence[Series], *, dpi: int = 80, limit: int = MAX_DRAWN) -> bytes:
    """The figure as PNG (Agg): for a place that takes an image and no HTML."""
    with require().rc_context(_RC):
        fig = figure(series, limit)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()
