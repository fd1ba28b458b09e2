"""SparQ's Table 2 claims as pure functions of measurements (no run, no torch).

Each function takes what a run measured and returns a :class:`Verdict`: ours as a number, whether
it meets the paper's criterion, and the precondition under which the paper's mechanism can show.
``harness.experiments.sparq`` turns them into claims rows; ``checks/test_sparq_verdicts.py`` calls
them with stand-in measurements below, at and above each criterion and with a failed precondition.
"""

from __future__ import annotations

from dataclasses import dataclass

from .claims import Precondition, outcome

# SparQ §3, observation (3) and Fig. 2: after 4-bit quantisation ReLU activations hold "below 5 %
# nonzero entries", GELU "nearly all ... under 5 %", SwiGLU "stabilize below 20 %".
FIG2_NNZ_LIMIT = {"relu": 0.05, "gelu": 0.05, "swiglu": 0.20}
COMM_SAVING = {"fo": 0.70, "aq": 0.50}  # §5: "more than 50% ... AQ-SGD and over 70% ... FO-SGD"
MEM_SAVING_VS_FO = 0.30  # §5: "reduces total peak usage by about 30 ~ 70%" (the low end)
MEM_RATIO = 3.0  # abstract, §7: "reduces GPU memory usage by over 3x"
B2_MIN_PARAMS = 1.3e9  # App. B.2 measures OPT-1.3B, 2.7B, 6.7B and 13B


@dataclass(frozen=True)
class Verdict:
    value: float | None  # ours, as a number
    holds: bool | None  # meets the criterion; None: undecided
    precondition: Precondition | None = None

    @property
    def outcome(self) -> str:
        return outcome(self.holds, self.precondition)


def activation_kind(activation: str, family: str) -> str:
    """Fig. 2's activation classes: ReLU (OPT), GELU (GPT-2, BERT), SwiGLU (Llama's gated SiLU)."""
    if family == "llama" or activation in ("silu", "swish"):
        return "swiglu"
    return "gelu" if activation.startswith("gelu") else "relu"


def sparse_activation(nnz: float | None, kind: str, bits: int) -> Precondition:
    """The split activation is as sparse as Fig. 2 reports after quantisation: the regime in which
    SparQ's sparse encoding pays (App. C.1: cost ~ rho d)."""
    limit = FIG2_NNZ_LIMIT[kind]
    return Precondition(f"activation non-zero ratio after {bits}-bit quantisation < {limit:.0%} "
                        f"({kind}; SparQ §3, Fig. 2)",
                        "not measured" if nnz is None else f"{nnz:.2f}", nnz is not None and nnz < limit)


def comm_vs_zo_pipeline(sparq_bytes: float, zo_bytes: float, nnz: float | None, kind: str, bits: int,
                        paper: float) -> Verdict:
    """SparQ's bytes per step over the uncompressed ZO pipeline's (same split, same P): the one
    Table 2 ratio whose step counts cancel (ZO-SGD and SparQ run the same ZO iterations)."""
    ratio = sparq_bytes / zo_bytes
    return Verdict(ratio, ratio <= paper, sparse_activation(nnz, kind, bits))


def step_counts(known: bool) -> Precondition:
    """The paper's saving percentages are ratios of whole-run totals (Table 2: "communication
    cost", GB per run); a per-step ratio decides them only when each method's steps are known."""
    return Precondition("each method's step count known (SparQ Table 2 gives whole-run totals, "
                        "\"on average\" over 15 rows)", "equal steps" if known else
                        "unstated in the paper", known)


def whole_run_saving(saved_per_step: float, threshold: float, steps_known: bool = False) -> Verdict:
    """``1 - SparQ / baseline`` against the paper's threshold (vs FO-SGD 70 %, vs AQ-SGD 50 %)."""
    return Verdict(saved_per_step, saved_per_step > threshold, step_counts(steps_known))


def peaks_measured(*totals: float | None) -> Precondition:
    """Memory verdicts need every method's total peak (a run with ``memory="tensor"`` or ``"pass"``)."""
    ok = all(t is not None for t in totals)
    return Precondition("peak tensor bytes measured on every rank of every method",
                        "yes" if ok else "not measured (run with memory='tensor' or 'pass')", ok)


def memory_saving_vs_fo(fo_total: float | None, sparq_total: float | None,
                        threshold: float = MEM_SAVING_VS_FO) -> Verdict:
    """``1 - SparQ total peak / FO total peak`` (Table 2's "total peak memory usage on two GPUs")."""
    pre = peaks_measured(fo_total, sparq_total)
    if not pre.held:
        return Verdict(None, None, pre)
    saved = 1 - sparq_total / fo_total
    return Verdict(saved, saved >= threshold, pre)


