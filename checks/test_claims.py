"""Claims as data: the precondition that gates a verdict, ``claims.json`` (written and read
through one schema), and ``commbench compare`` on two claims files, which fails on a changed
outcome and names the bad argument of a bad input."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.experiments.claims import (
    _CLAIMS,
    NOT_MEASURABLE,
    NOT_SUPPORTED,
    OUTCOMES,
    SUPPORTED,
    Claim,
    Precondition,
    claim,
    claims_json,
    timed_claim,
)
from harness.results import CLAIMS_SCHEMA, ClaimRow, ClaimsError, read_claims
from harness.stats import Interval

HOLDS = {True: SUPPORTED, False: NOT_SUPPORTED, None: NOT_MEASURABLE}
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
ids = st.from_regex(r"\A[a-z0-9][a-z0-9.-]{0,15}\Z")
finite = st.floats(-1e12, 1e12, allow_nan=False)


@pytest.fixture(autouse=True)
def _no_leftover_claims():
    _CLAIMS.clear()
    yield
    _CLAIMS.clear()


def _claim(id: str, outcome: str = SUPPORTED, value: float | None = 1.0, **kw) -> Claim:
    return Claim(id, "P", "q", "s", "c", "1", "—" if value is None else f"{value:g}", outcome,
                 kw.pop("how", "measured"), value=value, **kw)


def _write(path: Path, claims: list[Claim]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(claims_json(claims, "provenance"))
    return str(path)


# --------------------------------------------------------------------------- the precondition gate
@settings(max_examples=40)
@given(holds=st.sampled_from([True, False, None]), cond=text, measured=text, held=st.booleans(),
       ours=finite)
def test_a_failed_precondition_is_not_measurable_whatever_the_verdict(holds, cond, measured, held, ours):
    _CLAIMS.clear()
    c = claim("p.gate", "P", "q", "s", "c", "1", ours, holds, "how it ran",
              precondition=Precondition(cond, measured, held))
    if held:  # the verdict stands, the precondition printed beside it
        assert c.outcome == HOLDS[holds] and c.how.startswith("precondition ")
    else:
        assert c.outcome == NOT_MEASURABLE and c.how.startswith("not measurable here: ")
    assert cond in c.how and measured in c.how and c.how.endswith("how it ran")
    assert ("held" if held else "failed") in c.how


@settings(max_examples=30)
@given(value=st.floats(-1e6, 1e6), half=st.floats(1e-3, 1e6), above=st.booleans())
def test_a_timed_claim_with_a_failed_precondition_is_not_measurable(value, half, above):
    # an interval wholly beyond its threshold, which alone would decide the claim
    iv = Interval(value, value - half, value + half)
    thr = iv.lo - half
    pre = Precondition("load < 2", "load 9", False)
    c = timed_claim("p.t", "P", "q", "s", "c", "1", iv, thr, "timed", above=above, precondition=pre)
    assert c.outcome == NOT_MEASURABLE and "load < 2" in c.how and "load 9" in c.how
    held = timed_claim("p.t", "P", "q", "s", "c", "1", iv, thr, "timed", above=above,
                       precondition=Precondition("load < 2", "load 1", True))
    assert held.outcome == (SUPPORTED if above else NOT_SUPPORTED)


@pytest.mark.parametrize("outcome", [SUPPORTED, NOT_SUPPORTED])
def test_a_claim_built_with_a_failed_precondition_refuses_a_verdict(outcome):
    with pytest.raises(ValueError, match="precondition failed"):
        _claim("p.x", outcome, precondition=Precondition("a > 1", "0", False))
    _claim("p.x", NOT_MEASURABLE, precondition=Precondition("a > 1", "0", False))  # the one outcome left
    _claim("p.x", outcome, precondition=Precondition("a > 1", "2", True))


@pytest.mark.parametrize("bad", ["", "Sparq.x", "-x", ".x", "a b", "a_b", "sparq/x", "é", 7, None])
def test_claim_ids_are_lower_case_words_joined_by_dots_or_dashes(bad):
    with pytest.raises(ValueError, match="id"):
        _claim(bad)
    _claim("sparq.comm-saving-vs-fo2")


# --------------------------------------------------------------------------- claims.json
def test_duplicate_ids_in_claims_json_raise():
    with pytest.raises(ValueError, match="unique.*p.x"):
        claims_json([_claim("p.x"), _claim("p.y"), _claim("p.x", NOT_SUPPORTED)])


@pytest.mark.parametrize("nonfinite", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_written_as_null(nonfinite, tmp_path):
    c = Claim("p.t", "P", "q", "s", "c", "1", "?", NOT_MEASURABLE, "no value", value=nonfinite,
              interval=Interval(1.5, 1.0, 2.0), threshold=nonfinite)
    d = json.loads(claims_json([c]))["claims"][0]  # json.loads would read NaN back: it is not there
    assert d["value"] is None and d["threshold"] is None and d["interval"] == [1.0, 2.0]
    back = read_claims(_write(tmp_path / "claims.json", [c])).claims[0]
    assert back.value is None and back.threshold is None and back.interval == (1.0, 2.0)


rows = st.builds(
    lambda i, outcome, value, pre: _claim(
        i, NOT_MEASURABLE if pre is not None and not pre.held else outcome, value, precondition=pre),
    ids, st.sampled_from(OUTCOMES), st.none() | finite,
    st.none() | st.builds(Precondition, text, text, st.booleans()))


@settings(max_examples=30)
@given(claims=st.lists(rows, max_size=6, unique_by=lambda c: c.id))
def test_claims_json_reads_back_field_for_field(claims):
    with tempfile.TemporaryDirectory() as d:
        back = read_claims(_write(Path(d) / "claims.json", claims))
    assert back.provenance == "provenance" and [r.id for r in back.claims] == [c.id for c in claims]
    for r, c in zip(back.claims, claims, strict=True):
        assert (r.outcome, r.value, r.ours, r.how) == (c.outcome, c.value, c.ours, c.how)
        pre = c.precondition
        assert (r.precondition, r.precondition_measured, r.precondition_held) == (
            (None, None, None) if pre is None else (pre.condition, pre.measured, pre.held))


def _row(**changes) -> dict:
    d = json.loads(claims_json([_claim("p.x")]))
    d["claims"][0].update(changes)
    return d


@pytest.mark.parametrize("doc, needle", [
    (_row(value="1.0"), "value must be a finite number or null"),
    (_row(value=True), "value must be a finite number or null"),
    (_row(outcome="yes"), "outcome must be one of"),
    (_row(id="P.X"), "id must be lower-case words"),
    (_row(interval=[1.0]), "interval must be null or [lo, hi]"),
    (_row(precondition_held="no"), "precondition_held must be true, false or null"),
    (_row(precondition="a > 1"), "a precondition gives its condition, what was measured"),
    (_row(precondition="a", precondition_measured="0", precondition_held=False), "its precondition failed"),
    (_row(extra=1), "unknown extra"),
    (dict(_row(), schema="commbench.claims/2"), "schema 'commbench.claims/2', expected"),
    (dict(_row(), claims={}), "a list 'claims'"),
    ({"schema": "commbench.result/1"}, "not a claims file"),
    ([1, 2], "not a claims file"),
])
def test_the_reader_rejects_each_broken_field_naming_the_file(doc, needle, tmp_path):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ClaimsError) as e:
        read_claims(path)
    msg = str(e.value)
    assert msg.startswith(str(path)) and needle in msg and "\n" not in msg


def test_the_writer_holds_rows_to_the_readers_rules():
    with pytest.raises(ClaimsError, match="value must be"):
        ClaimRow(**{**json.loads(claims_json([_claim("p.x")]))["claims"][0], "value": "1"})
    assert CLAIMS_SCHEMA == json.loads(claims_json([]))["schema"]


# --------------------------------------------------------------------------- commbench compare
def _compare(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["compare", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _changed_ids(out: str) -> set[str]:
    """The ids of the table's rows whose change is "outcome changed"."""
    return {line.split("│")[1].strip() for line in out.splitlines()
            if "outcome changed" in line and line.count("│") > 2}


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), claims=st.lists(rows, min_size=1, max_size=6, unique_by=lambda c: c.id))
def test_a_changed_outcome_is_named_and_fails(data, claims, capsys):
    k = data.draw(st.integers(0, len(claims) - 1))
    was = claims[k]
    now = _claim(was.id, data.draw(st.sampled_from([o for o in OUTCOMES if o != was.outcome])),
                 data.draw(st.none() | finite))
    with tempfile.TemporaryDirectory() as d:
        old = _write(Path(d) / "old.json", claims)  # any file name: the schema key says what it is
        new = _write(Path(d) / "exports" / "claims.json", [*claims[:k], now, *claims[k + 1:]])
        code, out, err = _compare(capsys, old, str(Path(new).parent))
        assert code == 1 and _changed_ids(out) == {was.id}
        assert "1 changed outcome(s)" in err
        code, out, _ = _compare(capsys, old, old)
        assert code == 0 and _changed_ids(out) == set()


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claims=st.lists(rows, min_size=1, max_size=6, unique_by=lambda c: c.id),
       values=st.lists(st.none() | finite, min_size=6, max_size=6))
