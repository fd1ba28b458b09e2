"""The FO references: fo-sgd and pipeline-sgd train the same model on every
backend, count exactly the bytes of the closed form, and fail cleanly."""

from __future__ import annotations

import os
import time

import pytest
import torch

from algorithms.codecs import make_codec
from algorithms.pipeline.engine import LinkCodecs, StageLinks
from algorithms.pipeline.local import train_local
from algorithms.pipeline.sgd import SGDParams, pipeline_bytes_per_step
from harness.launcher import RankFailed, run
from harness.models import PRESETS
from harness.registry import make_config

COMMON = dict(model="tiny-opt", data="wiki-en", steps=3, seed=7, batch_size=4, seq_len=16,
              micro_batches=2)


def _run(algo, world=1, backend="threads", **kw):
    cfg = make_config(algo, world_size=world, backend=backend, **{**COMMON, **kw})
    return cfg, run(cfg)


@pytest.fixture(scope="module")
def reference():
    return {dt: _run("fo-sgd", dtype=dt)[1] for dt in ("float32", "float64")}


def _sha(rec):
    return rec.metrics["params_sha256"].value


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pipeline_threads_equals_fo_sgd(reference, world, dtype):
    cfg, rec = _run("pipeline-sgd", world, "threads", dtype=dtype)
    assert _sha(rec) == _sha(reference[dtype])
    assert rec.metrics["final_loss"].value == reference[dtype].metrics["final_loss"].value


@pytest.mark.gloo
@pytest.mark.parametrize("world", [2, 4])
def test_pipeline_gloo_equals_fo_sgd_and_threads(reference, world):
    cfg, rec = _run("pipeline-sgd", world, "gloo")
    assert _sha(rec) == _sha(reference["float32"])
    assert rec.metrics["payload_bytes_per_step"].value == pipeline_bytes_per_step(cfg)


