"""Headline numbers of Protocol Models (issue 6).

1. Bytes per token per boundary (measured by the Comm meter, against the closed form).
2. Seconds per step and peak memory per stage (gloo, one process per stage) of
   ``protocol`` and of the uncompressed pipeline, over unshaped network-namespace
   links and at 80 Mbit/s.
3. Throughput at 80 Mbit/s of ``protocol`` against the uncompressed pipeline at
   80 Mbit/s and against the centralised run (one process, no links), as ratios
   measured in one run (runs interleaved so machine noise hits all alike).

Usage: ``python -m benchmarks.protocol_headline [--model small-llama] [--k 8] [--steps 6]
[--rounds 2] [--no-netns]``.  The netns part needs root (tc, ip netns).
"""

from __future__ import annotations

import argparse
import statistics

from algorithms.protocol.pipeline import bytes_per_token, expected_bytes
from harness.launcher import run
from harness.registry import make_config

LR = 3e-3
UNCOMPRESSED = ("direct-compress", dict(optimizer="adamw", lr=LR, beta1=0.1, beta2=0.05, weight_decay=0.01,
                                        fwd="fp32", bwd="fp32"))


def _cfg(algo, params, model, steps, world=2, **kw):
    return make_config(algo, world_size=world, model=model, data="wiki-en", steps=steps, batch_size=8,
                       seq_len=64 if model.startswith("tiny") else 128, micro_batches=2, params=params, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="small-llama")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-netns", action="store_true")
    a = ap.parse_args()
    proto = ("protocol", {"lr": LR, "k": a.k})
    central = ("protocol-central", {"lr": LR, "k": a.k, "constrained": False})

    cfg = _cfg(*proto, a.model, a.steps)
    per, closed = bytes_per_token(cfg), expected_bytes(cfg)
    rec = run(cfg)
    tokens = cfg.batch_size * cfg.seq_len
    print(f"{a.model} k={a.k}: bytes/token/boundary forward {per['fwd']} (k s + s_id), backward {per['bwd']} "
          f"(k s), uncompressed {per['uncompressed']} (d s), ratio d/k = {per['uncompressed'] / per['bwd']:g}")
    print(f"  measured payload {rec.metrics['payload_bytes_per_step'].value:.0f} B/step "
          f"({rec.metrics['payload_bytes_per_step'].value / tokens:.2f} B/token), closed form "
          f"{sum(closed.values())} B/step")

    links = [(None, {"backend": "gloo"})] if a.no_netns else [
        ("unshaped", {"backend": "gloo", "net": "netns"}),
        ("80mbit", {"backend": "gloo", "net": "netns", "bandwidth": "80mbit"})]
    times: dict[tuple[str, str], list[float]] = {}
    mem: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        c = run(_cfg(*central, a.model, a.steps, world=1))
        times.setdefault(("centralised", "none"), []).append(c.metrics["step_time_s"].value)
        for name, link in links:
            for algo, params in (UNCOMPRESSED, proto):
                r = run(_cfg(algo, params, a.model, a.steps, **link))
                times.setdefault((algo, name or "loopback"), []).append(r.metrics["step_time_s"].value)
                mem[(algo, name or "loopback")] = [x["metrics"]["peak_memory_bytes"].value / 2**20
                                                   for x in r.per_rank]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'algorithm':16} {'link':9} {'s/step':>9} {'peak MiB stage0':>16} {'stage1':>8}")
    for (algo, link), t in med.items():
        m = mem.get((algo, link), [float("nan")] * 2)
        print(f"{algo:16} {link:9} {t:9.4f} {m[0]:16.1f} {m[1]:8.1f}")
    if not a.no_netns:
        p, u, c = med[("protocol", "80mbit")], med[("direct-compress", "80mbit")], med[("centralised", "none")]
        print(f"throughput at 80 Mbit/s: protocol / uncompressed = {u / p:.2f}x, "
              f"protocol / centralised = {c / p:.2f}x")


if __name__ == "__main__":
    main()
