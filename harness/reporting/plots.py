"""PNG plots where a picture reads better than a table.

matplotlib is optional (the ``bench`` extra): every function returns the path
it wrote, or None when matplotlib is missing; :func:`note` turns either into
the line an experiment adds to its table's notes.  The Agg backend is used so
plots render on headless machines.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SKIPPED = "plot skipped: matplotlib is not installed"


def note(path: str | None) -> str:
    """The table note for a plot: where it is, or why there is none."""
    return f"plot: {path}" if path else SKIPPED


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, **kw) -> Path:
    """Render ``fig`` as PNG and write it atomically: only a regular file is ever replaced
    (a device node, FIFO or socket at ``path`` is refused, a link followed)."""
    import io

    from harness.results import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, **kw)
    return atomic_write(path, buf.getvalue())


def _save(fig, plt, path: Path, tight: bool = True) -> str:
    if tight:
        fig.tight_layout()
    try:
        save_figure(fig, Path(path), bbox_inches="tight")  # keeps legends placed outside the axes
    finally:
        plt.close(fig)
    return str(path)


def _styles():
    """Distinct (colour, linestyle) pairs: ten colours, then the colours again dashed."""
    colours = [f"C{i}" for i in range(10)]
    return itertools.cycle([(c, ls) for ls in ("-", "--", ":") for c in colours])


# --------------------------------------------------------------------------- loss curves
@dataclass
class Curve:
    """One run's training curve.

    ``steps``: the x of each loss value (default 1..n, one loss per step);
    ``step_time_s``: measured seconds of each step, aligned with ``loss``
    (the wall-clock panel is their running sum); ``bits``: cumulative bits on
    the wire at each loss value.
    """

    label: str
    loss: Sequence[float]
    steps: Sequence[float] | None = None
    step_time_s: Sequence[float] | None = None
    bits: Sequence[float] | None = None


def curve_from_record(label: str, rec) -> Curve:
    """A run's loss per step and its slowest rank's measured step times (record history)."""
    loss = rec.history["loss"]
    times = rec.history.get("step_time_s")
    # A loss logged other than once per step has no step time of its own: no wall-clock line.
    return Curve(label, loss, step_time_s=times if times and len(times) == len(loss) else None)


def _cumsum(xs: Iterable[float]) -> list[float]:
    return list(itertools.accumulate(xs))


def running_mean(xs: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    sums = [0.0, *_cumsum(xs)]
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(window, i + 1) for i in range(len(xs))]


def plot_loss_curves(series: Sequence[Curve], path: Path, title: str, hline: float | None = None,
                     step_label: str = "training step",
                     bits_label: str = "bits on the wire (cumulative)", smooth: bool = True) -> str | None:
    """Loss vs step, vs wall-clock seconds (when step times are known) and vs bits (when
    bits are known), one line per run; ``hline`` marks a loss threshold; the labels name
    the step and bits axes.

    Per-step losses of small batches are noisy and the runs overlap, so with
    ``smooth`` long curves (40 points or more) are drawn faint with their running
    mean over 5 % of the longest run solid on top; the figure says so.  Pass
    ``smooth=False`` for exact (full-objective) losses.
    """
    plt = _pyplot()
    if plt is None:
        return None
    panels = [("step", step_label)]
    if any(c.step_time_s for c in series):
        panels.append(("wall", "wall-clock seconds (sum of measured step times, slowest rank)"))
    if any(c.bits for c in series):
        panels.append(("bits", bits_label))
    longest = max((len(c.loss) for c in series), default=0)
    window = max(1, round(longest / 20)) if smooth and longest >= 40 else 1
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 1.5, 4.2), squeeze=False)
    for c, (colour, ls) in zip(series, _styles(), strict=False):
        xs = {"step": list(c.steps) if c.steps is not None else list(range(1, len(c.loss) + 1)),
              "wall": _cumsum(c.step_time_s) if c.step_time_s else None,
              "bits": list(c.bits) if c.bits else None}
        for ax, (kind, _) in zip(axes[0], panels, strict=True):
            if xs[kind] is None:
                continue
            if window > 1:
                ax.plot(xs[kind], c.loss, color=colour, ls=ls, lw=0.6, alpha=0.25)
            ax.plot(xs[kind], running_mean(c.loss, window), color=colour, ls=ls, lw=1.4, label=c.label)
    for ax, (kind, xlabel) in zip(axes[0], panels, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss" + (f" (running mean of {window})" if window > 1 else ""))
        ax.grid(True, alpha=0.3)
        if kind == "bits":
            ax.set_xscale("log")
        if hline is not None:
            ax.axhline(hline, color="grey", lw=0.8, ls="--")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title + (f"\nfaint: every logged loss; solid: running mean of the last {window}"
                          if window > 1 else ""), fontsize=10)
    return _save(fig, plt, path)


# --------------------------------------------------------------------------- bandwidth sweep
def _point(v) -> tuple[float, float, float]:
    """(value, lo, hi) of a number or an Interval; a lower bound above the value (a bootstrap
    interval of a ratio need not contain the point) draws no bar below it."""
    if hasattr(v, "lo"):
        return v.value, min(v.lo, v.value), max(v.hi, v.value)
    return v, v, v


def plot_bandwidth(rows: list[dict], path: Path, shaper: str = "tc tbf") -> str | None:
    """Bandwidth sweep rows ``{method, bandwidth, step, speedup[, speedup_paper]}`` (a rate such
    as "80mbit", seconds per step, ratio; the two measured ones plain numbers or
    :class:`~harness.stats.Interval` s, drawn as error bars): time per step and speed-up over
    uncompressed against the rate, with the paper's speed-ups at its rates marked and labelled."""
    plt = _pyplot()
    if plt is None:
        return None
    from harness.config import parse_rate

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.4))
    for i, label in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = [r for r in rows if r["method"] == label]
        pts = sorted(((parse_rate(r["bandwidth"]), r["step"], r["speedup"]) for r in mine), key=lambda p: p[0])
        for ax, k in ((ax1, 1), (ax2, 2)):
            ys = [_point(p[k]) for p in pts]
            ax.errorbar([p[0] / 1e6 for p in pts], [y[0] for y in ys],
                        yerr=[[y[0] - y[1] for y in ys], [y[2] - y[0] for y in ys]], marker="o",
                        color=f"C{i}", label=label, capsize=3)
        paper = sorted((parse_rate(r["bandwidth"]), r["speedup_paper"]) for r in mine
                       if r.get("speedup_paper") is not None)
        if paper:
            ax2.scatter([p[0] / 1e6 for p in paper], [p[1] for p in paper], marker="*", s=120, color=f"C{i}",
                        edgecolor="black", zorder=3, label=f"{label}: paper")
            for x, y in paper:
                ax2.annotate(f"paper {y:.2f}x", (x / 1e6, y), textcoords="offset points", xytext=(6, 6),
                             fontsize=7)
    for ax, ylabel in ((ax1, "seconds per step (median)"), (ax2, "speed-up over uncompressed")):
        ax.set_xscale("log")
        ax.set_xlabel(f"link bandwidth [Mbit/s] ({shaper})")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_title("time per step")
    ax2.set_title("speed-up over the uncompressed pipeline")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7)
    fig.suptitle(f"bandwidth sweep: 2-stage pipelines, links shaped by {shaper}; "
                 "stars: the paper's speed-ups (Clapping Table 9)", fontsize=10)
    return _save(fig, plt, path)


