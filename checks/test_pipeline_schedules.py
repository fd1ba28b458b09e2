"""The engine's schedules (GPipe, 1F1B) and its receives posted ahead change only time: every
pipeline that runs on the engine reaches the same parameters with the same bytes and messages
under either schedule, on threads and gloo, at 2 and 3 stages.  (``sparq`` has its own
schedule, not the engine's: nothing to compare.)"""

from __future__ import annotations

import pytest

from algorithms.pipeline.engine import POSTS_AHEAD, schedule_ops
from algorithms.pipeline.params import SCHEDULES, SGDParams
from harness.comm.threads import ThreadsComm
from harness.launcher import run
from harness.registry import make_config

# micro_batches > stages, so 1F1B has a warm-up, a steady state and a drain at every stage
COMMON = dict(model="tiny-opt", data="wiki-en", steps=2, seed=5, batch_size=8, seq_len=16, micro_batches=4)
ALGOS = {
    "pipeline-sgd": {},
    "pipeline-sgd/ffn_act": {"cut": "ffn_act"},  # two tensors per boundary
    "aq-sgd": {"dataset_size": 16, "raw_first_visit": True},  # one or two messages per tensor
    "clapping-fc": {},
    "protocol": {"k": 4, "grassmann_every": 1},
}


def _fingerprint(name: str, world: int, backend: str, schedule: str) -> tuple:
    algo = name.split("/")[0]
    cfg = make_config(algo, world_size=world, backend=backend,
                      params={**ALGOS[name], "schedule": schedule}, **COMMON)
    m = run(cfg).metrics
    return (m["params_sha256"].value, m["payload_bytes_per_step"].value, m["messages_per_step"].value,
            m["final_loss"].value)


def _check(name: str, world: int, backend: str) -> None:
    gpipe = _fingerprint(name, world, backend, "gpipe")
    assert _fingerprint(name, world, backend, "1f1b") == gpipe


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", list(ALGOS))
def test_1f1b_equals_gpipe_on_threads(name, world):
    _check(name, world, "threads")


@pytest.mark.gloo
@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALGOS))
def test_1f1b_on_gloo_equals_gpipe_on_threads(name):
    # one gloo run each: 3 stages have both end stages and a middle one, so 1F1B's interleaved
    # sends and receives meet the transport in every order; GPipe on threads is the reference
    # the threads check above ties to 1F1B on threads
    assert _fingerprint(name, 3, "gloo", "1f1b") == _fingerprint(name, 3, "threads", "gpipe")


def test_1f1b_pipeline_equals_the_one_process_reference():
    ref = run(make_config("fo-sgd", world_size=1, **COMMON)).metrics["params_sha256"].value
    assert _fingerprint("pipeline-sgd", 3, "threads", "1f1b")[0] == ref


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 3, 5])
def test_schedules_run_every_micro_batch_once_backwards_in_order(world, micro):
    for rank in range(world):
        gp = list(schedule_ops("gpipe", rank, world, micro))
        ob = list(schedule_ops("1f1b", rank, world, micro))
        assert gp == [("F", m) for m in range(micro)] + [("B", m) for m in range(micro)]
        assert sorted(ob) == sorted(gp)
        assert [m for op, m in ob if op == "B"] == list(range(micro))  # accumulation order kept
        assert [m for op, m in ob if op == "F"] == list(range(micro))
        live = peak = 0  # micro-batches whose activations the stage holds
        for op, _ in ob:
            live += 1 if op == "F" else -1
            peak = max(peak, live)
        assert peak == min(world - rank, micro)  # 1F1B's memory bound; GPipe holds all
        if rank == world - 1:  # the last stage turns every forward round at once
            assert ob == [(op, m) for m in range(micro) for op in "FB"]


def _posted_receives(monkeypatch, **params) -> list[tuple[int, int, str]]:
    """(rank, source, tag) of every receive a 3-stage pipeline-sgd step posts ahead."""
    posted = []
    real = ThreadsComm.irecv

    def counting(self, src, tag=""):
        posted.append((self.rank, src, tag))
        return real(self, src, tag)

    monkeypatch.setattr(ThreadsComm, "irecv", counting)
    run(make_config("pipeline-sgd", world_size=3, **{**COMMON, "steps": 1}, params=params))
    return posted


def test_the_engine_posts_the_next_micro_batch_receives_ahead(monkeypatch):
    posted = _posted_receives(monkeypatch)
    m = COMMON["micro_batches"]
    # each stage after the first posts micro-batches 1..M-1's activation, each before the last
    # posts micro-batches 1..M-1's gradient
    assert sorted(posted) == sorted([(1, 0, "act")] * (m - 1) + [(2, 1, "act")] * (m - 1)
                                    + [(0, 1, "grad")] * (m - 1) + [(1, 2, "grad")] * (m - 1))


def test_1f1b_posts_only_the_gradient_receives_ahead(monkeypatch):
    m = COMMON["micro_batches"]
    posted = _posted_receives(monkeypatch, schedule="1f1b")
    assert sorted(posted) == sorted([(0, 1, "grad")] * (m - 1) + [(1, 2, "grad")] * (m - 1))


def test_a_schedule_is_validated_with_the_parameters():
    assert SCHEDULES == ("gpipe", "1f1b")
    with pytest.raises(ValueError, match="schedule must be one of gpipe, 1f1b, got 'interleaved'"):
        SGDParams(schedule="interleaved")
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_config("clapping-fc", world_size=2, params={"schedule": "1F1B"}, **COMMON)
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_config("protocol", world_size=2, params={"schedule": ""}, **COMMON)


def test_every_schedule_says_whether_it_posts_receives_ahead():
    assert POSTS_AHEAD.keys() == set(SCHEDULES)
    assert all(set(tags) <= {"act", "grad"} for tags in POSTS_AHEAD.values())
    assert POSTS_AHEAD["gpipe"] == ("act", "grad")  # the overlap the engine's GPipe is measured with
