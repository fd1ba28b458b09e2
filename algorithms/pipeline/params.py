"""The first-order pipeline family's declarations: parameter dataclasses and algorithms
(torch-free).

The rank functions live in :mod:`.sgd` (the uncompressed references) and
:mod:`.compressed` (direct compression, AQ-SGD, Clapping-FC / FU); they are
imported only when a rank runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.registry import AlgorithmSpec, declare, param

CUTS = ("block", "ffn_act")  # where stages are cut: between blocks, or after a block's FFN activation
SCHEDULES = ("gpipe", "1f1b")  # the pipeline engine's schedules (algorithms.pipeline.engine)
SCHEDULE_HELP = ('pipeline schedule: "gpipe" (all forwards, then all backwards; Protocol Models\' '
                 'setup) or "1f1b" (one forward, one backward); same arithmetic, bytes and messages')


def pipeline_schedule_problem(schedule: str) -> str | None:
    if schedule not in SCHEDULES:
        return f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
    return None


@dataclass(frozen=True)
class SGDParams:
    lr: float = param(0.05, "learning rate")
    momentum: float = param(0.0, "SGD momentum (torch convention)")
    cut: str = param("block", "where stages are cut: between blocks, or after a block's FFN activation")
    optimizer: str = param("sgd", 'or "adamw" (torch\'s betas and eps, no weight decay): e.g. to '
                                  "pre-train a checkpoint")
    weights: str = param("", 'a local save_pretrained directory to start from ("": seeded init)')
    save_weights: str = param("", "fo-sgd: write the trained model there (save_pretrained), e.g. to "
                                  "fine-tune from")
    schedule: str = param("gpipe", SCHEDULE_HELP + " (fo-sgd: one process, no schedule)")

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be sgd or adamw, got {self.optimizer!r}")
        if self.cut not in CUTS:
            raise ValueError(f"cut must be one of {', '.join(CUTS)}, got {self.cut!r}")
        if bad := pipeline_schedule_problem(self.schedule):
            raise ValueError(bad)


@dataclass(frozen=True)
class CompressedParams:
    lr: float = param(0.05, "the peak lr under lr_schedule")
    lr_schedule: str = param("constant", 'or "linear": decayed to 0 over the run (Clapping App. I.3.2); '
                                         '"warmup-linear": Protocol Models §8.1, for its baselines')
    warmup: float = param(0.02, "warm-up fraction of the steps under warmup-linear")
    optimizer: str = param("sgd", "sgd (torch, `momentum`), ema (paper eq. 3, `m`), paper-adam, adamw")
    momentum: float = param(0.0, "SGD momentum (torch convention)")
    m: float = param(0.1, "ema: weight of the new gradient (Clapping eq. 3)")
    beta1: float = param(0.1, "paper convention: weight of the new term")
    beta2: float = param(0.001, "paper-adam: weight of the new squared gradient")
    eps: float = param(1e-8, "optimiser epsilon")
    weight_decay: float = param(0.0, "decoupled weight decay")
    cut: str = param("block", "where stages are cut: block | ffn_act")
    fwd: str = param("topk:ratio=0.1", "codec on activations")
    bwd: str = param("topk:ratio=0.1", "codec on activation gradients")
    dataset_size: int = param(0, "0: the data stream; N: a finite set of N samples, multi-epoch")
    eval_batches: int = param(0, "uncompressed validation batches after training (val_loss, val_accuracy)")
    eval_every: int = param(0, "also validate every this many steps (unmetered; history val_loss)")
    clip_grad: float = param(0.0, "> 0: clip each stage's gradient norm to this before the update "
                                  "(no communication)")
    weights: str = param("", 'a local save_pretrained directory every stage starts from ("": seeded init)')
    log_state_digests: bool = param(False, "log a digest of every EF state replica after every step")
    schedule: str = param("gpipe", SCHEDULE_HELP)

    def __post_init__(self):
        from algorithms.codecs import CodecError

        from .links import make_link_codec
        from .optim import OPTIMIZERS, schedule_problem

        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        bad = schedule_problem(self.lr_schedule, self.warmup)
        need(bad is None, bad)
        need(self.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        need(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        need(0 < self.m <= 1, f"m must be in (0, 1], got {self.m}")
        need(0 < self.beta1 <= 1 and 0 < self.beta2 <= 1, "beta1 and beta2 must be in (0, 1]")
        need(self.eps > 0, f"eps must be > 0, got {self.eps}")
        need(self.cut in CUTS, f"cut must be one of {', '.join(CUTS)}, got {self.cut!r}")
        bad = pipeline_schedule_problem(self.schedule)
        need(bad is None, bad)
        need(self.dataset_size >= 0, f"dataset_size must be >= 0, got {self.dataset_size}")
        need(self.eval_batches >= 0, f"eval_batches must be >= 0, got {self.eval_batches}")
        need(self.clip_grad >= 0, f"clip_grad must be >= 0, got {self.clip_grad}")
        need(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        need(not self.eval_every or self.eval_batches, "eval_every needs eval_batches >= 1")
        for name in ("fwd", "bwd"):
            try:
                make_link_codec(getattr(self, name))
            except CodecError as e:
                raise ValueError(f"{name}: {e}") from None


@dataclass(frozen=True)
class ClappingParams(CompressedParams):
    p: float = param(0.5, "lazy-sampling probability of a fresh draw")
    rule: str = param("batch", "batch-wise or sample-wise lazy sampling")

    def __post_init__(self):
        from .lazy import RULES

        super().__post_init__()
        if not 0 < self.p <= 1:
            raise ValueError(f"p must be in (0, 1], got {self.p}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")


@dataclass(frozen=True)
class AQParams(CompressedParams):
    dataset_size: int = param(64, "the finite set of N samples whose per-sample buffers AQ-SGD keeps")
    raw_first_visit: bool = param(False, "send a sample's first visit uncompressed (original AQ-SGD)")

    def __post_init__(self):
        super().__post_init__()
        if self.dataset_size < 1:
            raise ValueError("aq-sgd needs a finite dataset: dataset_size must be >= 1")


declare(AlgorithmSpec(
    "fo-sgd", family="pipeline", params=SGDParams, max_world=1, entry="algorithms.pipeline.sgd:fo_sgd",
    check="algorithms.pipeline.local:micro_batch_problem",
    summary="first-order SGD on the unsplit model in one process (the reference)"))
declare(AlgorithmSpec(
    "pipeline-sgd", family="pipeline", params=SGDParams, min_world=2, entry="algorithms.pipeline.sgd:pipeline_sgd",
    check="algorithms.pipeline.sgd:pipeline_fits",
    summary="first-order pipeline SGD, one stage per rank, uncompressed activations and gradients"))

_COMPRESSED = dict(family="pipeline", min_world=2, paper="clapping", cites=("§1.3", "§2.9"),
                   check="algorithms.pipeline.compressed:check")
declare(AlgorithmSpec(
    "direct-compress", params=CompressedParams, entry="algorithms.pipeline.compressed:direct_compress",
    **_COMPRESSED,
    summary="pipeline SGD with activations and activation gradients compressed directly, C(y), C(v)"))
declare(AlgorithmSpec(
    "aq-sgd", params=AQParams, entry="algorithms.pipeline.compressed:aq_sgd", **_COMPRESSED,
    summary="AQ-SGD: per-sample error feedback on activations (buffers on both link ends), "
            "directly compressed gradients"))
declare(AlgorithmSpec(
    "clapping-fc", params=ClappingParams, entry="algorithms.pipeline.compressed:clapping_fc", **_COMPRESSED,
    summary="Clapping-FC: lazy sampling + error feedback both ways, one state per link end; "
            "every message compressed (p = 1 is EF21)"))
declare(AlgorithmSpec(
    "clapping-fu", params=ClappingParams, entry="algorithms.pipeline.compressed:clapping_fu", **_COMPRESSED,
    summary="Clapping-FU: as FC, but a fresh sample's first step is sent uncompressed and resets the states"))
