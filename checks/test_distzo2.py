"""DistZO2: PertP / DDP / 2D equal single-device MeZO; only scalars cross; sliced bytes."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from algorithms.zo.distzo2 import scalar_bytes_per_rank, shard_batch
from algorithms.zo.estimator import scalars, walk
from algorithms.zo.offload import slice_len
from algorithms.zo.perturb import Perturber, step_seeds, zo_update
from algorithms.zo.throughput import model_extras, rate
from harness.config import ConfigError
from harness.data import get_dataset
from harness.launcher import run
from harness.models import PRESETS, build_model, lm_loss
from harness.registry import make_config
from harness.results import params_sha256, params_sha256_of_model

COMMON = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=16)
ZO = dict(lr=1e-2, difference="central")


def _run(algo, world=1, backend="threads", dtype="float64", **params):
    return run(make_config(algo, world_size=world, backend=backend, dtype=dtype,
                           params=dict(ZO, **params), **COMMON))


def _sha(rec):
    return rec.metrics["params_sha256"].value


@pytest.fixture(scope="module")
def mezo_sha():
    return {d: _sha(_run("mezo", dtype=d)) for d in ("float32", "float64")}


def sharded_mezo_sha(K, dtype=torch.float64):
    """Single device, concatenated batch: MeZO with g = mean over K equal row-chunks of their g_k."""
    data = make_config("mezo", **COMMON).data
    model = build_model("tiny-opt", seed=0, dtype=dtype).eval()
    pert = Perturber(list(enumerate(model.parameters())), "exact")
    with torch.no_grad():
        for t in range(COMMON["steps"]):
            ids, labels = get_dataset(data).batch(t, batch_size=COMMON["batch_size"],
                                                       seq_len=COMMON["seq_len"], seed=0)
            seeds = step_seeds(0, t, 1)
            gs = []
            for ci, cl in zip(ids.chunk(K), labels.chunk(K), strict=True):
                losses = [lm_loss(model(ci).logits, cl) for _ in walk(pert, seeds, 1e-3, "central")]
                gs.append(scalars(losses, "central", 1e-3))
            g = [float(torch.tensor(sum(x[0] for x in gs) / K, dtype=torch.float32))]
            zo_update(pert, seeds, g, ZO["lr"])
    return params_sha256_of_model(model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algo, world, params", [
    ("distzo2-pertp", 2, {}),
    ("distzo2-ddp", 2, dict(same_batch=True)),
    ("distzo2-ddp", 3, dict(same_batch=True)),
    ("distzo2-2d", 4, dict(same_batch=True)),
    ("distzo2-pertp", 2, dict(sliced=True)),
    ("distzo2-2d", 4, dict(same_batch=True, sliced=True, budget=2)),
])
def test_same_batch_equals_single_device_mezo_threads(mezo_sha, dtype, algo, world, params):
    rec = _run(algo, world, dtype=dtype, **params)  # the record also checks all ranks agree
    assert _sha(rec) == mezo_sha[dtype]


@pytest.mark.parametrize("algo, world, K", [("distzo2-ddp", 2, 2), ("distzo2-ddp", 4, 4), ("distzo2-2d", 4, 2)])
def test_own_shards_equal_mezo_with_averaged_shard_scalars(mezo_sha, algo, world, K):
    rec = _run(algo, world)
    assert _sha(rec) == sharded_mezo_sha(K)
    if algo == "distzo2-ddp":  # DDP ranks log their own shard's loss: the shards really differ
        assert rec.history["loss"] != rec.history[f"loss[rank{world - 1}]"]


def test_scalar_bytes_are_the_closed_form():
    P = 2
    for algo, world, pair, dtype, size in [("distzo2-pertp", 2, 2, "float32", 4),
                                           ("distzo2-pertp", 2, 2, "float64", 8),
                                           ("distzo2-ddp", 3, 1, "float64", 8),
                                           ("distzo2-2d", 4, 2, "float32", 4)]:
        rec = _run(algo, world, dtype=dtype, perturbations=P, same_batch=algo != "distzo2-pertp")
        per_rank = scalar_bytes_per_rank(world, pair, P, size)
        assert per_rank == (world - 1) * P * (4 if pair == 1 else size)
        assert rec.metrics["payload_bytes_per_step"].value == world * per_rank
        for r in rec.per_rank:
            assert r["metrics"]["sent_bytes_per_step[zo2.scalar]"].value == per_rank
        assert rec.metrics["d2d_bytes_per_step"].value == 0


@pytest.mark.parametrize("world, algo", [(2, "distzo2-pertp"), (3, "distzo2-ddp"), (4, "distzo2-2d")])
def test_sliced_transfer_bytes(world, algo):
    rec = _run(algo, world, dtype="float32", sliced=True, same_batch=algo != "distzo2-pertp")
    model = build_model("tiny-opt", seed=0)
    M = sum(p.numel() for p in model.model.decoder.layers[0].parameters())
    N, S = PRESETS["tiny-opt"].num_blocks, slice_len(M, world)
    assert world * S >= M > (world - 1) * S  # the slices of the ranks make one (padded) block
    m = rec.metrics
    assert m["h2d_bytes_per_step"].value == m["d2h_bytes_per_step"].value == N * S * 4
    assert m["d2d_bytes_per_step"].value == N * (world - 1) * S * 4
    for r in rec.per_rank:
        assert r["metrics"]["sent_bytes_per_step[zo2.gather]"].value == N * (world - 1) * S * 4
    assert m["host_master_bytes"].value == N * S * 4  # each rank's host holds only its slice
    assert m["host_master_bytes"].unit == "bytes"
    assert m["device_pool_peak_bytes"].unit == "bytes"


def _measured(n, h2d=(8000, 2.0), d2d=(6000, 0.5)):
    """An offloader's link counters as :func:`model_extras` reads them: 3 blocks, the largest 1000 float32."""
    return SimpleNamespace(n=n, esize=4, numel=[1000, 600, 1000], bytes={"h2d": h2d[0], "d2h": 0, "d2d": d2d[0]},
                           seconds={"h2d": h2d[1], "d2h": 0.0, "d2d": d2d[1]})


