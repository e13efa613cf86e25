"""Admission policies: vLLM's reactive default and the reservation buffers eta_i of the paper's baselines.

A reservation policy admits a class-i request only when the free KV blocks cover
``ceil((L_in + eta_i) / 16)`` blocks; :func:`policy_buffers` computes eta_i [tokens] per class from
a training trace:

============  =================================================================================
``vllm``      no reservation: vLLM's own reactive admission (prompt blocks above the 1% watermark);
              :func:`policy_buffers` returns an empty :class:`Buffers`.
``max``       the largest training output of the class (never preempts in-sample).
``mean``      the mean training output, E[xi_i].
``p90`` ...   the lower empirical 0.90 / 0.95 / 0.99 quantile of the training outputs.
``saa``       the SAA newsvendor buffer: the lower q* = rho/(rho+1) quantile (chapter 2, (9)-(10)).
``dro``       the Wasserstein-DRO buffer of chapter 3 (closed form), eps = 0.15 E[xi_i],
              support [0, L_max^i] with L_max^i the largest training output.
``lp1/lp2``   "LP+1σ" / "LP+2σ" (:data:`DISPLAY_NAMES`), our reading: a **length predictor** -- per class, the least-squares
              line xi ~ a_i + b_i L_in fitted on the training part -- plus k = 1 or 2 standard
              deviations of its residuals: eta = a_i + b_i L_in + k sigma_i, so the buffer depends on
              the request's own prompt length (clipped to [0, L_max^i]).
============  =================================================================================

Two **oracles** (:data:`ORACLE_POLICIES`) know every request's true output length xi (after the
context cap); they bound what knowing the length is worth and need no training data
(:func:`policy_buffers` returns an empty :class:`Buffers`):

============  =================================================================================
``oracle``    vLLM's reactive admission plus a look-ahead with the true lengths: a request is
              admitted only if no running sequence will ever run out of blocks (the block usage
              of every known trajectory stays below the watermark's line); it never preempts
              (:mod:`kvdro.sim.scheduler`).
``exact``     a reservation of exactly L_in + xi tokens, eta = xi per request: it never outgrows
              its reservation, and holds those blocks from admission on.
============  =================================================================================

Units: tokens. rho = c_p / c_w.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvdro.newsvendor import saa_reservation
from kvdro.sim.deployment import _real
from kvdro.wasserstein import dro_reservation

__all__ = ["ALL_POLICIES", "DISPLAY_NAMES", "ORACLE_POLICIES", "POLICIES", "RESERVATION_POLICIES", "Buffers",
           "policy_buffers", "request_buffers"]

#: The deployable policies (no knowledge of a request's output length), in the order tables show them;
#: the sweeps iterate over these.
POLICIES: tuple[str, ...] = ("vllm", "max", "mean", "p90", "p95", "p99", "saa", "dro", "lp1", "lp2")
#: The policies that reserve a buffer fitted on training data (all of :data:`POLICIES` but ``vllm``).
RESERVATION_POLICIES: tuple[str, ...] = POLICIES[1:]
#: The oracles, which know each request's true output length (bounds, not deployable policies).
ORACLE_POLICIES: tuple[str, ...] = ("oracle", "exact")
#: Every policy name the simulator accepts.
ALL_POLICIES: tuple[str, ...] = POLICIES + ORACLE_POLICIES
#: How tables and charts name the policies (the CLI keeps the names above; `oracle` is shown as what it is, the
#: FCFS no-preemption look-ahead). "LP+1σ"/"LP+2σ" are the
#: paper's length-predictor baselines, not chapter 6's linear programs LP1/LP2.
DISPLAY_NAMES: dict[str, str] = {"vllm": "vLLM", "max": "Max", "mean": "Mean", "p90": "P90", "p95": "P95", "p99": "P99",
                                 "saa": "SAA", "dro": "DRO", "lp1": "LP+1σ", "lp2": "LP+2σ",
                                 "oracle": "Look-ahead", "exact": "Exact"}

_QUANTILES = {"p90": 0.90, "p95": 0.95, "p99": 0.99}


class Buffers(dict):
    """Class name -> buffer eta_i [tokens] (a plain ``dict`` to every reader).

    ``slope`` (class -> b_i, tokens per prompt token) and ``mean_input`` (class -> mean training
    prompt length) are set only by the ``lp1``/``lp2`` predictors: a request of class i with prompt
    ``L_in`` then gets ``eta = self[i] + b_i (L_in - mean_input[i])``, clipped to ``[0, cap[i]]``.
    ``self[i]`` is the buffer at the class's mean prompt.
    """

    def __init__(self, values: Mapping[str, float] | None = None, *, slope: Mapping[str, float] | None = None,
                 mean_input: Mapping[str, float] | None = None, cap: Mapping[str, float] | None = None):
        super().__init__(values or {})
        self.slope = dict(slope or {})
        self.mean_input = dict(mean_input or {})
        self.cap = dict(cap or {})


def _check_train(train: pd.DataFrame) -> None:
    if not isinstance(train, pd.DataFrame):
        raise ValueError("train: must be a pandas DataFrame in kvdro.datasets' tidy schema")
    for col in ("input_tokens", "output_tokens", "request_class"):
        if col not in train.columns:
            raise ValueError(f"train: missing column {col!r}")
    if len(train) == 0:
        raise ValueError("train: empty trace")
    from kvdro.sim.simulate import _numeric_column  # simulate imports this module

    for col in ("input_tokens", "output_tokens"):  # numbers, not text or booleans; each column once
        _numeric_column(train, col, "train", "tokens")
    out = train["output_tokens"].to_numpy(dtype=float)
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise ValueError("train: column 'output_tokens' must hold non-negative finite token counts")


def policy_buffers(
    policy: str,
    train: pd.DataFrame,
    *,
    rho: float,
    c_w: float = 1.0,
    eps_fraction: float = 0.15,
) -> Buffers:
    """Per-class output buffers eta_i [tokens] of ``policy``, fitted on the tidy trace ``train``.

    ``rho`` = c_p / c_w sets the critical fractile of ``saa`` and ``dro``; ``eps_fraction`` sets the
    Wasserstein radius of ``dro``, eps_i = eps_fraction * E[xi_i] (the paper's 0.15). Returns an
    empty :class:`Buffers` for ``vllm`` (reactive: no reservation) and for the oracles ``oracle``
    and ``exact`` (they read each request's true length, not a per-class buffer: ``exact``'s
    eta = xi is set per request by :func:`kvdro.sim.simulate`). See the module tables.

    Raises:
        ValueError: unknown policy, bad ``rho``/``c_w``/``eps_fraction``, or a malformed ``train``.
    """
    if policy not in ALL_POLICIES:
        raise ValueError(f"policy: must be one of {ALL_POLICIES}, got {policy!r}")
    for name, value in (("rho", rho), ("c_w", c_w)):
        if not (_real(name, value) > 0):  # strings and booleans refused, not converted
            raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
    if not (_real("eps_fraction", eps_fraction) >= 0):
        raise ValueError(f"eps_fraction: must be a non-negative finite number, got {eps_fraction!r}")
    _check_train(train)
    if policy == "vllm" or policy in ORACLE_POLICIES:
        return Buffers()
    c_p = rho * c_w
    values, slope, mean_in, cap = {}, {}, {}, {}
    for name, part in train.groupby("request_class", sort=True, observed=True):
        xi = part["output_tokens"].to_numpy(dtype=float)
        L_max = float(xi.max())
        cap[str(name)] = L_max
        if policy == "max":
            eta = L_max
        elif policy == "mean":
            eta = float(xi.mean())
        elif policy in _QUANTILES:
            eta = saa_reservation(xi, _QUANTILES[policy], 1.0 - _QUANTILES[policy])
        elif policy == "saa":
            eta = saa_reservation(xi, c_p, c_w)
        elif policy == "dro":
            eta = dro_reservation(xi, c_p, c_w, eps_fraction * float(xi.mean()), L_max)
        else:  # lp1, lp2: least-squares length predictor + k sigma of its residuals
            k = 1.0 if policy == "lp1" else 2.0
            x = part["input_tokens"].to_numpy(dtype=float)
            if xi.size >= 2 and np.ptp(x) > 0:
                b, a = np.polyfit(x, xi, 1)
            else:
                b, a = 0.0, float(xi.mean())
            resid = xi - (a + b * x)
            sigma = float(resid.std())
            mean_in[str(name)] = float(x.mean())
            slope[str(name)] = float(b)
            eta = float(np.clip(a + b * x.mean() + k * sigma, 0.0, L_max))
        values[str(name)] = float(eta)
    if policy in ("lp1", "lp2"):
        return Buffers(values, slope=slope, mean_input=mean_in, cap=cap)
    return Buffers(values)


def request_buffers(buffers: Mapping[str, float], request_class: np.ndarray, input_tokens: np.ndarray) -> np.ndarray:
    """Per-request buffer eta [tokens] from per-class ``buffers`` (and an ``lp`` predictor's slopes).

    Raises ValueError naming a trace class that has no buffer, or a negative / non-finite buffer, or
    one given as text or a boolean. A buffer may be any finite size: :func:`kvdro.sim.simulate`
    clips it to the context window before casting it to an integer (``SimResult.clipped_buffers``).
    """
    eta = np.empty(len(request_class))
    classes = pd.unique(request_class)
    for name in classes:
        if str(name) not in buffers:
            raise ValueError(f"buffers: no buffer for request class {name!r} (have {sorted(buffers)})")
        value = _real(f"buffers[{str(name)!r}]", buffers[str(name)])  # "10" or True refused, not converted
        if not value >= 0:
            raise ValueError(f"buffers: buffer of class {name!r} must be a non-negative finite number, got {value!r}")
        mask = request_class == name
        slope = getattr(buffers, "slope", {}).get(str(name), 0.0)
        if slope:
            mean_in = buffers.mean_input[str(name)]
            cap = buffers.cap.get(str(name), np.inf)
            eta[mask] = np.clip(value + slope * (input_tokens[mask] - mean_in), 0.0, cap)
        else:
            eta[mask] = value
    return eta
