"""Which experiments exist, in which order ``reproduce all`` runs them, and how
a name is found.

Each experiment is declared here, torch-free (:data:`DECLARED`: its module, its
paper key and its summary), so ``commbench list`` reads it without importing
any experiment; the module binds its ``run`` with :func:`experiment` and is
imported only when the name is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError, did_you_mean


@dataclass(frozen=True)
class Declared:
    module: str  # the module of this package that defines its run
    paper: str | None  # the key of the paper it reproduces (a key of harness.registry.PAPERS); None: cross-paper
    summary: str


DECLARED = {
    "double-quant": Declared(
        "double_quant", "double-quant",
        "AsyLPG / Sparse-AsyLPG / Acc-AsyLPG vs AsyFPG, Acc-AsyFPG, QSVRG, QSGD: bits to a loss "
        "threshold (Table 1) and the mu / b_x study"),
    "clapping": Declared(
        "clapping", "clapping",
        "Clapping vs no compression, direct compression, AQ-SGD and EF21 (fine-tuning a pre-"
        "trained mini LM), EF memory vs dataset size, the paper's memory table, and the logistic-"
        "regression toy"),
    "protocol": Declared(
        "protocol", "protocol",
        "Protocol Models: subspace pipeline vs centralised, uncompressed and lossy (Top-K, "
        "quantised) pipelines; loss vs tokens / wall time; throughput on a similarity-scaled "
        "link; bytes per token; memory vs sequence length"),
    "sparq": Declared(
        "sparq", "sparq",
        "SparQ Tables 1-2 shape: bits vs sparsity and bytes (tiny ReLU/GELU/SwiGLU); FO pipeline "
        "vs AQ-SGD vs MeZO vs ZO pipeline vs SparQ peak tensor memory and bytes (tiny-opt, small-"
        "opt; batch 32, P = 5)"),
    "distzo2": Declared(
        "distzo2", "distzo2",
        "DistZO2 Table 1 shape: ZO2 vs PertP vs DDP vs 2D speed-ups with their spread, the speed-"
        "up this machine can reach from the phase breakdown, bytes per step (gloo ranks)"),
    "bandwidth": Declared(
        "bandwidth", None,
        "time per step vs shaped bandwidth (10 Mbit/s - 10 Gbit/s) for the uncompressed, Clapping"
        " and Protocol pipelines, with payload bytes (and kernel wire bytes as root)"),
    "foundation": Declared(
        "foundation", None,
        "reference FO runs: fo-sgd vs pipeline-sgd on threads and gloo (equivalence, bytes vs "
        "closed form, memory, speed)"),
    "scaling": Declared(
        "scaling", None,
        "payload bytes, messages, peak memory and step time vs model size and world size for each"
        " family (pipeline, ZO, DistZO2, protocol, double-quant), with growth factors"),
    "codecs": Declared(
        "codecs", None,
        "payload bytes of every codec (serialized, measured) beside its declared floor, dense and"
        " ReLU'd float32 tensors of 1k-256k elements"),
    "sparq-opt125m": Declared(
        "sparq", "sparq",
        "SparQ Table 2 at the OPT-125M shape (M = 2, P = 5, batch 32, 4-bit, 1 step): FO pipeline"
        " vs AQ-SGD vs MeZO vs ZO pipeline vs SparQ peak tensor bytes (sum and max over nodes) "
        "and payload bytes, beside the paper's OPT-125M rows; the memory verdict at this shape"),
    "sparq-activations": Declared(
        "sparq_activations", "sparq",
        "SparQ Fig. 2 on real weights: non-zero ratio of each layer's FFN activation after "
        "1/2/4/8-bit quantisation per tensor / token / channel and clipped scales (MiniLM "
        "pretrained and random-init, Gemma-3-270M when installed), and the bytes per bit beside "
        "Table 1's"),
    "sparq-gemma": Declared(
        "sparq_gemma", "sparq",
        "SparQ Table 2 on Gemma-3-270M (opt-in; GeGLU, prompt-based tweets task): the methods' bytes "
        "and peak tensor memory per step, and ZO pipeline vs SparQ held-out accuracy after 20 steps "
        "(about 50 min on 2 cores)"),
}
MODULES = {name: d.module for name, d in DECLARED.items()}
# ``reproduce all``: the papers' experiments, each family's first, the cross-family sweep last
ORDER = ("double-quant", "clapping", "protocol", "sparq", "distzo2", "bandwidth")
SUPPORTING = tuple(n for n in DECLARED if n not in ORDER)  # run by name only


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    run: Callable[[str, Path, bool], list]  # (scale, out_dir, quiet) -> tables
    paper: bool = True  # part of ``all``; its tables put the paper's numbers beside ours


EXPERIMENTS: dict[str, Experiment] = {}


def experiment(name: str):
    """Bind the decorated ``run(scale, out_dir, quiet) -> tables`` to the declared experiment ``name``."""
    if name not in DECLARED:
        raise RuntimeError(f"experiment {name!r} is not declared in harness.experiments.registry.DECLARED")

    def deco(fn):
        EXPERIMENTS[name] = Experiment(name, DECLARED[name].summary, fn, name in ORDER)
        return fn

    return deco


def get_experiment(name: str) -> Experiment:
    if name not in DECLARED:
        raise ConfigError(f"unknown experiment {name!r}{did_you_mean(name, [*DECLARED, 'all'])}; "
                          f"choose from all, {', '.join(DECLARED)}")
    if name not in EXPERIMENTS:
        importlib.import_module(f"{__package__}.{MODULES[name]}")
    return EXPERIMENTS[name]


def all_experiments() -> list[Experiment]:
    """Every experiment, the papers' in ``ORDER`` first, then the supporting ones."""
    return [get_experiment(n) for n in (*ORDER, *SUPPORTING)]

