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
# machine whose history is committed, so `commbench compare` finds both sides; on
# another CPU the default is local-<host>, and a tracked machine is never rewritten), renamed
# so that no machine path is in them (scripts/asv_portable.py) and they can be
# committed as that machine's history; the dashboard goes to .asv/html (open
# it with `asv preview`), and `commbench compare OLD NEW` reads them.  Exits non-zero when
# any benchmark of any commit failed (scripts/asv_failed.py names them).
#
# It installs each commit into $PYTHON (default python3) with `pip install -e`: point
# PYTHON at a virtual environment made for it (python3 -m venv --system-site-packages).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
machine=${ASV_MACHINE:-ci-2core}
bench=${ASV_BENCH:-.}
revs=("$@")
[ ${#revs[@]} -eq 0 ] && revs=(HEAD)

# describe this machine to asv (its own `asv machine --yes` stores only some fields); a
# machine.json already under results/asv/<machine>/ that describes another CPU is another
# machine's history: never written into (the default name then becomes local-<host>)
machine=$("$py" - "$machine" "${ASV_MACHINE:+explicit}" <<'EOF'
import json, os, platform, socket, sys
from pathlib import Path
from asv.machine import MachineCollection
name, explicit = sys.argv[1], sys.argv[2] == "explicit"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.processor())
here = {"machine": name, "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
        "cpu": cpu, "num_cpu": str(os.cpu_count()),
        "ram": str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}
same = ("cpu", "num_cpu", "arch")
known = Path("results/asv") / name / "machine.json"
if known.exists():
    told = json.loads(known.read_text())
    if all(told.get(k) == here[k] for k in same):
        here = {k: v for k, v in told.items() if k != "version"}  # asv writes it back unchanged
    elif explicit:
        sys.exit(f"asv.sh: {known} describes another machine ({told.get('cpu')}, {told.get('num_cpu')} "
                 f"cores; this one: {here['cpu']}, {here['num_cpu']}); choose another ASV_MACHINE")
    else:
        name = f"local-{socket.gethostname().split('.')[0]}"
        print(f"asv.sh: {known} is another machine's ({told.get('cpu')}); measuring as {name!r}",
              file=sys.stderr)
        here["machine"] = name
MachineCollection.save(name, here)
print(name)
EOF
)
work=$(mktemp -d)
cleanup() {
  "$py" -m pip install --quiet --no-deps -e "$root" >/dev/null 2>&1 || true
  for wt in "$work"/*; do [ -d "$wt" ] && git worktree remove --force "$wt" >/dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT

# asv looks up the configured branches even for one given commit (run, publish), and a
# clone may lack them: a copy of the configuration names the commit (its paths made absolute)
write_conf() {
  "$py" - "$work/asv.conf.json" "$1" <<'EOF'
import json, os, sys
from asv.util import load_json
conf = load_json("asv.conf.json", js_comments=True)
conf["branches"] = [sys.argv[2]]
for key in ("repo", "benchmark_dir", "results_dir", "env_dir", "html_dir"):
    conf[key] = os.path.abspath(conf[key])
open(sys.argv[1], "w").write(json.dumps(conf))
EOF
}

shas=()
asv_failed=0
for rev in "${revs[@]}"; do
  sha=$(git rev-parse "$rev^{commit}")
  shas+=("$sha")
  echo "== asv: ${sha:0:8} ($rev)"
  if [ "$sha" = "$(git rev-parse HEAD)" ] && git diff --quiet HEAD -- harness algorithms; then
    src=$root
  else
    src="$work/${sha:0:8}"
    git worktree add --detach "$src" "$sha" >/dev/null
  fi
  "$py" -m pip install --quiet --no-deps -e "$src"
  # exit status 2 means some benchmark failed: measure the other commits, then fail
  rc=0
  write_conf "$sha"
  "$py" -m asv run --config "$work/asv.conf.json" -E existing:same --set-commit-hash "$sha" \
      --machine "$machine" -b "$bench" --launch-method spawn || rc=$?
  case $rc in 0) ;; 2) asv_failed=1 ;; *) exit "$rc" ;; esac
done
"$py" scripts/asv_portable.py results/asv
"$py" scripts/asv_failed.py "results/asv/$machine" "${shas[@]}" || asv_failed=1
write_conf "$(git rev-parse HEAD)"
"$py" -m asv publish --config "$work/asv.conf.json" >/dev/null && echo "dashboard: .asv/html (asv preview)"
if [ "$asv_failed" -ne 0 ]; then
  echo "asv.sh: some benchmarks failed (listed above)" >&2
  exit 1
fi
