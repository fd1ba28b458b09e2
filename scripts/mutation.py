"""Mutation testing of the algorithms' cores against the checks that anchor them.

``mutmut`` (3.x) reads one configuration, ``[tool.mutmut]`` in pyproject.toml:
every file of ``algorithms/`` and ``harness/comm/`` mutated, against the checks
listed there. A full run takes hours on two cores, so this script also names
*profiles*: one core module (or two) with the few checks that anchor it. A
profile narrows the mutated files (``only_mutate``) and the test selection
before mutmut runs; mutmut itself then runs each mutant only against the checks
that reached the mutated function in its clean run.

    python scripts/mutation.py --list
    python scripts/mutation.py zo codecs-quant --max-children 2
    python scripts/mutation.py all            # the pyproject configuration as is

After each profile it prints killed / survived / timeout / suspicious / no
tests per module. Changing the test selection makes mutmut drop its cached
verdicts, so record the counts of a profile before running the next one.
The survivors and their triage are kept in checks/MUTATION.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="*", default=["all"])
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="list the profiles and exit")
    ap.add_argument("--mutants", nargs="*", default=[],
                    help="only these mutant names (globs), e.g. to re-run survivors")
    args = ap.parse_args(argv)
    if args.list:
        for name, (files, tests) in PROFILES.items():
            print(f"{name:16s} {' '.join(files)}  <-  {' '.join(tests)}")
        return 0
    os.chdir(ROOT)
    # Derandomised hypothesis: a mutant's verdict must not depend on the draw.
    os.environ.setdefault("HYPOTHESIS_PROFILE", "ci")
    import mutmut.configuration as mc

    cfg = mc.config()
    base_only, base_sel = list(cfg.only_mutate), list(cfg.pytest_add_cli_args_test_selection)
    for name in args.profiles:
        if name != "all" and name not in PROFILES:
            ap.error(f"unknown profile {name!r}; --list shows them")
        files, sel = PROFILES.get(name, (base_only, base_sel))
        cfg.only_mutate, cfg.pytest_add_cli_args_test_selection = list(files), list(sel)
        from mutmut.__main__ import cli

        print(f"== profile {name}: {' '.join(files)}", flush=True)
        try:
            cli(["run", "--max-children", str(args.max_children), *args.mutants],
                standalone_mode=False)
        except SystemExit as e:
            if e.code:
                return int(e.code)
        listed = [f for f in files if not f.endswith("*")] or [
            str(p.relative_to(ROOT)) for pat in files for p in sorted(ROOT.glob(pat))
            if p.suffix == ".py"]
        for f, c in _counts(listed).items():
            shown = ", ".join(f"{s} {c[s]}" for s in STATUS if s in c)
            print(f"   {f}: {shown}", flush=True)
        for s in _survivors(listed):
            print(f"   not killed: {s}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
