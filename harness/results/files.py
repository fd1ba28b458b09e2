"""Result files: atomic writes, and reads that validate.

Files are written atomically (temp file in the same directory, fsync,
``os.replace``) and validated when read: a corrupt, truncated or foreign file
raises :class:`ResultError` with the file name and a one-line reason.

Only regular files are ever written or replaced.  A device node, FIFO, socket
or directory at the target is refused (:class:`OutputRefused`), checked again
just before the rename; a symbolic link is followed: the file it names is
written and the link itself stays.  A writer that must not replace another
process's file passes ``expect``: ``None`` (the file must not exist; it is
created with a hard link, which fails if anything appeared there) or the
:func:`file_stamp` it saw before (the file must still be that one).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from .schema import ResultError, ResultRecord


class OutputRefused(OSError):
    """The target is not a regular file (a device node, FIFO, socket, directory): not written."""


class OutputChanged(OutputRefused):
    """The target appeared or changed after the writer looked at it: another process's file, kept."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def path_kind(mode: int) -> str:
    """What a ``st_mode`` names, in words ('a regular file', 'a character device', ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def regular_target(path: str | os.PathLike) -> Path:
    """The file to write for ``path``; raise :class:`OutputRefused` unless it is a regular file or absent.

    A symbolic link is followed (also a chain, also a dangling one): what is written is the file it
    names, and the link stays a link.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a loop of links, a component that is not a directory, no permission
        raise OutputRefused(f"{path}: cannot inspect it ({e.strerror or e}); nothing was written") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        link = f" (a link to {os.path.realpath(p)})" if p.is_symlink() else ""
        raise OutputRefused(f"{path}{link}: is {path_kind(st.st_mode)}, not a regular file; "
                            "refusing to replace it, nothing was written")
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def file_stamp(path: str | os.PathLike) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime ns) of the file ``path`` names, None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


ANY = object()  # atomic_write's default ``expect``: replace whatever regular file is there


def _put(tmp: str, path: Path, expect) -> None:
    """Move the finished temp file to ``path`` under the rule ``expect`` (see the module)."""
    if expect is None:
        try:
            os.link(tmp, path)  # atomic create-only: fails if anything is there
        except FileExistsError:
            raise OutputChanged(f"{path}: another process wrote it during this one; not replaced") \
                from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:  # no hard links on this file system: claim the name, then replace the claim
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                raise OutputChanged(f"{path}: another process wrote it during this one; not replaced") \
                    from None
            os.replace(tmp, path)
        return
    regular_target(path)  # again: the check before a run may be minutes old
    if expect is not ANY and file_stamp(path) != expect:
        raise OutputChanged(f"{path}: changed since this process looked at it (another run wrote it?); "
                            "not replaced")
    os.replace(tmp, path)


def atomic_write(path: str | os.PathLike, write: str | bytes | Callable[[IO[str]], None],
                 *, expect=ANY) -> Path:
    """Write text (or bytes) to ``path`` atomically; returns the path written.

    ``write`` is the text or bytes itself or a function that writes text into the open file.
    The data go to a temp file in the same directory, are flushed and fsynced,
    then ``os.replace`` moves the file into place: readers see the old file or
    the new one, never a part. On any failure the temp file is removed and the
    old file (if any) is left untouched. Parent directories are created.
    Only a regular file is replaced (:class:`OutputRefused`); ``expect`` says which one
    (default: any; ``None``: none may exist; a :func:`file_stamp`: that one).
    """
    path = regular_target(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name[:48]}.", suffix=".tmp")
    try:
        if isinstance(write, bytes):
            fh = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
        with fh:
            if callable(write):
                write(fh)
            else:
                fh.write(write)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        _put(tmp, path, expect)
    finally:
        try:
            os.unlink(tmp)  # gone after a rename; after a hard link, or a failure, still here
        except FileNotFoundError:
            pass
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


def write_result(record: ResultRecord, path: str | os.PathLike, *, expect=ANY) -> Path:
    """Validate ``record`` and write it atomically as JSON to ``path``; returns the path.

    ``expect``: as for :func:`atomic_write`."""
    try:
        d = record.to_dict()
    except ResultError as exc:
        raise ResultError(str(exc).replace("<record>", os.fspath(path), 1)) from None

    def _dump(fh: IO[str]) -> None:
        json.dump(d, fh, indent=2, allow_nan=False, ensure_ascii=False)
        fh.write("\n")

    return atomic_write(path, _dump, expect=expect)


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


#: Left in an export directory by a `commbench reproduce` that has not finished (stopped, failed):
#: its records, tables and claims may mix that run's and an earlier one's, so reads refuse them.
INCOMPLETE = "INCOMPLETE"


def check_complete(path: str | os.PathLike, levels: int = 3) -> None:
    """ResultError when ``path`` lies in (or up to ``levels`` directories below) a directory
    marked :data:`INCOMPLETE`."""
    p = Path(os.path.abspath(path))
    d = p if p.is_dir() else p.parent
    for _ in range(levels + 1):
        if (d / INCOMPLETE).is_file():
            raise ResultError(f"{path}: {d} holds an unfinished `commbench reproduce` (see its {INCOMPLETE} "
                              "file): its records, tables and claims may mix two runs; re-run it")
        if d.parent == d:
            break
        d = d.parent


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
        if p.exists():
            check_complete(p)
        if p.is_dir():
            files = sorted(f for f in p.glob("*.json")
                           if f.is_file() and not f.name.startswith("."))
            out.extend(read_result(f) for f in files)
        else:
            out.append(read_result(p))
    return out
