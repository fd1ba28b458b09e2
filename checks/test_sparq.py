"""``sparq``: equivalence with MeZO, bytes against the closed form, quantised sparsity, split choice."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from algorithms.codecs import Payload, make_codec
from algorithms.zo import wire
from algorithms.zo.sparq import choose_split
from algorithms.zo.split import candidates, measure_nnz, select_split
from harness.config import ConfigError
from harness.data import get_dataset
from harness.launcher import run
from harness.models import build_model, split_model
from harness.registry import make_config

COMMON = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=16, dtype="float64")


def _run(algo, world=1, backend="threads", model="tiny-opt", **params):
    base = dict(lr=1e-2, perturbations=2)
    base.update(params)
    cfg = make_config(algo, world_size=world, backend=backend, params=base, **{**COMMON, "model": model})
    return cfg, run(cfg)


def _sha(rec):
    return rec.metrics["params_sha256"].value


@pytest.mark.parametrize("difference", ["forward", "central"])
@pytest.mark.parametrize("model", ["tiny-opt", "tiny-gpt2", "tiny-llama"])
def test_identity_sparq_equals_mezo_on_2_and_4_stages(model, difference):
    _, ref = _run("mezo", model=model, difference=difference)
    for M in (2, 4):
        _, rec = _run("sparq", M, model=model, difference=difference, bits=None)
        assert _sha(rec) == _sha(ref), (M, difference)
        assert rec.history["g0"] == ref.history["g0"]  # the same scalars every step


def test_sparq_threads_equals_gloo():
    _, t = _run("sparq", 2, bits=4, split="1")
    _, g = _run("sparq", 2, backend="gloo", bits=4, split="1")
    assert _sha(t) == _sha(g)
    assert t.metrics["payload_bytes_per_step"].value == g.metrics["payload_bytes_per_step"].value


def _by_rank(rec, key):
    return {r["rank"]: r["metrics"][key].value for r in rec.per_rank if key in r["metrics"]}


@pytest.mark.parametrize("difference, M", [("forward", 2), ("central", 3)])
def test_dense_bytes_per_step_equal_the_closed_form(difference, M):
    cfg, rec = _run("sparq", M, difference=difference, bits=None, format="dense", perturbations=3)
    B, T, P = cfg.batch_size, cfg.seq_len, 3
    evals = P + 1 if difference == "forward" else 2 * P  # SparQ App. C.3 message counts
    act = wire.act_nbytes((B, T, 128), 0, None, 8, "dense")  # tiny-opt ffn 128, float64
    res = wire.dense_nbytes((B, T, 32), 8)
    labels = wire.labels_nbytes((B, T), 256)  # ids codec, vocab 256 -> 1 byte per token
    assert labels == 26 + B * T  # h0 = 18 + 4 * 2
    expected = (M - 1) * evals * (act + res) + labels + 4 * P * (M - 1)
    assert rec.metrics["payload_bytes_per_step"].value == expected
    assert rec.metrics["messages_per_step"].value == (M - 1) * evals * 2 + 1 + (M - 1)
    last = M - 1
    assert _by_rank(rec, "sent_bytes_per_step[scalars]") == {last: 4 * P * (M - 1)}  # P float32 per stage
    assert _by_rank(rec, "sent_messages_per_step[act]") == {m: evals for m in range(M - 1)}
    assert _by_rank(rec, "sent_bytes_per_step[labels]") == {0: labels}


@pytest.mark.parametrize("bits", [None, 1, 2, 4, 8])
def test_quantised_bytes_equal_the_closed_form_of_each_message(bits):
    _, rec = _run("sparq", 3, bits=bits)
    for r in rec.per_rank:
        key = "closed_form_bytes" + ("" if r["rank"] == 0 else f"[rank{r['rank']}]")
        logged = rec.history[key]
        assert r["metrics"]["payload_bytes_per_step"].value == sum(logged) / len(logged)
    assert _by_rank(rec, "sent_bytes_per_step[scalars]") == {2: 4 * 2 * 2}


def test_quantised_run_is_cheaper_and_reports_its_sparsity():
    _, dense = _run("sparq", 2, bits=None)
    _, q4 = _run("sparq", 2, bits=4)
    _, q1 = _run("sparq", 2, bits=1)
    b = {k: r.metrics["payload_bytes_per_step"].value for k, r in [("id", dense), ("4", q4), ("1", q1)]}
    assert b["1"] < b["4"] < b["id"]
    assert 0 < q4.metrics["act_nnz_ratio"].value < dense.metrics["act_nnz_ratio"].value <= 1
    # ReLU activations take the unsigned grid, so 1 bit sends data; the signed grid forced sends none
    assert q1.metrics["act_nnz_ratio"].value > 0
    _, q1s = _run("sparq", 2, bits=1, signed="true")
    assert q1s.metrics["act_nnz_ratio"].value == 0  # signed 1-bit maps every ReLU output to 0 (spec §2.7)
    assert q1s.metrics["payload_bytes_per_step"].value < b["1"]


# --------------------------------------------------------------------------- the activation's grid
@pytest.mark.parametrize("granularity", wire.GRANULARITIES)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@given(seed=st.integers(0, 2**31 - 1), shift=st.floats(-2, 2))
def test_relu_activation_sends_real_data_at_every_bit_width(bits, granularity, seed, shift):
    g = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(3, 5, 16, generator=g) + shift)
    x[0, 0, :] = 1.0 + torch.rand(16, generator=g)  # every channel has a positive maximum
    codec = wire.act_codec(bits, granularity=granularity)  # default grid: auto
    payload = codec.encode(x)
    xh = codec.decode(payload)
    k = wire.act_nnz(x, bits, granularity=granularity)
    assert k == int(torch.count_nonzero(xh)) > 0  # real values cross
    assert payload.nbytes == wire.act_nbytes(tuple(x.shape), k, bits, 4, granularity=granularity)
    # written here from the unsigned grid: x̂ ∈ {q s / L}, L = 2^b - 1, s = the group's max,
    # so |x - x̂| <= s / 2L (+ the fp16 rounding of s); the signed grid at 1 bit would leave |x|
    s = {"channel": x.amax(dim=(0, 1)), "tensor": x.amax(), "token": x.amax(dim=-1, keepdim=True)}[granularity]
    L = 2**bits - 1
    bound = s * (0.5 / L + 2.0**-10) + 1e-5
    assert bool(((x - xh).abs() <= bound).all())
    assert bool((xh >= 0).all())


@given(seed=st.integers(0, 2**31 - 1), bits=st.sampled_from([1, 2, 4, 8]))
def test_an_activation_with_negative_entries_keeps_the_signed_grid_bit_for_bit(seed, bits):
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.gelu(torch.randn(3, 5, 16, generator=g))
    x[0, 0, 0] = -0.1  # at least one negative entry
    auto, signed = wire.act_codec(bits), wire.act_codec(bits, "true")
    assert torch.equal(auto.encode(x).data, signed.encode(x).data)
    assert wire.act_nnz(x, bits) == wire.act_nnz(x, bits, "true")


# --------------------------------------------------------------------------- quantiser and encoding
# where each granularity's group reaches -s (so its fp16 absmax scale is s), and the scales' shape
_GROUP = {"channel": ((0, 0, slice(None)), (6,)), "tensor": ((0, 0, 0), ()),
          "token": ((Ellipsis, 0), (3, 5, 1))}


@given(bits=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 2**31 - 1),
       scale_exp=st.integers(-4, 8), density=st.floats(0, 1), fmt=st.sampled_from(wire.FORMATS),
       granularity=st.sampled_from(wire.GRANULARITIES))
def test_quantiser_round_trips_exactly_on_its_lossless_domain(bits, seed, scale_exp, density, fmt, granularity):
    g = torch.Generator().manual_seed(seed)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = torch.randint(lo, hi + 1, (3, 5, 6), generator=g)
    q = torch.where(torch.rand(q.shape, generator=g) < density, q, 0)
    at, scale_shape = _GROUP[granularity]
    q[at] = lo  # every group reaches -s
    s = 2.0**scale_exp * (1 + torch.randint(0, 1024, scale_shape, generator=g) / 1024)  # fp16-exact scales
    x = (q * 2.0 ** (1 - bits) * s).float()
    codec = wire.act_codec(bits, True, fmt, granularity)
    assert codec.is_lossless_on(x)
    payload = codec.encode(x)
    assert torch.equal(codec.decode(payload), x)
    k = wire.act_nnz(x, bits, granularity=granularity)
    assert k == int(torch.count_nonzero(q))
    assert (payload.nbytes == wire.act_nbytes(tuple(x.shape), k, bits, 4, fmt, granularity)
            == codec.encoded_nbytes(x))


@given(seed=st.integers(0, 2**31 - 1), density=st.floats(0, 1), fmt=st.sampled_from(wire.FORMATS),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_sparse_encoding_is_lossless_and_sized_by_the_closed_form(seed, density, fmt, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(4, 9, 7, generator=g, dtype=dtype) + (density - 0.5) * 4)
    codec = wire.act_codec(None, fmt=fmt)
    payload = codec.encode(x)
    assert torch.equal(codec.decode(payload), x)
    k = wire.act_nnz(x, None)
    assert payload.nbytes == wire.act_nbytes(tuple(x.shape), k, None, x.element_size(), fmt)


def _tiny_acts():
    model = build_model("tiny-opt", seed=0).eval()
    ids = get_dataset("synthetic-markov").batch(0, batch_size=8, seq_len=32, seed=0, split="val")[0]
    with torch.no_grad():
        act = split_model(model, 2, "ffn_act", [2])[0](ids)[0]
        hidden = split_model(model, 2, "block", [2])[0](ids)[0]
    return act, hidden


def test_relu_split_at_4_bits_is_sparser_than_a_dense_split():
    act, hidden = _tiny_acts()
    relu4 = wire.act_nnz(act, 4) / act.numel()
    dense4 = wire.act_nnz(hidden, 4) / hidden.numel()
    assert relu4 < dense4
    assert relu4 < wire.act_nnz(act, None) / act.numel()  # quantisation adds zeros to ReLU's own
    # the reported count is what decoding the real payload shows
    decoded = wire.act_codec(4).decode(wire.act_codec(4).encode(act))
    assert int(torch.count_nonzero(decoded)) == wire.act_nnz(act, 4)
    assert wire.act_codec(4).encode(act).nbytes < wire.act_codec(4).encode(hidden).nbytes * 4


def test_nnz_is_monotone_in_bits():
    act, _ = _tiny_acts()
    counts = [wire.act_nnz(act, b) for b in range(1, 9)]
    assert counts == sorted(counts)  # seed-sparq P14


# --------------------------------------------------------------------------- split selection
def test_split_selection_picks_the_sparsest_candidate_and_reports_it():
    cuts, rho = select_split("tiny-opt", 2, bits=4)
    cand = candidates(4, 2, 1)[0]
    assert set(rho) == set(cand) and cuts[0] in cand
    assert rho[cuts[0]] == min(rho.values())
    assert rho == measure_nnz("tiny-opt", cand, bits=4)
    _, rec = _run("sparq", 2, bits=4)  # the run calibrates on its own batch shape and dtype
    run_cuts, run_rho = select_split("tiny-opt", 2, bits=4, batch_size=4, seq_len=16, dtype=torch.float64)
    assert rec.metrics["split_block0"].value == run_cuts[0]
    assert rec.metrics["split_nnz_ratio0"].value == run_rho[run_cuts[0]]
    cuts4, _ = select_split("tiny-opt", 4, bits=4)
    assert len(cuts4) == 3 and list(cuts4) == sorted(set(cuts4))


def test_split_window_bounds_the_blocks_the_run_measures():
    # App. B.1: window 0 leaves one candidate, the even split (block 1 of tiny-opt's 4 for M = 2),
    # so the run cuts there and measures nothing else (the default window 1 would measure 0, 1, 2)
    cfg = make_config("sparq", world_size=2, model="tiny-opt", batch_size=2, seq_len=8,
                      params=dict(split_window=0, calib_batches=1))
    cuts, rho = choose_split(cfg)
    assert cuts == (1,) and set(rho) == {1}


def test_opt125m_candidates_centre_on_the_papers_block():
    assert candidates(12, 2, 1) == [[5, 4, 6]]  # 0-based block 5 = the paper's "Block 6"


def test_candidates_are_real_blocks_within_the_window():
    # App. B.1: the blocks within `window` of each even-split target, nearest (then lower) first;
    # only blocks 0..num_blocks-1 exist, so wide windows are clipped at both ends
    assert candidates(4, 2, 3) == [[1, 0, 2, 3]]
    assert candidates(12, 4, 4)[-1] == [8, 7, 9, 6, 10, 5, 11, 4]


# --------------------------------------------------------------------------- bad config
@pytest.mark.parametrize("world, params, message", [
    (2, dict(bits=0), "bits"),
    (2, dict(bits=9), "bits"),
    (5, dict(), "more than the 4 blocks"),
    (2, dict(perturbations=0), "perturbations"),
    (2, dict(mu=0.0), "mu"),
    (2, dict(mu=-0.1), "mu"),
    (2, dict(split="1,2"), "split"),
    (3, dict(split="2,1"), "split"),
    (2, dict(labels="telepathy"), "labels"),
    (2, dict(signed="maybe"), "signed"),
    (2, dict(split="middle"), "split"),
    (1, dict(), "world size"),
])
def test_bad_config_fails_clearly(world, params, message):
    with pytest.raises(ConfigError, match=message):
        make_config("sparq", world_size=world, model="tiny-opt", params=params)


def test_cli_rejects_bits_zero(capsys):
    from harness.cli import main

    assert main(["run", "sparq", "--world-size", "2", "--set", "bits=0"]) == 2
    assert "bits must be an int in 1..8" in capsys.readouterr().err


def test_residual_codec_auto_is_fp16_for_quantised_runs_and_raw_for_identity_runs():
    # wire: the residual is dense, fp16 by default for quantised runs, raw for identity runs
    x = torch.randn(2, 3, 40, dtype=torch.float64)
    assert wire.residual_codec("auto", 4).encode(x).nbytes == wire.dense_nbytes((2, 3, 40), 2)
    assert wire.residual_codec("auto", None).encode(x).nbytes == wire.dense_nbytes((2, 3, 40), 8)
    assert wire.residual_codec("bf16", None).spec() == make_codec("bf16").spec()  # an explicit codec is kept


def test_residual_auto_follows_the_family_half_float():
    # Gemma-3's residual stream outgrows fp16 (|r| ~ 68k at <bos>): auto sends it as bf16, which
    # keeps such a value finite, while fp16 turns it into inf; the other families keep fp16
    from harness.models.families import FAMILY_SPECS

    big = torch.tensor([67_984.0, -1.5])
    gemma = wire.residual_codec("auto", 4, FAMILY_SPECS["gemma3_text"].half_dtype)
    assert gemma.spec() == make_codec("bf16").spec()
    assert torch.isfinite(gemma.decode(gemma.encode(big))).all()
    fp16 = wire.residual_codec("auto", 4, FAMILY_SPECS["opt"].half_dtype)
    assert fp16.spec() == make_codec("fp16").spec()
    assert torch.isinf(fp16.decode(fp16.encode(big))[0])
    assert {f.half_dtype for n, f in FAMILY_SPECS.items() if n != "gemma3_text"} == {"fp16"}


def test_wire_closed_forms_match_the_codecs():
    x = torch.zeros(2, 3, 40)
    x[0, 0, :7] = 1.0
    for fmt in wire.FORMATS:
        assert make_codec(f"sparse:format={fmt}").encoded_nbytes(x) == wire.act_nbytes((2, 3, 40), 7, None, 4, fmt)
    r = make_codec("fp16")
    assert r.encode(x).nbytes == wire.residual_nbytes((2, 3, 40), r, 4) == 15 + 12 + 2 * 240
    assert math.prod((2, 3)) == Payload(make_codec("identity").encode(torch.zeros(2, 3, dtype=torch.uint8)).data).nbytes - 23


@pytest.mark.parametrize(("given", "mode"), [(True, "true"), (False, "false"), ("auto", "auto"),
                                             ("true", "true"), ("false", "false")])
def test_signed_takes_a_python_bool_as_its_mode(given, mode):
    # Python callers may pass a bool; it means the fixed grid (true: signed, false:
    # unsigned), never "auto" (SparQParams.signed, wire.SIGNED_MODES).
    from algorithms.zo.sparq import SparQParams

    assert SparQParams(signed=given).signed == mode
