#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): CUDA checks, ZO2's offload streams, peak GPU
# memory against SparQ Table 2, the CPU tensor meter calibrated against the GPU.
# Records and summary.md go to $OUT (default: a new temporary directory); extra
# arguments go to `python -m benchmarks.gpu_check run` (e.g. --parts checks,zo2).
# Without CUDA it says why in one line, writes the summary and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
exec "$PY" -m benchmarks.gpu_check run "$@"
