"""Result files: atomic writes, and reads that validate.

Files are written atomically (temp file in the same directory, fsync,
``os.replace``) and validated when read: a corrupt, truncated or foreign file
raises :class:`ResultError` with the file name and a one-line reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from .schema import ResultError, ResultRecord


def atomic_write(path: str | os.PathLike, write: str | Callable[[IO[str]], None]) -> Path:
    """Write text to ``path`` atomically.

    ``write`` is the text itself or a function that writes into the open file.
    The data go to a temp file in the same directory, are flushed and fsynced,
    then ``os.replace`` moves the file into place: readers see the old file or
    the new one, never a part. On any failure the temp file is removed and the
    old file (if any) is left untouched. Parent directories are created.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            if callable(write):
                write(fh)
            else:
                fh.write(write)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable; not possible on every platform
        dfd = os.open(parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
    return path


def write_result(record: ResultRecord, path: str | os.PathLike) -> Path:
    """Validate ``record`` and write it atomically as JSON to ``path``; returns the path."""
    try:
        d = record.to_dict()
    except ResultError as exc:
        raise ResultError(str(exc).replace("<record>", os.fspath(path), 1)) from None

    def _dump(fh: IO[str]) -> None:
        json.dump(d, fh, indent=2, allow_nan=False, ensure_ascii=False)
        fh.write("\n")

    return atomic_write(path, _dump)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} (not valid JSON)")


def read_result(path: str | os.PathLike) -> ResultRecord:
    """Read and validate one result file; raise :class:`ResultError` for any problem."""
    src = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ResultError(f"{src}: no such file") from None
    except IsADirectoryError:
        raise ResultError(f"{src}: is a directory, not a result file") from None
    except OSError as exc:
        raise ResultError(f"{src}: cannot read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise ResultError(f"{src}: empty file, not a commbench result")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultError(f"{src}: not UTF-8 text (byte {exc.start}); not a commbench result") \
            from None
    try:
        d = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ResultError(f"{src}: truncated or invalid JSON at line {exc.lineno} "
                          f"column {exc.colno} ({exc.msg})") from None
    except ValueError as exc:
        raise ResultError(f"{src}: {exc}") from None
    except RecursionError:
        raise ResultError(f"{src}: JSON nested too deeply") from None
    return ResultRecord.from_dict(d, source=src)


def read_results(paths_or_dirs: str | os.PathLike | Iterable[str | os.PathLike]
                 ) -> list[ResultRecord]:
    """Read several results; a directory contributes its ``*.json`` files, sorted by name.

    Hidden files (temp files of writes in progress among them) are skipped.
    """
    if isinstance(paths_or_dirs, (str, os.PathLike)):
        paths_or_dirs = [paths_or_dirs]
    out: list[ResultRecord] = []
    for p in paths_or_dirs:
        p = Path(p)
        if p.is_dir():
            files = sorted(f for f in p.glob("*.json")
                           if f.is_file() and not f.name.startswith("."))
            out.extend(read_result(f) for f in files)
        else:
            out.append(read_result(p))
    return out
