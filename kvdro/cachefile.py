"""Atomic writes of cached results, and the partial results of a grid kept beside its file.

Every cache file of the package (the benchmarks' CSVs under ``data/``, ``--write``) is written
here: the bytes go to a temporary file in the **same directory** (so the rename cannot cross a file
system), which is flushed and ``fsync``-ed, then ``os.replace``-d onto the target in one step. A run
killed at any moment (SIGKILL, SIGINT, a full disk) leaves either the old file or the new one,
never a truncated one; the directory is ``fsync``-ed after the rename so the new name survives a
crash too. A temporary file left by a killed writer is named ``.<name>.<pid>.tmp`` and removed by
the next write of the same file once that process is gone.

A long grid keeps the cells it has finished in ``<name>.partial.csv`` beside the target
(:func:`partial_path`), never in the target: :func:`run_grid` appends each finished cell there
(atomically), a rerun resumes from it, and only the complete grid replaces the target (and the
partial file is removed). An interrupted grid therefore leaves the old table intact and the cells
done so far on disk.

Floating-point results that a solver only reaches to round-off (a rejection cost of 1e-12 per
second where the optimum rejects nothing) are rounded with ``decimals`` before writing, so that a
regeneration that changes nothing real leaves the file byte-identical.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["atomic_path", "partial_path", "round_floats", "run_grid", "write_bytes_atomic", "write_csv_atomic",
           "write_text_atomic"]


def _target(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path (str or os.PathLike), got {type(path).__name__}")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"path: {p} is a directory")
    if not p.parent.is_dir():
        raise ValueError(f"path: the folder {p.parent} does not exist")
    return p


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _remove_stale(p: Path) -> None:
    """Remove ``.<name>.<pid>.tmp`` files of writers of ``p`` that no longer run."""
    pattern = re.compile(rf"^\.{re.escape(p.name)}\.(\d+)\.tmp$")
    for other in p.parent.glob(f".{p.name}.*.tmp"):
        m = pattern.match(other.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                other.unlink()


def _mode(p: Path) -> int:
    """The permissions the file gets: the old file's, else the usual 0o666 less the umask."""
    try:
        return p.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write instead of ``path``; on a clean exit it is fsync-ed and replaces
    ``path`` in one step, on an exception it is removed and ``path`` is untouched.

    Raises:
        ValueError: ``path`` is not a file path in an existing folder.
    """
    p = _target(path)
    _remove_stale(p)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _mode(p))
        os.replace(tmp, p)
    except BaseException:  # KeyboardInterrupt included: the old file stays
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename durable (not possible on every OS)
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (module docstring); returns the path."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"data: must be bytes, got {type(data).__name__}")
    with atomic_path(path) as tmp:
        tmp.write_bytes(bytes(data))
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (module docstring); returns the path."""
    if not isinstance(text, str):
        raise ValueError(f"text: must be a str, got {type(text).__name__}")
    return write_bytes_atomic(path, text.encode(encoding))


def round_floats(df: pd.DataFrame, decimals: int) -> pd.DataFrame:
    """``df`` with every float column rounded to ``decimals`` places after the point, and -0.0
    written as 0.0 (a round-off of -1e-12 must not print as ``-0``)."""
    if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)) or not 0 <= decimals <= 15:
        raise ValueError(f"decimals: must be an integer in [0, 15], got {decimals!r}")
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].round(int(decimals)) + 0.0
    return out


def write_csv_atomic(df: pd.DataFrame, path: str | os.PathLike[str], *, decimals: int | None = None,
                     index: bool = False, **to_csv: object) -> Path:
    """Write ``df`` as CSV to ``path`` atomically (module docstring); returns the path.

    Args:
        decimals: round float columns to this many places first (:func:`round_floats`), where a
            solver's round-off would otherwise change the file at every regeneration.
        index, **to_csv: passed to :meth:`pandas.DataFrame.to_csv` (e.g. ``float_format="%.6g"``).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {type(df).__name__}")
    if decimals is not None:
        df = round_floats(df, decimals)
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=index, **to_csv)
    return Path(path)


def partial_path(path: str | os.PathLike[str]) -> Path:
    """Where the finished cells of a grid for ``path`` are kept: ``<stem>.partial.csv`` beside it."""
    p = Path(path)
    return p.with_name(f"{p.stem}.partial.csv")


def _key(row: Mapping, key: Sequence[str]) -> tuple:
    out = []
    for k in key:
        v = row[k]
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            v = int(v)  # 60.0 read back from a CSV is the cell 60
        elif isinstance(v, np.generic):
            v = v.item()
        out.append(v)
    return tuple(out)


def run_grid(
    cells: Iterable[Mapping],
    compute: Callable[[Mapping], Mapping],
    path: str | os.PathLike[str],
    *,
    key: Sequence[str],
    resume: bool = True,
    decimals: int | None = None,
    on_row: Callable[[dict, bool], None] | None = None,
    **to_csv: object,
) -> pd.DataFrame:
    """Compute a grid cell by cell, keeping finished cells in :func:`partial_path` and writing the
    whole table to ``path`` only at the end.

    Args:
        cells: the grid, each cell a mapping holding (at least) the ``key`` columns.
        compute: cell -> the row of results (a ``key`` column it lacks is taken from the cell).
        key: columns that identify a cell (include every setting that changes its result).
        resume: reuse the rows of an earlier, interrupted run found in the partial file.
        decimals, **to_csv: as :func:`write_csv_atomic`, for the partial and the final file.
        on_row: called with (row, resumed) after each cell (progress, a printed line).

    Returns:
        The table, one row per cell in the order of ``cells``.
    """
    if not key:
        raise ValueError("key: name at least one column that identifies a cell")
    cells = list(cells)
    part = partial_path(path)
    done: dict[tuple, dict] = {}
    if resume and part.is_file():
        try:
            old = pd.read_csv(part)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
            old = pd.DataFrame()
        if set(key) <= set(old.columns):
            for rec in old.to_dict("records"):
                done[_key(rec, key)] = {k: v for k, v in rec.items() if not (isinstance(v, float) and np.isnan(v))}
    rows: list[dict] = []
    for cell in cells:
        k = _key(cell, key)
        resumed = k in done
        if resumed:
            row = done[k]
        else:
            row = dict(compute(cell))
            row = {c: cell[c] for c in key if c not in row} | row  # a key column the result lacks goes first
        rows.append(row)
        if not resumed:
            write_csv_atomic(pd.DataFrame(rows), part, decimals=decimals, **to_csv)
        if on_row is not None:
            on_row(row, resumed)
    df = pd.DataFrame(rows)
    write_csv_atomic(df, path, decimals=decimals, **to_csv)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    return df
