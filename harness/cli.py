"""``commbench`` command line: list, run, table, reproduce.

Built on the same API a user imports (``harness.registry.make_config``,
``harness.launcher.run``, ``harness.results``, ``harness.reporting``).  This is
the composition root: the only module outside ``harness.experiments`` that
imports it (see ARCHITECTURE.md).  Every
bad input ends with one line on stderr and a non-zero exit status.
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

    from .data import DATASETS, get_dataset
    from .experiments import all_experiments
    from .models import PRESETS
    from .registry import load_all

    con = _console()
    t = Table(title="algorithms")
    for c in ("name", "family", "world size", "summary"):
        t.add_column(c)
    for name, spec in sorted(load_all().items()):
        ws = f"{spec.min_world}" if spec.max_world == spec.min_world else (
            f">= {spec.min_world}" if spec.max_world is None else f"{spec.min_world}..{spec.max_world}")
        t.add_row(name, spec.family, ws, spec.summary)
    con.print(t)
    t = Table(title="models")
    for c in ("name", "family", "blocks", "d_model", "ffn", "activation", "vocab"):
        t.add_column(c)
    for name, p in PRESETS.items():
        t.add_row(name, p.family, str(p.num_blocks), str(p.d_model), str(p.ffn_dim), p.activation, str(p.vocab_size))
    con.print(t)
    t = Table(title="data")
    for c in ("name", "kind", "source"):
        t.add_column(c)
    for name in DATASETS:
        ds = get_dataset(name)
        t.add_row(name, ds.kind, ds.source)
    con.print(t)
    t = Table(title="experiments (commbench reproduce NAME)")
    t.add_column("name")
    t.add_column("in 'all'")
    t.add_column("what")
    for exp in all_experiments():
        t.add_row(exp.name, "yes" if exp.paper else "by name", exp.summary)
    con.print(t)
    return 0


# --------------------------------------------------------------------------- run
def _default_out(cfg) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("results") / "runs" / f"{cfg.algorithm}-{cfg.model}-w{cfg.world_size}-{cfg.backend}-{stamp}.json"


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) and \
        "COMMBENCH_RUN_DIR" not in os.environ


def build_config(args):
    from .config import apply_sets, parse_sets
    from .registry import make_config

    base = dict(model=args.model, data=args.data, world_size=args.world_size, backend=args.backend,
                steps=args.steps, seed=args.seed, net=args.net, bandwidth=args.bandwidth,
                latency_ms=args.latency_ms, timeout_s=args.timeout, metered=not args.no_meter)
    base = {k: v for k, v in base.items() if v is not None}
    if args.net == "netns" and args.backend is None:
        base["backend"] = "gloo"  # namespaces hold processes; threads cannot be split across them
    cfg = make_config(args.algorithm, **base)
    cfg = apply_sets(cfg, parse_sets(args.set or []))
    from .launcher import validate

    validate(cfg)
    return cfg


def cmd_run(args) -> int:
    from . import progress
    from .reporting import print_table, records_to_table
    from .results import write_result

    cfg = build_config(args)
    if _under_torchrun() and cfg.backend != "threads":
        from .rank_entry import run_rank

        if int(os.environ["WORLD_SIZE"]) != cfg.world_size:
            raise UsageError(f"--world-size {cfg.world_size} differs from torchrun's WORLD_SIZE "
                             f"{os.environ['WORLD_SIZE']}")
        out = Path(args.out) if args.out else _default_out(cfg)
        record = run_rank(cfg, out if int(os.environ["RANK"]) == 0 else None)
    else:
        record = progress.run(cfg, args.quiet)
        out = Path(args.out) if args.out else _default_out(cfg)
        write_result(record, out)
    if record is not None:
        if not args.quiet:
            print_table(records_to_table([record]))
        print(f"result: {out}")
    return 0


# --------------------------------------------------------------------------- table
def cmd_table(args) -> int:
    from .reporting import (
        load_reference,
        print_table,
        records_to_table,
        render,
        with_reference,
        write_table,
    )
    from .results import read_results

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

    from .reporting.compare import compare

    changes, notes = compare(args.old, args.new, args.machine)
    regressions = [c for c in changes if c.regression]
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
    print(f"{len(regressions)} deterministic change(s), {same} deterministic metric(s) unchanged; "
          "time and memory are reported, never failed on")
    return 1 if regressions else 0


def _short(v) -> str:
    if isinstance(v, str) and len(v) == 64:
        return v[:12]
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# --------------------------------------------------------------------------- reproduce
def cmd_reproduce(args) -> int:
    from .experiments import run_experiments

    run_experiments(args.paper, scale=args.scale, out_dir=Path(args.out_dir), quiet=args.quiet)
    return 0


# --------------------------------------------------------------------------- main
def make_parser() -> argparse.ArgumentParser:
    from .comm import BACKENDS
    from .config import NETS

    p = _Parser(prog="commbench", description="verification test-bed and benchmark harness for "
                "memory- and communication-efficient distributed training")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True

    sub.add_parser("list", help="algorithms, models, data and experiments").set_defaults(fn=cmd_list)

    r = sub.add_parser("run", help="run one algorithm and write its result record")
    r.add_argument("algorithm")
    r.add_argument("--model")
    r.add_argument("--data")
    r.add_argument("--world-size", type=int)
    r.add_argument("--backend", choices=BACKENDS)
    r.add_argument("--steps", type=int)
    r.add_argument("--seed", type=int)
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config or algorithm parameter (repeatable)")
    r.add_argument("--out", help="result file (default: results/runs/<algorithm>-...json)")
    r.add_argument("--net", choices=NETS, help="pacer: --bandwidth paced by the Comm (any user); "
                   "netns: one network namespace per rank, shaped by the kernel (root)")
    r.add_argument("--bandwidth", help="shape every rank's link, e.g. 80mbit (user-space pacer; tc tbf with --net netns)")
    r.add_argument("--latency-ms", type=float, help="latency injected per message by the Comm")
    r.add_argument("--timeout", type=float, help="seconds any communication may wait (default 120)")
    r.add_argument("--no-meter", action="store_true", help="disable byte metering (overhead baseline)")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_run)

    t = sub.add_parser("table", help="tabulate result records")
    t.add_argument("results", nargs="+", help="result files or directories")
    t.add_argument("--format", choices=("md", "csv", "latex", "html"))
    t.add_argument("--metrics", help="comma-separated metric names")
    t.add_argument("--reference", help="paper name or CSV under results/reference/")
    t.add_argument("--out", help="write the table here instead of stdout")
    t.set_defaults(fn=cmd_table)

    c = sub.add_parser("compare", help="regression report between two result sets or commits "
                       "(non-zero exit on changed bytes, messages or equivalence hashes)")
    c.add_argument("old", help="result file/directory, or a git commit with asv results")
    c.add_argument("new")
    c.add_argument("--all", action="store_true", help="also list unchanged deterministic metrics")
    c.add_argument("--machine", help="asv machine whose results to compare (commits only; default: "
                   "the one machine that measured both)")
    c.set_defaults(fn=cmd_compare)

    rp = sub.add_parser("reproduce", help="run a paper's comparison at this machine's scale")
    rp.add_argument("paper", help="experiment name (commbench list), or 'all' for every paper's")
    rp.add_argument("--scale", choices=("tiny", "small"), default="tiny")
    rp.add_argument("--out-dir", default="results/exports")
    rp.add_argument("--quiet", action="store_true")
    rp.set_defaults(fn=cmd_reproduce)
    return p


def main(argv: list[str] | None = None) -> int:
    from algorithms.codecs import CodecError

    from .comm import RankFailed
    from .config import ConfigError
    from .netns import NetnsError
    from .reporting import TableError
    from .results import ResultError

    try:
        args = make_parser().parse_args(argv)
        return args.fn(args)
    except UsageError as e:
        print(f"commbench: error: {str(e).removeprefix('commbench: ')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ConfigError, ResultError, TableError, CodecError, ValueError, FileNotFoundError) as e:
        print(f"commbench: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (RankFailed, NetnsError) as e:
        print(f"commbench: run failed: {_one_line(e)}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        print("commbench: interrupted", file=sys.stderr)
        return 130


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
