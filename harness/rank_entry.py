"""Entry point of one rank process (gloo / nccl).

Started by the launcher (``python -m harness.rank_entry RUN_DIR``) or, through
``commbench run`` under torchrun, with the config passed in directly.  Rank 0
gathers every rank's output over the control plane, builds the result record
and writes it; a failing rank writes ``rankN.error.json`` for the launcher.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from pathlib import Path

from .config import RunConfig


def run_rank(cfg: RunConfig, out: Path | None, run_dir: Path | None = None):
    """Join the process group from the environment, run, and write the record at rank 0."""
    from .comm.torchdist import TorchDistComm, init_process_group_from_env
    from .context import set_rank_threads
    from .launcher import rank_program
    from .results import write_result
    from .results.from_ranks import build_record

    set_rank_threads(cfg.threads_per_rank)
    init_process_group_from_env(cfg.backend, cfg.timeout_s)
    comm = TorchDistComm(cfg.backend, timeout_s=cfg.timeout_s, latency_ms=cfg.latency_ms,
                         metered=cfg.metered, bandwidth_bps=cfg.paced_bps)
    progress = None
    if run_dir is not None and comm.rank == comm.world_size - 1:
        pfile = run_dir / f"progress{comm.rank}.json"

        def progress(step, values):
            tmp = pfile.with_suffix(".tmp")
            tmp.write_text(json.dumps([step, values]))
            os.replace(tmp, pfile)

    try:
        output = rank_program(cfg, comm, progress)
        outputs = comm.gather_objects(output)
        record = build_record(cfg, outputs) if comm.rank == 0 else None
        if record is not None and out is not None:
            write_result(record, out)
        comm.barrier()
        return record
    except BaseException as e:
        # Report before closing: closing drops the connections, and the peers'
        # resulting errors must not look earlier than the cause.
        if run_dir is not None:
            report_error(run_dir, comm.rank, e)
        raise
    finally:
        comm.close()


def report_error(run_dir: Path, rank: int, e: BaseException) -> None:
    target = run_dir / f"rank{rank}.error.json"
    if target.exists():
        return
    err = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else "",
           "traceback": traceback.format_exc(), "time": time.time()}
    tmp = run_dir / f"rank{rank}.error.tmp"
    tmp.write_text(json.dumps(err))
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", "-1"))
    try:
        cfg = pickle.loads((run_dir / "config.pkl").read_bytes())
        run_rank(cfg, run_dir / "record.json", run_dir)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        report_error(run_dir, rank, e)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
