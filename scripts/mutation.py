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
    python scripts/mutation.py all            # the pyproject configuration (+ -x)
    python scripts/mutation.py all --sample 6 --round 0   # 6 random mutants per module

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
import random
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
    # the wire header every codec parses, and the dense bodies copied by address (with the dense
    # codec's kept plans and headers decoded before)
    "codecs-core": (
        ["algorithms/codecs/_core.py", "algorithms/codecs/dense.py"],
        ["checks/test_codecs.py", "checks/test_message_codecs.py", "checks/test_codec_crc.py",
         "checks/test_anchor_codecs.py", "checks/test_dense_repeats.py"],
    ),
    # the sparse bodies' positions (bitmap, index list, Elias–Fano), sparse-qstoch's layouts
    # over them, and the bit packing under every sparse body
    "codecs-positions": (
        ["algorithms/codecs/elias_fano.py", "algorithms/codecs/bitpack.py",
         "algorithms/codecs/sparse_body.py", "algorithms/codecs/sparse_qstoch.py"],
        ["checks/test_message_codecs.py", "checks/test_anchor_codecs.py", "checks/test_codecs.py",
         "-k", "pack or elias or sparse or positions or format"],
    ),
    "comm-sizes": (
        ["harness/comm/torchdist.py"],
        ["checks/test_comm_sized_frames.py", "-k", "size_history"],
    ),
    # tc tbf per egress for the step-by-step shaped benchmark (root: the checks make namespaces).
    # Run it with --mutants 'harness.netns.x_shape*': mutants of NetnsTopology leave namespaces
    # and veths behind (harness.leftovers removes the namespaces of dead runs, not the veths).
    "netns-shape": (
        ["harness/netns.py"],
        ["checks/test_netns.py", "-k", "shape"],
    ),
    "pipeline-links": (
        ["algorithms/pipeline/links.py"],
        ["checks/test_anchor_aqsgd.py",
         "checks/test_compressed_pipeline.py", "-k", "test_anchor_aqsgd or both_ends or raw"],
    ),
    # the engine's schedules and the receives each posts ahead (run it with --mutants naming
    # run_step and schedule_ops: checks/MUTATION.md)
    "pipeline-engine": (
        ["algorithms/pipeline/engine.py"],
        ["checks/test_pipeline_schedules.py", "checks/test_pipeline.py"],
    ),
    "byte-meter": (
        ["harness/comm/byte_meter.py"],
        ["checks/test_comm.py"],
    ),
    # the Comm's per-message bookkeeping that runs in the checks' own process: the progress
    # board's marks and beats, the meter's flow per peer and tag, a sized buffer's far guard.
    # Run it with --mutants naming those (checks/MUTATION.md): the rest of base.py and
    # torchdist.py is reached through spawned gloo ranks, which mutmut cannot follow.
    "comm-per-message": (
        ["harness/comm/progress_board.py", "harness/comm/base.py", "harness/comm/torchdist.py"],
        ["checks/test_comm.py", "checks/test_faults_inprocess.py", "checks/test_comm_sized_frames.py",
         "checks/test_pacer.py", "checks/test_wire_hostile.py", "-k", "not paced_benchmark"],
    ),
    # the threads backend: a send completes once its receive is posted, the in-flight bound and
    # the wait at a collective as on gloo (base.py's bound with it)
    "comm-threads": (
        ["harness/comm/threads.py", "harness/comm/base.py"],
        ["checks/test_comm.py", "checks/test_comm_recv_any.py", "checks/test_pacer.py",
         "-k", "threads or exchange or stream or collective or bound or recv_any or bucket"],
    ),
    # the spawned rank processes of checks and benchmarks: fail fast, grace after a death, cleanup
    # (the gloo checks that run a dead peer through run_gloo are in the selection: MARKS)
    "rank-processes": (
        ["harness/rank_processes.py"],
        ["checks/test_gloo_pair.py", "checks/test_comm.py", "-k", "pair or grace or ranks_end or death or dies"],
    ),
    # a long benchmark's progress lines (the module's own check, with a fake clock)
    "benchmark-progress": (
        ["benchmarks/progress.py"],
        ["checks/test_benchmark_tools.py", "-k", "long_run"],
    ),
    # the intervals every timed table and claim shows (a ratio of medians over repeats among them)
    "stats-intervals": (
        ["harness/stats.py"],
        ["checks/test_experiments.py", "checks/test_tables.py", "-k", "interval or timed_claim or median"],
    ),
    # the pretrained task: prompt encoding of the causal LM, held-out accuracy and its head
    "prompt-heldout": (
        ["harness/models/prompt.py", "harness/heldout.py"],
        ["checks/test_gemma.py", "checks/test_pretrained.py", "-k",
         "prompt or label or heldout or accuracy or probe or template or scorer or tokenised "
         "or (on_the_encoder and (fo-sgd or mezo or sparq or aq-sgd))"],
    ),
}
# Profiles whose anchoring checks carry marks the default selection leaves out: prompt-heldout's
# are slow (they load a real checkpoint), so every check but the process-spawning and hardware
# ones; netns-shape's make namespaces in-process (root); rank-processes' spawn gloo ranks;
# benchmark-progress's file is marked gloo as a whole (its one check spawns nothing).
MARKS = {"prompt-heldout": "not gloo and not netns and not gpu", "netns-shape": "not gpu",
         "rank-processes": "not gpu", "benchmark-progress": "not gpu"}