def test_throughput_model_is_eqs_3_and_4_at_the_measured_rates():
    # DistZO2 App. C: T_block = M / (n B_PCIe) + (n - 1) M / (n B_NVLink) (Eq. 3), pipelined
    # max of the two stages, T_step = max(N T_block, T_comp) (Eq. 4); M the largest block
    M, b_pcie, b_nv = 4000, 8000 / 2.0, 6000 / 0.5
    tb = M / (2 * b_pcie) + M / (2 * b_nv)
    assert model_extras(_measured(2), compute_s=1.0, steps=1) == {
        "link_rate_h2d": (b_pcie, "bytes/s"), "link_rate_d2d": (b_nv, "bytes/s"),
        "model_t_block_s": (pytest.approx(tb), "s"),
        "model_t_block_pipelined_s": (pytest.approx(max(M / (2 * b_pcie), M / (2 * b_nv))), "s"),
        "model_t_comp_s": (1.0, "s"), "model_t_step_s": (pytest.approx(3 * tb), "s")}
    one = model_extras(_measured(1, d2d=(0, 0.0)), compute_s=12.0, steps=3)  # unsliced: no peer stage
    assert one["model_t_block_s"] == (M / b_pcie, "s") and "link_rate_d2d" not in one
    assert one["model_t_step_s"] == (4.0, "s")  # compute-bound: T_comp = 12 s / 3 steps > 3 T_block = 3 s
    # no measured rate (nothing timed on a link the model needs): no prediction, not a division by 0
    assert rate(8000, 0.0) is None and rate(0, 1.0) is None
    assert model_extras(_measured(1, h2d=(8000, 0.0)), compute_s=1.0, steps=1) == {}
    assert model_extras(_measured(2, d2d=(6000, 0.0)), compute_s=1.0, steps=1) == {}


@pytest.mark.parametrize("algo, world, params, message", [
    ("distzo2-pertp", 3, {}, "world size 2"),
    ("distzo2-pertp", 2, dict(difference="forward"), "central"),
    ("distzo2-2d", 3, {}, "even"),
    ("distzo2-ddp", 3, {}, "equal shards"),
])
def test_rank_counts_that_do_not_fit_fail_clearly(algo, world, params, message):
    with pytest.raises(ConfigError, match=message):
        make_config(algo, world_size=world, params=dict(ZO, **params), **COMMON)


# --------------------------------------------------------------------------- gloo
def _gloo_runs(runs, comm):
    """Several rank programs in one gloo world (the rank processes are started once)."""
    from harness.context import RankContext
    from harness.registry import get_algorithm

    out = []
    for algo, params in runs:
        cfg = make_config(algo, world_size=comm.world_size, backend="gloo", dtype="float64",
                          params=dict(ZO, **params), **COMMON)
        o = get_algorithm(algo).run(RankContext(cfg, comm))
        out.append((params_sha256(o.params), o.sent_bytes))
    return out


@pytest.mark.gloo
def test_gloo_two_ranks_equal_mezo(mezo_sha):
    from checks._gloo import run_gloo

    runs = [("distzo2-pertp", {}), ("distzo2-ddp", dict(same_batch=True)), ("distzo2-2d", dict(same_batch=True)),
            ("distzo2-pertp", dict(sliced=True)), ("distzo2-ddp", {})]
    res = run_gloo(2, partial(_gloo_runs, runs), timeout_s=120)
    for k in range(len(runs)):
        assert res[0][k][0] == res[1][k][0]  # ranks agree
    assert [r[0] for r in res[0][:4]] == [mezo_sha["float64"]] * 4
    assert res[0][4][0] == sharded_mezo_sha(2)
    assert res[0][0][1] == 3 * 8  # PertP: one float64 loss per step to the peer


@pytest.mark.gloo
def test_gloo_zo2_and_2d_mesh_equal_mezo(mezo_sha):
    rec = _run("zo2", 1, backend="gloo")
    assert _sha(rec) == mezo_sha["float64"]
    rec = _run("distzo2-2d", 4, backend="gloo", same_batch=True)
    assert _sha(rec) == mezo_sha["float64"]


@pytest.mark.parametrize("groups, same_batch", [(1, False), (2, False), (2, True)])
def test_shard_batch_puts_ids_and_labels_on_the_run_device(groups, same_batch):
    # The meta device stands in for an accelerator: both tensors of a shard land on it,
    # with the shapes of the shard (batch_size / groups rows unless every group shares one).
    cfg = make_config("distzo2-ddp", model="tiny-opt", batch_size=4, seq_len=8)
    ids, labels = shard_batch(cfg, 0, groups - 1, groups, same_batch, torch.device("meta"))
    assert ids.device.type == labels.device.type == "meta"
    rows = 4 if groups == 1 or same_batch else 4 // groups
    assert tuple(ids.shape) == tuple(labels.shape) == (rows, 8)
