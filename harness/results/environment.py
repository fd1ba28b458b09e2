"""The environment of a run (record key ``env``): versions, device, git sha, host, date, and
the machine's load average when the run started and when it ended (``load_before``,
``load_after``: 1, 5 and 15 minutes), so a time can be read against the load it was taken under."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from .schema import _now_iso


def _git_sha(repo_root: Path) -> str | None:
    """HEAD of the checkout holding this package, ``-dirty`` if tracked files changed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True,
                               text=True, timeout=10, env=env, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # An installed copy may sit inside some other repository (a venv in a checkout):
    # only report a sha when the checkout's root is this package's own source root.
    if not top or Path(top).resolve() != repo_root.resolve():
        return None
    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    if status is None:
        return sha
    return sha + ("-dirty" if status else "")


LOAD_KEYS = ("load_before", "load_after")


def load_average() -> list[float] | None:
    """``os.getloadavg()`` (1, 5, 15 min) as a list, None where the platform has none."""
    try:
        return [round(float(x), 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def env_info(device: Any = None) -> dict[str, Any]:
    """Where and with what a run happened: versions, device, git sha, host, date."""
    import torch

    try:
        version = importlib.metadata.version("commbench")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            device_name = torch.cuda.get_device_name(dev)
        except Exception:  # noqa: BLE001 - a description must never fail a run
            device_name = "cuda"
    else:
        device_name = dev.type
    return {
        "commbench": version,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": device_name,
        "git_sha": _git_sha(Path(__file__).resolve().parents[2]),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "date": _now_iso(),
    }
