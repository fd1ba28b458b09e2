"""Bandwidth sweep (``commbench reproduce bandwidth``): time per step of each
pipeline algorithm at several shaped link rates, with both byte counts and
the speed-up of each compressed method over the uncompressed pipeline.

Each rank runs in its own network namespace with ``tc tbf`` on both
directions of its link (root only; without root the experiment says so and
produces no rows).  A PNG of time per step and speed-up against bandwidth is
written next to the tables.
"""

from __future__ import annotations

from pathlib import Path

from .experiments import experiment
from .tables import Column, Table

RATES = ("10mbit", "80mbit", "1gbit", "10gbit")
# (label, algorithm, params): the uncompressed pipeline first (the baseline)
METHODS = (
    ("uncompressed", "pipeline-sgd", {}),
    ("clapping-fc Top-10% p=0.5", "clapping-fc", {"p": 0.5}),
    ("protocol k=4", "protocol", {"k": 4}),
)


def _plot(rows: list[list], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from .config import parse_rate

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(r[0] for r in rows):
        pts = sorted((parse_rate(r[1]), r[5], r[6]) for r in rows if r[0] == label)
        ax1.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax2.plot([p[0] / 1e6 for p in pts], [p[2] for p in pts], marker="o", label=label)
    for ax, ylabel in ((ax1, "seconds per step (median)"), (ax2, "speed-up over uncompressed")):
        ax.set_xscale("log")
        ax.set_xlabel("link bandwidth [Mbit/s] (tc tbf)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


@experiment("bandwidth", "time per step vs shaped bandwidth (10 Mbit/s - 10 Gbit/s) for the uncompressed, "
                         "Clapping and Protocol pipelines, with payload and kernel wire bytes (root)")
def bandwidth_sweep(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    from .cli import run_with_progress
    from .netns import unavailable_reason
    from .registry import make_config
    from .results import write_result

    model, steps, seq = ("tiny-llama", 5, 256) if scale == "tiny" else ("small-llama", 10, 256)
    cols = [Column("method", "method"), Column("bandwidth", "bandwidth"),
            Column("payload", "payload bytes/step", "bytes", False),
            Column("wire", "wire bytes/step (kernel)", "bytes", False),
            Column("wire_ratio", "wire / payload", "ratio", None, ".3f"),
            Column("step", "step time (median)", "s", False),
            Column("speedup", "speed-up over uncompressed", "ratio", True, ".2f")]
    title = f"bandwidth sweep: {model}, 2 stages (gloo, one namespace each), batch 8x{seq}, {steps} steps"
    why = unavailable_reason()
    if why:
        return [Table(title=title, columns=cols, rows=[], caption=f"skipped: {why}")]
    rows, base = [], {}
    run_dir = out_dir / "bandwidth" / "runs"
    for rate in RATES:
        for label, algo, params in METHODS:
            cfg = make_config(algo, world_size=2, backend="gloo", net="netns", bandwidth=rate, model=model,
                              data="wiki-en", steps=steps, batch_size=8, seq_len=seq, micro_batches=2,
                              params=params)
            rec = run_with_progress(cfg, quiet)
            write_result(rec, run_dir / f"{algo}-{rate}.json")
            m = {k: v.value for k, v in rec.metrics.items()}
            if algo == "pipeline-sgd":
                base[rate] = m["step_time_s"]
            rows.append([label, rate, m["payload_bytes_per_step"], m.get("wire_bytes_per_step"),
                         m.get("wire_to_payload_ratio"), m["step_time_s"],
                         base[rate] / m["step_time_s"]])
    png = _plot(rows, out_dir / "bandwidth.png")
    table = Table(title=title, columns=cols, rows=rows,
                  caption="wire bytes: the kernel's tx_bytes of every rank's interface over the measured "
                          "window (TCP/IP headers and ACKs included); speed-up = uncompressed step time / "
                          "method's step time at the same bandwidth",
                  notes=[f"plot: {png}"] if png else ["plot skipped: matplotlib is not installed"])
    return [table]
