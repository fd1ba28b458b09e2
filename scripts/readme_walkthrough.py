"""Run the README's commands verbatim, in order, and print every command's exit status.

Meant for a fresh clone with the README's install done or about to be done by its first
command (run it from the clone's root, ``commbench`` on PATH).  Each line of the README's
``sh`` blocks runs through ``bash -c`` exactly as written: no step cut, no prepared file.
A command named with ``--skip 'SUBSTRING=why'`` is listed with that reason instead of run
(say where its run is); one that serves until stopped (``asv preview``) runs for
SERVE_S seconds and is stopped.  The table at the end has one row per README command.

    python3 scripts/readme_walkthrough.py --skip '-m pytest=ran as its own fresh-clone job'
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE_S = 20
SERVES = ("asv preview",)  # run until stopped: up for SERVE_S seconds is a pass


def readme_commands(readme: Path) -> list[str]:
    """Every non-comment line of the README's ``sh`` blocks, in order."""
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", readme.read_text(), re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    return cmds


def _children_cpu_s() -> float:
    """User + system CPU seconds of the finished commands (and their processes)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:160]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", action="append", default=[], metavar="SUBSTRING=WHY",
                    help="do not run the commands containing SUBSTRING; list them with WHY")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="keep each command's output there as NN.log (a new directory)")
    a = ap.parse_args(argv)
    skips = {}
    for s in a.skip:
        key, sep, why = s.partition("=")
        if not sep or not key or not why:
            ap.error(f"--skip takes SUBSTRING=WHY, got {s!r}")
        skips[key] = why
    if a.log_dir is not None:
        a.log_dir.mkdir(parents=True)  # refuses an existing directory: nothing overwritten
    rows = []
    for i, cmd in enumerate(readme_commands(ROOT / "README.md"), 1):
        why = next((w for k, w in skips.items() if k in cmd), None)
        if why is not None:
            rows.append((i, cmd, "skipped", "", "", why))
            print(f"[{i}] skipped: {cmd} ({why})", flush=True)
            continue
        print(f"[{i}] $ {cmd}", flush=True)
        t0, c0 = time.monotonic(), _children_cpu_s()
        serves = any(s in cmd for s in SERVES)
        with subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) as p:
            try:
                out, _ = p.communicate(timeout=SERVE_S if serves else None)
                status = str(p.returncode)
            except subprocess.TimeoutExpired:  # only a serving command has a limit
                p.terminate()
                out, _ = p.communicate()
                status = f"serving, stopped after {SERVE_S} s"
        took, cpu = time.monotonic() - t0, _children_cpu_s() - c0
        if a.log_dir is not None:
            (a.log_dir / f"{i:02d}.log").write_text(f"$ {cmd}\n{out}")
        rows.append((i, cmd, status, f"{took:.0f}", f"{cpu:.0f}", _last_line(out)))
        print(f"[{i}] exit {status} after {took:.0f} s wall, {cpu:.0f} CPU-s: {_last_line(out)}", flush=True)
    print("\n| # | command | exit status | wall s | CPU s | last line of output / why not run |")
    print("|---|---|---|---|---|---|")
    for i, cmd, status, took, cpu, note in rows:
        print(f"| {i} | `{cmd}` | {status} | {took} | {cpu} | {note.replace('|', '/')} |")
    failed = [r for r in rows if r[2] not in ("0", "skipped") and not r[2].startswith("serving")]
    print(f"\n{len(rows)} commands: {sum(r[2] == '0' for r in rows)} exit 0, "
          f"{sum(r[2] == 'skipped' for r in rows)} skipped, {len(failed)} non-zero")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