def _selection(name: str) -> list[str]:
    common = COMMON_SELECTION if name not in MARKS else ["-x", "-m", MARKS[name]]
    return PROFILES[name][1] + common

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


def _generate() -> None:
    """Copy the tree into ``mutants/`` and write every mutant (mutmut run's first step)."""
    from mutmut.__main__ import (
        copy_also_copy_files,
        copy_src_dir,
        create_mutants,
        setup_source_paths,
        store_lines_covered_by_tests,
    )

    WORK.mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    store_lines_covered_by_tests()
    create_mutants(1)


def _pick(base: Path, n: int, round_: int, seed: int) -> list[str]:
    """Round ``round_`` of a stratified random sample: ``n`` mutants of every module.

    Shuffles each module's mutant names with ``seed`` and takes positions
    ``[round_ n, (round_ + 1) n)``, so rounds of one ``n`` are disjoint and
    each is a uniform sample of every module: a per-module score estimated
    from it is unbiased, unlike a run stopped part-way (mutmut runs the
    cheapest mutants first).
    """
    picked = []
    for meta in sorted(base.rglob("*.py.meta")):
        module = str(meta.relative_to(base))[: -len(".meta")]
        names = sorted(json.loads(meta.read_text())["exit_code_by_key"])
        random.Random(f"{seed}:{module}").shuffle(names)
        picked += names[round_ * n:(round_ + 1) * n]
    return picked


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a proportion k / n (sound for small n and k = n)."""
    if n == 0:
        return (0.0, 1.0)
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5 / d
    return (max(0.0, mid - half), min(1.0, mid + half))


def report(name: str, sample: tuple[int, int, int] | None = None) -> str:
    """Markdown table of the verdicts held in profile ``name``'s copy, per module.

    Only mutants with a verdict count (a sample's unchosen mutants are "not
    checked"); with ``sample``, only that round's mutants. Score = killed / (checked - no tests), with a 95 % Wilson
    interval since a sample's few mutants per module give a wide one; a row
    per family (``algorithms/zo``, ``harness/comm``...) sums its modules.
    """
    from mutmut.stats import status_by_exit_code

    base = WORK if (WORK / MARKER).is_file() and (WORK / MARKER).read_text().strip() == name \
        else PARKED / name
    only = set(_pick(base, *sample)) if sample else None
    rows: dict[str, dict[str, int]] = {}
    for meta in sorted(base.rglob("*.py.meta")):
        module = str(meta.relative_to(base))[: -len(".meta")]
        c = rows.setdefault(module, {})
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code is not None and (only is None or key in only):
                st = status_by_exit_code[code]
                c[st] = c.get(st, 0) + 1
    families: dict[str, dict[str, int]] = {}
    for module, c in rows.items():
        f = families.setdefault(str(Path(module).parent), {})
        for k, v in c.items():
            f[k] = f.get(k, 0) + v
    cols = ["killed", "survived", "timeout", "suspicious", "no tests"]
    out = ["| module | checked | " + " | ".join(cols) + " | score | 95 % interval |",
           "|---|" + "---:|" * (len(cols) + 3)]
    for label, table in (("", rows), ("**family** ", families)):
        for module, c in sorted(table.items()):
            checked = sum(c.values())
            if not checked:
                continue
            tested = checked - c.get("no tests", 0)
            lo, hi = _wilson(c.get("killed", 0), tested)
            score = f"{c.get('killed', 0)}/{tested}" if tested else "–"
            out.append(f"| {label}{module} | {checked} | "
                       + " | ".join(str(c.get(k, 0)) for k in cols)
                       + f" | {score} | {lo:.2f}–{hi:.2f} |")
    return "\n".join(out)


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
                 mutants: list[str], sample: tuple[int, int, int] | None = None) -> int:
    """One profile, in this process (mutmut keeps its state in module globals)."""
    os.chdir(ROOT)
    # A few derandomised examples per hypothesis check (checks/conftest.py).
    os.environ.setdefault("HYPOTHESIS_PROFILE", "mutation")
    import mutmut.configuration as mc

    cfg = mc.config()
    cfg.only_mutate, cfg.pytest_add_cli_args_test_selection = list(files), list(sel)
    # a profile's files outside the configured source paths (benchmarks/): mutated there, not
    # copied as they are
    tops = {f.split("/")[0] for f in files} - {str(p) for p in cfg.source_paths}
    cfg.source_paths = [*cfg.source_paths, *(Path(t) for t in sorted(tops))]
    cfg.also_copy = [p for p in cfg.also_copy if str(p) not in tops]
    from mutmut.__main__ import cli

    if sample:
        _generate()
        mutants = _pick(WORK, *sample)
        print(f"== sample: {sample[0]} per module, round {sample[1]}, seed {sample[2]}: "
              f"{len(mutants)} mutants", flush=True)
    start, load = time.monotonic(), os.getloadavg()
    print(f"== profile {name}: {' '.join(files)}  <-  {' '.join(sel)}", flush=True)
    try:
        cli(["run", "--max-children", str(max_children), *mutants], standalone_mode=False)
    except SystemExit as e:
        if e.code:
            return int(e.code)
    took = time.monotonic() - start
    from mutmut.utils.file_utils import walk_mutatable_files

    listed = sorted(str(p) for p in walk_mutatable_files())  # only_mutate, as narrowed above
    counts, survivors = _counts(listed), _survivors(listed)
    for f, c in counts.items():
        shown = ", ".join(f"{s} {c[s]}" for s in STATUS if s in c)
        print(f"   {f}: {shown}", flush=True)
    for s in survivors:
        print(f"   not killed: {s}", flush=True)
    load_end = os.getloadavg()
    print(f"   took {took:.0f} s (load average {load[0]:.1f} at the start, {load_end[0]:.1f} at the end)",
          flush=True)
    summary = {"profile": name, "mutants": mutants, "sample": sample, "seconds": round(took, 1),
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
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="run N randomly chosen mutants of every mutated module")
    ap.add_argument("--round", type=int, default=0,
                    help="which disjoint sample of N per module (0, 1, ...)")
    ap.add_argument("--seed", type=int, default=13, help="the sample's shuffle seed")
    ap.add_argument("--report", action="store_true",
                    help="print the verdicts each profile's copy holds, per module, and exit")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for name, (files, _) in PROFILES.items():
            print(f"{name:16s} {' '.join(files)}  <-  {' '.join(_selection(name))}")
        return 0
    for name in args.profiles:
        if name != "all" and name not in PROFILES:
            ap.error(f"unknown profile {name!r}; --list shows them")
    if args.report:
        for name in args.profiles:
            sample = (args.sample, args.round, args.seed) if args.sample else None
            print(f"profile {name}\n\n{report(name, sample)}\n")
        return 0
    if args.in_process:
        (name,) = args.profiles
        if name == "all":
            os.chdir(ROOT)
            import mutmut.configuration as mc

            cfg = mc.config()
            files, sel = list(cfg.only_mutate), list(cfg.pytest_add_cli_args_test_selection) + ["-x"]
        else:
            files, sel = PROFILES[name][0], _selection(name)
        sample = (args.sample, args.round, args.seed) if args.sample else None
        return _run_profile(name, files, sel, args.max_children, args.mutants, sample)
    for name in args.profiles:
        _use_workdir(name)
        # a fresh interpreter per profile: mutmut's state and configuration are globals
        rc = subprocess.call([sys.executable, str(Path(__file__).resolve()), name, "--in-process",
                              "--max-children", str(args.max_children),
                              *(["--mutants", *args.mutants] if args.mutants else []),
                              *(["--sample", str(args.sample), "--round", str(args.round),
                                 "--seed", str(args.seed)] if args.sample else [])], cwd=ROOT)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