def test_identical_outcomes_pass_whatever_the_values(claims, values, capsys):
    moved = [_claim(c.id, c.outcome, v, precondition=c.precondition) for c, v in zip(claims, values, strict=False)]
    with tempfile.TemporaryDirectory() as d:
        code, out, _ = _compare(capsys, _write(Path(d) / "a.json", claims), _write(Path(d) / "b.json", moved))
    assert code == 0 and "0 changed outcome(s)" in out and "outcome changed" not in out


def test_a_row_on_one_side_only_is_reported_and_fails_unless_allowed(tmp_path, capsys):
    old = _write(tmp_path / "old.json", [_claim("p.x"), _claim("p.gone")])
    new = _write(tmp_path / "new.json", [_claim("p.x"), _claim("p.new")])
    code, out, err = _compare(capsys, old, new)
    assert code == 1 and "claim(s) on one side only" in err
    rows_shown = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "removed" in rows_shown["p.gone"] and "added" in rows_shown["p.new"] and "p.x" not in rows_shown
    assert _compare(capsys, old, new, "--allow-missing")[0] == 0
    assert _compare(capsys, old, _write(tmp_path / "other.json", [_claim("p.y")]))[0] == 2  # nothing in common


BAD = {
    "missing": None,
    "invalid JSON": "{not json",
    "a result record": json.dumps({"schema": "commbench.result/1"}),
    "a wrong field": json.dumps(_row(value="high")),
    "NaN": claims_json([_claim("p.x")]).replace('"value": 1.0', '"value": NaN'),
    "an empty directory": "",
}