# --------------------------------------------------------------------------- codec sizes
def plot_codec_sizes(rows: list[dict], path: Path) -> str | None:
    """Rows ``{codec, tensor, elements, payload, floor}`` (bytes).

    One panel per tensor kind: bits per element of the payload (solid) and of
    the floor (dashed) against elements, log-log (payload bytes / elements, so
    codecs of different rates separate and the header's share shows at small
    sizes); a last panel: bytes above the floor, in % of the floor, as bars.
    """
    plt = _pyplot()
    if plt is None:
        return None
    kinds = list(dict.fromkeys(r["tensor"] for r in rows))
    codecs = list(dict.fromkeys(r["codec"] for r in rows))
    markers = "osv^D<>pPX*h"
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(5 * len(kinds) + 6.5, 6))
    for ax, kind in zip(axes, kinds, strict=False):
        for i, codec in enumerate(codecs):
            pts = sorted((r["elements"], r["payload"], r["floor"]) for r in rows
                         if r["codec"] == codec and r["tensor"] == kind)
            xs = [p[0] for p in pts]
            c = f"C{i % 10}"
            ax.plot(xs, [8 * p[1] / p[0] for p in pts], color=c, marker=markers[i % len(markers)], ms=5,
                    mfc="none", lw=1.2, label=codec)
            ax.plot(xs, [8 * p[2] / p[0] for p in pts], color=c, ls="--", lw=0.9)
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.set(xlabel="elements", ylabel="bits per element",
               title=f"{kind}: payload (solid) vs floor (dashed)")
        ax.grid(True, which="both", alpha=0.3)
    ax = axes[-1]
    sizes = sorted({r["elements"] for r in rows})
    groups = [(kind, n) for kind in kinds for n in (sizes[0], sizes[-1])]
    height = 0.8 / len(groups)
    for j, (kind, n) in enumerate(groups):
        over = {r["codec"]: 100 * (r["payload"] / r["floor"] - 1) for r in rows
                if r["tensor"] == kind and r["elements"] == n}
        ax.barh([i + j * height for i in range(len(codecs))], [over.get(c, 0) for c in codecs],
                height=height, color=f"C{kinds.index(kind)}", alpha=0.45 if n == sizes[0] else 0.9,
                label=f"{kind}, {n:,} elements")
    ax.set_yticks([i + height * (len(groups) - 1) / 2 for i in range(len(codecs))], codecs, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set(xlabel="payload above the floor [% of floor]", title="overhead over the floor")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    # Figure-level legends under the panels (every region of the plots holds data);
    # _save keeps them in the picture with a tight bounding box.
    fig.tight_layout()
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, ncol=5, loc="upper left",
               bbox_to_anchor=(0.03, 0.0))
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, ncol=2, loc="upper right",
               bbox_to_anchor=(0.99, 0.0))
    fig.text(0.03, -0.1, "coinciding lines: codecs that send the same bytes for this input (identity = fp32 "
             "on float32, fp16 = bf16, topk = randk at the same k)", fontsize=7, va="top")
    return _save(fig, plt, path, tight=False)


