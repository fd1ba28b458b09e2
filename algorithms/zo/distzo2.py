"""DistZO2 (DistZO2 paper §4-§6): ZO2 on several ranks, only scalars sent.

One rank program covers every mode.  The world is a ``groups x pair`` mesh,
rank ``r`` at ``(b, s) = divmod(r, pair)`` (PertP inner, the paper's layout):

* ``zo2``            1 x 1: single device (the engine is :mod:`.zo2`'s);
* ``distzo2-pertp``  1 x 2: rank 0 evaluates the +mu points, rank 1 the -mu
  points, both on the whole batch; they all-gather their losses;
* ``distzo2-ddp``    K x 1: rank k runs ZO2 on shard k and all-gathers its P
  projected gradients ``g_k`` (float32);
* ``distzo2-2d``     n_b x 2: PertP pairs on shard b; one all-gather of every
  rank's losses.

Every rank then computes ``g = (1/groups) sum_b g_b`` with the same
expression in the same (rank) order — the sum in float64, rounded once to
float32 — so every rank applies the identical deferred update.  Seeds are
derived from ``(run seed, step)`` (zero bytes).  With one group this is
exactly MeZO's ``g``; with K equal shards it is the mean of the shards'
estimates, which single-device MeZO on the concatenated batch equals when it
averages the per-shard scalars the same way (the paper's DDP, §5; the
whole-batch loss differs in rounding only).

Perturbation restore is the shared ``exact`` / ``inplace`` Perturber: every
rank walks *all* evaluation points and restores the same way, whatever subset
it computes, so ranks never diverge (restoring only one's own sign would let
them drift apart by an ulp here and there, so it is not offered).
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.heldout import evaluate_params

from .estimator import evaluations, logged_loss, scalars
from .mezo import log_scalars
from .perturb import step_seeds
from .phases import PHASES
from .throughput import model_extras
from .zo2 import build_engine


def layout(rank: int, pair: int) -> tuple[int, int]:
    """``(group b, position s)`` of ``rank``: PertP pairs are adjacent ranks."""
    return divmod(rank, pair)


def scalar_bytes_per_rank(world: int, pair: int, perturbations: int, loss_itemsize: int) -> int:
    """Closed form of the payload each rank sends per step (all-gather to world-1 peers)."""
    if world == 1:
        return 0
    per = perturbations * (4 if pair == 1 else loss_itemsize)  # P float32 g_k, or P own losses
    return (world - 1) * per


def shard_batch(cfg, step: int, group: int, groups: int, same_batch: bool, device):
    from harness.data import get_dataset

    ds = get_dataset(cfg.data)
    if groups == 1 or same_batch:
        ids, labels = ds.batch(step, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed,
                               model=cfg.model)
    else:  # shard b of the global batch (its rows b*bs/K ..)
        ids, labels = ds.batch(step, batch_size=cfg.batch_size // groups, seq_len=cfg.seq_len,
                               seed=cfg.seed, shard=group, num_shards=groups, model=cfg.model)
    return ids.to(device), labels.to(device)


def combine(parts: list[torch.Tensor], *, groups: int, pair: int, n_eval: int, difference: str,
            mu: float) -> tuple[list[float], list[float]]:
    """``(g, per-group logged losses)`` from the gathered per-rank tensors (same on every rank).

    DDP ranks send only their P scalars, so for ``pair == 1`` no losses are returned.
    """
    gs, logged = [], []
    for b in range(groups):
        if pair == 1:
            gs.append([float(x) for x in parts[b]])
        else:
            losses = [parts[b * pair + k % pair][k // pair] for k in range(n_eval)]
            gs.append(scalars(losses, difference, mu))
            logged.append(logged_loss(losses, difference))
    P = len(gs[0])
    g = [float(torch.tensor(sum(gb[i] for gb in gs) / groups, dtype=torch.float32)) for i in range(P)]
    return g, logged


def log_phases(ctx, clock: tuple[dict[str, float], dict[str, float]], wall: float, cpu: float,
               z_draws: int) -> None:
    """One step's phase seconds (wall and this rank's CPU), the rest as ``other``, and its z draws."""
    walls, cpus = clock
    vals = {}
    for ph in PHASES:
        vals[f"phase_{ph}_s"] = walls[ph]
        vals[f"phase_{ph}_cpu_s"] = cpus[ph]
    vals["phase_other_s"] = max(0.0, wall - sum(walls.values()))
    vals["phase_other_cpu_s"] = max(0.0, cpu - sum(cpus.values()))
    vals["phase_step_s"], vals["phase_step_cpu_s"] = wall, cpu
    ctx.log(**vals, z_generations=z_draws)


def train(ctx, *, groups: int, pair: int):
    cfg, p = ctx.cfg, ctx.params
    b, s = layout(ctx.rank, pair)
    eng = build_engine(ctx, comm=ctx.comm)
    evaluate_params(ctx, eng.named_params(), "start")
    n_eval = len(evaluations(p.difference, p.perturbations))
    mine = [k for k in range(n_eval) if k % pair == s]
    ctx.tokens_per_step = cfg.batch_size * cfg.seq_len
    eng.clock.take()  # the measured steps only
    for step in ctx.steps():
        t0, c0, z0 = time.perf_counter(), time.thread_time(), eng.z_generations
        ids, labels = shard_batch(cfg, step, b, groups, p.same_batch, ctx.device)
        seeds = step_seeds(cfg.seed, step, p.perturbations)
        out = eng.losses(ids, labels, seeds, p, mine)
        if pair == 1:  # DDP / ZO2: this shard's P scalars, float32 (the paper's 4 B each)
            own = [out[k] for k in range(n_eval)]
            local = torch.tensor(scalars(own, p.difference, p.mu), dtype=torch.float32)
        else:  # PertP / 2D: this rank's losses, in the model dtype (bit-exact g on every rank)
            local = torch.stack([out[k] for k in mine]).cpu()
        with eng.clock("comm"):
            parts = ctx.comm.all_gather(local, tag="zo2.scalar") if ctx.world_size > 1 else [local]
            g, logged = combine(parts, groups=groups, pair=pair, n_eval=n_eval, difference=p.difference, mu=p.mu)
        eng.defer(seeds, g, p.lr)
        # DDP ranks log their own shard's loss (the record averages ranks); pairs the group mean
        ctx.log(loss=sum(logged) / len(logged) if logged else logged_loss(own, p.difference))
        log_scalars(ctx, g)
        log_phases(ctx, eng.clock.take(), time.perf_counter() - t0, time.thread_time() - c0,
                   eng.z_generations - z0)
    steps = max(1, cfg.steps)
    for key in [k for k in ctx.history if k.startswith("phase_") or k == "z_generations"]:
        v = ctx.history[key]  # per-step median of this rank (the record keeps the max over ranks)
        ctx.extra[key] = (statistics.median(v), "draws" if key == "z_generations" else "s")
    off = eng.off
    for link in off.bytes:  # the measured steps only: the flush pass comes after
        ctx.extra[f"{link}_bytes_per_step"] = (off.bytes[link] / steps, "bytes")
    ctx.extra.update(model_extras(off, compute_s=eng.compute_s, steps=steps))
    eng.flush()
    ctx.extra["device_blocks_peak"] = (float(off.log.max_resident), "blocks")
    ctx.extra["device_pool_peak_bytes"] = (float(eng.device_pool_peak_bytes()), "bytes")
    ctx.extra["host_master_bytes"] = (float(sum(h.numel() for h in off.host) * off.esize), "bytes")
    params = eng.named_params()
    evaluate_params(ctx, params, "end")
    return ctx.finish(params)


# --------------------------------------------------------------------------- fit rules
def pertp_check(cfg):
    if cfg.params.difference != "central":
        return "PertP splits the +mu and -mu evaluations between its 2 ranks: needs difference=central"
    return None


def ddp_check(cfg):
    K = cfg.world_size
    if not cfg.params.same_batch and cfg.batch_size % K:
        return f"batch_size {cfg.batch_size} does not split into {K} equal shards (one per rank)"
    return None


def check_2d(cfg):
    w = cfg.world_size
    if w % 2:
        return f"2D parallelism needs an n_b x 2 mesh (PertP pairs): world size must be even, got {w}"
    if cfg.params.difference != "central":
        return "2D pairs split the +mu and -mu evaluations: needs difference=central"
    if not cfg.params.same_batch and cfg.batch_size % (w // 2):
        return f"batch_size {cfg.batch_size} does not split into n_b = {w // 2} equal shards"
    return None


def zo2(ctx):
    return train(ctx, groups=1, pair=1)


def distzo2_pertp(ctx):
    return train(ctx, groups=1, pair=2)


def distzo2_ddp(ctx):
    return train(ctx, groups=ctx.world_size, pair=1)


def distzo2_2d(ctx):
    return train(ctx, groups=ctx.world_size // 2, pair=2)
