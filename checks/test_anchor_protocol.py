"""Anchors for Protocol Models: the optimiser state after a Grassmann update, the pipeline
against its unsplit reference in float64 with the subspace moving, and token ids through
the real send path of every family that sends them.

What the paper requires after a subspace update (Protocol Models paper §4.5 with §5 and
App. A; the paper omits the follow-up, which the implementation documents in
``algorithms.protocol.pipeline``):

* **weights**: every constrained tensor lies in the new ``S = Col(U_new)`` along its
  model-width axis, and is the orthogonal projection ``P_new W`` of what it was
  (``P = U Uᵀ``) — not a rotation of its coefficients, not left in the old ``S``;
* **first moment** ``M``: App. A's argument for the row-constant AdamW is that ``M``
  is a linear combination of (projected) gradients, so its rows lie in ``S``; after
  the update ``M`` must therefore be re-projected, ``M ← P_new M`` (the rule this
  implementation documents), so that the next update ``M̂ ⊘ (√Ṽ + ε)`` of a down
  projection is again in the new ``S``;
* **second moment** ``V``: element-wise squares, not a vector of the width space, so
  it is not projected (projection could make it negative); the row-constant rule
  (eqs. 12-14) averages it along the width axis, which makes the update a per-row
  scalar times ``M̂`` whatever ``V`` holds.  ``V`` and the step count stay unchanged.
* tensors that are not constrained, and their optimiser state, are untouched.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import make_codec
from algorithms.codecs.channel import Channel
from algorithms.protocol.model import ConstrainedModel, first_free_block
from algorithms.protocol.pipeline import (
    GramAccumulator,
    ProtocolBoundary,
    grassmann_sync,
    make_wire,
)
from algorithms.protocol.subspace import Wire, make_basis
from algorithms.zo.sparq import Link, SparQParams
from harness.comm import run_threads
from harness.data import get_dataset
from harness.models import PRESETS, build_model
from harness.registry import make_config

from ._capture import run_capturing

F64 = torch.float64


def _ce(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _projected(t: torch.Tensor, U: torch.Tensor, axis: int) -> torch.Tensor:
    """``P t`` along ``axis``, written here: ``t ×_axis (U Uᵀ)``."""
    return torch.tensordot(t, U @ U.T, dims=([axis], [0])).movedim(-1, axis)


def _off(t: torch.Tensor, U: torch.Tensor, axis: int) -> float:
    scale = float(t.abs().max())
    return float((t - _projected(t, U, axis)).abs().max()) / scale if scale else 0.0


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), model=st.sampled_from(["tiny-llama", "tiny-gpt2"]),
       wp2=st.sampled_from(["rowconst_adamw", "adamw"]))
def test_grassmann_update_leaves_weights_and_moments_consistent_with_the_new_subspace(seed, model, wp2):
    cfg = make_config("protocol-central", model=model, seed=seed % 1000, steps=3, batch_size=2, seq_len=8,
                      dtype="float64", data="synthetic-markov", params={"k": 4, "wp2_optimizer": wp2,
                                                                         "lr": 3e-3, "grassmann_every": 1})
    net = build_model(model, seed=cfg.seed, dtype=F64)
    wire = make_wire(cfg, F64, "cpu")
    cm = ConstrainedModel(net, wire, first_free_block(PRESETS[model].num_blocks, 2))
    opt = cm.optimizer(cfg.params)
    ds = get_dataset(cfg.data)

    def train_step(step: int) -> None:
        ids, labels = ds.batch(step, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed)
        opt.zero_grad(set_to_none=True)
        _ce(net(ids).logits, labels).backward()
        cm.project_grads()
        opt.step()

    for step in range(3):
        train_step(step)
        cm.project()
    # a Gram matrix of full-width gradients (any PSD S with a spread spectrum moves U)
    g = torch.Generator().manual_seed(seed)
    gram = GramAccumulator(wire.d, F64, "cpu")
    gram.add(torch.randn(64, wire.d, generator=g, dtype=F64) * torch.linspace(0.1, 3, wire.d, dtype=F64))
    gram.steps = 1
    U_old = wire.U.clone()
    constrained = {id(c.param): c for c in cm.constraints}
    before = {id(w): (w.detach().clone(), {k: v.clone() if torch.is_tensor(v) else v
                                          for k, v in opt.state[w].items()}) for w in net.parameters()}

    grassmann_sync(SimpleNamespace(rank=0, world_size=1), wire, cm, opt, gram, 0.25, src=0)
    U = wire.U
    k = U.shape[1]
    assert float((U.T @ U - torch.eye(k, dtype=F64)).abs().max()) <= 1e-12
    assert float(torch.linalg.svdvals(U_old.T @ U).min()) < 1 - 1e-6  # the subspace moved
    for w in net.parameters():
        w0, st0 = before[id(w)]
        st = opt.state[w]
        c = constrained.get(id(w))
        assert st["t"] == st0["t"]
        assert torch.equal(st["exp_avg_sq"], st0["exp_avg_sq"])  # V is not a width-space vector
        if c is None:
            assert torch.equal(w, w0) and torch.equal(st["exp_avg"], st0["exp_avg"])
            continue
        torch.testing.assert_close(w.detach(), _projected(w0, U, c.axis), rtol=0, atol=1e-13 * float(w0.abs().max()))
        torch.testing.assert_close(st["exp_avg"], _projected(st0["exp_avg"], U, c.axis), rtol=0,
                                   atol=1e-13 * float(st0["exp_avg"].abs().max()))
        assert _off(w.detach(), U, c.axis) <= 1e-12, c.name
        assert _off(st["exp_avg"], U, c.axis) <= 1e-12, c.name
    # the next AdamW step keeps the row-constant down projections in the new S by itself
    train_step(3)
    downs = [c for c in cm.constraints if c.down]
    assert downs
    for c in downs:
        off = _off(c.param.detach(), U, c.axis)
        assert off <= 1e-12 if wp2 == "rowconst_adamw" else off > 1e-8, (c.name, off)


@pytest.mark.parametrize("model, every", [("tiny-llama", 1), ("tiny-gpt2", 2)])
def test_protocol_equals_protocol_central_in_float64_with_grassmann_updates(model, every):
    params = {"k": 6, "grassmann_every": every, "lr": 3e-3}
    common = dict(model=model, data="synthetic-markov", steps=4, seed=3, batch_size=4, seq_len=8,
                  micro_batches=2, dtype="float64")
    outs_p, pipe = run_capturing(make_config("protocol", world_size=2, params=params, **common))
    outs_c, cent = run_capturing(make_config("protocol-central", params={**params, "stages": 2}, **common))
    assert set(pipe) == set(cent)
    diff = max(float((pipe[i] - cent[i]).abs().max()) for i in cent)
    assert diff <= TOL_PARAMS, diff
    for o in (outs_p[-1], outs_c[0]):
        assert o.extra["grassmann_updates"][0] == 4 // every
        assert o.extra["basis_shift_sin"][0] > 1e-6  # the subspace really moved


#: steps x lr x 1e-9: AdamW divides rounding-level gradient differences (~1e-17, the wire
#: rebuilds X = C Uᵀ + T[ids] with rounding) by √v + ε (ε = 1e-8); measured: 6e-13
TOL_PARAMS = 4 * 3e-3 * 1e-9


# --------------------------------------------------------------------------- token ids
VOCABS = sorted({p.vocab_size for p in PRESETS.values()})


def test_preset_vocabularies_are_the_papers():
    assert {256, 50272, 50257} <= set(VOCABS)


def _ids(seed: int, vocab: int, shape=(3, 7)) -> torch.Tensor:
    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))
    ids[0, 0], ids[-1, -1], ids[1, 2] = 0, vocab - 1, vocab - 1  # the extremes
    return ids


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
@pytest.mark.parametrize("vocab", VOCABS)
def test_token_ids_cross_the_protocol_boundary_exactly(seed, vocab):
    ids = _ids(seed, vocab)
    d, k = 6, 2
    g = torch.Generator().manual_seed(seed)
    wire = Wire(make_basis(d, k, seed), torch.randn(vocab, d, generator=g, dtype=F64), None)
    x = wire.base(ids) + torch.randn(*ids.shape, k, generator=g, dtype=F64) @ wire.U.T  # in S + T[ids]

    def body(comm):
        b = ProtocolBoundary(wire, vocab)
        act = Channel(make_codec("fp64"))
        if comm.rank == 0:
            b.send(comm, act, (x,), 1, 0, ids)
            return None
        arr = b.recv(comm, act, 0, 0, None, "cpu")
        return arr.tokens, arr.inputs[0].detach()

    _, (tokens, rebuilt) = run_threads(2, body)
    assert tokens.dtype == torch.int64 and torch.equal(tokens, ids)
    torch.testing.assert_close(rebuilt, x, rtol=0, atol=1e-12)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
@pytest.mark.parametrize("vocab", VOCABS)
def test_token_ids_cross_the_sparq_label_link_exactly(seed, vocab):
    labels = _ids(seed, vocab)

    def body(comm):
        link = Link(comm, SparQParams(), 8, vocab)
        if comm.rank == 0:
            link.send_labels(labels, 1)
            return link.closed_form
        return link.recv_labels(0, "cpu")

    sent, got = run_threads(2, body)
    assert got.dtype == torch.int64 and torch.equal(got, labels)
    width = 1 if vocab <= 256 else 2 if vocab <= 65536 else 4  # narrowest unsigned width
    # the shared codec header (magic 2, version, family, dtype, ndim, 4 per dim, body CRC 4,
    # header CRC 4) + the ids codec's parameter (vocab - 1, 4 bytes) + the ids
    assert sent == 18 + 4 * labels.dim() + labels.numel() * width
