"""Name every benchmark asv recorded no value for, for some commits of one machine.

asv's result files hold ``null`` where a benchmark failed and ``NaN`` where it was skipped
(``NotImplementedError`` in its ``setup``: a shaped run without root, say).  ``scripts/asv.sh``
runs this after measuring: a failed benchmark makes it exit non-zero even when asv itself did
not; skipped ones are listed.

    python scripts/asv_failed.py results/asv/<machine> SHA [SHA ...]
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path


def no_values(machine_dir: Path, sha: str) -> tuple[list[str], list[str], int]:
    """(failed, skipped, number of values) of one commit's result files."""
    failed, skipped, total = [], [], 0
    files = sorted(machine_dir.glob(f"{sha[:8]}-*.json"))
    if not files:
        return [f"{sha[:8]}: no result file"], [], 0
    for f in files:
        data = json.loads(f.read_text())
        cols = data["result_columns"]
        for bench, row in data["results"].items():
            row = dict(zip(cols, row, strict=False))
            params = row.get("params") or []
            names = [",".join(p) for p in itertools.product(*params)] if params else [""]
            values = row.get("result")
            values = values if isinstance(values, list) else [None] * len(names)
            for i, name in enumerate(names):
                v = values[i] if i < len(values) else None
                label = f"{sha[:8]} {bench}({name})" if name else f"{sha[:8]} {bench}"
                total += 1
                if v is None:
                    failed.append(label)
                elif isinstance(v, float) and math.isnan(v):
                    skipped.append(label)
    return failed, skipped, total


def main(argv: list[str]) -> int:
    machine_dir, shas = Path(argv[0]), argv[1:]
    bad = 0
    for sha in shas:
        failed, skipped, total = no_values(machine_dir, sha)
        for label in skipped:
            print(f"asv: skipped: {label}")
        for label in failed:
            print(f"asv: FAILED: {label}", file=sys.stderr)
        print(f"asv: {sha[:8]}: {total - len(failed) - len(skipped)} of {total} benchmark values recorded, "
              f"{len(failed)} failed, {len(skipped)} skipped")
        bad += len(failed)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
