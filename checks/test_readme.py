"""The README's command examples run as written (the cheap ones), so it cannot go stale.

Every line of the README's ``sh`` blocks is either run here, in order and as written — in a
scratch directory holding nothing a user's fresh clone would not, ``commbench`` as
``python -m harness.cli``, ``--steps`` cut to 2 and a run's held-out rows to 32 —
or named in ``EXPENSIVE`` with the reason it is not; a line that is neither
fails the check, and so does an ``EXPENSIVE`` entry that no README line has.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import readme_walkthrough as _walkthrough  # its parser: one reading of the README

ROOT = Path(__file__).resolve().parents[1]
HELDOUT_ROWS = 32  # a labelled run's evaluation, twice per run: 512 rows of MiniLM take most of its time

# substring of a README command -> why the walkthrough does not run it
EXPENSIVE = {
    "scripts/install.sh": "installs packages (CI has just run it)",
    "reproduce all": "the main job, about 10 minutes",
    "reproduce scaling": "a supporting experiment, minutes",
    "-m pytest": "the whole suite (this check is part of it)",
    "scripts/asv.sh": "installs and measures commits with asv, minutes per commit",
    "asv preview": "serves the dashboard until stopped",
    "compare HEAD~1 HEAD": "needs both commits measured by the scripts/asv.sh line",
    "cp -r results/exports": "copies reproduce's exports (the reproduce lines are not run here)",
    "compare results/exports-old": "compares two reproduce runs' claims (checks/test_claims.py compares claims files)",
    "--net netns": "needs root; checks/test_netns.py runs namespaced runs where it can",
    "scripts/gpu-check.sh": "the GPU run; checks/test_gpu_check.py runs its CPU path",
    "benchmarks.gpu_check table": "needs a device's records; checks/test_gpu_check.py builds it from a fixture",
    "--model gemma3-270m": "the opt-in Gemma-3 (its licence keeps it out of CI); checks/test_gemma.py when installed",
    "reproduce sparq-gemma": "the opt-in Gemma-3, about 50 minutes",
}


def readme_commands() -> list[str]:
    return _walkthrough.readme_commands(ROOT / "README.md")


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd)
    if argv[0] == "commbench":
        argv = [sys.executable, "-m", "harness.cli", *argv[1:]]
    for i, a in enumerate(argv[:-1]):
        if a == "--steps":
            argv[i + 1] = "2"
    if argv[3:4] == ["run"] and "--help" not in argv:  # the evaluation's cost, not its meaning
        argv += ["--set", f"heldout_rows={HELDOUT_ROWS}"]
    return argv


def test_every_readme_command_is_run_or_skipped_by_name():
    cmds = readme_commands()
    assert any(c.startswith("commbench run") for c in cmds) and any("reproduce" in c for c in cmds)
    for key in EXPENSIVE:
        assert any(key in c for c in cmds), f"EXPENSIVE entry {key!r} matches no README command: drop it"
    for c in cmds:
        assert c.startswith("commbench ") or any(k in c for k in EXPENSIVE), \
            f"README command {c!r} is neither a commbench command this check runs nor listed in EXPENSIVE"


def test_readme_walkthrough(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               COLUMNS="120")
    ran = []
    for cmd in readme_commands():
        if any(k in cmd for k in EXPENSIVE):
            continue
        p = subprocess.run(_argv(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"README command failed: {cmd}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        ran.append(cmd.split()[1])
        if cmd.startswith("commbench run") and "--help" not in cmd:
            assert "result: " in p.stdout, p.stdout[-2000:]
        if cmd.startswith("commbench table"):
            assert "|" in p.stdout and "payload" in p.stdout
    # the walkthrough a newcomer does: usage, list, runs, a table, a comparison
    assert {"--help", "list", "run", "table", "compare"} <= set(ran), ran
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) >= 2


@pytest.mark.parametrize("cmd", ["commbench run x --steps 50 --world-size 4"])
def test_argv_cuts_steps(cmd):
    assert _argv(cmd)[-5:] == ["2", "--world-size", "4", "--set", f"heldout_rows={HELDOUT_ROWS}"]
    assert _argv("commbench table results/runs")[3:] == ["table", "results/runs"]
