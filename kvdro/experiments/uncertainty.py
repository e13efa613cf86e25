"""Uncertainty of a comparison: per-block sums of a run, and one seeded moving-block bootstrap.

Every comparison in chapters 8 to 10 is *paired*: the policies (or plans) compared serve the same arrivals,
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

**Intervals of a percentage change.** A change such as "goodput +12 % [+8, +15]" is a ratio minus one,
and its interval is the bootstrap of that ratio: numerator and denominator are resampled together.
Where the baseline (the denominator) is itself near zero in some resamples -- a queue that grows
without bound serves its few requests in time in a few blocks, and a resample that misses them has
almost none -- the ratio of the resampled sums explodes (an upper end of +13,000 %) or, when both
sides are zero, sits at -100 %. Such an interval says nothing about the change. :func:`change`
bootstraps a ratio together with the same comparison as a *difference* in the metric's own unit
and flags the baseline as near zero when the 2.5 % quantile of its resampled value is below
:data:`NEAR_ZERO` (5 %) of its point estimate -- then at least one resample in forty divides by less
than a twentieth of the baseline, and the 97.5 % end is set by such resamples --;
:meth:`Interval.pct` then prints the difference. An interval read back from a cached table without
its resamples is judged by :attr:`Interval.exploded` instead (the ratio's own ends).
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
    "NEAR_ZERO",
    "bootstrap",
    "change",
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
#: A ratio's baseline is near zero when the 2.5 % quantile of its resampled value is below this share
#: of its point estimate (:func:`change`); a ratio read back without resamples is judged by its ends
#: (:attr:`Interval.exploded`).
NEAR_ZERO = 0.05
#: Edges of the latency histogram [s] used to bootstrap a P99 (log-spaced, 0.05 s to 20,000 s).
LATENCY_BINS = np.geomspace(0.05, 20_000.0, 65)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95 % bootstrap interval.

    For a relative change built by :func:`change`, ``diff`` holds the same comparison as a difference
    in the metric's own ``unit`` (an :class:`Interval`, or a bare number where a cached table has no
    resamples) and ``base_near_zero`` says whether the ratio's baseline comes near zero in resamples
    (:data:`NEAR_ZERO`); :meth:`pct` then prints the difference instead of the ratio."""

    point: float
    lo: float
    hi: float
    diff: Interval | float | None = None
    unit: str = ""
    base_near_zero: bool = False

    def __post_init__(self) -> None:
        for name in ("point", "lo", "hi"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name}: the bootstrap gave a non-finite value")
        if self.base_near_zero and self.diff is None:
            raise ValueError("diff: a ratio whose baseline is near zero needs its difference to be reported")
        if isinstance(self.diff, (int, float)) and not np.isfinite(self.diff):
            raise ValueError("diff: not a finite number")

    @property
    def positive(self) -> bool:
        """The whole interval is above 0."""
        return self.lo > 0

    @property
    def negative(self) -> bool:
        """The whole interval is below 0."""
        return self.hi < 0

    @property
    def exploded(self) -> bool:
        """For a relative change (ratio - 1) read back without its resamples: some resampled ratio
        (the 2.5 % or 97.5 % one) is more than 1/:data:`NEAR_ZERO` = 20 times, or less than
        :data:`NEAR_ZERO` times, the point ratio. Numerator and denominator are sums over the same
        resampled blocks, so that happens only where one side fell below 5 % of its share relative
        to the other: a baseline near zero (the upper end explodes), or both near zero (a resampled
        0/0 reads -100 %)."""
        r = 1.0 + self.point
        return r > 0 and ((1.0 + self.hi) * NEAR_ZERO > r or (1.0 + self.lo) < NEAR_ZERO * r)

    def pct(self, digits: int = 0) -> str:
        """``+12% [+8, +15]``; a ratio whose baseline is near zero (``base_near_zero``) as its
        difference in the metric's unit: ``+35 requests within their deadline [+20, +48] (a difference:
        the baseline comes near zero)``; with a bare number as ``diff``, ``+0.27 req/s (a difference,
        no interval: ...)``."""
        if self.base_near_zero:
            d = self.diff
            if isinstance(d, Interval):
                k = _digits(max(abs(d.point), abs(d.lo), abs(d.hi)))
                f = f"{{:+,.{k}f}}"
                return (f"{f.format(d.point)} {self.unit} [{f.format(d.lo)}, {f.format(d.hi)}]".replace("  ", " ")
                        + " (a difference: the baseline comes near zero)")
            return (f"{float(d):+,.{_digits(abs(float(d)))}f} {self.unit}".rstrip()
                    + " (a difference, no interval: the baseline comes near zero)")
        f = f"{{:+.{digits}f}}"
        return f"{f.format(100 * self.point)}% [{f.format(100 * self.lo)}, {f.format(100 * self.hi)}]"

    def num(self, digits: int = 2) -> str:
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.point)} [{f.format(self.lo)}, {f.format(self.hi)}]"