@pytest.mark.parametrize("model", ["tiny-opt", "tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("cut", ["block", "ffn_act"])
def test_pipeline_equals_fo_for_every_family_and_cut(model, cut):
    _, ref = _run("fo-sgd", model=model, steps=2)
    cfg, rec = _run("pipeline-sgd", 2, model=model, steps=2, params={"cut": cut})
    assert _sha(rec) == _sha(ref)


def test_training_changes_the_parameters_and_lowers_the_loss():
    # the equivalence above must not pass because nothing happened
    _, a = _run("fo-sgd", steps=1)
    _, b = _run("fo-sgd", steps=30, params={"lr": 0.2})
    assert _sha(a) != _sha(b)
    hist = b.history["loss"]
    assert sum(hist[-5:]) / 5 < sum(hist[:5]) / 5


@pytest.mark.parametrize("world,micro,cut", [(2, 1, "block"), (2, 2, "block"), (3, 4, "block"),
                                             (4, 2, "ffn_act")])
def test_counted_bytes_equal_the_closed_form(world, micro, cut):
    cfg, rec = _run("pipeline-sgd", world, micro_batches=micro, batch_size=4, params={"cut": cut})
    m = rec.metrics
    assert m["payload_bytes_per_step"].value == pipeline_bytes_per_step(cfg)
    # one message per boundary tensor per micro-batch per link, each way
    tensors = 2 if cut == "ffn_act" else 1
    assert m["messages_per_step"].value == 2 * (world - 1) * micro * tensors
    # per rank: stage r sends activations forward (r < last) and gradients back (r > 0)
    sends = [pr["metrics"]["messages_per_step"].value for pr in rec.per_rank]
    assert sends == [micro * tensors * ((r < world - 1) + (r > 0)) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_direct_links_are_the_channel_ends_a_stage_touches(world):
    # stage r touches link r-1 (activations in, gradients out) when r > 0 and link r
    # (activations out, gradients in) when r < M-1; the pipeline's ends have None there
    # (engine module docstring, StageLinks)
    fwd, bwd = make_codec("fp32"), make_codec("fp16")
    for rank in range(world):
        links = StageLinks.direct(rank, world, LinkCodecs(forward=fwd, backward=bwd))
        prev, nxt = rank > 0, rank < world - 1
        ends = {"fwd_in": (prev, fwd), "bwd_out": (prev, bwd), "fwd_out": (nxt, fwd), "bwd_in": (nxt, bwd)}
        for name, (present, codec) in ends.items():
            ch = getattr(links, name)
            assert (ch is not None) == present, (world, rank, name)
            assert ch is None or ch.codec is codec, (world, rank, name)
        assert len(links.all()) == 2 * (prev + nxt)


@pytest.mark.parametrize("kw,msg", [
    ({"lr": 0.0}, "lr must be > 0, got 0.0"),
    ({"momentum": 1.0}, "momentum must be in [0, 1), got 1.0"),
    ({"momentum": -0.1}, "momentum must be in [0, 1), got -0.1"),
    ({"cut": "layer"}, "cut must be one of block, ffn_act, got 'layer'"),
])
def test_sgd_params_reject_bad_values_with_the_bound(kw, msg):
    with pytest.raises(ValueError) as e:
        SGDParams(**kw)
    assert str(e.value) == msg


def test_closed_form_is_hidden_state_bytes():
    # block cut, fp32 on the wire: B/micro x T x d floats per message plus the codec header
    from harness.models import PRESETS

    cfg = make_config("pipeline-sgd", world_size=2, **COMMON)
    d = PRESETS["tiny-opt"].d_model
    mb = cfg.batch_size // cfg.micro_batches
    import torch

    header = make_codec("fp32").encoded_nbytes(torch.empty(mb, cfg.seq_len, d)) - mb * cfg.seq_len * d * 4
    assert 0 < header < 64
    assert pipeline_bytes_per_step(cfg) == 2 * cfg.micro_batches * (mb * cfg.seq_len * d * 4 + header)


def test_unmetered_run_counts_nothing_but_trains_the_same():
    _, a = _run("pipeline-sgd", 2)
    _, b = _run("pipeline-sgd", 2, metered=False)
    assert _sha(a) == _sha(b)
    assert b.metrics["payload_bytes_per_step"].value == 0
    assert a.metrics["payload_bytes_per_step"].value > 0


def test_record_has_every_required_metric():
    from harness.results import REQUIRED_METRICS

    _, rec = _run("pipeline-sgd", 2)
    for name in REQUIRED_METRICS:
        assert name in rec.metrics
    assert rec.data_kind == "real"
    assert rec.metrics["peak_memory_bytes"].value > 0
    assert len(rec.per_rank) == 2


@pytest.mark.gloo
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failing_gloo_rank_ends_the_run_with_its_name(how):
    cfg = make_config("pipeline-sgd", world_size=3, backend="gloo", timeout_s=20,
                      inject_fault=f"1@1:{how}", **{**COMMON, "steps": 4})
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run(cfg)
    assert info.value.rank == 1
    msg = str(info.value)
    assert ("InjectedFault: injected fault at step 1" in msg) if how == "raise" else ("died" in msg)
    assert time.monotonic() - t0 < 60
    _assert_no_rank_processes_left()


def test_a_failing_threads_rank_ends_the_run():
    cfg = make_config("pipeline-sgd", world_size=2, inject_fault="0@1", timeout_s=20, **COMMON)
    with pytest.raises(RankFailed, match="rank 0 failed: InjectedFault"):
        run(cfg)


def _assert_no_rank_processes_left():
    mine = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        assert not (ppid == mine and b"harness.rank_entry" in cmd), f"stray rank process {pid}"


class _Stop(Exception):
    pass


class _Toy(torch.nn.Module):
    """Logits = bias (+ ``extra`` during the first ``extra_calls`` forwards); records input devices
    (and stops the run at once if ``extra_calls < 0``)."""

    def __init__(self, vocab, extra_calls):
        super().__init__()
        self.bias, self.extra = torch.nn.Parameter(torch.zeros(vocab)), torch.nn.Parameter(torch.zeros(vocab))
        self.calls, self.extra_calls, self.devices = 0, extra_calls, []

    def forward(self, ids):
        self.calls += 1
        self.devices.append(ids.device)
        if self.extra_calls < 0:
            raise _Stop
        logits = self.bias.expand(*ids.shape, -1)
        return type("Out", (), {"logits": logits + self.extra if self.calls <= self.extra_calls else logits})


def _local_ctx(cfg, device, steps):
    return type("Ctx", (), {"cfg": cfg, "device": device, "steps": lambda self: iter(range(steps)),
                            "log": lambda self, **kw: None})()


def test_train_local_reads_its_batch_on_the_run_device():
    # local.py: every step's batch goes to ctx.device (the rank's accelerator); the "meta" device
    # stands for one here, so a batch left on the CPU shows.
    cfg = make_config("fo-sgd", **COMMON)
    model = _Toy(PRESETS[cfg.model].vocab_size, -1)
    with pytest.raises(_Stop):
        train_local(_local_ctx(cfg, torch.device("meta"), 1), model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model.devices == [torch.device("meta")]


def test_train_local_leaves_a_parameter_its_step_does_not_reach():
    # local.py clears gradients to None each step, as engine.run_step does, so a parameter the
    # step's loss does not reach has no gradient and torch's optimisers skip it; zeroed gradients
    # would let SGD momentum keep moving it.  ``extra`` is used in step 0's micro-batches only.
    cfg = make_config("fo-sgd", **COMMON)
    model = _Toy(PRESETS[cfg.model].vocab_size, cfg.micro_batches)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    train_local(_local_ctx(cfg, torch.device("cpu"), 3), model, opt,
                after_update=lambda step: seen.append(model.extra.detach().clone()))
    assert seen[0].abs().max() > 0
    assert torch.equal(seen[1], seen[0]) and torch.equal(seen[2], seen[0])
    assert model.extra.grad is None
