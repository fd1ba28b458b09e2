"""Entry point of one rank process (gloo / nccl).

Started by the launcher (``python -m harness.rank_entry RUN_DIR``, the config in
the run directory's ``config.json``, validated on load like a new one: no pickle)
or, through ``commbench run`` under torchrun, with the config passed in directly.  Rank 0
gathers every rank's output over the control plane (bytes in the format of
``harness.rank_output_wire``, validated, never unpickled), builds the result
record and writes it; a failing rank writes ``rankN.error.json`` for the
launcher.  A rank started by the launcher dies with it (Linux parent-death
signal), also when the launcher is killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from .config import RunConfig

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher() -> None:
    """SIGKILL this process when the launcher (our parent, ``COMMBENCH_LAUNCHER_PID``) ends.

    ``ip netns exec`` execs in place, so the parent is the launcher there too.
    Checked after setting it: a launcher that died before is seen as a new parent.
    """
    want = os.environ.get("COMMBENCH_LAUNCHER_PID")
    if want is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(want):
        os._exit(1)  # the launcher is already gone


def run_rank(cfg: RunConfig, out: Path | None, run_dir: Path | None = None):
    """Join the process group from the environment, run, and write the record at rank 0."""
    from .comm.progress_board import ProgressBoard
    from .comm.torchdist import TorchDistComm, init_process_group_from_env
    from .context import set_rank_threads
    from .launcher import rank_program
    from .rank_output_wire import decode, encode
    from .results import write_result
    from .results.from_ranks import build_record

    set_rank_threads(cfg.threads_per_rank)
    store = os.environ.get("COMMBENCH_STORE_FILE") if run_dir is not None else None
    board = None
    if run_dir is not None and (run_dir / "board").exists():
        board = ProgressBoard.open_file(run_dir / "board", cfg.world_size)
    rendezvous(cfg, board, lambda: init_process_group_from_env(cfg.backend, cfg.timeout_s, store_file=store))
    comm = TorchDistComm(cfg.backend, timeout_s=cfg.timeout_s, latency_ms=cfg.latency_ms,
                         metered=cfg.metered, board=board, bandwidth_bps=cfg.paced_bps,
                         max_frame_bytes=cfg.max_frame_bytes)
    progress = None
    if run_dir is not None and comm.rank == comm.world_size - 1:
        pfile = run_dir / f"progress{comm.rank}.json"

        def progress(step, values):
            tmp = pfile.with_suffix(".tmp")
            tmp.write_text(json.dumps([step, values]))
            os.replace(tmp, pfile)

    try:
        output = rank_program(cfg, comm, progress)
        parts = comm.gather_bytes(encode(output))
        record = build_record(cfg, [decode(b, r) for r, b in enumerate(parts)]) if comm.rank == 0 else None
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


def rendezvous(cfg: RunConfig, board, join) -> None:
    """Join the process group (``join()``) with this rank's slot of the progress board beating,
    so that when the group does not form the rank that never joined is named, not the one
    that waited: a stopped rank's heartbeat goes stale, one that never started has none."""
    from .comm.base import CommTimeout
    from .comm.progress_board import COMPUTING, WAITING, Heartbeat, load_note

    if board is None:
        join()
        return
    rank = int(os.environ["RANK"])
    board.mark(rank, WAITING)
    beat = Heartbeat(board, rank)
    try:
        join()
        board.clear(rank, COMPUTING)  # in the group: from here the Comm marks its boundaries
    except Exception as e:
        found = board.stalled(rank)
        if found is None:
            raise
        first = (str(e).splitlines() or [""])[0]
        raise CommTimeout(f"waiting for the {cfg.world_size} ranks to join the process group timed out "
                          f"after {cfg.timeout_s:g} s ({type(e).__name__}: {first})", found[0],
                          found[1] + load_note()) from e
    finally:
        beat.stop()


def report_error(run_dir: Path, rank: int, e: BaseException) -> None:
    target = run_dir / f"rank{rank}.error.json"
    if target.exists():
        return
    err = {"type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else "",
           "traceback": traceback.format_exc(), "time": time.time(),
           "stalled_rank": getattr(e, "stalled_rank", None),
           "blame": e.blame() if getattr(e, "stalled_rank", None) is not None else None}
    tmp = run_dir / f"rank{rank}.error.tmp"
    tmp.write_text(json.dumps(err))
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", "-1"))
    try:
        die_with_launcher()
        from .registry import config_from_dict

        cfg = config_from_dict(json.loads((run_dir / "config.json").read_text()))
        run_rank(cfg, run_dir / "record.json", run_dir)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the launcher
        report_error(run_dir, rank, e)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