@pytest.mark.parametrize("bad_side", ["OLD", "NEW"])
@pytest.mark.parametrize("what", list(BAD))
def test_bad_input_is_one_line_exit_2_naming_the_bad_argument(what, bad_side, tmp_path, capsys):
    good = _write(tmp_path / "good" / "claims.json", [_claim("p.x")])
    bad = tmp_path / "bad.json"
    if what == "an empty directory":
        bad.mkdir()
    elif BAD[what] is not None:
        bad.write_text(BAD[what])
    args = (good, str(bad)) if bad_side == "NEW" else (str(bad), good)
    code, _, err = _compare(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("commbench: error:"), err
    assert str(bad) in lines[0] and good not in lines[0] and bad_side in lines[0], lines[0]


@pytest.mark.parametrize("bad_side", ["OLD", "NEW"])
def test_a_missing_path_beside_a_result_directory_is_the_one_named(bad_side, tmp_path, capsys):
    (tmp_path / "ok").mkdir()
    ok, missing = str(tmp_path / "ok"), str(tmp_path / "missing.json")
    code, _, err = _compare(capsys, *((ok, missing) if bad_side == "NEW" else (missing, ok)))
    assert code == 2 and f"{bad_side} {missing!r}: no such file" in err and ok not in err


# --------------------------------------------------------------------------- asv: the claim values
@pytest.mark.slow
def test_asv_claim_values_are_deterministic_payload_ratios():
    from benchmarks.asv_suite import bench_claims as bc

    first, again = bc.payload_ratios(), bc.payload_ratios()
    assert first == again and set(first) == set(bc.ClaimValues.params)
    assert all(0 < v < math.inf for v in first.values())
    # named track_payload_*: what `commbench compare COMMIT COMMIT` and asv.conf.json hold deterministic
    assert [m for m in dir(bc.ClaimValues) if m.startswith("track_")] == ["track_payload_ratio"]
    # the values at least order as the claims say: SparQ below the dense ZO and FO pipelines, k = 8 below d
    assert first["sparq-4bit/zo-dense"] < 1 and first["sparq-4bit/fo-pipeline"] < 1
    assert first["protocol-k8/uncompressed"] < 1
