"""Service time (1), Little's law for KV memory (6e), utilisation and the waiting time (7).

The reading we use (chapter 4 derives it):

* **Service time (1)** ``T_ik`` is the *work* a class-i request puts on a group of configuration k,
  in seconds of that group's time::

      T = p * alpha * L_eff / C_k  +  E[xi] * max(beta / B_k, 2 P / C_k)  +  comm

  ``L_eff = L_in - L_pre`` when the prefix is cached, else ``L_in``; alpha = FLOPs per prefill token
  (:func:`kvdro.hardware.prefill_flops_per_token`, ~2 * params); beta = bytes moved per decode token
  = weight bytes / decode batch  +  KV bytes of the mean context ``L_in + E[xi]/2`` (weights are read
  once per step and shared by the batch; each sequence reads its own KV cache); comm = two
  all-reduces per layer for the prefill plus, per decode token, the step's two all-reduces per layer
  shared by the batch. The paper's ``beta E[xi] / B_k`` with a constant beta has no batch in it; we
  amortise the weights over ``perf.decode_batch`` sequences.
* **Residence time** (:func:`residence_time`) is how long a request *holds its KV blocks*: its
  prefill plus E[xi] decode steps of a whole batch, stretched by the prefill-first steps of other
  requests. This, not the work, is what Little's law needs in the memory constraint (6e):
  occupancy = lambda * residence * r tokens.
* **The decode batch is endogenous** (chapter 7, where the simulator referees this model): a busy
  group's batch n is a fixed point of Little's law, n (1 - lambda t_pf) = lambda E[xi] t_dec(n)
  (:func:`kvdro.hardware.decode_operating_point`). The work T uses the largest batch n_max (the
  group's capacity: u = lambda T is the share of the saturation throughput); the residence time uses
  the batch n_dec and prefill share at the reference utilisation (``perf.busy_batch``,
  ``perf.prefill_share``). ``config_performance(..., decode_batch=64)`` gives the first edition's
  fixed batch of 64 for all three.
* **Utilisation** ``u = sum_i lambda_i T_i / z`` (work conservation: exact for any work-conserving
  server).
* **Waiting time (7)** -- the formula printed in the paper is garbled; we implement Kingman's G/G/1
  approximation ``W = (c_a^2 + c_s^2) / 2 * u / (1 - u) * T_bar`` with c_a^2 the squared coefficient of
  variation (SCV) of inter-arrival times and c_s^2 that of service times. With Poisson arrivals
  (c_a^2 = 1) it *is* the exact M/G/1 Pollaczek-Khinchine mean wait ``lambda E[S^2] / (2 (1 - u))``.
  :func:`simulate_gg1_wait` checks it against an exact FCFS single-server simulation.

Units: seconds, tokens, requests/second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvdro.hardware import (
    ConfigPerformance,
    Model,
    allreduce_time,
    kv_bytes_per_token,
    prefill_flops_per_token,
    weight_bytes,
)

__all__ = [
    "prefill_time",
    "decode_time_per_token",
    "service_time",
    "residence_time",
    "memory_occupancy_tokens",
    "utilisation",
    "mixture_service_moments",
    "waiting_time",
    "simulate_gg1_wait",
]


def _nonneg(name: str, value: float) -> float:
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None or np.ndim(value) != 0:
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return v


def _check_serving(model: object, perf: object) -> None:
    """ValueError naming ``model`` or ``perf`` when either is not the kvdro.hardware object (e.g. swapped)."""
    if not isinstance(model, Model):
        raise ValueError(f"model must be a kvdro.hardware.Model, got {type(model).__name__}")
    if not isinstance(perf, ConfigPerformance):
        raise ValueError(f"perf must be a kvdro.hardware.ConfigPerformance, got {type(perf).__name__}")


def _effective_prompt(input_tokens: float, prefix_tokens: float, cached_prefix: bool) -> tuple[float, float]:
    L_in = _nonneg("input_tokens", input_tokens)
    L_pre = _nonneg("prefix_tokens", prefix_tokens)
    if L_pre > L_in:
        raise ValueError(f"prefix_tokens ({L_pre}) must not exceed input_tokens ({L_in})")
    return L_in, (L_pre if cached_prefix else 0.0)


def prefill_time(model: Model, perf: ConfigPerformance, input_tokens: float, prefix_tokens: float = 0.0, cached_prefix: bool = False) -> float:
    """Prefill + bubble term of (1), seconds: ``p_k * FLOPs / C_k`` plus two all-reduces per layer.

    FLOPs = 2 P (L_in - c) + 2 N_L d (L_in^2 - c^2) with c the cached prefix (0 if not cached): the
    new tokens' weight FLOPs and their causal attention, which still attends over the cached prefix.
    """
    _check_serving(model, perf)
    L_in, c = _effective_prompt(input_tokens, prefix_tokens, cached_prefix)
    new = L_in - c
    if new == 0:
        return 0.0
    d = model.n_heads * model.head_dim
    flops = prefill_flops_per_token(model, 0.0) * new + 2.0 * model.n_layers * d * (L_in**2 - c**2)
    comm = 2 * model.n_layers * allreduce_time(perf.gpu, new * model.hidden * model.dtype_bytes, perf.config.tp)
    return perf.config.pp * flops / perf.compute_flops + comm


def decode_time_per_token(model: Model, perf: ConfigPerformance, context_tokens: float, batch: float | None = None) -> float:
    """Decode term of (1) per generated token, seconds of group time: ``max(beta / B_k, 2P / C_k)`` plus
    the step's all-reduces shared by the batch, ``2 N_L t_ar / n``, at a decode batch of ``batch``
    sequences (default ``perf.decode_batch``).

    beta = weight_bytes / n + kv_bytes_per_token * context_tokens * eta_m / eta_attn (bytes per decode
    token): each sequence reads its own KV cache, at the bandwidth attention kernels reach
    (:attr:`kvdro.hardware.GPU.attention_bandwidth`), a fraction eta_attn / eta_m of the GEMMs'.
    """
    _check_serving(model, perf)
    ctx = _nonneg("context_tokens", context_tokens)
    n = perf.decode_batch if batch is None else _nonneg("batch", batch)
    if n <= 0:
        raise ValueError(f"batch must be positive, got {batch!r}")
    gpu = perf.gpu
    kv_weight = gpu.hbm_efficiency * gpu.hbm_bandwidth / gpu.attention_bandwidth
    beta = weight_bytes(model) / n + kv_bytes_per_token(model) * ctx * kv_weight
    compute = prefill_flops_per_token(model, 0.0) / perf.compute_flops
    t_ar = perf.allreduce_s if batch is None else allreduce_time(gpu, n * model.hidden * model.dtype_bytes, perf.config.tp)
    return max(beta / perf.bandwidth, compute) + 2 * model.n_layers * t_ar / n


def service_time(
    model: Model,
    perf: ConfigPerformance,
    input_tokens: float,
    mean_output_tokens: float,
    prefix_tokens: float = 0.0,
    cached_prefix: bool = False,
) -> float:
    """Service time T_ik of (1), seconds: the work one request puts on a group (see module doc).

    A cached prefix (``cached_prefix=True``) shortens the prefill to ``input_tokens - prefix_tokens``.
    Decode uses the mean context ``L_in + E[xi]/2`` (the cache grows by one token per step).
    """
    _check_serving(model, perf)
    L_in, _ = _effective_prompt(input_tokens, prefix_tokens, cached_prefix)
    mean_out = _nonneg("mean_output_tokens", mean_output_tokens)
    return prefill_time(model, perf, input_tokens, prefix_tokens, cached_prefix) + mean_out * decode_time_per_token(
        model, perf, L_in + mean_out / 2
    )


def residence_time(
    model: Model,
    perf: ConfigPerformance,
    input_tokens: float,
    mean_output_tokens: float,
    prefix_tokens: float = 0.0,
    cached_prefix: bool = False,
) -> float:
    """Seconds a request holds its KV blocks: its prefill plus E[xi] engine steps of a busy group,
    stretched by the prefill steps of the others (vLLM's prefill-first scheduling).

    A busy group decodes ``n = perf.busy_batch`` sequences in each of its ``pp`` micro-batch engines,
    so a step lasts ``pp * n`` times the per-token work at batch n; the request needs E[xi] such
    steps, and decoding stops during the fraction ``s = perf.prefill_share`` of the time spent on
    other requests' prefills: H = prefill + E[xi] pp n t(n) / (1 - s). n and s are the endogenous
    operating point of :func:`kvdro.hardware.decode_operating_point` (a fixed point of Little's law,
    chapter 7). Use this time in Little's law for memory, (6e), and in the response time of (6f).
    """
    _check_serving(model, perf)
    L_in, _ = _effective_prompt(input_tokens, prefix_tokens, cached_prefix)
    mean_out = _nonneg("mean_output_tokens", mean_output_tokens)
    n = perf.busy_batch
    per_token = decode_time_per_token(model, perf, L_in + mean_out / 2, batch=n)
    stall = 1.0 / (1.0 - perf.prefill_share)
    return prefill_time(model, perf, input_tokens, prefix_tokens, cached_prefix) + mean_out * perf.config.pp * n * per_token * stall


def memory_occupancy_tokens(arrival_rate: float, service_time_s: float, reserved_tokens: float) -> float:
    """Little's law for memory: mean KV tokens held = lambda * T * r (requests/s * s * tokens/request)."""
    lam = _nonneg("arrival_rate", arrival_rate)
    T = _nonneg("service_time_s", service_time_s)
    r = _nonneg("reserved_tokens", reserved_tokens)
    return lam * T * r


def _vector(name: str, values: Sequence[float] | np.ndarray | float) -> np.ndarray:
    if values is None or isinstance(values, (str, bytes)):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got {values!r}")
    raw = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    if any(isinstance(v, (str, bytes, bool, np.bool_)) or v is None for v in np.atleast_1d(raw).ravel()):
        raise ValueError(f"{name} must hold numbers only, got {values!r}")
    try:
        arr = np.atleast_1d(np.asarray(values, dtype=float))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got {values!r}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be non-negative and finite")
    return arr


def utilisation(arrival_rates: Sequence[float] | float, service_times_s: Sequence[float] | float, groups: float = 1.0) -> float:
    """u_k = sum_i lambda_i T_ik / z_k: the fraction of time each of ``groups`` identical groups is busy,
    arrivals being split evenly over the groups. No upper bound is enforced here (u >= 1 is overload)."""
    lam = _vector("arrival_rates", arrival_rates)
    T = _vector("service_times_s", service_times_s)
    if lam.shape != T.shape:
        raise ValueError(f"arrival_rates and service_times_s must have the same length ({lam.size} != {T.size})")
    z = _nonneg("groups", groups)
    if z == 0:
        raise ValueError("groups must be positive")
    return float(lam @ T / z)


def mixture_service_moments(
    arrival_rates: Sequence[float] | float,
    mean_service_s: Sequence[float] | float,
    var_service_s2: Sequence[float] | float,
) -> tuple[float, float]:
    """Mean (seconds) and SCV c_s^2 of the service time of a random arrival to a group that serves
    several classes: class i arrives with weight lambda_i and has service mean T_i and variance V_i.

    E[S] = sum w_i T_i, E[S^2] = sum w_i (V_i + T_i^2), c_s^2 = E[S^2] / E[S]^2 - 1 (w = lambda / sum lambda).
    """
    lam = _vector("arrival_rates", arrival_rates)
    T = _vector("mean_service_s", mean_service_s)
    V = _vector("var_service_s2", var_service_s2)
    if not (lam.shape == T.shape == V.shape):
        raise ValueError("arrival_rates, mean_service_s and var_service_s2 must have the same length")
    if lam.sum() == 0:
        raise ValueError("arrival_rates must not all be zero")
    w = lam / lam.sum()
    m1 = float(w @ T)
    if m1 == 0:
        raise ValueError("mean_service_s must not all be zero")
    m2 = float(w @ (V + T**2))
    return m1, max(m2 / m1**2 - 1.0, 0.0)


def waiting_time(utilisation: float, mean_service_s: float, service_scv: float, arrival_scv: float = 1.0) -> float:
    """Mean queueing delay W_k of (7), seconds -- Kingman's G/G/1 approximation:

        W = (c_a^2 + c_s^2) / 2 * u / (1 - u) * T_bar,

    ``arrival_scv`` = c_a^2 (1 for Poisson arrivals; then W is the exact M/G/1 Pollaczek-Khinchine mean
    wait), ``service_scv`` = c_s^2. Raises ValueError if u >= 1 (no steady state) or u < 0.
    """
    u = _nonneg("utilisation", utilisation)
    if u >= 1:
        raise ValueError(f"utilisation must be < 1 for a steady state, got {u!r}")
    T = _nonneg("mean_service_s", mean_service_s)
    cs2 = _nonneg("service_scv", service_scv)
    ca2 = _nonneg("arrival_scv", arrival_scv)
    return (ca2 + cs2) / 2.0 * u / (1.0 - u) * T


def _gamma(rng: np.random.Generator, mean: float, scv: float, size: int) -> np.ndarray:
    if scv == 0:
        return np.full(size, mean)
    return rng.gamma(shape=1.0 / scv, scale=mean * scv, size=size)


def simulate_gg1_wait(
    arrival_rate: float,
    arrival_scv: float,
    mean_service_s: float,
    service_scv: float,
    n_customers: int,
    rng: np.random.Generator,
    warmup: int | None = None,
    service_samples: np.ndarray | None = None,
) -> float:
    """Mean FCFS waiting time (seconds) of a single-server queue, simulated exactly (Lindley recursion).

    Inter-arrival times are Gamma with mean 1/lambda and SCV ``arrival_scv`` (1 = Poisson); service
    times are Gamma with mean ``mean_service_s`` and SCV ``service_scv`` -- or, if ``service_samples``
    is given, drawn with replacement from it (then ``mean_service_s``/``service_scv`` are ignored).
    The first ``warmup`` customers (default n/10) are dropped. Lindley: W_{n+1} = max(0, W_n + S_n - A_{n+1}),
    computed vectorised as W_n = P_n - min_{k<=n} P_k with P the partial sums of S_{k-1} - A_k.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator (seeded by the caller)")
    lam = _nonneg("arrival_rate", arrival_rate)
    if lam == 0:
        raise ValueError("arrival_rate must be positive")
    ca2 = _nonneg("arrival_scv", arrival_scv)
    if isinstance(n_customers, bool) or int(n_customers) != n_customers or n_customers < 2:
        raise ValueError(f"n_customers must be an integer >= 2, got {n_customers!r}")
    n = int(n_customers)
    if warmup is not None and (isinstance(warmup, (bool, np.bool_)) or not isinstance(warmup, (int, np.integer))):
        raise ValueError(f"warmup must be an integer in [0, n_customers), got {warmup!r}")
    warm = n // 10 if warmup is None else int(warmup)
    if not (0 <= warm < n):
        raise ValueError(f"warmup must be in [0, n_customers), got {warmup!r}")
    if service_samples is None:
        mean_s = _nonneg("mean_service_s", mean_service_s)
        cs2 = _nonneg("service_scv", service_scv)
        services = _gamma(rng, mean_s, cs2, n)
    else:
        pool = _vector("service_samples", service_samples)
        services = rng.choice(pool, size=n, replace=True)
    gaps = _gamma(rng, 1.0 / lam, ca2, n)
    steps = np.empty(n)
    steps[0] = 0.0
    steps[1:] = services[:-1] - gaps[1:]
    partial = np.cumsum(steps)
    waits = partial - np.minimum.accumulate(np.minimum(partial, 0.0))
    return float(waits[warm:].mean())

