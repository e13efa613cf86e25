"""Request classes, calibrated synthetic workloads, and the output-length shift operator.

A *request class* :math:`i` (paper, Sec. III) carries an arrival rate :math:`\\lambda_i` [req/s], an
input length :math:`L_{in}^i` [tokens], samples :math:`\\hat\\xi_i^{(n)}` of the output length (the
empirical distribution :math:`\\hat P_N^i` at the centre of the ambiguity set (5)), the support bound
:math:`L_{max}^i` [tokens], a shared-prefix length :math:`L_{pre}^i` [tokens] and a latency SLO
:math:`D_i` [s] (6f).

**No public trace records** :math:`L_{pre}` **or** :math:`D`. They are explicit parameters here with
documented defaults (:data:`DEFAULT_PREFIX_TOKENS`, :data:`DEFAULT_TTFT_SLO_S`,
:data:`DEFAULT_TPOT_SLO_S`); every experiment that depends on them should say which values it used.

Three ways to get classes:

* :func:`classes_from_trace` -- one class per ``request_class`` of a tidy trace
  (:mod:`kvdro.datasets`); :func:`split_by_input_quantile` first splits each trace class into
  input-length buckets (the Azure 2023 code and conversation classes x 3 buckets = 6 classes).
* :func:`fit_class_model` -- a calibrated generative model of a class: truncated log-normal mixtures
  for input and output lengths (:class:`LengthModel`, fitted by EM) and Gamma inter-arrival times
  with the class's coefficient of variation; :func:`synthesize_trace` samples a trace from it.
* :func:`synthetic_classes` -- more classes (e.g. 15) with distinct, realistic parameters, made by
  perturbing fitted models.

:func:`shift_outputs` scales output lengths by a factor ``s`` (distribution-shift experiments).

:func:`servegen_r1` (from :mod:`kvdro.servegen`) draws a DeepSeek-R1 reasoning trace from ServeGen's
published per-client statistics.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from kvdro.servegen import servegen_r1  # the DeepSeek-R1 reasoning workload (ServeGen's statistics)

__all__ = [
    "DEFAULT_PREFIX_TOKENS",
    "DEFAULT_TTFT_SLO_S",
    "DEFAULT_TPOT_SLO_S",
    "RequestClass",
    "LengthModel",
    "ClassModel",
    "classes_from_trace",
    "split_by_input_quantile",
    "interarrival_cv",
    "default_slo_s",
    "fit_length_model",
    "fit_class_model",
    "gamma_interarrivals",
    "synthesize_trace",
    "synthetic_classes",
    "shift_outputs",
    "shift_trace",
    "save_class_models",
    "load_class_models",
    "servegen_r1",
]

#: Default shared prefix :math:`L_{pre}` [tokens]: a typical system prompt. Not in any trace. It is
#: capped at half the class's mean input length so that a prefix never exceeds the prompt.
DEFAULT_PREFIX_TOKENS = 128
#: Default SLO parts [s]: :math:`D_i` = time-to-first-token budget + time-per-output-token budget x
#: :math:`E[\xi_i]`. Not in any trace (2 s and 100 ms/token are common serving targets).
DEFAULT_TTFT_SLO_S = 2.0
DEFAULT_TPOT_SLO_S = 0.1


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def _int_samples(values: object, argument: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{argument}: must be a non-empty 1-D array of token counts")
    if not np.issubdtype(a.dtype, np.number) or not np.all(np.isfinite(a)):
        raise ValueError(f"{argument}: token counts must be finite numbers")
    if np.any(a < 0) or np.any(a != np.round(a)):
        raise ValueError(f"{argument}: token counts must be non-negative integers")
    return a.astype(np.int64)


def _is_number(x: object) -> bool:
    """An int/float/numpy number; not a bool, a string or None (which ``float()`` would accept or choke on)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _positive(x: float, argument: str, *, allow_zero: bool = False) -> float:
    need = "non-negative" if allow_zero else "positive"
    if not _is_number(x):
        raise ValueError(f"{argument}: must be a finite {need} number, got {x!r} ({type(x).__name__})")
    x = float(x)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise ValueError(f"{argument}: must be a finite {need} number, got {x}")
    return x


