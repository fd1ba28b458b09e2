"""The fault and hostile-input table, produced by running the checks (not typed).

Runs the checks of each category below in one pytest process with a JUnit XML
report and counts, per category, the cases tried and how each ended:

* clear error: the check passed.  Every check listed asserts that its fault or
  bad input ends in one clear error (a named rank, a one-line message, the exit
  status), and, where the category says so, that nothing was left behind;
* crash/traceback, silent wrong, left behind: a failed check, sorted by its
  failure text (a traceback or a dead process; no error raised where one was
  due; a rank process, namespace, run directory or file left, or a run started);
  a failure that fits none is counted under "other failure";
* skipped: not tried on this machine (e.g. network namespaces without root).

A check that covers two categories counts in both (the signal check also looks
at listening sockets; rank-output bytes are a payload and a trust boundary).
"n/c" in "left behind": the category's checks do not look for leftovers (they run
in this process: nothing is started that could stay).

    python scripts/fault_table.py [--fast] [--out table.md]

``--fast`` leaves out the checks marked gloo (process runs); the table then says
so in its title.  Exit status: 0 when every case tried ended in a clear error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# category -> (checks: (file, test-function prefix), do they look for leftovers)
CATEGORIES: dict[str, tuple[list[tuple[str, str]], bool]] = {
    "signals to the launcher": ([
        ("test_faults_launcher.py", "test_stop_signal_to_the_launcher"),
        ("test_faults_launcher.py", "test_sigkill_to_the_launcher"),
        ("test_faults_launcher.py", "test_signals_in_network_namespaces"),
        ("test_faults_inprocess.py", "test_stop_signals_raise_interrupted"),
        ("test_faults_inprocess.py", "test_remove_stale"),
        ("test_faults_inprocess.py", "test_commbench_clean"),
    ], True),
    "hung, failing or dead rank": ([
        ("test_faults_launcher.py", "test_a_stopped_gloo_rank"),
        ("test_faults_inprocess.py", "test_a_blocked_rank_thread"),
        ("test_faults_inprocess.py", "test_a_timeout_without_a_stalled_rank"),
        ("test_faults_inprocess.py", "test_max_run_time"),
        ("test_faults_inprocess.py", "test_cli_rejects_a_bad_max_run_time"),
        ("test_pipeline.py", "test_a_failing_gloo_rank"),
        ("test_pipeline.py", "test_a_failing_threads_rank"),
    ], True),
    "frame receive path": ([
        ("test_wire_hostile.py", "test_threads_malformed_frames"),
        ("test_wire_hostile.py", "test_gloo_malformed_frames"),
        ("test_wire_hostile.py", "test_send_refuses"),
        ("test_wire_hostile.py", "test_threads_run_ends_on_a_message_above"),
        ("test_wire_hostile.py", "test_gloo_run_ends_on_a_message_above"),
    ], False),
    "decoder size bombs, corrupt payloads": ([
        ("test_wire_hostile.py", "test_decoders_refuse"),
        ("test_wire_hostile.py", "test_non_finite_scales"),
        ("test_rank_output_wire.py", "test_malformed_bytes"),
    ], False),
    "trust: pickle, config file, listening sockets": ([
        ("test_config.py", "test_a_bad_config_file"),
        ("test_config.py", "test_rank_entry_reads_json"),
        ("test_config.py", "test_nothing_in_the_project_unpickles"),
        ("test_rank_output_wire.py", "test_malformed_bytes"),
        # listening sockets are looked at inside the signal check (loopback only)
        ("test_faults_launcher.py", "test_stop_signal_to_the_launcher"),
    ], False),
    "command-line bad input": ([
        ("test_cli.py", "test_bad_input_is_one_line"),
        ("test_cli.py", "test_hostile_input_is_one_line"),
        ("test_cli.py", "test_no_traceback_from_the_command_line"),
        ("test_config.py", "test_max_frame_bytes_is_validated"),
        ("test_config.py", "test_only_the_families_that_split"),
    ], True),
    "compare": ([
        ("test_compare.py", "test_unknown_input"),
        ("test_compare.py", "test_nothing_compared"),
        ("test_compare.py", "test_disjoint_sides"),
        ("test_compare.py", "test_a_run_missing_on_one_side"),
        ("test_compare.py", "test_two_records_of_one_config"),
        ("test_compare.py", "test_a_planted_byte_change"),
        ("test_compare.py", "test_a_changed_equivalence_hash"),
        ("test_compare.py", "test_commits_need_one_machine"),
    ], False),
}
COLUMNS = ("clear error", "crash/traceback", "silent wrong", "left behind", "other failure")

_LEFT = ("rank processes of launcher", "namespaces of launcher", "run directory of launcher",
         "_tree(work) == before", "sandbox[\"calls\"]", "left behind")
_CRASH = ("Traceback", "process died", "exit code -", "Aborted", "Segmentation")
_SILENT = ("DID NOT RAISE", "no error", "not reached")


def classify(text: str) -> str:
    """The column of a failed check, from its failure text."""
    if any(s in text for s in _LEFT):
        return "left behind"
    if any(s in text for s in _SILENT):
        return "silent wrong"
    if any(s in text for s in _CRASH):
        return "crash/traceback"
    return "other failure"


def _select(fast: bool) -> list[str]:
    files = sorted({f for checks, _ in CATEGORIES.values() for f, _ in checks})
    names = sorted({n for checks, _ in CATEGORIES.values() for _, n in checks})
    args = [str(ROOT / "checks" / f) for f in files] + ["-k", " or ".join(names)]
    if fast:
        args += ["-m", "not gloo"]
    return args


def run_checks(fast: bool, xml: Path) -> list[tuple[str, str, str, str]]:
    """(file, test name, outcome, failure text) of every check run."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
           f"--junitxml={xml}", *_select(fast)]
    subprocess.run(cmd, cwd=ROOT, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        file = Path(case.get("file") or case.get("classname", "").replace(".", "/") + ".py").name
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out.append((file, case.get("name"), "failed", (bad.get("message") or "") + (bad.text or "")))
        elif case.find("skipped") is not None:
            out.append((file, case.get("name"), "skipped", ""))
        else:
            out.append((file, case.get("name"), "passed", ""))
    return out


def table(results, fast: bool) -> tuple[str, bool]:
    lines = ["| test | tried | " + " | ".join(COLUMNS) + " | skipped |",
             "|---|---:|" + "---:|" * (len(COLUMNS) + 1)]
    clean = True
    for cat, (checks, leftovers) in CATEGORIES.items():
        counts = dict.fromkeys((*COLUMNS, "skipped"), 0)
        tried = 0
        for file, name, outcome, text in results:
            if not any(file == f and name.startswith(prefix) for f, prefix in checks):
                continue
            if outcome == "skipped":
                counts["skipped"] += 1
                continue
            tried += 1
            col = "clear error" if outcome == "passed" else classify(text)
            counts[col] += 1
            clean &= col == "clear error"
        cells = [str(counts[c]) if c != "left behind" or leftovers else "n/c" for c in COLUMNS]
        lines.append(f"| {cat} | {tried} | " + " | ".join(cells) + f" | {counts['skipped']} |")
    failed = [f"* {file}::{name}: {classify(text)}: {text.strip().splitlines()[0][:200] if text.strip() else '?'}"
              for file, name, outcome, text in results if outcome == "failed"]
    if failed:
        lines += ["", "Failed checks:", *failed]
    title = "Faults and hostile input (checks run by scripts/fault_table.py" + \
        (", without the gloo process checks)" if fast else ")")
    return "\n".join([title, "", *lines]), clean


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="leave out the gloo process checks")
    ap.add_argument("--out", help="also write the table here (Markdown)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_checks(args.fast, Path(tmp) / "junit.xml")
    text, clean = table(results, args.fast)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
