"""Launch a run: config -> rank programs over a Comm -> one result record.

* ``threads``: all ranks in this process (fast checks).
* ``gloo`` / ``nccl``: one process per rank, started here with torchrun's
  environment variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  LOCAL_RANK), or started by torchrun itself on one or several hosts (then
  ``commbench run`` in each process joins as that rank).  With
  ``net="netns"`` each rank runs in its own network namespace, shaped with
  tc tbf, and the kernel's interface counters are recorded.

A rank that raises or dies ends the run: the others are killed, the
namespaces removed, and ``RankFailed`` names the rank and its error (for a
wait that timed out, the rank that stopped making progress).  SIGINT,
SIGTERM, SIGHUP and SIGQUIT end a process run the same way and raise
``Interrupted``; the ranks die with the launcher even on SIGKILL, and a
watchdog removes the run directory and namespaces then
(:mod:`harness.leftovers`).  A healthy run has no time limit unless
``max_run_time_s`` is set; every wait is bounded by ``timeout_s``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .comm.base import RankFailed
from .config import ConfigError, RunConfig
from .context import Diverged, RankContext, RankOutput, set_rank_threads
from .registry import get_algorithm

ProgressFn = Callable[[int, dict], None]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Interrupted(KeyboardInterrupt):
    """A process run was stopped by a signal; ranks, run directory and namespaces are gone."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}; ranks stopped, "
                         "run directory and namespaces removed")


def validate(cfg: RunConfig) -> None:
    """What the machine must provide for ``cfg``, before any rank starts (the config itself was
    checked when it was made: ``harness.registry.validate``)."""
    _check_sources(cfg)
    if cfg.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("the nccl backend needs CUDA GPUs; none is available here")


def _check_sources(cfg: RunConfig) -> None:
    """A pretrained model's package and checkpoint hash, and a text task's package, file and
    tokenizer, before any rank starts: a missing or damaged source is one line, not a rank's
    traceback (the errors say what to install or which file failed)."""
    from .data import dataset_class
    from .models import PRESETS
    from .models.pretrained import checkpoint_dir, tokenizer_for

    preset = PRESETS.get(cfg.model)
    if preset is None:  # a problem of its family (logreg-*, mlp-*): it reads its own data
        return
    if preset.pretrained is not None:
        checkpoint_dir(preset.pretrained)
    if dataset_class(cfg.data).modality == "classify":
        tok = tokenizer_for(cfg.model)
        if preset.prompt is not None:
            from .models.prompt import PromptError, label_token_ids

            try:
                label_token_ids(tok, preset.prompt)
            except PromptError as exc:
                raise ConfigError(f"model {cfg.model!r}: {exc}") from None
        dataset_class(cfg.data)().texts("train")  # parses the file (a bad row is named)


def rank_program(cfg: RunConfig, comm, progress: ProgressFn | None = None) -> RankOutput:
    """Run the configured algorithm as one rank over ``comm``."""
    spec = get_algorithm(cfg.algorithm)
    ctx = RankContext(cfg, comm, progress=progress)
    try:
        with ctx.tracking():
            out = spec.run(ctx)
    except Exception as e:
        if getattr(e, "nonfinite", False):  # a codec met NaN/inf in what it was to send
            raise Diverged(f"a tensor to send holds NaN or infinity ({e}): the run diverged "
                           "(try a smaller lr, or mu for ZO methods)") from e
        raise
    if not isinstance(out, RankOutput):
        raise TypeError(f"{spec.name}: the rank function must return ctx.finish(...)")
    return out


# ---------------------------------------------------------------------------
def run(cfg: RunConfig, *, progress: ProgressFn | None = None):
    """Run ``cfg`` and return its ResultRecord (not written anywhere)."""
    from .results.environment import load_average

    validate(cfg)
    load_before = load_average()  # the load the run's times were taken under, before and after
    record = _run_once(cfg, progress)
    load_after = load_average()
    if cfg.memory == "pass" and cfg.backend != "nccl":
        from .results.from_ranks import merge_memory_pass

        merge_memory_pass(record, _run_once(dataclasses.replace(cfg, memory="tensor"), None))
    record.env["load_before"], record.env["load_after"] = load_before, load_after
    return record


