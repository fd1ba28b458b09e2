"""Compressed pipelines: direct-compress, aq-sgd, clapping-fc / clapping-fu.

Whole runs on the threads backend (gloo where the issue asks for it): identity
equivalences with pipeline-sgd, FU with p = 1, identical EF replicas on both
link ends, memory independent of the dataset size (AQ-SGD's grows by its
closed form), counted bytes = closed form, and clear errors.
"""

from __future__ import annotations

import functools

import pytest
import torch

from algorithms.pipeline.compressed import (
    AQParams,
    ClappingParams,
    CompressedParams,
    build_links,
    ef_state_elements,
    expected_bytes_per_step,
)
from checks._gloo import run_gloo
from harness.config import ConfigError
from harness.launcher import run
from harness.models import PRESETS
from harness.registry import make_config
from harness.results.from_ranks import build_record
from harness.seeding import keyed_seed

COMMON = dict(model="tiny-opt", data="wiki-en", steps=3, seed=7, batch_size=4, seq_len=16, micro_batches=2)
IDENTITY = {"fwd": "identity", "bwd": "identity"}


def _run(algo, world=2, backend="threads", params=None, **kw):
    cfg = make_config(algo, world_size=world, backend=backend, params=params or {}, **{**COMMON, **kw})
    return cfg, run(cfg)


def _sha(rec):
    return rec.metrics["params_sha256"].value


@pytest.fixture(scope="module")
def reference():
    return {w: _sha(_run("pipeline-sgd", w)[1]) for w in (2, 3)}


VARIANTS = [("direct-compress", IDENTITY), ("aq-sgd", {**IDENTITY, "dataset_size": 16}),
            ("clapping-fc", {**IDENTITY, "p": 1.0}), ("clapping-fu", {**IDENTITY, "p": 1.0})]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("algo,params", VARIANTS)
def test_identity_compressor_equals_pipeline_sgd(reference, world, algo, params):
    _, rec = _run(algo, world, params=params)
    assert _sha(rec) == reference[world]


def test_lossy_codecs_change_the_result(reference):
    # the equivalences above must not hold because nothing was compressed
    # (a finite set of 2 batches, so AQ-SGD revisits samples; on a first visit it is direct)
    lossy = {"fwd": "topk:ratio=0.1", "bwd": "topk:ratio=0.1", "dataset_size": 8}
    shas = {_sha(_run(a, 2, params={**p, **lossy})[1]) for a, p in VARIANTS if a != "clapping-fu"}
    assert reference[2] not in shas and len(shas) == 3


def test_identity_with_lazy_sampling_fc_equals_fu_and_differs_from_p1():
    # same lazily sampled sequence; with a lossless link FC and FU are the same training
    fc = _sha(_run("clapping-fc", 2, params={**IDENTITY, "p": 0.5}, steps=6)[1])
    fu = _sha(_run("clapping-fu", 2, params={**IDENTITY, "p": 0.5}, steps=6)[1])
    p1 = _sha(_run("clapping-fc", 2, params={**IDENTITY, "p": 1.0}, steps=6)[1])
    assert fc == fu != p1


@pytest.mark.parametrize("rule", ["batch", "sample"])
def test_fu_with_p1_is_uncompressed_training_even_with_a_lossy_codec(reference, rule):
    _, rec = _run("clapping-fu", 3, params={"fwd": "topk:k=3", "bwd": "natural", "p": 1.0, "rule": rule})
    assert _sha(rec) == reference[3]
    cfg = make_config("pipeline-sgd", world_size=3, **COMMON)
    from algorithms.pipeline.sgd import pipeline_bytes_per_step
    assert rec.metrics["payload_bytes_per_step"].value == pipeline_bytes_per_step(cfg)