def aq_memory_ratio(aq_total: float, aq_window_buffers: float, per_sample: float, n: int,
                    sparq_total: float) -> float:
    """(AQ-SGD peak without the buffers of its run + per-sample buffer bytes x N) / SparQ's peak:
    Table 2 prints AQ-SGD as "GPU + storage", the storage one buffer per training sample."""
    return (aq_total - aq_window_buffers + per_sample * n) / sparq_total


def aq_flip_n(aq_total: float, aq_window_buffers: float, per_sample: float, sparq_total: float,
              threshold: float = MEM_RATIO) -> float | None:
    """N*: the training set size at which :func:`aq_memory_ratio` reaches ``threshold`` (the
    verdict flips there); 0 when it holds at any N; None without per-sample buffers."""
    if per_sample <= 0:
        return None
    return max(0.0, (threshold * sparq_total - (aq_total - aq_window_buffers)) / per_sample)


def training_set(n: int | None, source: str) -> Precondition:
    return Precondition("the training set size N is known (AQ-SGD keeps one buffer per sample)",
                        f"N = {n:,}, {source}" if n else f"none: {source}", bool(n))


def memory_vs_aq(aq_total: float | None, aq_window_buffers: float, per_sample: float, n: int | None,
                 n_source: str, sparq_total: float | None, threshold: float = MEM_RATIO) -> Verdict:
    pre = peaks_measured(aq_total, sparq_total)
    if pre.held:
        pre = training_set(n, n_source)
    if not pre.held:
        return Verdict(None, None, pre)
    ratio = aq_memory_ratio(aq_total, aq_window_buffers, per_sample, n, sparq_total)
    return Verdict(ratio, ratio > threshold, pre)


def model_scale(num_params: int, minimum: float = B2_MIN_PARAMS) -> Precondition:
    return Precondition(f"model >= {minimum / 1e9:.1f}B parameters (App. B.2 measures OPT-1.3B to 13B)",
                        f"{num_params / 1e6:.3g}M parameters", num_params >= minimum)


def fo_vs_zo_memory(fo_total: float | None, sparq_total: float | None, num_params: int,
                    threshold: float = MEM_RATIO) -> Verdict:
    """App. B.2: "The memory overhead for first-order methods is over 3x more than that for
    memory-efficient zeroth-order methods", measured on OPT-1.3B to 13B."""
    pre = peaks_measured(fo_total, sparq_total)
    if pre.held:
        pre = model_scale(num_params)
    ratio = fo_total / sparq_total if fo_total is not None and sparq_total is not None else None
    return Verdict(ratio, None if ratio is None else ratio > threshold, pre)


# SparQ Table 2: SparQ − ZO-SGD test accuracy over the 15 rows, mean −0.14 points, worst −0.9
ACC_VS_ZO_WORST = -0.009


def binomial_se(p: float, n: int) -> float:
    return (p * (1 - p) / n) ** 0.5


def accuracy_moved(start: float | None, end: float | None, n: int) -> Precondition:
    """ZO fine-tuning changed what accuracy measures: the uncompressed ZO pipeline's held-out
    accuracy moved by at least 2 binomial standard errors (at the start accuracy, ``n`` rows)
    during the run.  Below that, SparQ and ZO-SGD agree because neither trained yet."""
    if start is None or end is None or not (0 <= start <= 1 and 0 <= end <= 1):
        return Precondition("held-out accuracy measured (a labelled task)", "no labels in the run's data", False)
    se2 = 2 * binomial_se(start, n)
    return Precondition(f"the ZO pipeline's held-out accuracy moved by >= 2 standard errors ({se2:.3f} at "
                        f"{n} rows) during the run", f"{start:.3f} -> {end:.3f}", abs(end - start) >= se2)


def accuracy_vs_zo(sparq_acc: float | None, zo_acc: float | None, start: float | None, n: int,
                   worst: float = ACC_VS_ZO_WORST) -> Verdict:
    """SparQ's held-out accuracy minus the uncompressed ZO pipeline's (same steps, split and seeds)
    against Table 2's worst row (−0.9 points), less 2 standard errors of a difference of two
    accuracies on ``n`` rows: the paper's "comparable accuracy" at our sample size."""
    pre = accuracy_moved(start, zo_acc, n)
    if not pre.held and (sparq_acc is None or zo_acc is None or not 0 <= zo_acc <= 1):
        return Verdict(None, None, pre)
    diff = sparq_acc - zo_acc
    tol = 2 * (2 * binomial_se(zo_acc, n) ** 2) ** 0.5
    return Verdict(diff, diff >= worst - tol, pre)
