"""Mutation testing of the algorithms' cores against the checks that anchor them.

``mutmut`` (3.x) reads one configuration, ``[tool.mutmut]`` in pyproject.toml:
every file of ``algorithms/`` and ``harness/comm/`` mutated, against the checks
listed there. A full run takes hours on two cores, so this script also names
*profiles*: one core module (or two) with the few checks that anchor it. A
profile narrows the mutated files (``only_mutate``) and the test selection
before mutmut runs; mutmut itself then runs each mutant only against the checks
that reached the mutated function in its clean run.

    python scripts/mutation.py --list
    python scripts/mutation.py zo codecs-quant --max-children 1
    python scripts/mutation.py zo --mutants 'algorithms.zo.estimator.x_walk*'
    python scripts/mutation.py all            # the pyproject configuration as is

Every profile's checks run with ``-x``, without the slow, gloo, netns and gpu
checks, and under the ``mutation`` hypothesis profile (checks/conftest.py: a
few derandomised examples), so a verdict is cheap and does not depend on the
draw. Each profile keeps its own copy of the tree and its verdicts (see
``_use_workdir``), so profiles can be run in any order and survivors re-run.
After each profile it prints killed / survived / timeout / suspicious / no
tests per module, the mutants not killed and the time it took. The survivors
and their triage are kept in checks/MUTATION.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"  # where mutmut works (fixed by mutmut)
PARKED = ROOT / ".mutants"  # the other profiles' copies, one folder each
MARKER = ".profile"

# Appended to every profile's test selection: stop at the first failing check,
# and leave out what spawns processes or needs hardware (mutmut cannot follow a
# mutant into a rank process; slow checks make every surviving mutant slow).
COMMON_SELECTION = ["-x", "-m", "not slow and not gloo and not netns and not gpu"]

# profile -> (files to mutate, pytest arguments selecting the checks that anchor them)
PROFILES: dict[str, tuple[list[str], list[str]]] = {
    "zo": (
        ["algorithms/zo/estimator.py", "algorithms/zo/perturb.py"],
        ["checks/test_anchor_zo.py", "checks/test_zo_mezo.py", "checks/test_zo_perturb.py"],
    ),
    "codecs-quant": (
        ["algorithms/codecs/quant.py"],
        ["checks/test_anchor_codecs.py", "checks/test_codecs.py"],
    ),
    "pipeline-links": (
        ["algorithms/pipeline/links.py"],
        ["checks/test_anchor_aqsgd.py",
         "checks/test_compressed_pipeline.py", "-k", "test_anchor_aqsgd or both_ends or raw"],
    ),
    "byte-meter": (
        ["harness/comm/byte_meter.py"],
        ["checks/test_comm.py"],
    ),
}

STATUS = ["killed", "survived", "timeout", "suspicious", "no tests", "skipped", "segfault",
          "caught by type check", "not checked"]


def _counts(files: list[str]) -> dict[str, dict[str, int]]:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    out: dict[str, dict[str, int]] = {}
    for f in files:
        m = SourceFileMutationData(path=Path(f))
        m.load()
        c: dict[str, int] = {}
        for code in m.exit_code_by_key.values():
            s = status_by_exit_code[code]
            c[s] = c.get(s, 0) + 1
        out[f] = c
    return out


def _survivors(files: list[str]) -> list[str]:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    names = []
    for f in files:
        m = SourceFileMutationData(path=Path(f))
        m.load()
        names += [k for k, code in m.exit_code_by_key.items()
                  if status_by_exit_code[code] in ("survived", "suspicious", "timeout")]
    return sorted(names)


def _use_workdir(name: str) -> None:
    """Make ``mutants/`` this profile's copy, parking another profile's under ``.mutants/``.

    One shared copy is unsafe: a file mutmut no longer mutates is copied over
    unmutated (newer than its source), and a later profile that mutates it
    again takes it for already mutated (mutmut compares the two mtimes), so
    its mutants would run against unmutated code and all survive. A changed
    test selection also drops every cached verdict.
    """
    marker = WORK / MARKER
    current = marker.read_text().strip() if marker.is_file() else "_unlabelled"
    if WORK.exists() and current != name:
        PARKED.mkdir(exist_ok=True)
        dst = PARKED / current
        if dst.exists():
            shutil.rmtree(dst)
        WORK.rename(dst)
    if not WORK.exists():
        if (PARKED / name).exists():
            (PARKED / name).rename(WORK)
        else:
            WORK.mkdir()
    marker.write_text(name + "\n")


def _run_profile(name: str, files: list[str], sel: list[str], max_children: int,
                 mutants: list[str]) -> int:
    """One profile, in this process (mutmut keeps its state in module globals)."""
    os.chdir(ROOT)
    # A few derandomised examples per hypothesis check (checks/conftest.py).
    os.environ.setdefault("HYPOTHESIS_PROFILE", "mutation")
    import mutmut.configuration as mc

    cfg = mc.config()
    cfg.only_mutate, cfg.pytest_add_cli_args_test_selection = list(files), list(sel)
    from mutmut.__main__ import cli

    start, load = time.monotonic(), os.getloadavg()
    print(f"== profile {name}: {' '.join(files)}  <-  {' '.join(sel)}", flush=True)
    try:
        cli(["run", "--max-children", str(max_children), *mutants], standalone_mode=False)
    except SystemExit as e:
        if e.code:
            return int(e.code)
    took = time.monotonic() - start
    listed = [f for f in files if not f.endswith("*")] or [
        str(p.relative_to(ROOT)) for pat in files for p in sorted(ROOT.glob(pat))
        if p.suffix == ".py"]
    counts, survivors = _counts(listed), _survivors(listed)
    for f, c in counts.items():
        shown = ", ".join(f"{s} {c[s]}" for s in STATUS if s in c)
        print(f"   {f}: {shown}", flush=True)
    for s in survivors:
        print(f"   not killed: {s}", flush=True)
    load_end = os.getloadavg()
    print(f"   took {took:.0f} s (load average {load[0]:.1f} at the start, {load_end[0]:.1f} at the end)",
          flush=True)
    summary = {"profile": name, "mutants": mutants, "seconds": round(took, 1),
               "load_average": [round(load[0], 2), round(load_end[0], 2)],
               "counts": counts, "not_killed": survivors}
    (WORK / f"summary-{int(time.time())}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="*", default=["all"])
    ap.add_argument("--max-children", type=int, default=1)
    ap.add_argument("--list", action="store_true", help="list the profiles and exit")
    ap.add_argument("--mutants", nargs="*", default=[],
                    help="only these mutant names (globs), e.g. to re-run survivors")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for name, (files, tests) in PROFILES.items():
            print(f"{name:16s} {' '.join(files)}  <-  {' '.join(tests + COMMON_SELECTION)}")
        return 0
    for name in args.profiles:
        if name != "all" and name not in PROFILES:
            ap.error(f"unknown profile {name!r}; --list shows them")
    if args.in_process:
        (name,) = args.profiles
        if name == "all":
            os.chdir(ROOT)
            import mutmut.configuration as mc

            cfg = mc.config()
            files, sel = list(cfg.only_mutate), list(cfg.pytest_add_cli_args_test_selection)
        else:
            files, sel = PROFILES[name][0], PROFILES[name][1] + COMMON_SELECTION
        return _run_profile(name, files, sel, args.max_children, args.mutants)
    for name in args.profiles:
        _use_workdir(name)
        # a fresh interpreter per profile: mutmut's state and configuration are globals
        rc = subprocess.call([sys.executable, str(Path(__file__).resolve()), name, "--in-process",
                              "--max-children", str(args.max_children),
                              *(["--mutants", *args.mutants] if args.mutants else [])], cwd=ROOT)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