def _replicas_agree(rec, world):
    keys = [k for k in rec.history if k.startswith("ef_") and "[" not in k]
    assert len(keys) > 0
    for k in keys:
        link = int(k.rsplit("link", 1)[1])
        other = f"{k}[rank{link + 1}]"  # the key is logged first by the lower rank of the link
        assert rec.history[k] == rec.history[other], k
        assert len(rec.history[k]) == rec.config["steps"]


@pytest.mark.parametrize("algo,params", [
    ("clapping-fc", {"fwd": "randk:ratio=0.1,scaled=false", "bwd": "natural", "p": 0.5}),
    ("clapping-fu", {"fwd": "natural", "bwd": "randk:k=5,scaled=false", "p": 0.5, "rule": "sample"}),
    ("aq-sgd", {"fwd": "qstoch:bits=4", "bwd": "natural", "dataset_size": 8, "raw_first_visit": True}),
])
def test_both_ends_of_every_link_hold_identical_state_after_every_step(algo, params):
    cfg, rec = _run(algo, 3, params={**params, "log_state_digests": True}, steps=5)
    _replicas_agree(rec, 3)
    # the state changed over the run (digests are not all equal), so the check saw real updates
    assert len(set(rec.history["ef_act_link0"])) > 1


@pytest.mark.parametrize("n", [16, 64, 256])
def test_clapping_memory_is_independent_of_dataset_size_and_aqsgd_grows_by_closed_form(n):
    width, item = PRESETS["tiny-opt"].d_model, 4
    shape = dict(links=2, batch=COMMON["batch_size"], seq_len=COMMON["seq_len"], width=width)
    for algo, params in (("clapping-fc", {"p": 0.5}), ("clapping-fu", {"p": 0.5}), ("aq-sgd", {})):
        _, rec = _run(algo, 3, params={**params, "dataset_size": n}, steps=2)
        got = rec.metrics["ef_state_bytes_total"].value
        assert got == item * ef_state_elements(algo, dataset_size=n, **shape)
    assert ef_state_elements("clapping-fc", dataset_size=n, **shape) == 4 * 2 * 4 * 16 * width
    assert ef_state_elements("aq-sgd", dataset_size=n, **shape) == 2 * 2 * n * 16 * width


@pytest.mark.parametrize("algo,params,world,micro", [
    ("direct-compress", {"fwd": "topk:ratio=0.1", "bwd": "randk:k=7,scaled=true"}, 3, 2),
    ("direct-compress", {"fwd": "natural", "bwd": "qstoch:bits=3", "cut": "ffn_act"}, 2, 1),
    ("aq-sgd", {"fwd": "topk:k=9", "bwd": "natural", "dataset_size": 8}, 3, 2),
    ("clapping-fc", {"fwd": "topk:ratio=0.05", "bwd": "qstoch:bits=6", "p": 0.4}, 4, 2),
    ("clapping-fu", {"fwd": "topk:ratio=0.05", "bwd": "natural", "p": 0.4}, 3, 2),
    ("clapping-fu", {"fwd": "natural", "bwd": "topk:k=4", "p": 0.5, "rule": "sample"}, 2, 2),
])
def test_counted_bytes_equal_the_closed_form(algo, params, world, micro):
    cfg, rec = _run(algo, world, params=params, micro_batches=micro, steps=6)
    assert rec.metrics["payload_bytes_per_step"].value == pytest.approx(expected_bytes_per_step(cfg), rel=1e-12)


def test_fu_sends_more_than_fc_and_less_than_uncompressed(reference):
    params = {"fwd": "topk:ratio=0.05", "bwd": "topk:ratio=0.05", "p": 0.5}
    fc = _run("clapping-fc", 2, params=params, steps=8)[1].metrics["payload_bytes_per_step"].value
    fu = _run("clapping-fu", 2, params=params, steps=8)[1].metrics["payload_bytes_per_step"].value
    raw = _run("pipeline-sgd", 2, steps=8)[1].metrics["payload_bytes_per_step"].value
    assert fc < fu < raw


