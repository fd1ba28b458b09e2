"""``commbench compare`` names runs whose configs differ with different labels."""

from __future__ import annotations

from harness.reporting.compare import _key, _label
from harness.results.schema import Metric, ResultRecord


def _rec(**config) -> ResultRecord:
    cfg = {**dict(algorithm="fo-sgd", model="tiny-opt", data="wiki-en", world_size=1, backend="threads",
                  steps=2, seed=0, params={}), **config}
    return ResultRecord(algorithm="fo-sgd", config=cfg, world_size=1, backend="threads", model="tiny-opt",
                        data="wiki-en", steps=2, seed=0, metrics={"final_loss": Metric(1.0, "nats/token")})


def test_configs_that_differ_get_distinct_labels():
    recs = [_rec(), _rec(lr=0.1), _rec(lr=0.2), _rec(params={"k": 4}), _rec(latency_ms=5.0)]
    assert len({_key(r) for r in recs}) == len(recs)
    labels = [_label(r) for r in recs]
    assert len(set(labels)) == len(labels), labels
    assert "[k=4]" in labels[3]
    assert _label(_rec(lr=0.1)) == labels[1]  # the same config, the same label
