"""Protocol Models: lossless subspace wire, gradient and trajectory equivalence with
the unsplit constrained model, the subspace invariant under AdamW + Grassmann, bytes, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.protocol.model import ConstrainedModel, first_free_block, residual_problem
from algorithms.protocol.pipeline import (
    GramAccumulator,
    ProtocolParams,
    bytes_per_token,
    expected_bytes,
    grassmann_sync,
    make_wire,
    protocol_step,
    wire_codec,
)
from algorithms.protocol.subspace import (
    SubspaceAdamW,
    Wire,
    fixed_table,
    grassmann_step,
    make_basis,
    off_subspace,
    project_,
)
from harness.comm import run_threads
from harness.config import ConfigError
from harness.launcher import rank_program, run
from harness.models import PRESETS, build_model, build_stage, lm_loss
from harness.registry import make_config
from harness.seeding import keyed_generator

F64 = torch.float64
MODELS = ("tiny-llama", "tiny-gpt2")
seeds = st.integers(0, 2**32 - 1)


def _cfg(algo="protocol", **kw):
    base = dict(world_size=2, model="tiny-llama", data="synthetic-markov", steps=3, batch_size=4,
                seq_len=8, micro_batches=2, dtype="float64")
    params = kw.pop("params", {})
    base.update(kw)
    return make_config(algo, params=params, **base)


# --------------------------------------------------------------------------- the wire
@settings(max_examples=25, deadline=None)
@given(seed=seeds, d=st.integers(2, 48), data=st.data(), vocab=st.integers(2, 300),
       b=st.integers(1, 3), n=st.integers(1, 12), with_pe=st.booleans())
def test_reconstruction_is_exact_for_random_basis_inputs_tokens(seed, d, data, vocab, b, n, with_pe):
    k = data.draw(st.integers(1, d - 1))
    g = torch.Generator().manual_seed(seed)
    U = make_basis(d, k, seed)
    wire = Wire(U, torch.randn(vocab, d, generator=g, dtype=F64),
                torch.randn(16, d, generator=g, dtype=F64) if with_pe else None)
    ids = torch.randint(0, vocab, (b, n), generator=g)
    x = wire.base(ids) + torch.randn(b, n, k, generator=g, dtype=F64) @ U.T  # residual part in S
    c = wire.encode(x, ids)
    assert c.shape == (b, n, k)
    torch.testing.assert_close(wire.decode(c, ids), x, rtol=0, atol=1e-12)
    assert float((U.T @ U - torch.eye(k, dtype=F64)).abs().max()) <= 1e-12
    # negative control: a residual component outside S is lost
    v = torch.randn(d, generator=g, dtype=F64)
    v = v - U @ (U.T @ v)
    if float(v.norm()) > 1e-6:
        assert float((wire.decode(wire.encode(x + v, ids), ids) - (x + v)).abs().max()) > 1e-8


@settings(max_examples=6, deadline=None)
@given(seed=seeds, model=st.sampled_from(MODELS), k=st.integers(1, 31))
def test_constrained_stage_output_reconstructs_exactly(seed, model, k):
    cfg = _cfg(model=model, seed=seed % 1000, params={"k": k, "fixed_std": 0.5})
    wire = make_wire(cfg, F64, "cpu")
    stage = build_stage(model, seed=cfg.seed, num_stages=2, stage_index=0, dtype=F64)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed))
    raw = stage(ids)[0].detach()
    ConstrainedModel(stage, wire, first_free_block(PRESETS[model].num_blocks, 2))
    x = stage(ids)[0].detach()
    torch.testing.assert_close(wire.decode(wire.encode(x, ids), ids), x, rtol=0,
                               atol=1e-12 * float(x.abs().max()))
    # the unconstrained model's boundary activation is not in the subspace (path check)
    assert float((wire.decode(wire.encode(raw, ids), ids) - raw).abs().max()) > 1e-6


# --------------------------------------------------------------------------- gradients
def _pipeline_grads(model, S, seed, k, ids, labels, M):
    cfg = _cfg(model=model, world_size=S, seed=seed, params={"k": k, "fixed_std": 0.3})
    pr = PRESETS[model]

    def body(comm):
        stage = build_stage(model, seed=seed, num_stages=S, stage_index=comm.rank, dtype=F64)
        wire = make_wire(cfg, F64, "cpu")
        cm = ConstrainedModel(stage, wire, first_free_block(pr.num_blocks, S))
        loss = protocol_step(comm, stage, wire, ids, labels, M, wire_codec(cfg.params, F64), pr.vocab_size)
        cm.project_grads()
        return loss, {i: p.grad.clone() for i, _, p in stage.global_named_parameters() if p.grad is not None}

    outs = run_threads(S, body)
    grads = {}
    for _, g in outs:
        grads.update(g)
    return outs[-1][0], grads, cfg


@settings(max_examples=6, deadline=None)
@given(seed=seeds, model=st.sampled_from(MODELS), S=st.integers(2, 4), k=st.integers(1, 31))
def test_every_weight_gradient_equals_unsplit_constrained_model(seed, model, S, k):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (4, 8), generator=g)
    labels = torch.randint(0, 256, (4, 8), generator=g)
    mseed = seed % 10_000
    loss_p, grads_p, cfg = _pipeline_grads(model, S, mseed, k, ids, labels, 2)

    net = build_model(model, seed=mseed, dtype=F64)
    cm = ConstrainedModel(net, make_wire(cfg, F64, "cpu"), first_free_block(PRESETS[model].num_blocks, S))
    loss_u = 0.0
    for part, lab in zip(ids.chunk(2), labels.chunk(2), strict=True):
        loss = lm_loss(net(part).logits, lab) / 2
        loss.backward()
        loss_u += loss.item()
    cm.project_grads()
    ref = {i: p.grad for i, p in enumerate(net.parameters())}
    assert abs(loss_p - loss_u) <= 1e-12
    assert set(grads_p) == set(ref)
    for i in ref:
        torch.testing.assert_close(grads_p[i], ref[i], rtol=0, atol=1e-12, msg=f"param {i}")


# --------------------------------------------------------------------------- optimiser / Grassmann
@settings(max_examples=10, deadline=None)
@given(seed=seeds)
def test_rowconst_adamw_keeps_down_projection_in_subspace(seed):
    g = torch.Generator().manual_seed(seed)
    d, dff, k = 16, 24, 3
    U = make_basis(d, k, seed)
    ws = [project_(torch.randn(d, dff, generator=g, dtype=F64), U, 0).requires_grad_() for _ in range(2)]
    opts = [SubspaceAdamW([{"params": [w], "row_axis": ax}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                          weight_decay=0.01) for w, ax in zip(ws, (0, None), strict=True)]
    for _ in range(50):
        grad = project_(torch.randn(d, dff, generator=g, dtype=F64), U, 0)
        for w, o in zip(ws, opts, strict=True):
            w.grad = grad.clone()
            o.step()
    assert off_subspace(ws[0].detach(), U, 0) <= 1e-12
    assert off_subspace(ws[1].detach(), U, 0) > 1e-4  # plain AdamW leaves S


@settings(max_examples=10, deadline=None)
@given(seed=seeds)
def test_grassmann_step_is_a_descent_step_on_the_grassmannian(seed):
    g = torch.Generator().manual_seed(seed)
    d, k = 12, 3
    G = torch.randn(40, d, generator=g, dtype=F64) * torch.linspace(0.2, 3, d, dtype=F64)
    S = G.T @ G
    U = make_basis(d, k, seed)

    def residual(u):
        return float(torch.linalg.norm(G - G @ u @ u.T) ** 2)

    # closed-form tangent gradient = tangent projection of autograd's gradient
    u = U.clone().requires_grad_()
    (torch.linalg.norm(G - G @ u @ u.T) ** 2).backward()
    tangent = u.grad - U @ (U.T @ u.grad)
    closed = -2 * (S @ U - U @ (U.T @ (S @ U)))
    torch.testing.assert_close(tangent, closed, rtol=1e-9, atol=1e-9 * float(closed.abs().max()))
    before = residual(U)
    for _ in range(20):
        new = grassmann_step(U, S, 1, 0.1)
        assert residual(new) <= residual(U) + 1e-9 * before
        U = new
    assert float((U.T @ U - torch.eye(k, dtype=F64)).abs().max()) <= 1e-12
    assert residual(U) < before


def _outputs(cfg):
    return run_threads(cfg.world_size, lambda comm: rank_program(cfg, comm))


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 1000), model=st.sampled_from(MODELS), S=st.integers(2, 3),
       every=st.integers(1, 3), wp2=st.sampled_from(("rowconst_adamw", "adamw")), k=st.integers(2, 12))
def test_trajectory_equals_unsplit_and_weights_stay_in_subspace(seed, model, S, every, wp2, k):
    params = {"k": k, "grassmann_every": every, "wp2_optimizer": wp2, "lr": 3e-3}
    pipe = _cfg(model=model, world_size=S, seed=seed, steps=4, params=params)
    cent = _cfg("protocol-central", model=model, world_size=1, seed=seed, steps=4,
                params={**params, "stages": S})
    outs_p, outs_c = _outputs(pipe), _outputs(cent)
    hist_p = outs_p[-1].history["loss"]
    torch.testing.assert_close(torch.tensor(hist_p), torch.tensor(outs_c[0].history["loss"]),
                               rtol=0, atol=1e-10)
    ref = dict(outs_c[0].params)
    for o in outs_p:
        for i, t in o.params:
            torch.testing.assert_close(t, ref[i], rtol=0, atol=1e-6)  # float32 copies
    for o in (*outs_p, outs_c[0]):
        assert o.extra["subspace_distance"][0] <= 1e-10
        assert o.extra["basis_orthonormality_error"][0] <= 1e-12
        assert o.extra["grassmann_updates"][0] == 4 // every
        assert o.extra["basis_shift_sin"][0] > 1e-6  # the subspace really moved


# --------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("model,S,k,dtype", [("tiny-llama", 2, 4, "float64"), ("tiny-gpt2", 3, 8, "float32"),
                                             ("tiny-llama", 4, 1, "float32")])
def test_bytes_equal_closed_form_and_ratio_is_d_over_k(model, S, k, dtype):
    cfg = _cfg(model=model, world_size=S, dtype=dtype, steps=2, params={"k": k})
    rec = run(cfg)
    per_tag = {tag: sum(r["metrics"][f"sent_bytes_per_step[{tag}]"].value for r in rec.per_rank
                        if f"sent_bytes_per_step[{tag}]" in r["metrics"]) for tag in ("act", "grad")}
    exp = expected_bytes(cfg)
    assert per_tag == exp
    assert rec.metrics["payload_bytes_per_step"].value == exp["act"] + exp["grad"]
    # values per token (headers removed) against the closed form
    d, tokens = PRESETS[model].d_model, cfg.batch_size * cfg.seq_len
    msgs = (S - 1) * cfg.micro_batches
    hdr_c = wire_codec(cfg.params, cfg.torch_dtype).encoded_nbytes(torch.empty(0, 0, 0))
    hdr_ids = 26  # ids codec, 2-D tensor: 18 + 4 * 2
    per = bytes_per_token(cfg)
    s = 8 if dtype == "float64" else 4
    assert per == {"fwd": k * s + 1, "bwd": k * s, "uncompressed": d * s}
    assert (per_tag["act"] - msgs * (hdr_c + hdr_ids)) / ((S - 1) * tokens) == k * s + 1
    assert (per_tag["grad"] - msgs * hdr_c) / ((S - 1) * tokens) == k * s
    # the uncompressed pipeline on the same config: d values each way
    base = run(make_config("pipeline-sgd", world_size=S, model=model, data=cfg.data, steps=2,
                           batch_size=cfg.batch_size, seq_len=cfg.seq_len, micro_batches=2, dtype=dtype))
    raw_grad = base.metrics["payload_bytes_per_step"].value / 2 - msgs * hdr_c
    assert raw_grad / (per_tag["grad"] - msgs * hdr_c) == d / k


@pytest.mark.gloo
def test_gloo_matches_threads():
    cfg = _cfg(steps=2, params={"k": 4, "grassmann_every": 1})
    a = run(cfg)
    b = run(make_config("protocol", params=cfg.params, **{**{f: getattr(cfg, f) for f in (
        "world_size", "model", "data", "steps", "batch_size", "seq_len", "micro_batches", "dtype")},
        "backend": "gloo"}))
    assert a.metrics["params_sha256"].value == b.metrics["params_sha256"].value
    assert a.metrics["payload_bytes_per_step"].value == b.metrics["payload_bytes_per_step"].value


# --------------------------------------------------------------------------- bad configurations
def test_bad_configurations_fail_with_clear_messages():
    with pytest.raises(ConfigError, match=r"k = 32 must be < d = 32"):
        _cfg(params={"k": 32})
    with pytest.raises(ConfigError, match=r"k = 40 must be < d = 32"):
        _cfg(params={"k": 40})
    for bad in (0, -3):
        with pytest.raises(ValueError, match=r"k must be an int >= 1"):
            _cfg(params={"k": bad})
    with pytest.raises(ConfigError, match=r"unknown model 'mlp-64-100-10' for protocol; choose from tiny-opt"):
        _cfg(model="mlp-64-100-10")  # a name outside the presets: named before any fit rule runs
    with pytest.raises(ValueError, match=r"not a residual transformer"):
        mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        ConstrainedModel(mlp, Wire(make_basis(4, 2, 0), fixed_table(3, 4, 0, "t", 1.0, F64), None), 1)
    with pytest.raises(ValueError, match=r"1 <= k < d"):
        make_basis(8, 8, 0)
    with pytest.raises(ConfigError, match=r"needs world size >= 2"):
        _cfg(world_size=1)


def test_bounds_and_preset_list_in_the_messages_are_exact():
    with pytest.raises(ValueError, match=r"^eps must be > 0, got 0\.0$"):  # eps is a divisor's floor
        ProtocolParams(eps=0.0)
    assert ProtocolParams(eps=1e-300).eps == 1e-300
    msg = residual_problem("mlp-64-100-10")
    head = ("model 'mlp-64-100-10' has no residual transformer blocks; protocol needs a pre-norm "
            "residual transformer preset (")
    assert msg.startswith(head) and msg.endswith(")")
    assert msg[len(head):-1].split(", ") == list(PRESETS)  # every preset, named once, comma-separated
    assert residual_problem("tiny-llama") is None


@settings(max_examples=10, deadline=None)
@given(seed=seeds, d=st.integers(2, 40), data=st.data())
def test_basis_is_the_unique_qr_of_its_keyed_gaussian(seed, d, data):
    # subspace.py: U = Q of QR(Z), R with a positive diagonal, Z ~ N(0, 1) (d x k) from the stream
    # ("commbench.protocol", "basis", seed), so every rank derives the same U.  That Q is the one
    # orthonormal U with Z = U R, R = UᵀZ upper triangular with a positive diagonal.
    k = data.draw(st.integers(1, d - 1))
    z = torch.randn(d, k, generator=keyed_generator("commbench.protocol", "basis", seed), dtype=F64)
    U = make_basis(d, k, seed)
    r = U.T @ z
    torch.testing.assert_close(U.T @ U, torch.eye(k, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(U @ r, z, rtol=0, atol=1e-12)
    assert float(r.tril(-1).abs().max()) <= 1e-12 and bool((r.diagonal() > 0).all())


@settings(max_examples=10, deadline=None)
@given(seed=seeds, name=st.sampled_from(("tokens", "positions")), std=st.floats(0.01, 3.0))
def test_fixed_table_is_its_keyed_gaussian_times_std(seed, name, std):
    # subspace.py: T_fixed / PE_fixed ~ N(0, std²) drawn in float32 from the stream
    # ("commbench.protocol", "fixed", name, seed): every rank of a run derives the same table,
    # and another run seed gives another table.
    z = torch.randn(5, 6, generator=keyed_generator("commbench.protocol", "fixed", name, seed))
    torch.testing.assert_close(fixed_table(5, 6, seed, name, std, F64), (z * std).to(F64), rtol=0, atol=0)
    assert not torch.equal(fixed_table(5, 6, seed, name, std), fixed_table(5, 6, seed + 1, name, std))


@settings(max_examples=5, deadline=None)
@given(seed=seeds)
def test_subspace_adamw_group_without_row_axis_is_torch_adamw(seed):
    # A group that names no row_axis is plain per-tensor AdamW (the class docstring: torch's
    # decoupled decay and bias correction), so it must step exactly like torch.optim.AdamW.
    g = torch.Generator().manual_seed(seed)
    w0 = torch.randn(4, 5, generator=g, dtype=F64)
    a, b = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours, ref = SubspaceAdamW([a], **hp), torch.optim.AdamW([b], foreach=False, **hp)
    for _ in range(3):
        grad = torch.randn(4, 5, generator=g, dtype=F64)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-14)


def test_grassmann_sync_broadcasts_the_step_under_its_tag():
    # pipeline.py (module docstring): the src rank takes the Grassmann step and broadcasts the new
    # U under tag "grassmann" (runs are metered per tag): d·k values to each of the S-1 others.
    S, d, k, src = 3, 6, 2, 2
    U0 = make_basis(d, k, 0)
    G = torch.randn(9, d, generator=torch.Generator().manual_seed(1), dtype=F64)
    stub = type("Stub", (), {"project": lambda self: None, "project_moments": lambda self, opt: None})()

    def body(comm):
        gram = None
        if comm.rank == src:
            gram = GramAccumulator(d, F64, "cpu")
            gram.add(G)
            gram.steps = 1
        wire = Wire(U0.clone(), fixed_table(3, d, 0, "tokens", 1.0, F64), None)
        grassmann_sync(comm, wire, stub, None, gram, 0.1, src)
        snap = comm.meter.snapshot()
        return wire.U, snap.by_tag("sent"), snap.by_tag("received")

    want = grassmann_step(U0, G.T @ G, 1, 0.1)
    for rank, (U, sent, received) in enumerate(run_threads(S, body)):
        torch.testing.assert_close(U, want, rtol=0, atol=0)
        if rank == src:
            assert (sent, received) == ({"grassmann": (d * k * 8 * (S - 1), S - 1)}, {})
        else:
            assert (sent, received) == ({}, {"grassmann": (d * k * 8, 1)})
