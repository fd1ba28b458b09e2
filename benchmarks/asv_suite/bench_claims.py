"""asv suite: the deterministic values behind the papers' communication claims, from small runs.

Each value is a ratio of Comm-metered payload bytes per step (deterministic for a seed: no time,
no memory), at the configs of the claims themselves, scaled down (tiny models, two steps, thread
ranks).  A commit that moves one moved what a claim's verdict rests on; ``commbench compare
COMMIT COMMIT`` and asv's thresholds (``asv.conf.json``) treat ``track_payload_*`` as
deterministic.
"""

from __future__ import annotations

SMALL = dict(steps=2, batch_size=8, seq_len=32)

# ratio name -> (numerator run, denominator run) and the claim it stands for
RATIOS = {
    # SparQ's quantisation-induced sparsity against the same ZO pipeline sending dense fp32
    "sparq-4bit/zo-dense": ("sparq", "zo-dense"),
    "sparq-4bit/fo-pipeline": ("sparq", "pipeline-sgd"),  # sparq.comm-saving-vs-fo = 1 - ratio
    "sparq-4bit/aq-sgd": ("sparq", "aq-sgd"),  # sparq.comm-saving-vs-aq = 1 - ratio
    # Protocol Models' lossless subspace compression (k = 8 of d, token ids beside)
    "protocol-k8/uncompressed": ("protocol", "uncompressed"),
}


def _configs() -> dict:
    from harness.experiments.sparq import Table2Setting, methods_runs
    from harness.registry import make_config

    # SparQ Table 2's methods (FO pipeline, AQ-SGD over epochs with raw first visits, the
    # uncompressed ZO pipeline, SparQ 4-bit, P = 5) at one FFN-activation cut
    s = Table2Setting("tiny-opt", steps=SMALL["steps"], batch=SMALL["batch_size"], seq=SMALL["seq_len"],
                      backend="threads", memory="rss")
    out = {name: cfg for name, cfg in methods_runs(s) if name != "mezo"}  # one rank: no bytes
    out["zo-dense"] = out.pop("zo-pipeline")
    protocol = dict(model="tiny-llama", data="wiki-en", world_size=2, backend="threads", micro_batches=2,
                    **SMALL)
    out["protocol"] = make_config("protocol", params={"k": 8}, **protocol)
    out["uncompressed"] = make_config("direct-compress", params={"fwd": "fp32", "bwd": "fp32"}, **protocol)
    return out


def payload_ratios(names: list[str] | None = None) -> dict[str, float]:
    """The ratios ``names`` (default: every one of :data:`RATIOS`), from one run of each config
    they need."""
    import torch

    from harness.launcher import run

    torch.set_num_threads(1)
    names = list(RATIOS) if names is None else names
    need = {run_name for k in names for run_name in RATIOS[k]}
    pay = {name: run(cfg).metrics["payload_bytes_per_step"].value
           for name, cfg in _configs().items() if name in need}
    return {k: pay[RATIOS[k][0]] / pay[RATIOS[k][1]] for k in names}


class ClaimValues:
    params = list(RATIOS)
    param_names = ["ratio"]
    smallest = ["protocol-k8/uncompressed"]
    timeout = 300

    def setup_cache(self):
        return payload_ratios(self.params)

    def track_payload_ratio(self, cache, ratio):
        return cache[ratio]

    track_payload_ratio.unit = "ratio"
