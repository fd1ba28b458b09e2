"""``mezo``: P scalars per step, replay from the (seed, scalar) log, clear config errors."""

import pytest
import torch

from algorithms.zo.mezo import batch, replay, scalar_log
from harness.config import ConfigError
from harness.data import get_dataset
from harness.launcher import run
from harness.models import build_model
from harness.registry import make_config
from harness.results import params_sha256_of_model


def _mezo(**params):
    base = dict(lr=1e-2, perturbations=3)
    base.update(params)
    cfg = make_config("mezo", model="tiny-opt", steps=4, batch_size=4, seq_len=16, params=base)
    return cfg, run(cfg)


@pytest.mark.parametrize("difference", ["forward", "central"])
def test_replay_from_seed_scalar_log_reproduces_params(difference):
    cfg, rec = _mezo(difference=difference)
    assert all(len(rec.history[f"g{i}"]) == cfg.steps for i in range(3))  # P scalars per step
    model = build_model(cfg.model, seed=cfg.seed)
    start = params_sha256_of_model(model)
    replay(list(enumerate(model.parameters())), scalar_log(cfg, rec.history), cfg.params.lr)
    assert params_sha256_of_model(model) == rec.metrics["params_sha256"].value != start


def test_training_moves_and_is_deterministic():
    _, a = _mezo()
    _, b = _mezo()
    assert a.metrics["params_sha256"].value == b.metrics["params_sha256"].value
    assert a.metrics["payload_bytes_per_step"].value == 0  # centralised: nothing on the wire


def test_inplace_mode_reports_restore_drift():
    _, rec = _mezo(mode="inplace", track_drift=True)
    assert 0 < rec.metrics["restore_drift_max"].value < 1e-6
    assert 0 < rec.metrics["restore_drift_fraction"].value < 1
    assert rec.metrics["restore_drift_max"].unit == "abs"  # an absolute parameter difference
    assert rec.metrics["restore_drift_fraction"].unit == "ratio"


def test_batch_puts_ids_and_labels_on_the_run_device():
    # the meta device stands in for an accelerator: both tensors must land on the requested device
    cfg = make_config("mezo", model="tiny-opt", batch_size=2, seq_len=8)
    ids, labels = batch(cfg, 0, torch.device("meta"))
    assert ids.device.type == labels.device.type == "meta"
    ref = get_dataset(cfg.data).batch(0, batch_size=2, seq_len=8, seed=cfg.seed)
    assert [(t.shape, t.dtype) for t in (ids, labels)] == [(t.shape, t.dtype) for t in ref]


def test_scalars_are_float32_values():
    _, rec = _mezo()
    for i in range(3):
        for g in rec.history[f"g{i}"]:
            assert float(torch.tensor(g, dtype=torch.float32)) == g


@pytest.mark.parametrize("params, message", [
    (dict(perturbations=0), "perturbations"),
    (dict(mu=0.0), "mu"),
    (dict(mu=-1e-3), "mu"),
    (dict(lr=0.0), "lr"),
    (dict(difference="backward"), "difference"),
    (dict(mode="sloppy"), "mode"),
])
def test_bad_config_fails_clearly(params, message):
    with pytest.raises(ConfigError, match=message):
        make_config("mezo", params=params)