def _integer(n: object, argument: str, *, minimum: int = 0) -> int:
    """An integer >= ``minimum`` (a Python or numpy int; not a bool, float or string)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"{argument}: must be an integer >= {minimum}, got {n!r}")
    return int(n)


def _numbers(values: object, argument: str) -> np.ndarray:
    """A float array from numbers only (strings and booleans are rejected, not converted)."""
    a = np.asarray(values)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{argument}: must be an array of numbers, got dtype {a.dtype}")
    return a.astype(float)


def _rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng: pass a numpy.random.Generator")
    return rng


def default_slo_s(mean_output_tokens: float) -> float:
    """Default latency SLO :math:`D` [s] (6f): ``DEFAULT_TTFT_SLO_S + DEFAULT_TPOT_SLO_S * E[xi]``."""
    return DEFAULT_TTFT_SLO_S + DEFAULT_TPOT_SLO_S * _positive(mean_output_tokens, "mean_output_tokens", allow_zero=True)


def _default_prefix(mean_input_tokens: float) -> float:
    return float(min(DEFAULT_PREFIX_TOKENS, math.floor(mean_input_tokens / 2)))


@dataclass(frozen=True, eq=False)
class RequestClass:
    """One request class :math:`i` of the joint problem (6).

    Attributes:
        name: class label.
        arrival_rate: :math:`\\lambda_i` [requests/s].
        input_tokens: samples of the prompt length [tokens]; :attr:`mean_input_tokens` is the
            :math:`L_{in}^i` of (1) and (8c)-(8f).
        output_tokens: samples :math:`\\hat\\xi_i^{(n)}` of the output length [tokens] (5).
        interarrival_cv: coefficient of variation of inter-arrival times (1 = Poisson); enters the
            waiting time (7) as :math:`\\alpha_\\lambda`-style burstiness.
        prefix_tokens: shared prefix :math:`L_{pre}^i` [tokens] -- *not in any trace*; default
            ``min(128, floor(L_in / 2))``.
        slo_s: latency SLO :math:`D_i` [s] (6f) -- *not in any trace*; default
            :func:`default_slo_s` (2 s + 0.1 s per mean output token).
        max_output_tokens: support bound :math:`L_{max}^i` [tokens] of the ambiguity set (5);
            default the largest output sample.
    """

    name: str
    arrival_rate: float
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    interarrival_cv: float = 1.0
    prefix_tokens: float | None = None
    slo_s: float | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name: must be a non-empty string")
        set_ = object.__setattr__
        if self.max_output_tokens is not None:
            _integer(self.max_output_tokens, "max_output_tokens", minimum=1)
        set_(self, "arrival_rate", _positive(self.arrival_rate, "arrival_rate"))
        set_(self, "input_tokens", _readonly(_int_samples(self.input_tokens, "input_tokens")))
        set_(self, "output_tokens", _readonly(_int_samples(self.output_tokens, "output_tokens")))
        set_(self, "interarrival_cv", _positive(self.interarrival_cv, "interarrival_cv", allow_zero=True))
        l_in = float(self.input_tokens.mean())
        pre = _default_prefix(l_in) if self.prefix_tokens is None else _positive(self.prefix_tokens, "prefix_tokens", allow_zero=True)
        if pre > l_in:
            raise ValueError(f"prefix_tokens: {pre} exceeds the mean input length {l_in:.1f} of class {self.name!r}")
        set_(self, "prefix_tokens", pre)
        slo = default_slo_s(self.output_tokens.mean()) if self.slo_s is None else _positive(self.slo_s, "slo_s")
        set_(self, "slo_s", slo)
        lmax = int(self.output_tokens.max()) if self.max_output_tokens is None else self.max_output_tokens
        if int(lmax) != lmax or lmax < int(self.output_tokens.max()):
            raise ValueError(
                f"max_output_tokens: {lmax} must be an integer >= the largest output sample "
                f"{int(self.output_tokens.max())} of class {self.name!r}"
            )
        set_(self, "max_output_tokens", int(lmax))

    @property
    def mean_input_tokens(self) -> float:
        """:math:`L_{in}^i` [tokens]: mean prompt length."""
        return float(self.input_tokens.mean())

    @property
    def mean_output_tokens(self) -> float:
        """:math:`E[\\xi_i]` [tokens] under the empirical distribution; used in (1) and for eps."""
        return float(self.output_tokens.mean())

    @property
    def n_samples(self) -> int:
        """Number of output-length samples N."""
        return int(self.output_tokens.size)

    def subsample(self, n: int, rng: np.random.Generator) -> RequestClass:
        """The same class with ``n`` output (and input) samples drawn without replacement.

        ``L_max``, ``L_pre`` and ``D`` are kept, so a subsample has the same support as its parent.
        """
        _rng(rng)
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 1 <= n <= self.n_samples:
            raise ValueError(f"n: must be an integer in [1, {self.n_samples}], got {n!r}")
        idx = rng.choice(self.n_samples, size=int(n), replace=False)
        m = self.input_tokens.size
        in_idx = idx if m == self.n_samples else rng.choice(m, size=min(int(n), m), replace=False)
        return replace(self, input_tokens=self.input_tokens[in_idx], output_tokens=self.output_tokens[idx])

    def __repr__(self) -> str:
        return (
            f"RequestClass(name={self.name!r}, arrival_rate={self.arrival_rate:.4g}/s, "
            f"L_in={self.mean_input_tokens:.1f}, E[xi]={self.mean_output_tokens:.1f}, N={self.n_samples}, "
            f"cv={self.interarrival_cv:.3g}, L_pre={self.prefix_tokens:g}, D={self.slo_s:.3g}s, "
            f"L_max={self.max_output_tokens})"
        )


# ----------------------------------------------------------------------------------------------
# Classes from a tidy trace
# ----------------------------------------------------------------------------------------------

_TIDY = ("arrival_s", "input_tokens", "output_tokens", "request_class")


def _check_tidy(df: pd.DataFrame, argument: str = "df") -> None:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{argument}: must be a pandas DataFrame in kvdro.datasets' tidy schema")
    missing = [c for c in _TIDY if c not in df.columns]
    if missing:
        raise ValueError(f"{argument}: missing column(s) {missing}")
    if len(df) == 0:
        raise ValueError(f"{argument}: empty trace")


def interarrival_cv(arrival_s: object) -> float:
    """Coefficient of variation (std / mean) of the gaps between sorted arrival times [s]."""
    t = np.asarray(arrival_s)
    if t.ndim != 1 or t.dtype.kind not in "iuf":
        raise ValueError("arrival_s: must be a 1-D array of numbers (seconds)")
    t = np.sort(t.astype(float))
    if t.size < 3 or not np.all(np.isfinite(t)):
        raise ValueError("arrival_s: need at least 3 finite arrival times")
    gaps = np.diff(t)
    if gaps.mean() <= 0:
        raise ValueError("arrival_s: all arrivals at the same instant")
    return float(gaps.std() / gaps.mean())


def _per_class(value: float | Mapping[str, float] | None, name: str) -> float | None:
    if isinstance(value, Mapping):
        return value.get(name)
    return value


def classes_from_trace(
    df: pd.DataFrame,
    *,
    prefix_tokens: float | Mapping[str, float] | None = None,
    slo_s: float | Mapping[str, float] | None = None,
    max_output_tokens: int | Mapping[str, int] | None = None,
) -> tuple[RequestClass, ...]:
    """One :class:`RequestClass` per ``request_class`` of a tidy trace, in order of first arrival.

    The arrival rate of a class is its request count divided by the span of the *whole* trace, so
    the rates of classes split from one trace add up to the trace's rate. ``prefix_tokens``,
    ``slo_s`` and ``max_output_tokens`` are not in the trace: pass one value for all classes, a
    mapping from class name, or ``None`` for the documented defaults of :class:`RequestClass`.
    """
    _check_tidy(df)
    span = float(df["arrival_s"].max() - df["arrival_s"].min())
    if span <= 0:
        raise ValueError("df: the trace spans zero seconds; cannot estimate arrival rates")
    out = []
    for name in pd.unique(df["request_class"]):
        part = df[df["request_class"] == name]
        if len(part) < 3:
            raise ValueError(f"df: class {name!r} has {len(part)} request(s); need at least 3")
        out.append(
            RequestClass(
                name=str(name),
                arrival_rate=len(part) / span,
                input_tokens=part["input_tokens"].to_numpy(),
                output_tokens=part["output_tokens"].to_numpy(),
                interarrival_cv=interarrival_cv(part["arrival_s"].to_numpy()),
                prefix_tokens=_per_class(prefix_tokens, str(name)),
                slo_s=_per_class(slo_s, str(name)),
                max_output_tokens=_per_class(max_output_tokens, str(name)),
            )
        )
    return tuple(out)


def split_by_input_quantile(df: pd.DataFrame, n_buckets: int = 3) -> pd.DataFrame:
    """Split each trace class into ``n_buckets`` sub-classes of (nearly) equal size by input length.

    Bucket edges are the class's input-length quantiles k/n; a request falls in the first bucket
    whose upper edge is >= its input length, so ties at an edge stay together. New class names are
    ``f"{class}-short"``, ``-medium``, ``-long`` for 3 buckets, otherwise ``f"{class}-q{k}"``
    (k = 1..n). The edges per class are in ``result.attrs["input_edges"]`` [tokens].
    A router can assign a request to its sub-class at arrival because the input length is known
    then; the output length is not (that is the point of the book).
    """
    _check_tidy(df)
    _integer(n_buckets, "n_buckets", minimum=1)
    labels = ["short", "medium", "long"] if n_buckets == 3 else [f"q{k + 1}" for k in range(n_buckets)]
    out = df.copy()
    edges: dict[str, list[float]] = {}
    new = out["request_class"].astype(object).to_numpy(copy=True)
    for name in pd.unique(df["request_class"]):
        mask = (df["request_class"] == name).to_numpy()
        x = df["input_tokens"].to_numpy()[mask]
        e = np.quantile(x, np.linspace(0, 1, n_buckets + 1))
        if np.unique(e).size != e.size:
            raise ValueError(f"n_buckets: class {name!r} has too few distinct input lengths for {n_buckets} buckets")
        bucket = np.clip(np.searchsorted(e[1:-1], x, side="left"), 0, n_buckets - 1)
        new[mask] = [f"{name}-{labels[b]}" for b in bucket]
        edges[str(name)] = [float(v) for v in e]
    out["request_class"] = pd.Series(new, index=out.index, dtype=object)
    out.attrs = {**df.attrs, "input_edges": edges}
    return out


# ----------------------------------------------------------------------------------------------
# Length models: truncated, discretised log-normal mixtures
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthModel:
    """A token-length distribution: a log-normal mixture, truncated to ``[low, high]`` and rounded,
    with an optional point mass at ``high``.

    With probability ``cap_mass`` a sample equals ``high`` (a context or generation limit that
    truncates requests, e.g. the Azure code prompts piled up at ~7,436 tokens); otherwise it is
    ``round(Y)`` where ``Y`` has density proportional to
    :math:`\\sum_k w_k \\,\\mathrm{LogNormal}(\\mu_k, \\sigma_k)` on ``[low - 0.5, high + 0.5]``.
    Every sample is an integer in ``[low, high]`` [tokens].
    """

    weights: tuple[float, ...]
    mu: tuple[float, ...]
    sigma: tuple[float, ...]
    low: int
    high: int
    cap_mass: float = 0.0

    def __post_init__(self) -> None:
        w, m, s = (np.asarray(v, dtype=float) for v in (self.weights, self.mu, self.sigma))
        if not (w.ndim == m.ndim == s.ndim == 1 and w.size == m.size == s.size >= 1):
            raise ValueError("weights: weights, mu and sigma must be equal-length non-empty sequences")
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0) or not np.all(np.isfinite(w)):
            raise ValueError("weights: must be non-negative and sum to 1")
        if not np.all(np.isfinite(m)):
            raise ValueError("mu: must be finite")
        if np.any(s <= 0) or not np.all(np.isfinite(s)):
            raise ValueError("sigma: must be positive and finite")
        if not _is_number(self.low) or int(self.low) != self.low or self.low < 1:
            raise ValueError(f"low: must be an integer >= 1 [tokens], got {self.low!r}")
        if not _is_number(self.high) or int(self.high) != self.high or self.high < self.low:
            raise ValueError(f"high: must be an integer >= low={self.low}, got {self.high!r}")
        if not _is_number(self.cap_mass) or not 0.0 <= float(self.cap_mass) < 1.0:
            raise ValueError(f"cap_mass: must lie in [0, 1), got {self.cap_mass!r}")
        object.__setattr__(self, "cap_mass", float(self.cap_mass))
        object.__setattr__(self, "weights", tuple(float(v) for v in w))
        object.__setattr__(self, "mu", tuple(float(v) for v in m))
        object.__setattr__(self, "sigma", tuple(float(v) for v in s))
        object.__setattr__(self, "low", int(self.low))
        object.__setattr__(self, "high", int(self.high))

    @property
    def n_components(self) -> int:
        return len(self.weights)

    def _bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, s = np.asarray(self.mu), np.asarray(self.sigma)
        a = (math.log(self.low - 0.5) - m) / s
        b = (math.log(self.high + 0.5) - m) / s
        mass = np.asarray(self.weights) * (special.ndtr(b) - special.ndtr(a))
        return a, b, mass

    def cdf(self, x: object) -> np.ndarray:
        """P(length <= x) for token counts ``x`` (a step function of the integers)."""
        xx = np.floor(_numbers(x, "x"))
        m, s = np.asarray(self.mu), np.asarray(self.sigma)
        a, _, mass = self._bounds()
        z = np.log(np.clip(xx, self.low - 1, self.high) + 0.5)[..., None]
        num = np.asarray(self.weights) * (special.ndtr((z - m) / s) - special.ndtr(a))
        body = np.clip(num.sum(axis=-1) / mass.sum(), 0.0, 1.0)
        return np.where(xx >= self.high, 1.0, (1.0 - self.cap_mass) * body)

    def quantile(self, q: object) -> np.ndarray:
        """Smallest integer length x [tokens] with ``cdf(x) >= q``."""
        qq = _numbers(q, "q")
        if np.any((qq < 0) | (qq > 1)) or not np.all(np.isfinite(qq)):
            raise ValueError("q: probabilities must lie in [0, 1]")
        grid = np.arange(self.low, self.high + 1)
        c = self.cdf(grid)
        c[-1] = 1.0
        return grid[np.minimum(np.searchsorted(c, qq - 1e-12, side="left"), grid.size - 1)]

    def mean(self) -> float:
        """Mean length [tokens] (exact sum over the integer support)."""
        grid = np.arange(self.low, self.high + 1)
        pmf = np.diff(np.concatenate([[0.0], self.cdf(grid)]))
        return float(np.dot(grid, pmf))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` integer lengths [tokens] drawn with ``rng``."""
        _rng(rng)
        _integer(n, "n")
        a, b, mass = self._bounds()
        comp = rng.choice(self.n_components, size=int(n), p=mass / mass.sum())
        u = rng.uniform(special.ndtr(a[comp]), special.ndtr(b[comp]))
        z = np.asarray(self.mu)[comp] + np.asarray(self.sigma)[comp] * special.ndtri(u)
        x = np.clip(np.rint(np.exp(z)), self.low, self.high).astype(np.int64)
        if self.cap_mass > 0:
            x[rng.uniform(size=int(n)) < self.cap_mass] = self.high
        return x

    def scaled(self, factor: float, *, high: int | None = None) -> LengthModel:
        """The distribution of ``factor * Y`` (medians times ``factor``), re-truncated to ``[low, high]``."""
        f = _positive(factor, "factor")
        new_high = max(self.low, round(self.high * f)) if high is None else _integer(high, "high", minimum=1)
        return replace(self, mu=tuple(m + math.log(f) for m in self.mu), high=new_high)


