"""Output paths checked before a run: a run of minutes must not end in "cannot write".

A target is writable when it is not a directory (for a file) or not a file
(for a directory), and a file can be created in its nearest existing
ancestor, which must be a directory.  The probe creates and removes one
hidden file there; nothing else is created before the run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .config import ConfigError


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _probe(flag: str, target: str | os.PathLike, directory: Path) -> None:
    where = _nearest_existing(directory)
    if not where.is_dir():
        raise ConfigError(f"{flag} {target}: {where} is a file, not a directory")
    try:
        fd, name = tempfile.mkstemp(dir=where, prefix=".commbench-probe-")
    except OSError as e:
        raise ConfigError(f"{flag} {target}: cannot write in {where} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def check_file_target(path: str | os.PathLike, flag: str = "--out") -> None:
    """Raise ConfigError unless a file can be written at ``path``."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    _probe(flag, path, p.parent)


def check_dir_target(path: str | os.PathLike, flag: str = "--out-dir") -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a writable directory."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {path}: exists and is not a directory")
    _probe(flag, path, p)


def rescue_path(intended: str | os.PathLike) -> Path:
    """Where a record goes when ``intended`` turned out unwritable after the run."""
    return Path(tempfile.mkdtemp(prefix="commbench-unsaved-")) / Path(intended).name