def _digits(x: float) -> int:
    """Decimals that show about three significant figures of ``x`` (none from 100 up)."""
    return 0 if x >= 100 or x == 0 else int(min(4, 2 - np.floor(np.log10(x))))


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


def _resample(units: np.ndarray, run: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The sums over all units (shape ``(1, *rest)``) and over each replicate's resampled units
    (``(n_boot, *rest)``), with the checks of :func:`bootstrap`."""
    u = np.asarray(units, dtype=float)
    if u.ndim < 1 or u.shape[0] < 2:
        raise ValueError(f"units: need at least 2 units along axis 0, got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ValueError("units: contains non-finite values")
    idx = _indices(u.shape[0], run, int(n_boot), np.random.default_rng(int(seed)))
    return u.sum(axis=0)[None], u[idx].sum(axis=1)


def _quantiles(reps: np.ndarray, point: float, n_boot: int, what: str = "stat") -> tuple[float, float]:
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size < 0.9 * n_boot:
        raise ValueError(f"{what}: more than 10% of the bootstrap replicates are not finite")
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return float(min(lo, point)), float(max(hi, point))


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
    total, reps = _resample(units, run, n_boot, seed)
    point = float(np.asarray(stat(total))[0])
    return Interval(point, *_quantiles(stat(reps), point, n_boot))


def change(
    num: Callable[[np.ndarray], np.ndarray],
    den: Callable[[np.ndarray], np.ndarray],
    units: np.ndarray,
    *,
    unit: str,
    floor: float = 1.0,
    run: int = BLOCK_RUN,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> Interval:
    """The relative change ``num / max(den, floor) - 1`` with its 95 % interval (the same resamples,
    so the same numbers, as :func:`bootstrap` of that ratio), the difference ``num - den`` in the
    metric's ``unit`` over the same resamples (``diff``), and ``base_near_zero``: the 2.5 % quantile
    of ``den``'s resampled value is below :data:`NEAR_ZERO` of its point estimate (see the module
    docstring). ``num`` and ``den`` map summed units ``(B, *rest)`` to ``B`` values each (the arm and
    its baseline, e.g. requests served within their deadline); ``floor`` keeps an empty baseline
    from dividing by zero (1 request for counts)."""
    if not np.isfinite(floor) or floor <= 0:
        raise ValueError(f"floor: must be a positive number, got {floor!r}")
    total, reps = _resample(units, run, n_boot, seed)
    a0, b0 = float(np.asarray(num(total))[0]), float(np.asarray(den(total))[0])
    a, b = np.asarray(num(reps), dtype=float), np.asarray(den(reps), dtype=float)
    point = a0 / max(b0, floor) - 1.0
    lo, hi = _quantiles(a / np.maximum(b, floor) - 1.0, point, n_boot)
    diff = Interval(a0 - b0, *_quantiles(a - b, a0 - b0, n_boot, "num - den"))
    near = bool(b0 <= 0 or np.quantile(b, 0.025) < NEAR_ZERO * b0)
    return Interval(point, lo, hi, diff=diff, unit=unit, base_near_zero=near)
