#!/usr/bin/env bash
# Record asv results for one or more commits, offline, on the current Python
# environment, then build the dashboard.
#
#   bash scripts/asv.sh                 # HEAD
#   bash scripts/asv.sh HEAD~3 HEAD     # several commits (each checked out in a worktree)
#   bash scripts/asv.sh $(git rev-list --reverse HEAD~5..HEAD)
#
# Each commit's code is installed (editable, no dependencies) from a temporary
# worktree and measured with the current benchmark suite, so every commit is
# measured the same way; the current checkout is reinstalled at the end.
# Results go to results/asv/<machine>/ (ASV_MACHINE, default: ci-2core, the
# machine whose history is committed, so `commbench compare` finds both sides), renamed
# so that no machine path is in them (scripts/asv_portable.py) and they can be
# committed as that machine's history; the dashboard goes to .asv/html (open
# it with `asv preview`), and `commbench compare OLD NEW` reads them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
machine=${ASV_MACHINE:-ci-2core}
bench=${ASV_BENCH:-.}
revs=("$@")
[ ${#revs[@]} -eq 0 ] && revs=(HEAD)

# describe this machine to asv (its own `asv machine --yes` stores only some fields)
"$py" - "$machine" <<'EOF'
import os, platform, sys
from asv.machine import MachineCollection
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.processor())
MachineCollection.save(sys.argv[1], {
    "machine": sys.argv[1], "os": f"{platform.system()} {platform.release()}",
    "arch": platform.machine(), "cpu": cpu, "num_cpu": str(os.cpu_count()),
    "ram": str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))})
EOF
work=$(mktemp -d)
cleanup() {
  "$py" -m pip install --quiet --no-deps -e "$root" >/dev/null 2>&1 || true
  for wt in "$work"/*; do [ -d "$wt" ] && git worktree remove --force "$wt" >/dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT

for rev in "${revs[@]}"; do
  sha=$(git rev-parse "$rev^{commit}")
  echo "== asv: ${sha:0:8} ($rev)"
  if [ "$sha" = "$(git rev-parse HEAD)" ] && git diff --quiet HEAD -- harness algorithms; then
    src=$root
  else
    src="$work/${sha:0:8}"
    git worktree add --detach "$src" "$sha" >/dev/null
  fi
  "$py" -m pip install --quiet --no-deps -e "$src"
  # exit status 2 means some benchmark failed (e.g. an algorithm the commit lacks): keep going
  "$py" -m asv run -E existing:same --set-commit-hash "$sha" --machine "$machine" -b "$bench" \
      --launch-method spawn || [ $? -eq 2 ]
done
"$py" scripts/asv_portable.py results/asv
"$py" -m asv publish >/dev/null && echo "dashboard: .asv/html (asv preview)"
