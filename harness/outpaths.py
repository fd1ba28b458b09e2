"""Output paths checked before a run: a run of minutes must not end in "cannot write",
and nothing that is not a regular file is ever replaced.

A file target is usable when it is a regular file or absent (a symbolic link is
followed: the file it names is written, the link stays; a link to anything else
is refused like that thing), its name fits the file system, and a file can be
created in its nearest existing ancestor, which must be a directory.  Device
nodes, FIFOs, sockets and directories are refused with one line naming the path
and its kind.  A directory target must be a directory or absent.  The probe
creates and removes one hidden file; nothing else is created before the run.

Existing files: ``existing="replace"`` (tables, exports: derived, rewritten),
``"refuse"`` (a run's record without ``--force``: another run's result is
never overwritten silently).  :func:`check_file_target` returns the
:func:`~harness.results.file_stamp` of what is there, which the writer passes
as ``expect`` so that a file another process wrote during the run is kept.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .config import ConfigError
from .results.files import OutputRefused, file_stamp, path_kind, regular_target

_NAME_MAX, _PATH_MAX = 255, 4096


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


def _in_a_directory(flag: str, target: str | os.PathLike, directory: Path) -> Path:
    where = _nearest_existing(directory)
    if not where.is_dir():
        raise ConfigError(f"{flag} {target}: {where} is a file, not a directory")
    return where


def _probe(flag: str, target: str | os.PathLike, directory: Path) -> None:
    where = _in_a_directory(flag, target, directory)
    try:
        fd, name = tempfile.mkstemp(dir=where, prefix=".commbench-probe-")
    except OSError as e:
        raise ConfigError(f"{flag} {target}: cannot write in {where} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def _limit(where: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(where, name)
    except (OSError, ValueError):
        return default


def _check_length(flag: str, path: str | os.PathLike, p: Path) -> None:
    where = _nearest_existing(p.parent)
    if not where.is_dir():
        return  # _probe names this
    name_max = _limit(where, "PC_NAME_MAX", _NAME_MAX)
    path_max = _limit(where, "PC_PATH_MAX", _PATH_MAX)
    for part in Path(os.path.abspath(p)).relative_to(where).parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{flag} {path}: the name {part[:24]}... is {len(os.fsencode(part))} bytes; "
                              f"this file system allows {name_max}")
    if len(os.fsencode(os.path.abspath(p))) >= path_max:
        raise ConfigError(f"{flag} {path}: the path is {len(os.fsencode(os.path.abspath(p)))} bytes; "
                          f"this system allows {path_max - 1}")


def check_file_target(path: str | os.PathLike, flag: str = "--out", *, existing: str = "replace"):
    """Raise ConfigError unless a file can be written at ``path``; return the stamp of what is there."""
    p = Path(path)
    _check_length(flag, path, p)
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    _in_a_directory(flag, path, p.parent)
    try:
        target = regular_target(p)
    except OutputRefused as e:
        raise ConfigError(f"{flag} {e}") from None
    if target != p:
        _check_length(flag, path, target)
    _probe(flag, path, target.parent)
    stamp = file_stamp(target)
    if stamp is not None and existing == "refuse":
        raise ConfigError(f"{flag} {path}: exists (another run's result?); choose another name, "
                          "or add --force to replace it")
    return stamp


def check_dir_target(path: str | os.PathLike, flag: str = "--out-dir") -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a writable directory."""
    p = Path(path)
    if os.path.lexists(p) and not p.is_dir():
        try:
            kind = path_kind(os.stat(p).st_mode)
        except OSError:
            kind = "a dangling link"
        raise ConfigError(f"{flag} {path}: exists and is not a directory ({kind})")
    _check_length(flag, path, p)
    _probe(flag, path, p)


def beside(intended: str | os.PathLike) -> Path:
    """A fresh name next to ``intended`` for a record that must not replace the file there."""
    p = Path(intended)
    return p.with_name(f"{p.stem[:150]}.{os.getpid()}-{os.urandom(3).hex()}{p.suffix}")


def rescue_path(intended: str | os.PathLike) -> Path:
    """Where a record goes when ``intended`` turned out unwritable after the run."""
    return Path(tempfile.mkdtemp(prefix="commbench-unsaved-")) / Path(intended).name[-200:]