@pytest.mark.parametrize("algo,params,world,match", [
    ("clapping-fc", {"p": 0.0}, 2, r"p must be in \(0, 1\]"),
    ("clapping-fu", {"p": 1.5}, 2, r"p must be in \(0, 1\]"),
    ("clapping-fc", {"p": -0.1}, 2, r"p must be in \(0, 1\]"),
    ("direct-compress", {"fwd": "topk:k=100000"}, 2, r"K=100000 > d="),
    ("clapping-fu", {"bwd": "topk:k=600", "rule": "sample"}, 2, r"K=600 > d=512"),
    ("clapping-fc", {}, 5, r"5 stages do not fit tiny-opt, which has 4 blocks"),
    ("aq-sgd", {"dataset_size": 0}, 2, r"dataset_size must be >= 1"),
    ("aq-sgd", {"dataset_size": 10}, 2, r"not a multiple of batch_size"),
    ("clapping-fc", {"fwd": "topk:k=0"}, 2, r"fwd: topk: k=0"),
    ("clapping-fc", {"rule": "row"}, 2, r"rule must be one of"),
])
def test_invalid_settings_fail_with_a_clear_message(algo, params, world, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        make_config(algo, world_size=world, params=params, **{**COMMON, "seq_len": 16})


@pytest.mark.parametrize("algo,params", [("direct-compress", CompressedParams()), ("aq-sgd", AQParams()),
                                         ("clapping-fc", ClappingParams()), ("clapping-fu", ClappingParams())])
def test_each_link_direction_draws_its_own_codec_stream_at_the_sender(algo, params):
    # links.py: the sender's generator is a link's only randomness, so a randomised codec on two
    # links (or both ways of one) must not draw the same coins; the stream of link e, direction
    # act / grad, is keyed (seed, "codec", direction, e) (checks/test_anchor_aqsgd.py relies on it).
    seed, world = 11, 4
    seen = []
    for rank in range(world):
        ends = build_links(algo, rank, world, params, torch.float32, seed)
        for ch in (ends.fwd_in, ends.bwd_in):  # receivers draw nothing
            assert ch is None or ch.generator is None
        for ch, direction, link in ((ends.fwd_out, "act", rank), (ends.bwd_out, "grad", rank - 1)):
            if ch is not None:
                assert ch.generator.initial_seed() == keyed_seed(seed, "codec", direction, link)
                seen.append(ch.generator.initial_seed())
    assert len(seen) == 2 * (world - 1) == len(set(seen))


def test_clapping_trains_and_evaluates():
    _, rec = _run("clapping-fu", 2, params={"p": 0.5, "lr": 0.2, "eval_batches": 1}, steps=12)
    hist = rec.history["loss"]
    assert sum(hist[-3:]) / 3 < sum(hist[:3]) / 3
    assert 0 <= rec.metrics["val_accuracy"].value <= 1 and rec.metrics["val_loss"].value > 0
    assert 0 < rec.metrics["fresh_fraction"].value <= 1


def test_a_validation_curve_leaves_the_bytes_and_the_training_unchanged():
    # eval_every validates between steps under ctx.unmetered(): the same model, the same counted
    # bytes and messages, one val point per eval_every steps, the last the final validation
    lossy = {"fwd": "topk:ratio=0.2", "bwd": "topk:ratio=0.2", "p": 0.5, "eval_batches": 1}
    _, plain = _run("clapping-fc", 2, params=lossy, steps=4)
    _, curve = _run("clapping-fc", 2, params={**lossy, "eval_every": 1}, steps=4)
    for key in ("params_sha256", "payload_bytes_per_step", "messages_per_step"):
        assert curve.metrics[key].value == plain.metrics[key].value
    assert curve.history["val_step"] == [1, 2, 3, 4]
    assert curve.history["val_loss"][-1] == curve.metrics["val_loss"].value == plain.metrics["val_loss"].value


def test_saved_weights_start_the_pipelines_where_fo_sgd_left_off(tmp_path):
    # fo-sgd save_weights, then weights=: fo-sgd and every pipeline continue from the same model
    # (same parameters after the same steps), which is not the seeded initialisation
    path = str(tmp_path / "ckpt")
    _run("fo-sgd", 1, params={"save_weights": path, "lr": 0.1}, micro_batches=2)
    kw = dict(seed=8, steps=2)
    fo = _sha(_run("fo-sgd", 1, params={"weights": path}, **kw)[1])
    assert _sha(_run("pipeline-sgd", 2, params={"weights": path}, **kw)[1]) == fo
    assert _sha(_run("direct-compress", 2, params={**IDENTITY, "weights": path, "lr": 0.05}, **kw)[1]) == fo
    assert _sha(_run("fo-sgd", 1, **kw)[1]) != fo


def test_linear_schedule_decays_to_zero_over_the_run():
    from algorithms.pipeline.optim import lr_factor

    # Hugging Face's linear schedule without warm-up: the lr of update t is lr0 (1 - t / T)
    assert [0.4 * lr_factor("linear", t, 4, 0.0) for t in range(5)] == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.0])
    assert all(lr_factor("constant", t, 4, 0.0) == 1.0 for t in range(4))


