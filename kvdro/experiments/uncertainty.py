"""Uncertainty of a comparison: per-block sums of a run, and one seeded moving-block bootstrap.

Every comparison in chapters 8 and 9 is *paired*: the policies (or plans) compared serve the same arrivals,
so the same time block of the test half is resampled for all of them at once.

* A real trace has one test half. Its requests are cut by arrival time into :data:`N_BLOCKS`
  consecutive blocks (about a minute each); each simulation stores, per block, the sum of each
  cost term and the number of requests served (:func:`block_sums`, saved in a sweep row as a short
  string, :func:`encode` / :func:`decode`). A *moving-block bootstrap* (Künsch 1989) resamples
  runs of :data:`BLOCK_RUN` consecutive blocks, so queueing that carries over from one minute to the
  next stays inside a resampled run; a ratio of sums (cost per served request) is recomputed on each
  replicate, and the 2.5 % and 97.5 % quantiles give the 95 % interval.
* Synthetic twins have independent realisations: the unit is a seed (run length 1, the ordinary
  bootstrap over seeds).

:func:`bootstrap` is written once and used for both; it is seeded (:data:`SEED`) so a rebuild
prints the same interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BLOCK_RUN",
    "LATENCY_BINS",
    "N_BLOCKS",
    "N_BOOT",
    "SEED",
    "Interval",
    "block_index",
    "block_sums",
    "bootstrap",
    "decode",
    "encode",
    "quantile_from_hist",
]

#: Time blocks per test half.
N_BLOCKS = 30
#: Consecutive blocks per resampled run (moving-block bootstrap).
BLOCK_RUN = 3
#: Bootstrap replicates.
N_BOOT = 2000
#: Seed of every bootstrap.
SEED = 15
#: Edges of the latency histogram [s] used to bootstrap a P99 (log-spaced, 0.05 s to 20,000 s).
LATENCY_BINS = np.geomspace(0.05, 20_000.0, 65)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95 % bootstrap interval."""

    point: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        for name in ("point", "lo", "hi"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name}: the bootstrap gave a non-finite value")

    @property
    def positive(self) -> bool:
        """The whole interval is above 0."""
        return self.lo > 0

    @property
    def negative(self) -> bool:
        """The whole interval is below 0."""
        return self.hi < 0

    def pct(self, digits: int = 0) -> str:
        """``+12% [+8, +15]``."""
        f = f"{{:+.{digits}f}}"
        return f"{f.format(100 * self.point)}% [{f.format(100 * self.lo)}, {f.format(100 * self.hi)}]"

    def num(self, digits: int = 2) -> str:
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.point)} [{f.format(self.lo)}, {f.format(self.hi)}]"


def encode(values) -> str:
    """A 1-D array as a short space-separated string (a sweep row holds scalars only)."""
    return " ".join(f"{float(v):.6g}" for v in np.asarray(values, dtype=float).ravel())


def decode(text: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Inverse of :func:`encode`; ValueError if ``text`` is not a list of numbers."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected a space-separated list of numbers, got {text!r}")
    out = np.array([float(t) for t in text.split()])
    return out.reshape(shape) if shape is not None else out


def block_index(arrival_s: np.ndarray, n_blocks: int = N_BLOCKS) -> np.ndarray:
    """The time block (0 ... n_blocks - 1) of each arrival: the span cut into equal intervals."""
    t = np.asarray(arrival_s, dtype=float)
    if t.size == 0:
        raise ValueError("arrival_s: empty")
    edges = np.linspace(t.min(), t.max(), int(n_blocks) + 1)
    return np.clip(np.searchsorted(edges, t, side="right") - 1, 0, int(n_blocks) - 1)


def block_sums(block: np.ndarray, values: np.ndarray, n_blocks: int = N_BLOCKS) -> np.ndarray:
    """Sum of ``values`` per block (``np.bincount`` with weights)."""
    return np.bincount(np.asarray(block), weights=np.asarray(values, dtype=float), minlength=int(n_blocks))


def quantile_from_hist(counts: np.ndarray, q: float, bins: np.ndarray = LATENCY_BINS) -> np.ndarray:
    """The ``q``-quantile of a histogram over ``bins`` (log-linear within a bin), along the last axis."""
    c = np.asarray(counts, dtype=float)
    cum = np.cumsum(c, axis=-1)
    total = cum[..., -1:]
    target = q * total
    k = np.minimum((cum < target).sum(axis=-1), c.shape[-1] - 1)
    below = np.where(k > 0, np.take_along_axis(cum, np.maximum(k - 1, 0)[..., None], -1)[..., 0], 0.0)
    inbin = np.take_along_axis(c, k[..., None], -1)[..., 0]
    frac = np.where(inbin > 0, (target[..., 0] - below) / np.where(inbin > 0, inbin, 1), 0.5)
    lo, hi = np.log(bins[k]), np.log(bins[k + 1])
    return np.exp(lo + np.clip(frac, 0, 1) * (hi - lo))


def _indices(n: int, run: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    run = max(1, min(int(run), n))
    starts = rng.integers(0, n - run + 1, size=(n_boot, -(-n // run)))
    idx = (starts[:, :, None] + np.arange(run)[None, None, :]).reshape(n_boot, -1)
    return idx[:, :n]


def bootstrap(
    stat: Callable[[np.ndarray], np.ndarray],
    units: np.ndarray,
    *,
    run: int = BLOCK_RUN,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> Interval:
    """95 % moving-block bootstrap interval of ``stat`` of the sums over ``units``.

    Args:
        stat: maps the sums over units, an array of shape ``(B, *rest)`` (a leading replicate axis),
            to ``B`` numbers. Ratios of sums (cost per served request, a gain) are what it is for.
        units: shape ``(n_units, *rest)``: axis 0 the time blocks of one test half (``run`` > 1) or
            the seeds of the synthetic twins (``run = 1``); all compared arms side by side in
            ``rest`` so that every replicate resamples them together (paired).
        run: consecutive units per resampled run.
        n_boot, seed: replicates and the seed of their ``numpy.random.Generator``.
    """
    u = np.asarray(units, dtype=float)
    if u.ndim < 1 or u.shape[0] < 2:
        raise ValueError(f"units: need at least 2 units along axis 0, got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ValueError("units: contains non-finite values")
    point = float(np.asarray(stat(u.sum(axis=0)[None]))[0])
    idx = _indices(u.shape[0], run, int(n_boot), np.random.default_rng(int(seed)))
    reps = np.asarray(stat(u[idx].sum(axis=1)), dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size < 0.9 * n_boot:
        raise ValueError("stat: more than 10% of the bootstrap replicates are not finite")
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return Interval(point, float(min(lo, point)), float(max(hi, point)))
