"""asv suite: Protocol Models (lossless subspace pipeline) against the
uncompressed pipeline, at unshaped loopback and, as root, at 80 Mbit/s in
network namespaces (tc tbf).  ``track_bytes_per_token`` is deterministic."""

from __future__ import annotations

from .common import RunSuite, _run_all


def _shaped_runs_possible() -> bool:
    from harness.netns import unavailable_reason

    return unavailable_reason() is None


class ProtocolModels(RunSuite):
    runs = {
        "protocol-k8/w2/loopback": ("protocol", dict(params={"k": 8})),
        "uncompressed/w2/loopback": ("pipeline-sgd", dict()),
        "protocol-k8/w2/80mbit": ("protocol", dict(params={"k": 8}, net="netns", bandwidth="80mbit")),
        "uncompressed/w2/80mbit": ("pipeline-sgd", dict(net="netns", bandwidth="80mbit")),
    }
    common = dict(model="small-llama", data="wiki-en", steps=5, batch_size=8, seq_len=64,
                  micro_batches=2, world_size=2, backend="gloo")
    params = list(runs)
    smallest = ["protocol-k8/w2/loopback"]
    smallest_common = dict(model="tiny-llama", steps=2)  # small-llama's tensor counting takes minutes

    def setup_cache(self):
        runs = {k: v for k, v in self.runs.items() if k in self.params
                and ("netns" not in str(v[1].get("net")) or _shaped_runs_possible())}
        out = _run_all(runs, self.common)
        for m in out.values():
            m["bytes_per_token"] = m["payload_bytes_per_step"] / m["tokens_per_step"]
        return out

    def setup(self, cache, key):
        if key not in cache:
            raise NotImplementedError("shaped runs need root, ip and tc")

    def track_bytes_per_token(self, cache, key):
        return cache[key]["bytes_per_token"]

    track_bytes_per_token.unit = "bytes"
