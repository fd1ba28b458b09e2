#!/usr/bin/env bash
# The transport's ratio table, every benchmark at once, each pinned to its own two cores:
#   pipeline-sgd / hand-written GPipe (tiny-opt, small-opt)   benchmarks/pipeline_ratio.py
#   pipeline-sgd / torch.distributed.pipelining (GPipe, 1F1B) benchmarks/pipelining_ratio.py
#   shaped pipeline / what its schedule allows (2, 10, 80 Mbit/s) benchmarks/paced_pipeline.py
#   Comm round trip and send burst / raw gloo                 benchmarks/roundtrip_ratio.py
#   codec encode / a copy, at 1 and 2 threads                  benchmarks/codec_ratios.py
#
#   bash scripts/transport-ratios.sh                      # this tree
#   BEFORE=DIR bash scripts/transport-ratios.sh           # and an older tree, side by side:
#       mkdir DIR && git archive REV | tar -x -C DIR      # (the benchmarks are copied into it)
#
# Needs 16 cores for the full set at once (fewer: the jobs share cores and the load says so).
# Each job's output goes to $OUT/<job>.txt (default: a new temporary directory), with the load
# average before and after; ratios compare only inside one job, before/after across jobs on
# the same machine.  REPEATS (default 5) sets the interleaved repeats of every benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
py=${PYTHON:-python3}
R=${REPEATS:-5}
ncpu=$(nproc)
mkdir -p "$out"
next=0

job() {  # job NAME "DIR MODULE ARGS" ...: one after the other, each in its DIR, on the next two cores
    local name=$1; shift
    local cores="$((next % ncpu)),$(((next + 1) % ncpu))"
    next=$((next + 2))
    (for cmd in "$@"; do
        read -r dir mod <<< "$cmd"
        echo "== $([ "$dir" = "$after" ] && echo this-tree || echo before-tree): python -m $mod"  # no machine path in the outputs
        # shellcheck disable=SC2086
        (cd "$dir" && PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$dir" taskset -c "$cores" \
            timeout "${JOB_TIMEOUT:-540}" "$py" -m $mod 2>&1)
        echo "exit $?"
    done > "$out/$name.txt") &
}

after=$PWD before=${BEFORE:-}
if [ -n "$before" ]; then
    # the older tree gets this tree's benchmark programs (they use only the public harness API)
    cp benchmarks/pipeline_ratio.py benchmarks/paced_pipeline.py benchmarks/roundtrip_ratio.py "$before/benchmarks/"
fi
for t in after ${before:+before}; do
    dir=$after; [ "$t" = before ] && dir=$before
    job "gpipe-tiny-$t" "$dir benchmarks.pipeline_ratio --model tiny-opt --repeats $R"
    job "gpipe-small-$t" "$dir benchmarks.pipeline_ratio --model small-opt --seq-len 128 --repeats $R"
    job "paced-$t" "$dir benchmarks.paced_pipeline --rates 2mbit,10mbit,80mbit --repeats $R"
done
job "roundtrip" "$after benchmarks.roundtrip_ratio --repeats $R" \
    ${before:+"$before benchmarks.roundtrip_ratio --repeats $R"}
extra=()
[ -f benchmarks/pipelining_ratio.py ] && extra=("$after benchmarks.pipelining_ratio --repeats $R")
job "codecs-pipelining" "$after benchmarks.codec_ratios --repeats $((R * 2))" "${extra[@]}"
wait
echo "outputs in $out"
grep -H "^exit " "$out"/*.txt