def _em_lognormal_mixture(
    logx: np.ndarray, count: np.ndarray, k: int, *, max_iter: int, tol: float, sigma_floor: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """EM for a k-component Gaussian mixture on distinct log lengths weighted by their counts.

    Deterministic start: means at the k quantiles (j + 1/2)/k of the data. Returns weights, means,
    standard deviations (in a canonical order: by mean, then sd, then weight) and the log-likelihood.
    """
    n = count.sum()
    cum = np.cumsum(count) / n
    mu = logx[np.minimum(np.searchsorted(cum, (np.arange(k) + 0.5) / k), logx.size - 1)].astype(float)
    spread = math.sqrt(float(np.dot(count, (logx - np.dot(count, logx) / n) ** 2) / n))
    sd = np.full(k, max(spread / k, sigma_floor))
    w = np.full(k, 1.0 / k)
    ll_old = -np.inf
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    for _ in range(max_iter):
        zz = (logx[:, None] - mu) / sd
        logp = np.log(w) - np.log(sd) - half_log_2pi - 0.5 * zz**2
        ll_row = special.logsumexp(logp, axis=1)
        ll = float(np.dot(count, ll_row))
        resp = np.exp(logp - ll_row[:, None]) * count[:, None]
        nk = resp.sum(axis=0) + 1e-300
        w = np.maximum(nk / n, 1e-300)
        mu = (resp * logx[:, None]).sum(axis=0) / nk
        sd = np.sqrt(np.maximum((resp * (logx[:, None] - mu) ** 2).sum(axis=0) / nk, sigma_floor**2))
        if ll - ll_old <= tol * abs(ll):
            break
        ll_old = ll
    # Canonical order: by mean, then sd, then weight (descending). Components that EM leaves at the
    # same (mean, sd) -- it happens at the sd floor -- differ only in the last bits, so the keys are
    # rounded: the order, and so what ``sample`` draws, must not depend on the BLAS or the CPU.
    order = np.lexsort((-w, np.round(sd, 8), np.round(mu, 8)))
    return w[order] / w.sum(), mu[order], sd[order], ll


def fit_length_model(
    samples: object,
    *,
    n_components: int | None = None,
    max_components: int = 8,
    low: int | None = None,
    high: int | None = None,
    max_iter: int = 500,
    tol: float = 1e-9,
    sigma_floor: float = 0.05,
    cap_tokens: int | None = 0,
) -> LengthModel:
    """Fit a truncated log-normal mixture to integer lengths by EM on log(x).

    With ``n_components=None`` the number of components (1..``max_components``) minimises BIC.
    ``low``/``high`` default to the sample min/max [tokens]. ``sigma_floor`` (log units) keeps a
    component from collapsing onto one integer value. Deterministic: no randomness in the fit.

    Point mass at the top: samples ``>= high - cap_tokens`` form ``cap_mass`` (their share) and the
    mixture is fitted to the rest; ``cap_tokens=0`` puts only samples equal to ``high`` there when
    they are at least 1% of the data (otherwise no atom); ``cap_tokens=None`` detects a pile-up:
    a window of ``ceil(0.001 * high)`` tokens holding >= 1% of the samples.
    """
    x = _int_samples(samples, "samples")
    if np.any(x < 1):
        raise ValueError("samples: lengths must be >= 1 token to take logs")
    if x.size < 10:
        raise ValueError(f"samples: need at least 10 lengths to fit, got {x.size}")
    lo = int(x.min()) if low is None else _integer(low, "low", minimum=1)
    hi = int(x.max()) if high is None else _integer(high, "high", minimum=1)
    _integer(max_components, "max_components", minimum=1)
    _integer(max_iter, "max_iter", minimum=1)
    _positive(tol, "tol")
    _positive(sigma_floor, "sigma_floor")
    if lo > x.min() or hi < x.max():
        raise ValueError(f"low/high: [{lo}, {hi}] must contain every sample [{x.min()}, {x.max()}]")
    if cap_tokens is None:
        window = max(1, math.ceil(0.001 * hi))
        cap_tokens = window if np.mean(x >= hi - window) >= 0.01 else 0
    if isinstance(cap_tokens, (bool, np.bool_)) or not isinstance(cap_tokens, (int, np.integer)) or cap_tokens < 0:
        raise ValueError(f"cap_tokens: must be a non-negative integer or None, got {cap_tokens!r}")
    at_cap = x >= hi - cap_tokens
    cap_mass = float(at_cap.mean()) if at_cap.mean() >= 0.01 and hi == x.max() else 0.0
    if cap_mass > 0:
        x = x[~at_cap]
        if x.size < 10:
            raise ValueError("samples: fewer than 10 lengths below the point mass at the top")
    values, counts = np.unique(x, return_counts=True)
    logx = np.log(values.astype(float))
    if n_components is not None:
        _integer(n_components, "n_components", minimum=1)
    ks = [n_components] if n_components is not None else list(range(1, max_components + 1))
    best: tuple[float, LengthModel] | None = None
    for k in ks:
        w, mu, sd, ll = _em_lognormal_mixture(logx, counts.astype(float), int(k), max_iter=max_iter, tol=tol, sigma_floor=sigma_floor)
        bic = (3 * k - 1) * math.log(x.size) - 2 * ll
        model = LengthModel(tuple(w / w.sum()), tuple(mu), tuple(sd), lo, hi, cap_mass)
        if best is None or bic < best[0]:
            best = (bic, model)
    assert best is not None
    return best[1]


# ----------------------------------------------------------------------------------------------
# Class models and synthetic traces
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassModel:
    """A generative model of one request class (for synthetic traces and scaled experiments).

    Attributes:
        name: class label.
        arrival_rate: :math:`\\lambda` [requests/s].
        interarrival_cv: CV of the Gamma inter-arrival times (shape ``1/cv**2``).
        input_model, output_model: :class:`LengthModel` of input and output lengths [tokens].
        prefix_tokens, slo_s: :math:`L_{pre}` [tokens] and :math:`D` [s]; not in any trace.
    """

    name: str
    arrival_rate: float
    interarrival_cv: float
    input_model: LengthModel
    output_model: LengthModel
    prefix_tokens: float
    slo_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name: must be a non-empty string")
        for field in ("input_model", "output_model"):
            if not isinstance(getattr(self, field), LengthModel):
                raise ValueError(f"{field}: must be a LengthModel, got {type(getattr(self, field)).__name__}")
        _positive(self.arrival_rate, "arrival_rate")
        _positive(self.interarrival_cv, "interarrival_cv", allow_zero=True)
        _positive(self.prefix_tokens, "prefix_tokens", allow_zero=True)
        _positive(self.slo_s, "slo_s")

    def to_request_class(self, n_samples: int, rng: np.random.Generator) -> RequestClass:
        """A :class:`RequestClass` with ``n_samples`` sampled input/output lengths.

        ``L_max`` is the output model's upper bound ``output_model.high``.
        """
        return RequestClass(
            name=self.name,
            arrival_rate=self.arrival_rate,
            input_tokens=self.input_model.sample(n_samples, rng),
            output_tokens=self.output_model.sample(n_samples, rng),
            interarrival_cv=self.interarrival_cv,
            prefix_tokens=min(self.prefix_tokens, self.input_model.mean()),
            slo_s=self.slo_s,
            max_output_tokens=self.output_model.high,
        )

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (inverse of :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> ClassModel:
        """Rebuild from :meth:`to_dict` output."""
        if not isinstance(d, Mapping):
            raise ValueError(f"d: must be a mapping from to_dict, got {type(d).__name__}")
        try:
            return cls(
                name=d["name"],
                arrival_rate=d["arrival_rate"],
                interarrival_cv=d["interarrival_cv"],
                input_model=LengthModel(**d["input_model"]),
                output_model=LengthModel(**d["output_model"]),
                prefix_tokens=d["prefix_tokens"],
                slo_s=d["slo_s"],
            )
        except KeyError as exc:
            raise ValueError(f"d: class model is missing key {exc.args[0]!r}") from None


def fit_class_model(rc: RequestClass, *, max_components: int = 8) -> ClassModel:
    """Calibrate a :class:`ClassModel` to a :class:`RequestClass` (length mixtures by EM + BIC).

    Lengths: :func:`fit_length_model` with a detected point mass at the top (``cap_tokens=None``).
    The output model's upper bound is the class's ``L_max``; rate, CV, ``L_pre`` and ``D`` are copied.
    """
    if not isinstance(rc, RequestClass):
        raise ValueError("rc: must be a RequestClass")
    _integer(max_components, "max_components", minimum=1)
    return ClassModel(
        name=rc.name,
        arrival_rate=rc.arrival_rate,
        interarrival_cv=rc.interarrival_cv,
        input_model=fit_length_model(np.maximum(rc.input_tokens, 1), max_components=max_components, cap_tokens=None),
        output_model=fit_length_model(
            np.maximum(rc.output_tokens, 1), max_components=max_components, high=rc.max_output_tokens, cap_tokens=None
        ),
        prefix_tokens=float(rc.prefix_tokens),
        slo_s=float(rc.slo_s),
    )


def _class_models(models: object, argument: str) -> None:
    if isinstance(models, (str, bytes)) or not isinstance(models, Sequence) or len(models) == 0:
        raise ValueError(f"{argument}: need a non-empty sequence of ClassModel")
    bad = [type(m).__name__ for m in models if not isinstance(m, ClassModel)]
    if bad:
        raise ValueError(f"{argument}: every item must be a ClassModel, found {bad[0]}")


def gamma_interarrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` Gamma inter-arrival times [s] with mean ``1/rate`` and coefficient of variation ``cv``.

    Shape ``k = 1/cv**2``, scale ``1/(rate k)``; ``cv = 1`` gives a Poisson process and ``cv = 0``
    evenly spaced arrivals.
    """
    _rng(rng)
    r = _positive(rate, "rate")
    c = _positive(cv, "cv", allow_zero=True)
    _integer(n, "n")
    if c == 0:
        return np.full(int(n), 1.0 / r)
    k = 1.0 / c**2
    return rng.gamma(shape=k, scale=1.0 / (r * k), size=int(n))


def synthesize_trace(
    models: Sequence[ClassModel], duration_s: float, rng: np.random.Generator
) -> pd.DataFrame:
    """A synthetic trace in the tidy schema of :mod:`kvdro.datasets`, ``duration_s`` seconds long.

    Each class is an independent Gamma renewal process (rate, CV of its model) started at a
    stationary-ish random phase (the first arrival is one inter-arrival time after 0), with lengths
    drawn from its length models. Arrival times are *not* shifted to start at 0.
    """
    _rng(rng)
    dur = _positive(duration_s, "duration_s")
    _class_models(models, "models")
    parts = []
    for m in models:
        times: list[np.ndarray] = []
        t_end = 0.0
        chunk = max(16, int(1.5 * m.arrival_rate * dur))
        while t_end <= dur:
            t = t_end + np.cumsum(gamma_interarrivals(chunk, m.arrival_rate, m.interarrival_cv, rng))
            times.append(t)
            t_end = float(t[-1])
        t_all = np.concatenate(times)
        t_all = t_all[t_all < dur]
        n = t_all.size
        parts.append(
            pd.DataFrame(
                {
                    "arrival_s": t_all,
                    "input_tokens": m.input_model.sample(n, rng),
                    "output_tokens": m.output_model.sample(n, rng),
                    "request_class": pd.Series([m.name] * n, dtype=object),
                }
            )
        )
    out = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable", ignore_index=True)
    out.attrs["source"] = "synthetic"
    return out


def synthetic_classes(
    base: Sequence[ClassModel],
    n_classes: int,
    rng: np.random.Generator,
    *,
    length_scale: tuple[float, float] = (0.5, 2.0),
    rate_scale: tuple[float, float] = (0.25, 1.0),
    cv_scale: tuple[float, float] = (0.75, 1.25),
    max_output_tokens: int = 4096,
    max_input_tokens: int = 16384,
) -> tuple[ClassModel, ...]:
    """``n_classes`` distinct classes made by perturbing fitted ``base`` models (round robin).

    Class j copies ``base[j % len(base)]`` and multiplies its input and output length scales by
    independent log-uniform factors in ``length_scale`` (the mixtures' shapes -- e.g. the code
    class's heavy tail -- are kept), its arrival rate by a log-uniform factor in ``rate_scale`` and
    its inter-arrival CV by a uniform factor in ``cv_scale``. Upper bounds are scaled too and capped
    at ``max_output_tokens``/``max_input_tokens`` [tokens]. ``L_pre`` is kept (capped at half the
    new mean input) and ``D`` is recomputed with :func:`default_slo_s` from the new mean output.
    Names are ``f"{base}-s{j:02d}"``.
    """
    _rng(rng)
    _class_models(base, "base")
    _integer(n_classes, "n_classes", minimum=1)
    _integer(max_output_tokens, "max_output_tokens", minimum=1)
    _integer(max_input_tokens, "max_input_tokens", minimum=1)
    for arg, pair in {"length_scale": length_scale, "rate_scale": rate_scale, "cv_scale": cv_scale}.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(_is_number(v) for v in pair)
                and 0 < pair[0] <= pair[1] < math.inf):
            raise ValueError(f"{arg}: must be (low, high) with 0 < low <= high")

    def log_uniform(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    out = []
    for j in range(int(n_classes)):
        b = base[j % len(base)]
        f_in, f_out = log_uniform(*length_scale), log_uniform(*length_scale)
        inp = b.input_model.scaled(f_in, high=min(max_input_tokens, max(b.input_model.low, round(b.input_model.high * f_in))))
        outm = b.output_model.scaled(
            f_out, high=min(max_output_tokens, max(b.output_model.low, round(b.output_model.high * f_out)))
        )
        out.append(
            ClassModel(
                name=f"{b.name}-s{j:02d}",
                arrival_rate=b.arrival_rate * log_uniform(*rate_scale),
                interarrival_cv=b.interarrival_cv * float(rng.uniform(*cv_scale)),
                input_model=inp,
                output_model=outm,
                prefix_tokens=float(min(b.prefix_tokens, math.floor(inp.mean() / 2))),
                slo_s=default_slo_s(outm.mean()),
            )
        )
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# Distribution shift
# ----------------------------------------------------------------------------------------------


def shift_outputs(output_tokens: object, s: float, *, max_output_tokens: int | None = None) -> np.ndarray:
    """Output lengths scaled by ``s`` (the paper's distribution-shift experiments, Fig. 5-6).

    Each length becomes ``max(1, rint(s * x))`` -- round half to even, and at least one token
    (every request emits one) -- and, if ``max_output_tokens`` (:math:`L_{max}`) is given, is
    clipped to it. Clipping puts an atom at ``L_max`` (a generation limit truncates long answers);
    the number clipped is ``np.sum(s * x > L_max)``. Returns int64 [tokens].
    """
    x = _int_samples(output_tokens, "output_tokens")
    factor = _positive(s, "s")
    y = np.maximum(1, np.rint(factor * x)).astype(np.int64)
    if max_output_tokens is not None:
        y = np.minimum(y, _integer(max_output_tokens, "max_output_tokens", minimum=1))
    return y


def shift_trace(df: pd.DataFrame, s: float, *, max_output_tokens: int | None = None) -> pd.DataFrame:
    """A copy of a tidy trace with ``output_tokens`` shifted by :func:`shift_outputs`.

    ``attrs["shift"]`` records ``s`` and ``attrs["clipped"]`` how many lengths hit ``L_max``.
    """
    _check_tidy(df)
    out = df.copy()
    x = df["output_tokens"].to_numpy()
    out["output_tokens"] = shift_outputs(x, s, max_output_tokens=max_output_tokens)
    clipped = 0 if max_output_tokens is None else int(np.sum(np.rint(float(s) * x) > max_output_tokens))
    out.attrs = {**df.attrs, "shift": float(s), "clipped": clipped}
    return out


# ----------------------------------------------------------------------------------------------
# JSON
# ----------------------------------------------------------------------------------------------


def save_class_models(models: Sequence[ClassModel], path: str | os.PathLike[str], *, meta: Mapping | None = None) -> None:
    """Write class models (and optional metadata) to a JSON file."""
    _class_models(models, "models")
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path, got {type(path).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise ValueError(f"meta: must be a mapping or None, got {type(meta).__name__}")
    payload = {"meta": dict(meta or {}), "classes": [m.to_dict() for m in models]}
    from kvdro.cachefile import write_text_atomic

    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def load_class_models(path: str | os.PathLike[str]) -> tuple[ClassModel, ...]:
    """Read class models written by :func:`save_class_models`."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path, got {type(path).__name__}")
    p = Path(path)
    try:
        payload = json.loads(p.read_text())
        classes = payload["classes"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{p}: not a class-model file ({type(exc).__name__}: {exc})") from None
    return tuple(ClassModel.from_dict(d) for d in classes)