def _run_once(cfg: RunConfig, progress: ProgressFn | None):
    from .results.from_ranks import build_record

    if cfg.backend == "threads":
        from .comm import run_threads

        set_rank_threads(cfg.threads_per_rank)

        def body(comm):
            last = cfg.world_size - 1
            return rank_program(cfg, comm, progress if comm.rank == last else None)

        outputs = run_threads(cfg.world_size, body, timeout_s=cfg.timeout_s,
                              latency_ms=cfg.latency_ms, metered=cfg.metered,
                              max_frame_bytes=cfg.max_frame_bytes,
                              max_run_time_s=cfg.max_run_time_s, bandwidth_bps=cfg.paced_bps)
        return build_record(cfg, outputs)
    return _run_processes(cfg, progress)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                os.killpg(p.pid, signal.SIGCONT)  # a stopped rank takes TERM only once continued
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _last_output(log: Path, lines: int = 3, chars: int = 400) -> str:
    """The last lines a rank printed (its log: stdout and stderr), on one line: what a rank that
    died without a report said last (an abort inside a library prints its reason there)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    said = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(said[-lines:])[-chars:]


def _root_cause(run_dir: Path, procs: list[subprocess.Popen], exited: set[int]) -> RankFailed:
    errors = {}
    for r in range(len(procs)):
        f = run_dir / f"rank{r}.error.json"
        if f.exists():
            try:
                errors[r] = json.loads(f.read_text())
            except ValueError:
                errors[r] = {"type": "?", "message": f.read_text()[:500], "time": 0.0}
    # The cause, in order: a rank that raised on its own (not because a peer
    # vanished), then a rank that died without a report, then a rank a
    # timed-out wait found stalled, then the rest.
    primary = {r: e for r, e in errors.items() if e.get("type") not in ("CommError", "CommTimeout")}
    if primary:
        r = min(primary, key=lambda k: (primary[k].get("time", 0.0), k))
        return RankFailed(r, f"{primary[r]['type']}: {primary[r]['message']}")
    dead = [(r, procs[r].returncode) for r in sorted(exited) if r not in errors]
    if dead:
        r, code = dead[0]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        tail = _last_output(run_dir / f"rank{r}.log")
        return RankFailed(r, f"process died without a report ({how})" + (f"; its last output: {tail}" if tail else ""))
    stalled = {r: e for r, e in errors.items() if isinstance(e.get("stalled_rank"), int)}
    if stalled:
        r = min(stalled, key=lambda k: (stalled[k].get("time", 0.0), k))
        return RankFailed(stalled[r]["stalled_rank"], str(stalled[r].get("blame")))
    if errors:
        r = min(errors, key=lambda k: (errors[k].get("time", 0.0), k))
        return RankFailed(r, f"{errors[r]['type']}: {errors[r]['message']}")
    return RankFailed(-1, "unknown failure")


class _Signals:
    """While installed, SIGINT/TERM/HUP/QUIT raise Interrupted in the launcher,
    except inside ``deferred()`` (starting ranks, cleaning up), where the
    signal is held and raised (by ``check``) once that is done."""

    def __init__(self):
        self.pending: int | None = None
        self.defer = 0
        self.old = {}

    def _handler(self, signum, frame):
        if self.defer:
            self.pending = self.pending or signum
            return
        raise Interrupted(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
            for sig in STOP_SIGNALS:
                self.old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, exc_type, *exc):
        for sig, old in self.old.items():
            signal.signal(sig, old)
        if self.pending is not None and exc_type is None:  # arrived while cleaning up
            raise Interrupted(self.pending)

    @contextlib.contextmanager
    def deferred(self):
        self.defer += 1
        try:
            yield
        finally:
            self.defer -= 1

    def check(self):
        if self.pending is not None and not self.defer:
            raise Interrupted(self.pending)


def _run_processes(cfg: RunConfig, progress: ProgressFn | None):
    from .comm.progress_board import ProgressBoard
    from .leftovers import make_run_dir, remove_stale, start_watchdog, stop_watchdog
    from .netns import NetnsTopology
    from .results import read_result

    remove_stale()  # what launchers killed earlier left behind (never a live one's)
    topo = NetnsTopology(cfg.world_size, cfg.bandwidth) if cfg.net == "netns" else None
    procs: list[subprocess.Popen] = []
    with _Signals() as sigs:
        with sigs.deferred():
            run_dir = make_run_dir()
            watchdog = start_watchdog(run_dir)
        try:
            # the launcher's own file in its 0700 run directory, read back by its ranks
            # as validated JSON (registry.config_from_dict): data, never a pickle
            (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), allow_nan=False))
            ProgressBoard.create_file(run_dir / "board", cfg.world_size)
            if topo is not None:
                topo.__enter__()
            master = topo.addr(0) if topo else "127.0.0.1"
            port = 29500 if topo else _free_port()
            with sigs.deferred():  # a signal here must not leave a started rank untracked
                for r in range(cfg.world_size):
                    env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(cfg.world_size), LOCAL_RANK=str(r),
                               LOCAL_WORLD_SIZE=str(cfg.world_size), MASTER_ADDR=master,
                               MASTER_PORT=str(port), OMP_NUM_THREADS=str(cfg.threads_per_rank),
                               COMMBENCH_RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1",
                               COMMBENCH_LAUNCHER_PID=str(os.getpid()))
                    env.pop("COMMBENCH_NETIF", None)
                    env.pop("COMMBENCH_STORE_FILE", None)
                    if topo:
                        env.update(GLOO_SOCKET_IFNAME=topo.ifname(r), COMMBENCH_NETIF=topo.ifname(r))
                    else:
                        # Single host: rendezvous through a file of the private run
                        # directory and gloo on loopback, so nothing listens on a
                        # network interface another host can reach.
                        env.update(GLOO_SOCKET_IFNAME="lo", COMMBENCH_STORE_FILE=str(run_dir / "store"))
                    cmd = [sys.executable, "-m", "harness.rank_entry", str(run_dir)]
                    if topo:
                        cmd = topo.exec_prefix(r) + cmd
                    with open(run_dir / f"rank{r}.log", "wb") as log:
                        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                      start_new_session=True, cwd=os.getcwd()))
            sigs.check()
            _supervise(cfg, run_dir, procs, progress)
            return read_result(run_dir / "record.json")
        finally:
            with sigs.deferred():
                _kill(procs)
                if topo is not None:
                    topo.close()
                shutil.rmtree(run_dir, ignore_errors=True)
                stop_watchdog(watchdog)


REPORT_GRACE_S = 1.0


def _supervise(cfg: RunConfig, run_dir: Path, procs, progress: ProgressFn | None) -> None:
    # No limit on a healthy run unless the user set one: every wait of the
    # ranks is bounded by the communication timeout, so a stuck run ends anyway.
    limit = cfg.max_run_time_s
    deadline = None if limit is None else time.monotonic() + limit
    shown = 0
    prog_file = run_dir / f"progress{cfg.world_size - 1}.json"
    first_report = None  # when the first rankN.error.json was seen
    while True:
        codes = [p.poll() for p in procs]
        if first_report is None and any(run_dir.glob("rank*.error.json")):
            first_report = time.monotonic()
        # a rank's report is acted on without waiting for its teardown (closing a group can
        # take the whole timeout); the short grace lets the reports of the same moment arrive
        reported = first_report is not None and time.monotonic() - first_report > REPORT_GRACE_S
        if reported or any(c not in (0, None) for c in codes):
            exited = {r for r, c in enumerate(codes) if c not in (0, None)}  # before we kill the rest
            _kill(procs)
            raise _root_cause(run_dir, procs, exited)
        if all(c == 0 for c in codes):
            if not (run_dir / "record.json").exists():
                raise RankFailed(0, "all ranks exited but no result was written")
            return
        if progress is not None and prog_file.exists():
            try:
                step, values = json.loads(prog_file.read_text())
            except ValueError:
                step, values = shown, {}
            if step > shown:
                shown = step
                progress(step, values)
        if deadline is not None and time.monotonic() > deadline:
            _kill(procs)
            raise RankFailed(-1, f"the run did not finish within --max-run-time {limit:g} s; ranks killed")
        try:
            procs[0].wait(0.2)  # wake on rank 0's exit or poll the others again
        except subprocess.TimeoutExpired:
            pass
