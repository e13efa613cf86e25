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

Every CSV written by :func:`write_csv_atomic` gets a **manifest** beside it,
``<stem>.manifest.json`` (:func:`manifest_path`): its file name, row count, column names, the
columns that identify a row (``key``, when the writer knows them) and the SHA-256 of its bytes,
written atomically right after the CSV. :func:`read_csv_checked` is how every reader of a cached
result opens it: a file whose rows, columns, key columns or bytes differ from its manifest (cut,
renamed header, edited by hand), or that has no manifest, is refused with a ValueError naming the
file and what is wrong -- never read as if it were whole. ``python -m kvdro.bench manifests``
writes the manifests of the committed ``data/*.csv`` (``--check`` verifies them).

Floating-point results that a solver only reaches to round-off (a rejection cost of 1e-12 per
second where the optimum rejects nothing) are rounded with ``decimals`` before writing, so that a
regeneration that changes nothing real leaves the file byte-identical.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["MANIFEST_SUFFIX", "FolderNotWritableError", "atomic_path", "ensure_writable", "check_manifest", "manifest_path", "partial_path", "read_csv_checked",
           "round_floats", "run_grid", "write_bytes_atomic", "write_csv_atomic", "write_manifest", "write_text_atomic"]

#: The manifest of ``<stem>.csv`` is ``<stem>.manifest.json`` beside it.
MANIFEST_SUFFIX = ".manifest.json"


def _target(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path (str or os.PathLike), got {type(path).__name__}")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"path: {p} is a directory")
    if not p.parent.is_dir():
        raise ValueError(f"path: the folder {p.parent} does not exist")
    return p


class FolderNotWritableError(PermissionError):
    """A cache or data folder that cannot be written (a file in its place, read-only, no permission).

    Raised before a benchmark computes anything where it can be (:func:`ensure_writable`), else by
    the write itself (:func:`atomic_path`); the message names the folder and what is wrong."""


def ensure_writable(folder: str | os.PathLike[str], what: str | None = None, *, create: bool = False) -> Path:
    """Check that ``folder`` can take new files by creating and removing one there (so a read-only
    mount is caught even for root, whom permission bits do not stop); ``create`` makes it first.

    Raises:
        FolderNotWritableError: naming ``what`` (default: the folder) and the reason.
    """
    d = Path(folder)
    name = what or str(d)
    if d.exists() and not d.is_dir():
        raise FolderNotWritableError(f"{name}: is a file, not a folder")
    try:
        if create:
            d.mkdir(parents=True, exist_ok=True)
        elif not d.is_dir():
            raise FolderNotWritableError(f"{name}: the folder does not exist")
        probe = d / f".kvdro-write-probe.{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except FolderNotWritableError:
        raise
    except OSError as exc:
        raise FolderNotWritableError(f"{name}: the folder is not writable ({exc.strerror or exc})") from None
    return d


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
        FolderNotWritableError: the folder cannot be written.
    """
    p = _target(path)
    _remove_stale(p)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        try:
            tmp.touch()
        except OSError as exc:  # a read-only or forbidden folder is named as such, not as a stray OSError
            raise FolderNotWritableError(f"{p.parent}: the folder is not writable, cannot write {p.name} "
                                         f"({exc.strerror or exc})") from None
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
                     index: bool = False, manifest: bool = True, key: Sequence[str] | None = None,
                     **to_csv: object) -> Path:
    """Write ``df`` as CSV to ``path`` atomically (module docstring), then its manifest
    (:func:`write_manifest`); returns the path.

    Args:
        decimals: round float columns to this many places first (:func:`round_floats`), where a
            solver's round-off would otherwise change the file at every regeneration.
        manifest: write ``<stem>.manifest.json`` beside the file (False for a grid's partial file).
        key: the columns that identify a row, recorded in the manifest (checked by every reader).
        index, **to_csv: passed to :meth:`pandas.DataFrame.to_csv` (e.g. ``float_format="%.6g"``).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {type(df).__name__}")
    if key is not None:
        key = _key_columns(key, "key")
        missing = [k for k in key if k not in df.columns]
        if missing:
            raise ValueError(f"key: column(s) {missing} are not in the frame")
    if decimals is not None:
        df = round_floats(df, decimals)
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=index, **to_csv)
    if manifest:
        write_manifest(path, key=key)
    return Path(path)


def _key_columns(key: object, argument: str) -> tuple[str, ...]:
    if isinstance(key, str) or not isinstance(key, Sequence) or not all(isinstance(k, str) for k in key):
        raise ValueError(f"{argument}: must be a sequence of column names, got {key!r}")
    return tuple(key)


def manifest_path(path: str | os.PathLike[str]) -> Path:
    """Where the manifest of a cached CSV lives: ``<stem>.manifest.json`` beside it."""
    p = Path(path)
    return p.with_name(p.stem + MANIFEST_SUFFIX)


def _parse(p: Path, data: bytes, **read_csv: object) -> pd.DataFrame:
    try:
        return pd.read_csv(io.BytesIO(data), **read_csv)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{p}: not a readable CSV ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None


def write_manifest(path: str | os.PathLike[str], *, key: Sequence[str] | None = None) -> Path:
    """Write the manifest of the CSV at ``path`` (module docstring) atomically; returns its path.

    The rows and columns are those :func:`pandas.read_csv` reads from the file's bytes (so the
    manifest describes what a reader gets); ``sha256`` is of the bytes themselves.

    Raises:
        ValueError: ``path`` is not a readable CSV, or ``key`` names a column it lacks.
    """
    p = _target(path)
    data = p.read_bytes()
    frame = _parse(p, data)
    columns = [str(c) for c in frame.columns]
    if key is not None:
        key = list(_key_columns(key, "key"))
        missing = [k for k in key if k not in columns]
        if missing:
            raise ValueError(f"key: column(s) {missing} are not in {p}")
    doc = {"file": p.name, "rows": int(len(frame)), "columns": columns, "key": key,
           "sha256": hashlib.sha256(data).hexdigest()}
    return write_text_atomic(manifest_path(p), json.dumps(doc, indent=1) + "\n")


def _read_manifest(p: Path, remake: str) -> dict:
    mp = manifest_path(p)
    if not mp.is_file():
        raise ValueError(f"{p}: no manifest {mp.name} beside it, so its rows and columns cannot be checked; {remake}")
    try:
        doc = json.loads(mp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{mp}: not a manifest (not JSON: {exc}); {remake}") from None
    ok = (isinstance(doc, dict) and isinstance(doc.get("rows"), int) and isinstance(doc.get("columns"), list)
          and isinstance(doc.get("sha256"), str) and (doc.get("key") is None or isinstance(doc.get("key"), list)))
    if not ok:
        raise ValueError(f"{mp}: not a manifest (needs rows, columns, sha256 and key); {remake}")
    return doc


def _problems(frame: pd.DataFrame, data: bytes, doc: Mapping, need: Sequence[str], key: Sequence[str]) -> list[str]:
    """What is wrong with a parsed CSV against its manifest and its reader's needs (empty: nothing)."""
    out = []
    columns = [str(c) for c in frame.columns]
    if columns != list(doc["columns"]):
        missing = [c for c in doc["columns"] if c not in columns]
        extra = [c for c in columns if c not in doc["columns"]]
        if missing or extra:
            out.append("its header differs from the manifest's columns"
                       + (f": missing {missing}" if missing else "") + (f", unexpected {extra}" if extra else ""))
        else:
            out.append("its columns are in another order than the manifest's")
    if len(frame) != doc["rows"]:
        cut = " (cut short?)" if len(frame) < doc["rows"] else ""
        out.append(f"it has {len(frame):,} rows, its manifest {doc['rows']:,}{cut}")
    lacking = [c for c in need if c not in columns]
    if lacking:
        out.append(f"it lacks the column(s) {lacking} its reader needs")
    key = [k for k in dict.fromkeys([*(doc.get("key") or []), *key]) if k in columns]
    if key:
        blank = [k for k in key if frame[k].isna().any()]
        if blank:
            out.append(f"key column(s) {blank} have empty cells")
        dup = int(frame.duplicated(subset=key).sum())
        if dup:
            out.append(f"{dup} row(s) repeat a key ({', '.join(key)})")
    if not out and hashlib.sha256(data).hexdigest() != doc["sha256"]:
        out.append("its bytes differ from the manifest's sha256 (edited after it was written)")
    return out


def read_csv_checked(path: str | os.PathLike[str], *, columns: Sequence[str] = (), key: Sequence[str] = (),
                     remake: str | None = None, **read_csv: object) -> pd.DataFrame:
    """Read a cached CSV checked against its manifest (module docstring).

    Args:
        columns: columns the reader needs (beyond the manifest's).
        key: columns that must identify each row (no empty cell, no repeat), beyond the manifest's key.
        remake: the command that regenerates the file (said in every error).
        **read_csv: passed to :func:`pandas.read_csv` (``usecols`` is not allowed: every column is checked).

    Raises:
        FileNotFoundError: no such file (naming ``remake``).
        ValueError: no manifest, or the file differs from it -- the message names the file and
            what is wrong (row count, missing or renamed columns, empty or repeated keys, edited bytes).
    """
    if "usecols" in read_csv:
        raise ValueError("read_csv: usecols is not allowed (every column is checked against the manifest)")
    columns, key = _key_columns(columns, "columns"), _key_columns(key, "key")
    p = Path(path)
    todo = f"regenerate it: `{remake}`" if remake else "restore it from git or regenerate it"
    if not p.is_file():
        raise FileNotFoundError(f"{p} is missing: " + (f"run `{remake}`" if remake else "restore it from git"))
    doc = _read_manifest(p, todo)
    data = p.read_bytes()
    frame = _parse(p, data, **read_csv)
    problems = _problems(frame, data, doc, columns, key)
    if problems:
        raise ValueError(f"{p}: refused, " + "; ".join(problems) + f"; {todo}")
    return frame


def check_manifest(path: str | os.PathLike[str]) -> list[str]:
    """What is wrong with the CSV at ``path`` against its manifest (an empty list: nothing)."""
    try:
        read_csv_checked(path)
    except (ValueError, FileNotFoundError) as exc:
        return [str(exc)]
    return []


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
            write_csv_atomic(pd.DataFrame(rows), part, decimals=decimals, manifest=False, **to_csv)
        if on_row is not None:
            on_row(row, resumed)
    df = pd.DataFrame(rows)
    write_csv_atomic(df, path, decimals=decimals, key=[k for k in key if k in df.columns], **to_csv)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    return df
