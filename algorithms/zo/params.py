"""The zeroth-order family's declarations: parameter dataclasses and algorithms (torch-free).

The rank functions live in :mod:`.mezo`, :mod:`.sparq` and :mod:`.distzo2`; they are
imported only when a rank runs, so ``commbench describe`` reads this module alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.config import ConfigError
from harness.registry import AlgorithmSpec, declare, param

DIFFERENCES = ("forward", "central")
MODES = ("exact", "inplace")  # how a perturbation is undone (algorithms.zo.perturb)
LABEL_MODES = ("send", "local")
FORMATS = ("auto", "dense", "bitmap", "coo")  # the sparse activation body (algorithms.zo.wire)
SIGNED_MODES = ("auto", "true", "false")  # the activation grid (algorithms.zo.wire explains each)
# What one activation scale covers by default: one absmax scale per tensor (algorithms.zo.wire
# says why: it reproduces SparQ Fig. 2 / §2.4 on real weights).
GRANULARITY = "tensor"


@dataclass(frozen=True)
class ZOParams:
    lr: float = param(1e-3, "learning rate")
    mu: float = param(1e-3, "perturbation scale")
    perturbations: int = param(1, "P: directions per iteration (P scalars per step)")
    difference: str = param("forward", "forward | central")
    mode: str = param("exact", "exact: stash + copy back; inplace: +mu / -mu (MeZO)")
    track_drift: bool = param(False, "inplace: measure what restore leaves (costs a stash)")

    def __post_init__(self):
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not self.mu > 0:
            raise ConfigError(f"mu (the perturbation scale) must be > 0, got {self.mu}")
        if not isinstance(self.perturbations, int) or self.perturbations < 1:
            raise ConfigError(f"perturbations (P) must be an int >= 1, got {self.perturbations!r}")
        if self.difference not in DIFFERENCES:
            raise ConfigError(f"difference must be one of {', '.join(DIFFERENCES)}, got {self.difference!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")


@dataclass(frozen=True)
class SparQParams(ZOParams):
    bits: int | None = param(4, "activation quantiser bits (1..8); None: lossless (identity)")
    signed: str = param("auto", "activation grid: auto = per message, unsigned iff no entry is negative "
                                "(ReLU); true: the signed AQ-SGD fixpoint quantiser (seed-sparq §2.7) "
                                "always; false: unsigned always")
    granularity: str = param(GRANULARITY, "what one activation scale covers: tensor (default: the "
                                          "granularity that reproduces SparQ Fig. 2 / §2.4 on real "
                                          "weights), token, or channel (AQ-SGD's)")
    format: str = param("auto", "sparse body: auto (cheapest) | dense | bitmap | coo")
    residual: str = param("auto", "residual-stream codec (any dense codec): auto = identity if bits is None "
                                  "else the model family's 16-bit float (fp16; bf16 for Gemma-3, "
                                  "whose residual stream exceeds fp16's range)")
    labels: str = param("send", "send: first stage sends them to the last (counted); local: regenerated")
    split: str = param("auto", 'ffn_act cut blocks, e.g. "5" or "1,2,3"; auto: choose by measured sparsity')
    split_window: int = param(1, "selection: blocks within this distance of the even split")
    calib_batches: int = param(2, "selection: validation batches measured")

    def __post_init__(self):
        from algorithms.codecs.quant import GRANULARITIES  # the codec's own list

        super().__post_init__()
        if self.bits is not None and not (isinstance(self.bits, int) and 1 <= self.bits <= 8):
            raise ConfigError(f"bits must be an int in 1..8 (or none for lossless activations), got {self.bits!r}")
        if isinstance(self.signed, bool):  # accept a bool from Python callers
            object.__setattr__(self, "signed", "true" if self.signed else "false")
        if self.signed not in SIGNED_MODES:
            raise ConfigError(f"signed must be one of {', '.join(SIGNED_MODES)}, got {self.signed!r}")
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"granularity must be one of {', '.join(GRANULARITIES)}, "
                              f"got {self.granularity!r}")
        if self.format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.labels not in LABEL_MODES:
            raise ConfigError(f"labels must be one of {', '.join(LABEL_MODES)}, got {self.labels!r}")
        if self.split_window < 0 or self.calib_batches < 1:
            raise ConfigError("split_window must be >= 0 and calib_batches >= 1")
        if self.split != "auto":
            try:
                self.blocks()
            except ValueError:
                raise ConfigError(f"split must be 'auto' or comma-separated block indices, got {self.split!r}") from None
        if self.residual != "auto":
            from algorithms.codecs import make_codec

            make_codec(self.residual)  # CodecError names the valid codecs

    def blocks(self) -> tuple[int, ...]:
        """The explicit split blocks (empty for auto)."""
        return () if self.split == "auto" else tuple(int(b) for b in self.split.split(",") if b.strip())


@dataclass(frozen=True)
class ZO2Params(ZOParams):
    difference: str = param("central", "the paper's estimator (Eq. 1)")
    budget: int = param(3, "device slots for blocks: offloading i-1, computing i, uploading i+1")
    sliced: bool = param(False, "DistZO2 paper §6.1: host slice per rank + all-gather of the rest")
    same_batch: bool = param(False, "DDP / 2D: every group reads the whole batch (equivalence checks)")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"budget (resident blocks) must be an int >= 1, got {self.budget!r}")


_DISTZO2 = dict(family="zo", params=ZO2Params, paper="distzo2", cites=("§4", "§5", "§6", "§6.1", "Eq. 1"))

declare(AlgorithmSpec(
    "mezo", family="zo", params=ZOParams, max_world=1, paper="sparq", cites=("Eq. 3", "Eq. 7"),
    entry="algorithms.zo.mezo:mezo",
    summary="centralised ZO-SGD (MeZO): seeded perturbations, P scalars per step, no gradients"))
declare(AlgorithmSpec(
    "sparq", family="zo", params=SparQParams, min_world=2, paper="sparq", cites=("§2.4", "§2.7", "Alg. 1-3"),
    entry="algorithms.zo.sparq:sparq", check="algorithms.zo.sparq:fits",
    summary="ZO model parallelism: quantised sparse FFN-activation splits forward, P scalars back"))
declare(AlgorithmSpec(
    "zo2", max_world=1, entry="algorithms.zo.distzo2:zo2", **_DISTZO2,
    summary="MeZO with blocks offloaded to host memory: 3-stage upload/compute/offload "
            "schedule, update deferred into the next forward, flushed at the end"))
declare(AlgorithmSpec(
    "distzo2-pertp", min_world=2, max_world=2, entry="algorithms.zo.distzo2:distzo2_pertp",
    check="algorithms.zo.distzo2:pertp_check", **_DISTZO2,
    summary="ZO2 + perturbation parallelism: +mu on rank 0, -mu on rank 1, "
            "losses exchanged (one scalar per rank per direction)"))
declare(AlgorithmSpec(
    "distzo2-ddp", min_world=1, entry="algorithms.zo.distzo2:distzo2_ddp",
    check="algorithms.zo.distzo2:ddp_check", **_DISTZO2,
    summary="ZO2 + data parallelism: K ranks on their own shards, P float32 scalars all-gathered"))
declare(AlgorithmSpec(
    "distzo2-2d", min_world=2, entry="algorithms.zo.distzo2:distzo2_2d",
    check="algorithms.zo.distzo2:check_2d", **_DISTZO2,
    summary="ZO2 + 2D parallelism: n_b x 2 mesh, PertP pairs inside, DDP across pairs"))
