"""Make asv result files portable, so results/asv/<machine>/ can be committed.

asv names a result file (and its environment) after the interpreter's absolute
path when it runs on an existing environment (``existing-py_<path>``), which
ties the history to one checkout and puts a machine path into the repository.
This renames each such file to ``<commit>-existing-py<X.Y>.json`` and records
only the Python version, so `commbench compare OLD NEW` finds results from any
clone; the same commit measured again updates its file benchmark by benchmark.

    python scripts/asv_portable.py [results/asv]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def make_portable(root: Path, version: str) -> list[Path]:
    written = []
    for path in sorted(root.glob("*/*-existing-py_*.json")):
        data = json.loads(path.read_text())
        data["python"] = version
        data.setdefault("params", {})["python"] = version
        data["env_name"] = f"existing-py{version}"
        target = path.with_name(f"{data['commit_hash'][:8]}-{data['env_name']}.json")
        if target.exists():  # a partial re-run (asv -b) updates the benchmarks it ran, keeps the rest
            old = json.loads(target.read_text())
            if old.get("result_columns") == data.get("result_columns"):
                data["results"] = {**old.get("results", {}), **data.get("results", {})}
                data["durations"] = {**old.get("durations", {}), **data.get("durations", {})}
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=None, sort_keys=True) + "\n")
        tmp.replace(target)  # atomic: a reader never sees half a file
        path.unlink()
        written.append(target)
    return written


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/asv")
    for p in make_portable(root, f"{sys.version_info.major}.{sys.version_info.minor}"):
        print(f"asv result: {p}")
