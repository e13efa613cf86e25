"""Real request traces: a registry of public files, fetched once and read into one tidy schema.

Every trace is returned by :func:`load_trace` as a :class:`pandas.DataFrame` with the columns

==================  =========  ==============================================================
``arrival_s``       float64    arrival time in seconds since the trace's first request
``input_tokens``    int64      prompt length :math:`L_{in}` [tokens]
``output_tokens``   int64      generated length :math:`\\xi` [tokens] (unknown at admission)
``request_class``   str        the request class (Azure: ``code``/``conversation``;
                               BurstGPT: ``f"{Model}-{Log Type}"``)
==================  =========  ==============================================================

sorted by arrival. ``df.attrs`` records the source name, the file read and, for BurstGPT, how many
failed requests were dropped.

Where a file comes from (first hit wins):

1. ``KVDRO_DATA_DIR``: a folder (searched with its subfolders) that already holds the file under
   its registry file name. The sha256 is checked when the registry knows it; a mismatch is an error.
2. pooch's cache: ``KVDRO_CACHE_DIR`` if set, else ``pooch.os_cache("kvdro")``.
3. A download from the canonical address (short connect timeout, no retries) into that cache.

With no local copy and no network, :func:`fetch` raises one :class:`FileNotFoundError` that names the
missing file, says where to put it, and gives its canonical address.

Entries with ``sha256=None`` (Azure 2024, BurstGPT) are *unverified*: we have never had those files
on the machine that wrote this registry, so we cannot pin their hash, and a changed or tampered file
would go unnoticed. Using one is an explicit opt-in: pass ``allow_unverified=True`` to :func:`fetch`
/ :func:`load_trace`, or set the environment variable ``KVDRO_ALLOW_UNVERIFIED_DATA=1``. Without it,
a local copy raises :class:`UnverifiedDataError` that prints the file's computed sha256 (to check
and pin in the registry), and no download is attempted. With it, every load warns
(:class:`UnverifiedDataWarning`) with the computed hash.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlparse
from typing import Literal

import numpy as np
import pandas as pd

__all__ = [
    "REGISTRY",
    "SCHEMA",
    "Source",
    "UnverifiedDataError",
    "UnverifiedDataWarning",
    "DroppedRequestsWarning",
    "ALLOW_UNVERIFIED_ENV",
    "fetch",
    "load_trace",
    "read_azure_csv",
    "read_burstgpt_csv",
    "sha256_of",
]

#: Column names and dtypes of every tidy trace.
SCHEMA: Mapping[str, str] = MappingProxyType(
    {"arrival_s": "float64", "input_tokens": "int64", "output_tokens": "int64", "request_class": "object"}
)

#: Connect timeout [s] for a download; reads may take longer (the 2024 week files are large).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0

_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_VIDUR = "https://raw.githubusercontent.com/microsoft/vidur/7d47513363ec/data/profiling/"


#: Environment variable that opts in to files the registry has no sha256 for ("1", "true" or "yes").
ALLOW_UNVERIFIED_ENV = "KVDRO_ALLOW_UNVERIFIED_DATA"


class UnverifiedDataWarning(UserWarning):
    """A file was used whose sha256 the registry does not know (``Source.sha256 is None``), by opt-in."""


class UnverifiedDataError(ValueError):
    """A file whose sha256 the registry does not know was requested without opting in."""


class DroppedRequestsWarning(UserWarning):
    """Rows were dropped while tidying a trace (e.g. BurstGPT's failed requests)."""


@dataclass(frozen=True)
class Source:
    """One file of the registry.

    Attributes:
        name: registry key, e.g. ``"azure-2023-code"``.
        url: canonical download address.
        filename: the local file name (searched for in ``KVDRO_DATA_DIR`` and used in the cache).
        subfolder: folder under the cache (and conventionally under ``KVDRO_DATA_DIR``).
        sha256: hex digest, or ``None`` if unknown (unverified: loads warn).
        kind: ``"azure"`` (TIMESTAMP, ContextTokens, GeneratedTokens), ``"burstgpt"``, or ``"raw"``
            (not a request trace: only :func:`fetch` applies).
        request_class: class label for single-class traces (Azure).
        citation: BibTeX key in ``references.bib``.
    """

    name: str
    url: str
    filename: str
    subfolder: str
    sha256: str | None
    kind: Literal["azure", "burstgpt", "raw"]
    request_class: str | None = None
    citation: str = ""


def _registry(*sources: Source) -> Mapping[str, Source]:
    return MappingProxyType({s.name: s for s in sources})


#: Every known file. Hashes of the 2023 Azure and Vidur files were computed on the copies in
#: ``../shared/data``; the 2024 Azure files and BurstGPT have no known hash (see module docstring).
REGISTRY: Mapping[str, Source] = _registry(
    Source(
        "azure-2023-code",
        _AZURE + "AzureLLMInferenceTrace_code.csv",
        "AzureLLMInferenceTrace_code.csv",
        "azure-llm-2023",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "azure",
        "code",
        "patel2024splitwise",
    ),
    Source(
        "azure-2023-conv",
        _AZURE + "AzureLLMInferenceTrace_conv.csv",
        "AzureLLMInferenceTrace_conv.csv",
        "azure-llm-2023",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "azure",
        "conversation",
        "patel2024splitwise",
    ),
    Source(
        "azure-2024-code",
        _AZURE + "AzureLLMInferenceTrace_code_1week.csv",
        "AzureLLMInferenceTrace_code_1week.csv",
        "azure-llm-2024",
        None,
        "azure",
        "code",
        "patel2024splitwise",
    ),
    Source(
        "azure-2024-conv",
        _AZURE + "AzureLLMInferenceTrace_conv_1week.csv",
        "AzureLLMInferenceTrace_conv_1week.csv",
        "azure-llm-2024",
        None,
        "azure",
        "conversation",
        "patel2024splitwise",
    ),
    Source(
        "burstgpt",
        "https://raw.githubusercontent.com/HPMLL/BurstGPT/main/data/BurstGPT_1.csv",
        "BurstGPT_1.csv",
        "burstgpt",
        None,
        "burstgpt",
        None,
        "wang2024burstgpt",
    ),
    Source(
        "vidur-a100-llama2-70b-mlp",
        _VIDUR + "compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
        "llama2-70b-mlp.csv",
        "vidur-a100-profiling",
        "d690ce601f94ab80586e1d5a6a92ea0d64114dc3e0895bf32b3bee270f3d9b7f",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-allreduce",
        _VIDUR + "network/a100_dgx/all_reduce.csv",
        "all_reduce_a100_dgx.csv",
        "vidur-a100-profiling",
        "5ea3f3c229fee1ef70ea308881fff420d60ab6f30e86edda1ed6146b12eb28ef",
        "raw",
        None,
        "agrawal2024vidur",
    ),
)


# ----------------------------------------------------------------------------------------------
# Locating a file
# ----------------------------------------------------------------------------------------------

_HASH_MEMO: dict[tuple[str, int, int], str] = {}


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The sha256 hex digest of a file (memoised on path, size and modification time)."""
    p = _check_path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_MEMO:
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASH_MEMO[key] = h.hexdigest()
    return _HASH_MEMO[key]


def _pooch():
    """Import pooch on first use (it imports ``tqdm.auto``, which warns in a notebook without ipywidgets)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import pooch
    return pooch


def _source(name: str) -> Source:
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"name: unknown dataset {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name]


def _cache_dir() -> Path:
    configured = os.environ.get("KVDRO_CACHE_DIR")
    return Path(configured) if configured else Path(_pooch().os_cache("kvdro"))


def _allow_unverified(allow_unverified: bool | None) -> bool:
    """The opt-in for unhashed files: the argument if given, else ``KVDRO_ALLOW_UNVERIFIED_DATA``."""
    if allow_unverified is not None:
        if not isinstance(allow_unverified, bool):
            raise ValueError(f"allow_unverified: must be True, False or None, got {allow_unverified!r}")
        return allow_unverified
    raw = os.environ.get(ALLOW_UNVERIFIED_ENV, "").strip().lower()
    if raw in {"", "0", "false", "no"}:
        return False
    if raw in {"1", "true", "yes"}:
        return True
    raise ValueError(f"{ALLOW_UNVERIFIED_ENV}: must be 1/true/yes or 0/false/no, got {raw!r}")


def _opt_in_hint(src: Source) -> str:
    return (
        f"pass allow_unverified=True to kvdro.datasets.fetch/load_trace or set {ALLOW_UNVERIFIED_ENV}=1 "
        f"to use it anyway"
    )


def _check_hash(src: Source, path: Path, where: str, allow_unverified: bool = False) -> Path:
    """Verify ``path`` against the registry: error on mismatch; for an unknown hash, an error
    (:class:`UnverifiedDataError`) unless opted in, then a warning. Both print the computed hash."""
    actual = sha256_of(path)
    if src.sha256 is None:
        if not allow_unverified:
            raise UnverifiedDataError(
                f"{src.name}: {path} is unverified: the registry has no sha256 for {src.filename}, so a "
                f"changed or corrupt file would go unnoticed. Its computed sha256 is {actual}; check it "
                f"against the publisher's and pin it in kvdro.datasets.REGISTRY, or {_opt_in_hint(src)}."
            )
        warnings.warn(
            f"{src.name}: using {path} unverified (opted in; the registry has no sha256 for "
            f"{src.filename}); its sha256 is {actual}",
            UnverifiedDataWarning,
            stacklevel=4,
        )
    elif actual != src.sha256:
        raise ValueError(
            f"{path}: sha256 mismatch for dataset {src.name!r} (found in {where}): expected "
            f"{src.sha256}, got {actual}. The file is corrupt or a different version: delete it and "
            f"put the original from {src.url} there (or unset {where} to let kvdro download it)."
        )
    return path


def _find_local(src: Source, root: Path) -> Path | None:
    """The file named ``src.filename`` in ``root`` or its subfolders (conventional subfolder first)."""
    preferred = root / src.subfolder / src.filename
    if preferred.is_file():
        return preferred
    hits = sorted(p for p in root.rglob(src.filename) if p.is_file())
    return hits[0] if hits else None


def _download(src: Source, cache: Path) -> Path:
    """Download ``src`` into ``cache/src.subfolder`` with pooch (no retries, short connect timeout)."""
    pooch = _pooch()
    downloader = pooch.HTTPDownloader(timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
    known = None if src.sha256 is None else f"sha256:{src.sha256}"
    path = pooch.retrieve(
        src.url, known_hash=known, fname=src.filename, path=cache / src.subfolder, downloader=downloader
    )
    return Path(path)


def _missing(src: Source, cache: Path, reason: str) -> FileNotFoundError:
    env = os.environ.get("KVDRO_DATA_DIR")
    looked = f"KVDRO_DATA_DIR={env}" if env else "KVDRO_DATA_DIR is not set"
    return FileNotFoundError(
        f"dataset {src.name!r}: file {src.filename} is not available locally ({looked}; "
        f"not in the cache {cache / src.subfolder}) and could not be downloaded ({reason}). "
        f"Put {src.filename} in a folder (any subfolder, e.g. {src.subfolder}/) and set "
        f"KVDRO_DATA_DIR to that folder, or connect to the internet. Canonical address: {src.url}"
    )


def fetch(name: str, *, allow_unverified: bool | None = None) -> Path:
    """Path of a local copy of registry file ``name`` (see the module docstring for the order).

    Args:
        name: a registry key.
        allow_unverified: opt in to a file the registry has no sha256 for (``None``: read the
            environment variable ``KVDRO_ALLOW_UNVERIFIED_DATA``). Ignored for verified files.

    Raises:
        ValueError: unknown ``name``; a local copy whose sha256 differs from the registry's;
            :class:`UnverifiedDataError` (a ValueError) for an unhashed file without the opt-in.
        FileNotFoundError: no local copy and the download failed (message says what to do).
    """
    src = _source(name)
    allowed = _allow_unverified(allow_unverified)
    env = os.environ.get("KVDRO_DATA_DIR")
    if env:
        root = Path(env)
        if root.is_dir():
            hit = _find_local(src, root)
            if hit is not None:
                return _check_hash(src, hit, "KVDRO_DATA_DIR", allowed)
    cache = _cache_dir()
    cached = cache / src.subfolder / src.filename
    if cached.is_file() and (src.sha256 is None or sha256_of(cached) == src.sha256):
        return _check_hash(src, cached, "KVDRO_CACHE_DIR", allowed)
    if src.sha256 is None and not allowed:
        raise UnverifiedDataError(
            f"{src.name}: the registry has no sha256 for {src.filename}, so kvdro does not download it "
            f"unasked; {_opt_in_hint(src)} (the warning will print the file's sha256 to pin)."
        )
    try:
        path = _download(src, cache)
    except ValueError as exc:  # pooch: downloaded file's hash does not match
        raise ValueError(
            f"{src.filename}: downloaded from {src.url} but its sha256 does not match the registry's "
            f"{src.sha256} ({exc}). The upstream file changed; use a copy with the registered hash "
            f"via KVDRO_DATA_DIR."
        ) from None
    except OSError as exc:  # requests' errors (subclass OSError), urllib/socket errors, timeouts
        host = urlparse(src.url).hostname
        raise _missing(src, cache, f"{type(exc).__name__} while contacting {host}") from None
    return _check_hash(src, path, "the download", allowed)


# ----------------------------------------------------------------------------------------------
# Reading and tidying
# ----------------------------------------------------------------------------------------------


def _require_columns(df: pd.DataFrame, columns: list[str], path: Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")


def _token_column(df: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """Column ``column`` as int64 after checking every value is a non-negative integer."""
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: column {column!r} has a non-numeric value {raw.iloc[i]!r} at data row {i}")
    arr = values.to_numpy(dtype=float)
    frac = arr != np.round(arr)
    if frac.any():
        i = int(np.flatnonzero(frac)[0])
        raise ValueError(f"{path}: column {column!r} has a non-integer token count {raw.iloc[i]!r} at data row {i}")
    neg = arr < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ValueError(f"{path}: column {column!r} has a negative token count {raw.iloc[i]!r} at data row {i}")
    return arr.astype(np.int64)


def _check_nrows(nrows: object) -> None:
    if nrows is not None and (
        isinstance(nrows, (bool, np.bool_)) or not isinstance(nrows, (int, np.integer)) or nrows < 1
    ):
        raise ValueError(f"nrows: must be a positive integer or None, got {nrows!r}")


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path (str or os.PathLike), got {type(path).__name__}")
    return Path(path)


def _tidy(arrival: np.ndarray, inp: np.ndarray, out: np.ndarray, cls: np.ndarray | str) -> pd.DataFrame:
    t = np.asarray(arrival, dtype=float)
    t = t - t.min() if t.size else t
    df = pd.DataFrame(
        {
            "arrival_s": t,
            "input_tokens": np.asarray(inp, dtype=np.int64),
            "output_tokens": np.asarray(out, dtype=np.int64),
            "request_class": pd.Series(np.broadcast_to(np.asarray(cls, dtype=object), t.shape), dtype=object),
        }
    )
    return df.sort_values("arrival_s", kind="stable", ignore_index=True)


def read_azure_csv(
    path: str | os.PathLike[str], request_class: str, *, nrows: int | None = None
) -> pd.DataFrame:
    """Read an Azure LLM inference trace (2023 or 2024 schema) into the tidy schema.

    The file has columns ``TIMESTAMP`` (ISO-8601 date-time), ``ContextTokens`` (prompt length,
    tokens) and ``GeneratedTokens`` (output length, tokens). ``nrows`` reads only the first rows
    (the 2024 week files hold tens of millions).

    Raises:
        ValueError: naming the file and column, for a missing column, an unparseable timestamp,
            or a token count that is non-numeric, non-integer or negative.
    """
    p = _check_path(path)
    _check_nrows(nrows)
    if not isinstance(request_class, str) or not request_class:
        raise ValueError(f"request_class: must be a non-empty string, got {request_class!r}")
    df = pd.read_csv(p, nrows=nrows, dtype={"TIMESTAMP": str})
    _require_columns(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], p)
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise ValueError(f"{p}: column 'TIMESTAMP' has an unparseable timestamp {df['TIMESTAMP'].iloc[i]!r} at data row {i}")
    seconds = (ts - ts.min()).dt.total_seconds().to_numpy()
    out = _tidy(
        seconds,
        _token_column(df, "ContextTokens", p),
        _token_column(df, "GeneratedTokens", p),
        request_class,
    )
    out.attrs["file"] = str(p)
    out.attrs["dropped_failed"] = 0
    return out


BURSTGPT_COLUMNS = [
    "Timestamp",
    "Session ID",
    "Elapsed time",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
]


def read_burstgpt_csv(path: str | os.PathLike[str], *, nrows: int | None = None) -> pd.DataFrame:
    """Read a BurstGPT trace into the tidy schema.

    BurstGPT columns: Timestamp (seconds since the trace start), Session ID, Elapsed time [s],
    Model, Request tokens, Response tokens, Total tokens, Log Type. Failed requests have
    ``Response tokens == 0``: they are dropped, counted in ``df.attrs["dropped_failed"]`` and
    reported with a :class:`DroppedRequestsWarning`. ``request_class`` is ``f"{Model}-{Log Type}"``.

    Raises:
        ValueError: naming the file and column (missing column, unparseable timestamp, bad tokens).
    """
    p = _check_path(path)
    _check_nrows(nrows)
    df = pd.read_csv(p, nrows=nrows)
    _require_columns(df, BURSTGPT_COLUMNS, p)
    ts = pd.to_numeric(df["Timestamp"], errors="coerce")
    bad_ts = ts.isna() | ~np.isfinite(ts.to_numpy(dtype=float, na_value=np.nan))
    if bad_ts.any():
        i = int(np.flatnonzero(bad_ts.to_numpy())[0])
        raise ValueError(f"{p}: column 'Timestamp' has an unparseable timestamp {df['Timestamp'].iloc[i]!r} at data row {i}")
    inp = _token_column(df, "Request tokens", p)
    out = _token_column(df, "Response tokens", p)
    for col in ("Model", "Log Type"):
        if df[col].isna().any():
            i = int(np.flatnonzero(df[col].isna().to_numpy())[0])
            raise ValueError(f"{p}: column {col!r} is empty at data row {i}")
    ok = out > 0
    dropped = int((~ok).sum())
    if dropped:
        warnings.warn(
            f"{p}: dropped {dropped} failed request(s) (Response tokens = 0) of {len(df)}",
            DroppedRequestsWarning,
            stacklevel=2,
        )
    cls = (df["Model"].astype(str) + "-" + df["Log Type"].astype(str)).to_numpy(dtype=object)
    tidy = _tidy(ts.to_numpy(dtype=float)[ok], inp[ok], out[ok], cls[ok])
    tidy.attrs["file"] = str(p)
    tidy.attrs["dropped_failed"] = dropped
    return tidy


def load_trace(name: str, *, nrows: int | None = None, allow_unverified: bool | None = None) -> pd.DataFrame:
    """Load registry trace ``name`` in the tidy schema (:data:`SCHEMA`), sorted by arrival.

    Args:
        name: a registry key of kind ``"azure"`` or ``"burstgpt"``, e.g. ``"azure-2023-conv"``.
        nrows: read only the first ``nrows`` rows of the file (use it for the 2024 week files).
        allow_unverified: opt in to a trace without a registered sha256 (Azure 2024, BurstGPT);
            see :func:`fetch`.

    Returns:
        DataFrame with ``arrival_s`` [s from the first request], ``input_tokens`` [tokens],
        ``output_tokens`` [tokens], ``request_class``; ``attrs`` holds ``source``, ``file`` and
        ``dropped_failed``.
    """
    src = _source(name)
    if src.kind == "raw":
        raise ValueError(f"name: {name!r} is not a request trace (use kvdro.datasets.fetch for it)")
    _check_nrows(nrows)
    path = fetch(name, allow_unverified=allow_unverified)
    if src.kind == "azure":
        df = read_azure_csv(path, src.request_class or "unknown", nrows=nrows)
    else:
        df = read_burstgpt_csv(path, nrows=nrows)
    df.attrs["source"] = name
    return df