# --------------------------------------------------------------------------- activation sparsity
ZERO_AT = 1e-4  # a log axis has no 0: an all-zero layer is drawn here


def plot_layer_nonzeros(panels: Sequence[tuple[str, float, dict[str, Sequence[float]]]],
                        path: Path) -> str | None:
    """SparQ Fig. 2 style: one panel per model, ``(title, paper_limit, {"<b>-bit, <quantiser>": ratio
    per layer})``; non-zero ratio against layer, log scale, one colour per bit width and one line style
    per quantiser; the paper's 4-bit limit as a dotted line."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 1.5, 4.4), squeeze=False)
    for ax, (title, limit, lines) in zip(axes[0], panels, strict=True):
        bits = list(dict.fromkeys(k.split(",")[0] for k in lines))
        quants = list(dict.fromkeys(k.split(", ", 1)[1] for k in lines))
        for label, ys in lines.items():
            b, qn = label.split(", ", 1)
            ax.plot(range(1, len(ys) + 1), [max(y, ZERO_AT) for y in ys], marker="o", ms=3,
                    color=f"C{bits.index(b)}", ls=("-", "--", ":")[quants.index(qn) % 3], label=label)
        ax.axhline(limit, color="black", lw=0.8, ls=":")
        ax.annotate(f"paper, 4-bit: < {limit:.0%}", (1, limit), textcoords="offset points", xytext=(2, 3),
                    fontsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_yscale("log")
        ax.set_ylim(ZERO_AT / 2, 1.2)
        ax.set(xlabel="layer", ylabel="non-zero ratio of the codes", title=title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"SparQ Fig. 2 on real activations: non-zero codes per layer (0 drawn at {ZERO_AT:g})",
                 fontsize=10)
    return _save(fig, plt, path)
