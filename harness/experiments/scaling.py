"""Scaling study (``commbench reproduce scaling``): how payload bytes, messages,
peak memory and time per step grow with model size and with world size, for
each algorithm family (pipeline, zeroth order, DistZO2, protocol, double
quantisation).

Model size runs over three existing presets of one family (tiny-opt, small-opt
and the OPT-125M shape); the double-quantisation problems (logistic regression
on cancer and digits, the digits MLP) are its three problem sizes.  Every row
carries its growth over the first (smallest) row of its series, so the shape
of the growth reads off the table; ``scaling.png`` plots bytes per step
against parameter count and world size on log axes.

At ``--scale tiny`` all ranks are threads of one process (a gloo process per
rank costs seconds of start-up, more than the whole budget allows), so peak
RSS is the whole world's; ``--scale small`` runs the multi-rank transformer
runs on gloo, one process per rank, where peak RSS is per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.models import PRESETS, default_boundaries, model_info
from harness.registry import make_config
from harness.reporting import Column, Table
from harness.reporting.plots import save_figure
from harness.stats import CI95, IQR, median_iqr, ratio_of_medians

from .registry import experiment
from .runner import run_and_save

SIZES = ("tiny-opt", "small-opt", "opt-125m")
DQ_PROBLEMS = ("logreg-cancer", "logreg-digits", "mlp-digits")
ZO = dict(lr=1e-4, mu=1e-3, mode="inplace")  # in place: no parameter copy, as the other ZO experiments
DQ = dict(m=30)  # fixed updates per epoch, so bytes vary only with d and W


@dataclass(frozen=True)
class Run:
    axis: str  # "size" or "world": which table the run belongs to
    family: str
    cfg: object  # a RunConfig

    @property
    def series(self) -> tuple[str, str, str]:
        return self.axis, self.family, self.cfg.algorithm


@cache
def num_parameters(model: str) -> int:
    """Parameters of a transformer preset, or the dimension d of a double-quantisation problem."""
    if model in DQ_PROBLEMS:
        from algorithms.dataparallel.problems import make_problem

        return make_problem(model).d

    return model_info(model)["num_parameters"]


def _setup(scale: str) -> dict:
    if scale == "tiny":
        # batch 4 splits into 4 DDP shards; the 125M shape gets one step (its ZO steps take seconds)
        return dict(backend="threads", steps=3, big_steps=1, batch=4, seq=16, world_model="tiny-opt")
    return dict(backend="gloo", steps=5, big_steps=2, batch=8, seq=32, world_model="small-opt")


def plan(scale: str) -> list[Run]:
    """Every run of the study, each series smallest first (its first row is the ratio's base)."""

    s = _setup(scale)

    def lm(axis, family, algo, model, world, params=None):
        backend = s["backend"] if world > 1 else "threads"
        steps = s["big_steps"] if model == SIZES[-1] else s["steps"]
        return Run(axis, family, make_config(
            algo, model=model, data="wiki-en", world_size=world, backend=backend, steps=steps, seed=0,
            batch_size=s["batch"], seq_len=s["seq"], micro_batches=2, params=params))

    def dq(axis, problem, workers):
        # one master + W workers; always threads: these rows are about bytes and time, not RSS
        return Run(axis, "double-quant", make_config(
            "asylpg", model=problem, world_size=workers + 1, backend="threads", steps=2, seed=0,
            params=DQ))

    def sparq(model, world):
        # even FFN-activation cuts, as SparQ's own methods table: no calibration pass choosing them
        # (one at the 125M shape costs more than its measured step)
        cuts = default_boundaries(PRESETS[model].num_blocks, world, "ffn_act")
        return dict(ZO, split=",".join(map(str, cuts)))

    wm = s["world_model"]
    runs = []
    for algo in ("pipeline-sgd", "clapping-fc"):
        runs += [lm("size", "pipeline", algo, m, 2) for m in SIZES]
        runs += [lm("world", "pipeline", algo, wm, w) for w in (2, 3, 4)]
    runs += [lm("size", "zo", "mezo", m, 1, ZO) for m in SIZES]
    runs += [lm("size", "zo", "sparq", m, 2, sparq(m, 2)) for m in SIZES]
    runs += [lm("world", "zo", "mezo", wm, 1, ZO)] + [lm("world", "zo", "sparq", wm, w, sparq(wm, w))
                                                      for w in (2, 3, 4)]
    runs += [lm("size", "distzo2", "distzo2-ddp", m, 2, ZO) for m in SIZES]
    runs += [lm("world", "distzo2", "distzo2-ddp", wm, w, ZO) for w in (2, 4)]  # batch splits in w shards
    runs += [lm("size", "protocol", "protocol", m, 2) for m in SIZES]
    runs += [lm("world", "protocol", "protocol", wm, w) for w in (2, 3, 4)]
    runs += [dq("size", p, 2) for p in DQ_PROBLEMS]
    runs += [dq("world", "mlp-digits", w) for w in (2, 4, 8)]
    return runs


def _release_heap() -> None:
    """Hand freed heap back to the OS between in-process runs: otherwise the pages a large run
    freed stay resident and count in every later threads run's peak RSS (glibc only)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(runs: list[Run], run_dir: Path, quiet: bool) -> list[tuple[Run, object]]:
    """Run each config and keep its result record (also written under ``run_dir``)."""
    out = []
    for run in runs:
        _release_heap()
        rec = run_and_save(run.cfg, run_dir / f"{run.axis}-{run.cfg.algorithm}-{run.cfg.model}-w{run.cfg.world_size}.json",
                           quiet)
        out.append((run, rec))
    return out


def _ratio(x, base):
    return x / base if x is not None and base else None


def rows_for(results: list[tuple[Run, object]]) -> list[dict]:
    """One row per run, with growth factors over the first run of the same series."""
    rows, base = [], {}
    for run, rec in results:
        m = {k: v.value for k, v in rec.metrics.items()}
        cfg = run.cfg
        size = num_parameters(cfg.model)
        x = size if run.axis == "size" else cfg.world_size
        times = rec.history["step_time_s"]
        vals = (x, m["payload_bytes_per_step"])
        ref, ref_times = base.setdefault(run.series, (vals, times))
        x_ratio, bytes_ratio = (_ratio(v, r) for v, r in zip(vals, ref, strict=True))
        time_ratio = ratio_of_medians([times], [ref_times])
        rows.append(dict(axis=run.axis, family=run.family, algorithm=cfg.algorithm, model=cfg.model, params=size,
                         world=cfg.world_size, backend=rec.backend, payload=m["payload_bytes_per_step"],
                         messages=m["messages_per_step"], peak_mem=m["peak_memory_bytes"],
                         growth=m.get("peak_memory_growth_bytes"), step_time=median_iqr(times),
                         x_ratio=x_ratio, bytes_ratio=bytes_ratio, time_ratio=time_ratio))
    return rows


def columns(axis: str) -> list[Column]:
    what = "params" if axis == "size" else "ranks"
    return [Column("axis", "axis"), Column("family", "family"), Column("algorithm", "algorithm"),
            Column("model", "model / problem"), Column("params", "parameters", None, None, "si"),
            Column("world", "ranks"), Column("backend", "backend"),
            Column("payload", "payload bytes/step", "bytes", False),
            Column("messages", "messages/step", None, False),
            Column("peak_mem", "peak RSS (max rank)", "bytes", False),
            Column("growth", "peak growth in window (max rank)", "bytes", False),
            Column("step_time", "step time", "s", False, spread=f"{IQR} of the steps"),
            Column("x_ratio", f"{what} x", "ratio", None, ".3g"),
            Column("bytes_ratio", "bytes x", "ratio", False, ".3g"),
            Column("time_ratio", "step time x", "ratio", False, ".3g",
                   spread=f"ratio of median step times {CI95} resampling the steps of both runs")]


def tables_for(rows: list[dict], scale: str) -> list[Table]:
    s = _setup(scale)
    where = ("threads of one process: peak RSS is the whole world's" if s["backend"] == "threads"
             else "gloo, one process per rank (1-rank and double-quant runs: threads)")
    common = (f"wiki-en batch {s['batch']}x{s['seq']}, 2 micro-batches, {s['steps']} steps "
              f"({s['big_steps']} for {SIZES[-1]}); double-quant: asylpg, one step = one epoch of "
              f"{DQ['m']} master updates, 2 epochs, b=4, b_x=8; defaults otherwise (clapping-fc Top-10 % "
              f"both ways, p=0.5; sparq 4-bit, even FFN-activation cuts; protocol k=8; one perturbation); "
              f"ranks: {where}")
    size = Table(
        title="scaling with model size: bytes, memory and time per step",
        columns=columns("size"), rows=[r for r in rows if r["axis"] == "size"],
        caption=f"varied: the model ({', '.join(SIZES)}; 2 ranks, mezo 1) or the double-quant problem "
                f"({', '.join(DQ_PROBLEMS)}; 1 master + 2 workers); each 'x' column is the row's value over "
                f"the first row of its series (family, algorithm); {common}")
    world = Table(
        title="scaling with world size: bytes, memory and time per step",
        columns=columns("world"), rows=[r for r in rows if r["axis"] == "world"],
        caption=f"varied: the number of ranks (pipeline stages, SparQ nodes, DDP ranks; double-quant: 1 master + "
                f"2, 4, 8 workers on mlp-digits), model {s['world_model']}; 'x' columns over the first row "
                f"of each series; {common}",
        notes=["mezo (1 rank) sends nothing: its bytes ratio is undefined and its row is the ZO baseline",
               "DDP with 3 ranks is left out: the batch does not split into 3 equal shards"])
    return [size, world]


def plot(rows: list[dict], path: Path) -> str | None:
    """Bytes per step against parameter count and against world size, one line per series
    (rows as :func:`rows_for` makes them)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, axis, xcol, xlabel in ((axes[0], "size", "params", "parameters (problem dimension for double-quant)"),
                                   (axes[1], "world", "world", "ranks")):
        for series in dict.fromkeys((r["family"], r["algorithm"]) for r in rows if r["axis"] == axis):
            # zero bytes (a 1-rank run) has no place on a log axis
            pts = [(r[xcol], r["payload"]) for r in rows
                   if r["axis"] == axis and (r["family"], r["algorithm"]) == series and r["payload"] > 0]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label="/".join(series))
        ax.set_xscale("log", base=10 if axis == "size" else 2)
        if axis == "world":
            ranks = sorted({r["world"] for r in rows if r["axis"] == "world"})
            ax.set_xticks(ranks, [str(w) for w in ranks])
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("payload bytes per step")
        ax.set_title("against model size (fixed ranks)" if axis == "size" else "against ranks (fixed model)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("scaling: payload bytes per step of every family, log-log", fontsize=10)
    fig.tight_layout()
    try:
        save_figure(fig, Path(path))
    finally:
        plt.close(fig)
    return str(path)


@experiment("scaling")
def scaling(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    rows = rows_for(measure(plan(scale), out_dir / "scaling" / "runs", quiet))
    tables = tables_for(rows, scale)
    png = plot(rows, out_dir / "scaling.png")
    tables[-1].notes.append(f"plot: {png}" if png else "plot skipped: matplotlib is not installed")
    return tables
