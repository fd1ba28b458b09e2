"""What a process run leaves on the machine, named after its launcher, and its removal.

A run's private directory is ``<tmp>/commbench-run-<launcher pid>-<random>``
holding a ``launcher.pid`` marker; its network namespaces are
``cb-<launcher pid>-<hex>-...`` (:mod:`harness.netns`).  When the launcher
is gone, a watchdog process (``watch``) removes them at once; should that die
too, the next run and ``commbench clean`` remove whatever belongs to a
launcher that is no longer alive.  Only names of exactly these forms, with the
marker, owned by this user, are ever touched, and never a live launcher's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = "commbench-run-"
MARKER = "launcher.pid"
_RUN_DIR = re.compile(rf"^{PREFIX}(\d+)-[A-Za-z0-9_]+$")
DONE = b"done\n"


def pid_alive(pid: int) -> bool:
    """True unless no process has this pid (a reused pid counts as alive: never remove then)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_run_dir() -> Path:
    """A fresh private (0700) run directory named after this process."""
    d = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    (d / MARKER).write_text(str(os.getpid()))
    return d


def run_dirs(base: str | os.PathLike | None = None) -> dict[int, list[Path]]:
    """Run directories under ``base`` (the temp dir) by launcher pid, ours only."""
    base = Path(base or tempfile.gettempdir())
    found: dict[int, list[Path]] = {}
    try:
        entries = list(base.iterdir())
    except OSError:
        return found
    for d in entries:
        m = _RUN_DIR.match(d.name)
        if not m or d.is_symlink() or not d.is_dir():
            continue
        try:
            if d.stat().st_uid != os.geteuid() or (d / MARKER).read_text().strip() != m.group(1):
                continue
        except (OSError, ValueError):
            continue
        found.setdefault(int(m.group(1)), []).append(d)
    return found


def _rank_pids(run_dir: Path) -> list[int]:
    """Rank processes of ``run_dir`` still alive (matched on their command line)."""
    pids = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.rank_entry" in argv and os.fsencode(str(run_dir)) in argv:
            pids.append(int(p.name))
    return pids


def remove(pid: int, dirs: list[Path]) -> list[str]:
    """Kill the ranks, delete the namespaces and directories of launcher ``pid``."""
    from .netns import delete_namespaces_of

    removed = []
    for d in dirs:
        for rp in _rank_pids(d):
            try:
                os.kill(rp, signal.SIGKILL)
                removed.append(f"rank process {rp}")
            except ProcessLookupError:
                pass
    removed += [f"namespace {n}" for n in delete_namespaces_of(pid)]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"run directory {d}")
    return removed


def remove_stale(base: str | os.PathLike | None = None) -> list[str]:
    """Remove what launchers that are no longer alive left behind; what was removed."""
    from .netns import namespace_owners

    by_pid = run_dirs(base)
    pids = set(by_pid) | set(namespace_owners())
    removed = []
    for pid in sorted(pids):
        if pid != os.getpid() and not pid_alive(pid):
            removed += remove(pid, by_pid.get(pid, []))
    return removed


# ---- the watchdog ------------------------------------------------------------
def start_watchdog(run_dir: Path) -> subprocess.Popen:
    """A process that cleans up after this launcher if it dies without saying ``DONE``
    (SIGKILL included): it holds the read end of a pipe only the launcher writes to."""
    return subprocess.Popen([sys.executable, "-m", "harness.leftovers", str(os.getpid()), str(run_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=os.getcwd())


def stop_watchdog(p: subprocess.Popen) -> None:
    """The launcher cleaned up itself: tell the watchdog so, and let it go."""
    try:
        p.stdin.write(DONE)
        p.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    p.wait()


def _watch(pid: int, run_dir: Path) -> int:
    got = sys.stdin.buffer.read()  # returns at EOF: the launcher closed it or died
    if got != DONE:
        remove(pid, [run_dir])
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles ^C; we wait for it
    sys.exit(_watch(int(sys.argv[1]), Path(sys.argv[2])))
