"""The before/after and profiling helpers among the benchmarks run end to end (their timings are
benchmarks, not checked here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.comm.torchdist import INLINE_MAX_PAYLOAD

pytestmark = pytest.mark.gloo


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_comm_before_after_times_both_comms_and_raw_gloo():
    # this tree's own package as the "other commit": the two Comms are the same code
    p = _run("benchmarks.comm_before_after", "harness/comm", "--sizes", "1024", "--rounds", "4")
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("| 1,024 |"))
    assert len(row.split("|")) == 10 and row.count(" us") == 3, row
    assert row.endswith("| (fewer than 30 rounds) |"), row  # no interval from 4 rounds


def test_comm_before_after_refuses_a_directory_that_is_not_a_comm_package():
    p = _run("benchmarks.comm_before_after", "benchmarks")
    assert p.returncode == 2 and "not a harness/comm package" in p.stderr


def test_roundtrip_ratio_times_every_contestant_on_both_receive_paths():
    # 1 KiB comes inline into the reused first buffer, 100 kB into a buffer of its own once it repeats
    p = _run("benchmarks.roundtrip_ratio", "--sizes", "1024,100000", "--rounds", "4", "--repeats", "1")
    assert p.returncode == 0, p.stderr
    for size in ("1,024", "100,000"):
        row = next(line for line in p.stdout.splitlines() if line.startswith(f"| {size} |"))
        assert row.count(" us (cpu ") == 5, row


def test_roundtrip_ratio_refuses_a_size_its_copies_contestant_does_not_model():
    p = _run("benchmarks.roundtrip_ratio", "--sizes", str(INLINE_MAX_PAYLOAD + 1))
    assert p.returncode == 2 and "does not model" in p.stderr


def test_comm_turnaround_stamps_every_span_of_rank_one():
    # it wraps two of the Comm's internals: a rename there must fail here, not in a benchmark run
    p = _run("benchmarks.comm_turnaround", "--sizes", "1024,100000", "--rounds", "4")
    assert p.returncode == 0, p.stderr
    for size in ("1,024", "100,000"):
        row = next(line for line in p.stdout.splitlines() if line.startswith(f"| {size} |"))
        spans = [float(c) for c in row.split("|")[2:7]]
        assert all(v > 0 for v in spans), row


# per contestant, the calls each rank makes once per message: the engine's channel writes into the
# frame and reads where a message arrived; the old channel encodes, copies and decodes; both post
# each message to gloo through a Comm of their own
_TIMED = {"engine[1f1b]": ("Channel.send", "Channel.recv", "DenseCodec.writer", "DenseCodec._decode_seen",
                           "Comm.send_written", "Comm.recv_read", "gloo send", "gloo recv"),
          "engine[1f1b] encoded": ("EncodedChannel.send", "EncodedChannel.recv", "DenseCodec.encode",
                                   "DenseCodec.decode", "DenseCodec._decode_seen", "Comm.send", "Comm.recv",
                                   "gloo send", "gloo recv")}


@pytest.mark.parametrize(("contestant", "posting", "posts"), [("engine[1f1b]", "--post-ahead", "act,grad"),
                                                           ("engine[1f1b] encoded", "--post-none", "none"),
                                                           ("engine[1f1b]", None, "grad")])
def test_pipeline_loop_runs_a_contestant_and_names_its_gloo_threads(contestant, posting, posts):
    p = _run("benchmarks.pipeline_loop", contestant, "--steps", "12", "--call-cpu", *([posting] if posting else []))
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert sum("gloo threads" in line and line.endswith(f", 1F1B posts ahead: {posts}") for line in lines) == 2, \
        p.stderr
    # two warm steps of 4 micro-batches: each rank sends and receives 4 messages a step
    for rank in (0, 1):
        step = next((x for x in lines if x.startswith(f"rank {rank}: the step ")), None)
        assert step is not None and step.endswith(" ms CPU (main thread)"), p.stderr
        assert float(step.split()[4]) > 0, step  # a step's forward and backward take CPU
        for call in _TIMED[contestant]:
            line = next((x for x in lines if x.startswith(f"rank {rank}: {call} ")), None)
            assert line is not None, (call, p.stderr)
            assert " us CPU per call in the steps (8 calls)" in line, line
            assert ("back to back" in line) == (call in ("DenseCodec.encode", "DenseCodec.decode")), line


def test_pipeline_interleaved_runs_the_contestants_named_and_their_ratios_only():
    from benchmarks.pipeline_interleaved import CONTESTANTS, RATIOS, chosen, ratios

    assert chosen(None) == CONTESTANTS and ratios(CONTESTANTS) == list(RATIOS)
    # in the benchmark's order, whatever the order named; spaces and repeats ignored
    picked = chosen("Schedule1F1B, engine[1f1b] encoded,engine[1f1b],Schedule1F1B")
    assert picked == ("engine[1f1b]", "Schedule1F1B", "engine[1f1b] encoded")
    assert ratios(picked) == [("engine[1f1b]", "Schedule1F1B"), ("engine[1f1b]", "engine[1f1b] encoded"),
                              ("engine[1f1b] encoded", "Schedule1F1B")]
    with pytest.raises(ValueError, match="unknown contestant.*'Schedule1f1b'.*choose from engine"):
        chosen("engine[1f1b],Schedule1f1b")
    for spec in ("engine[1f1b]", "engine[1f1b],engine[1f1b]", "engine[gpipe],engine[1f1b] ahead"):
        with pytest.raises(ValueError, match="no ratio this benchmark reports is between"):
            chosen(spec)


def test_a_posting_choice_holds_for_its_contestants_step_only():
    from algorithms.pipeline.engine import POSTS_AHEAD
    from benchmarks.pipeline_interleaved import AHEAD_CHOICES, posting_ahead

    own = POSTS_AHEAD["1f1b"]
    assert set(AHEAD_CHOICES.values()) == {("act", "grad"), ()} and own not in AHEAD_CHOICES.values()
    for tags in AHEAD_CHOICES.values():
        with posting_ahead(tags):
            assert POSTS_AHEAD["1f1b"] == tags
        assert POSTS_AHEAD["1f1b"] == own
    with pytest.raises(RuntimeError, match="a step that fails"), posting_ahead(()):
        raise RuntimeError("a step that fails")
    assert POSTS_AHEAD["1f1b"] == own


def test_a_long_run_reports_its_rounds_at_the_interval_and_at_the_end(capsys):
    import io

    from benchmarks.progress import rounds

    ticks = iter([100.0, 110.0, 130.0, 140.0, 161.0, 170.0])  # the start, then after each round
    out = io.StringIO()
    assert list(rounds(5, "bench", every_s=30.0, clock=lambda: next(ticks), out=out)) == [0, 1, 2, 3, 4]
    # a line once 30 s passed since the last line (at 30 s, not at 40 s, again at 61 s), and the end's
    assert out.getvalue().splitlines() == ["bench: round 2 of 5, 30 s, about 45 s left",
                                           "bench: round 4 of 5, 61 s, about 15 s left",
                                           "bench: round 5 of 5, 70 s"]
    quiet = io.StringIO()
    assert list(rounds(3, "bench", report=False, clock=lambda: 1 / 0, out=quiet)) == [0, 1, 2]
    assert quiet.getvalue() == ""
    ticks = iter([0.0, 1.0])
    assert list(rounds(1, "alone", clock=lambda: next(ticks))) == [0]
    assert capsys.readouterr() == ("", "alone: round 1 of 1, 1 s\n")  # on stderr by default
