"""The Protocol Models family's declarations: parameter dataclasses and algorithms (torch-free).

The rank functions live in :mod:`.pipeline`; it is imported only when a rank runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.pipeline.params import SCHEDULE_HELP, pipeline_schedule_problem
from harness.registry import AlgorithmSpec, declare, param

WIRES = ("auto", "fp64", "fp32", "bf16", "fp16")
WP2_OPTIMIZERS = ("rowconst_adamw", "adamw")


@dataclass(frozen=True)
class ProtocolParams:
    k: int = param(8, "subspace dimension (compression d / k)")
    lr: float = param(1e-3, "the peak lr under lr_schedule")
    lr_schedule: str = param("constant", 'or "warmup-linear" (paper §8.1: warm-up, then linear decay)')
    warmup: float = param(0.02, "warm-up fraction of the steps (spec G16; the paper gives no length)")
    beta1: float = param(0.9, "torch convention (weight of the old moment)")
    beta2: float = param(0.95, "torch convention (weight of the old second moment)")
    eps: float = param(1e-8, "optimiser epsilon")
    weight_decay: float = param(0.01, "decoupled weight decay")
    wp2_optimizer: str = param("rowconst_adamw", 'or "adamw" (+ projection, as node0)')
    grassmann_every: int = param(0, "N: a Grassmann subspace update every N steps (0: fixed subspace)")
    grassmann_eta: float = param(0.25, "η0; the step is η0 / λmax(S)")
    # The paper (§4.3.1) asks only for a frozen high-rank table; both reference code bases draw it
    # N(0, 1) (spec §2.3, §2.9 step 2: σ_fix = 1).  A small std leaves the token identity outside S
    # faint, so the trainable T_S, confined to the k dims of S, must carry it (cf. Fig. 15).
    fixed_std: float = param(1.0, "std of the frozen T_fixed and PE_fixed tables: N(0, 1) (spec §2.3, §2.9)")
    basis_seed: int = param(0, "U = QR(N(0,1)) from (seed, basis_seed)")
    wire: str = param("auto", "transmit dtype of C; auto: the run dtype (lossless)")
    schedule: str = param("gpipe", SCHEDULE_HELP + " (protocol-central: one process, no schedule)")

    def __post_init__(self):
        from algorithms.pipeline.optim import schedule_problem

        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(isinstance(self.k, int) and self.k >= 1, f"k must be an int >= 1, got {self.k!r}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        bad = schedule_problem(self.lr_schedule, self.warmup)
        need(bad is None, bad)
        need(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
        need(self.eps > 0, f"eps must be > 0, got {self.eps}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.wp2_optimizer in WP2_OPTIMIZERS,
             f"wp2_optimizer must be one of {', '.join(WP2_OPTIMIZERS)}, got {self.wp2_optimizer!r}")
        need(self.grassmann_every >= 0, f"grassmann_every must be >= 0, got {self.grassmann_every}")
        need(self.grassmann_eta > 0, f"grassmann_eta must be > 0, got {self.grassmann_eta}")
        need(self.fixed_std >= 0, f"fixed_std must be >= 0, got {self.fixed_std}")
        need(self.basis_seed >= 0, f"basis_seed must be >= 0, got {self.basis_seed}")
        need(self.wire in WIRES, f"wire must be one of {', '.join(WIRES)}, got {self.wire!r}")
        bad = pipeline_schedule_problem(self.schedule)
        need(bad is None, bad)


@dataclass(frozen=True)
class CentralParams(ProtocolParams):
    stages: int = param(2, "constrain the blocks that a split into this many stages puts before the last")
    constrained: bool = param(True, "False: the plain (unconstrained) model with the same AdamW")

    def __post_init__(self):
        super().__post_init__()
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")


declare(AlgorithmSpec(
    "protocol", family="protocol", params=ProtocolParams, min_world=2, paper="protocol",
    cites=("§2.3", "§2.4", "§2.5", "§2.9", "§4.3.1", "§8.1"),
    entry="algorithms.protocol.pipeline:protocol", check="algorithms.protocol.pipeline:check",
    summary="Protocol Models: subspace-constrained pipeline, lossless k-dim activations + token ids "
            "forward and k-dim gradients backward, row-mean AdamW, Grassmann subspace updates"))
declare(AlgorithmSpec(
    "protocol-central", family="protocol", params=CentralParams, max_world=1, paper="protocol",
    cites=("§2.4", "§2.5"),
    entry="algorithms.protocol.pipeline:protocol_central", check="algorithms.protocol.pipeline:check",
    summary="the protocol model unsplit in one process (same constraints, optimiser, Grassmann "
            "updates); constrained=false: the plain model with the same AdamW (centralised baseline)"))