# --------------------------------------------------------------------------- gloo
# One set of gloo processes runs every gloo configuration in turn (spawning
# ranks dominates the cost of a tiny run).
GLOO_WORLD = 3
LOSSY = {"fwd": "topk:ratio=0.2", "bwd": "topk:ratio=0.2", "p": 0.5}
RANDOMIZED = {"fwd": "randk:ratio=0.1,scaled=false", "bwd": "natural", "p": 0.5, "log_state_digests": True}
GLOO_RUNS = [("pipeline-sgd", {}, {})] + [(a, p, {}) for a, p in VARIANTS] + [
    ("clapping-fc", LOSSY, {"dtype": "float64"}), ("clapping-fc", RANDOMIZED, {"steps": 4})]


def _gloo_cfg(algo, params, kw, backend="gloo"):
    return make_config(algo, world_size=GLOO_WORLD, backend=backend, params=params, **{**COMMON, **kw})


def _rank_programs(cfgs, comm):
    from harness.launcher import rank_program

    return [rank_program(cfg, comm) for cfg in cfgs]


@pytest.fixture(scope="module")
def gloo_records():
    cfgs = [_gloo_cfg(*r) for r in GLOO_RUNS]
    outs = run_gloo(GLOO_WORLD, functools.partial(_rank_programs, cfgs), timeout_s=240)
    return [build_record(cfg, [outs[r][i] for r in range(GLOO_WORLD)]) for i, cfg in enumerate(cfgs)]


@pytest.mark.gloo
def test_identity_compressor_equals_pipeline_sgd_on_gloo(reference, gloo_records):
    assert _sha(gloo_records[0]) == reference[3]
    for (algo, _, _), rec in zip(GLOO_RUNS[1:1 + len(VARIANTS)], gloo_records[1:], strict=False):
        assert _sha(rec) == reference[3], algo


@pytest.mark.gloo
def test_lossy_clapping_on_gloo_equals_threads_bitwise(gloo_records, reference):
    # deterministic Top-K, float64, the same seeds: the rank program is backend-independent
    i = len(VARIANTS) + 1
    threads = run(_gloo_cfg(*GLOO_RUNS[i], backend="threads"))
    assert _sha(gloo_records[i]) == _sha(threads) != reference[3]
    assert gloo_records[i].metrics["payload_bytes_per_step"].value == threads.metrics["payload_bytes_per_step"].value


@pytest.mark.gloo
def test_state_replicas_agree_on_gloo_with_a_randomized_compressor(gloo_records):
    _replicas_agree(gloo_records[-1], GLOO_WORLD)
