"""Serving-side coefficients of the joint problem: work, residence time and waiting time per group.

Which time goes where (the reading of :mod:`kvdro.queueing`, chapter 4):

* the **work** ``T_ik`` of (1) (:func:`kvdro.queueing.service_time`, seconds of group time per request)
  sets the utilisation ``u_k = sum_i lambda_i pi_ik T_ik / z_k`` and is the service time of the
  queue in (7);
* the **residence time** ``H_ik`` (:func:`kvdro.queueing.residence_time`, how long a request holds
  its KV blocks: its prefill plus E[xi] steps of a full decode batch) is what Little's law needs in
  the memory constraint (6e), and what a request experiences, so the response time in (6f) is
  ``W_k + H_ik``.

Both are tabulated with and without the cached prefix (delta_ik = 1 shortens the prefill to
``L_in - L_pre``).

**Waiting time W_k (7) -- the model the exact solver optimises.** Kingman's G/G/1 approximation
(:func:`kvdro.queueing.waiting_time`) for one group of configuration k,

    W_k = phi_k(u_k),   phi_k(u) = (c_a^2 + c_s^2) / 2 * u / (1 - u) * Tbar_k,

with the service-time moments (Tbar_k, c_s^2) and the arrival SCV c_a^2 of the **whole workload
mix** (every class, weighted by its rate; the within-class variance of the work comes from the
output length, ``Var_ik = (dT/dxi)^2 Var(xi_i)``; c_a^2 is the rate-weighted mean of the classes'
inter-arrival SCVs, Whitt's QNA superposition rule), so that W_k depends on the decision only
through the group's utilisation u_k = sum_i lambda_i pi_ik T_ik / z_k. Then phi_k is evaluated at
the **upper edge of the utilisation band** containing u_k (:func:`band_edges`): a step
function that bounds phi_k from above and that a MILP represents exactly (one binary per
(z_k, band) pair). :func:`waiting_model` is that function; the exact solver and
:func:`kvdro.joint.objective.evaluate` both use it, so "proven optimal" is optimal for this model.

:func:`group_state` also reports, as a diagnostic, Kingman's W with the group's *own* class mix and
QNA-thinned arrival SCV (``p c_i^2 + 1 - p`` for a random share p = pi_ik / z_k of class i), which
is closer to what the simulator sees but depends on the routing non-linearly.

**Two serving models, one switch** (``Instance(..., serving="analytic"|"calibrated")``). Everything
above is the *analytic* model of chapter 4. The *calibrated* model (chapter 7, "One model for
planner and engine") takes the same four kinds of coefficient from a table the simulator measured
(:class:`CalibrationTable`, ``data/calibration_bands.csv``, written by :mod:`kvdro.calibration`),
per configuration k and utilisation band j (the bands of :func:`band_edges`):

* the work ``T_ik`` = analytic work x ``work_scale_k``, where ``work_scale_k`` makes ``u = 1`` the
  simulated saturation throughput of one group of k (so u is a share of what the engine delivers);
* the waiting time ``W_kj`` = the simulator's mean wait of a group run at the band's upper edge
  (replaces phi_k(u_j) in :func:`band_waiting_s`; still a step function of the band);
* the residence ``H_ik = a_kj + b_kj (L_in^i - delta L_pre^i) + c_kj E[xi_i]`` (a least-squares line
  over the simulated requests), read at one band per configuration, ``Instance.operating_bands``
  (default: the top band, like the analytic model's 90 % reference point). Banding H inside the MILP
  would need a product pi_ik [band_k = j] H_ikj that the current formulations do not have, so H is
  resolved by the plan -> simulate -> recalibrate loop (:func:`kvdro.calibration.calibration_loop`):
  it sets each configuration's operating band to the band its plan visits;
* the KV occupancy per reserved token ``m_kj`` = simulated mean KV tokens held / the Little's-law
  tokens sum_i lambda_i H_ik r_i of the formula; it enters (6e) as the effective capacity
  ``M_k / m_kj`` (:attr:`Instance.capacity_tokens`; the prefix term of (6e) is scaled with it),
  at the same operating band as H.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.queueing import (
    decode_time_per_token,
    mixture_service_moments,
    residence_time,
    service_time,
    waiting_time,
)

__all__ = [
    "service_table",
    "residence_table",
    "service_variance_table",
    "mix_waiting_coefficients",
    "band_edges",
    "band_waiting_s",
    "waiting_model",
    "band_of",
    "BAND_TOLERANCE",
    "GroupState",
    "group_state",
    "SERVING_MODELS",
    "CALIBRATION_FILE",
    "CALIBRATION_COLUMNS",
    "CalibrationTable",
    "load_calibration",
    "calibration_for",
    "residence_line",
    "RATIO_LEVELS",
    "ratio_cdf",
]

#: The two serving models of ``Instance(serving=...)``.
SERVING_MODELS = ("analytic", "calibrated")
#: The simulator-measured table (``python -m kvdro.bench calibration`` regenerates it).
CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "data" / "calibration_bands.csv"
#: Its columns: per (source, config, band): the band's upper edge, the arrival rate of the run
#: [req/s], the simulated saturation throughput [req/s] and work scale of the config, the mean wait
#: [s], the share of requests that waited under 1 s, the residence line (a [s], b [s per input
#: token], c [s per output token]), the KV occupancy per reserved token, the measured KV use, the
#: number of requests, and the deciles of e2e / (W + a + b L_in + c xi) per request.
CALIBRATION_COLUMNS = (
    "source", "config", "band", "u_edge", "rate_rps", "sat_rps", "work_scale", "wait_mean_s",
    "wait_short_share", "res_a_s", "res_b_s", "res_c_s", "kv_ratio", "kv_use", "requests",
) + tuple(f"e2e_ratio_q{q}" for q in range(10, 100, 10))

#: Levels of the ``e2e_ratio_q*`` columns: deciles of a request's end-to-end time over the model's
#: own prediction for it, W + a + b L_in + c xi (the spread the means leave out; goodput reads it).
RATIO_LEVELS = np.arange(1, 10) / 10.0


def _table(instance, fn) -> np.ndarray:
    out = np.empty((instance.n_classes, instance.n_configs, 2))
    for i, c in enumerate(instance.classes):
        for k, perf in enumerate(instance.configs):
            for cached in (0, 1):
                out[i, k, cached] = fn(
                    instance.model,
                    perf,
                    c.mean_input_tokens,
                    c.mean_output_tokens,
                    float(c.prefix_tokens),
                    bool(cached),
                )
    return out


def service_table(instance) -> np.ndarray:
    """Work T_ik of (1) [s], shape (I, K, 2): index 1 = with the cached prefix."""
    return _table(instance, service_time)


def residence_table(instance) -> np.ndarray:
    """Residence time H_ik [s] (KV blocks held; response time without queueing), shape (I, K, 2)."""
    return _table(instance, residence_time)


def service_variance_table(instance) -> np.ndarray:
    """Within-class variance of the work, (dT/dxi)^2 Var(xi_i) [s^2], shape (I, K)."""
    out = np.empty((instance.n_classes, instance.n_configs))
    for i, c in enumerate(instance.classes):
        var_xi = float(np.var(c.output_tokens))
        for k, perf in enumerate(instance.configs):
            per_token = decode_time_per_token(instance.model, perf, c.mean_input_tokens + c.mean_output_tokens / 2)
            out[i, k] = per_token**2 * var_xi
    return out


def mix_waiting_coefficients(instance) -> np.ndarray:
    """(c_a^2 + c_s^2) / 2 * Tbar_k [s] per configuration, for the whole workload mix (module doc):
    W_k = coefficient_k * u / (1 - u)."""
    lam = instance.rates
    cv2 = np.array([c.interarrival_cv**2 for c in instance.classes])
    ca2 = float(lam @ cv2 / lam.sum())
    out = np.empty(instance.n_configs)
    for k in range(instance.n_configs):
        mean, cs2 = mixture_service_moments(lam, instance.service_s[:, k, 0], instance.service_variance_s2[:, k])
        out[k] = (ca2 + cs2) / 2.0 * mean
    return out


def band_edges(instance) -> np.ndarray:
    """Upper edges u_j of the utilisation bands, equally spaced in log(1 - u):
    ``1 - u_j = (1 - u_max)^(j/B)``, j = 1..B (B = instance.waiting_bands), so u_B = u_max.

    Within band j the step bound over-estimates the factor 1/(1 - u) of (7) by at most
    ``(1 - u_max)^(-1/B)`` (1.26 for u_max = 0.9, B = 10): bands are narrow where W is steep.
    """
    B = instance.waiting_bands
    return 1.0 - (1.0 - instance.u_max) ** (np.arange(1, B + 1) / B)


def band_waiting_s(instance) -> np.ndarray:
    """W at each band's upper edge [s], shape (K, B): the constants the MILP multiplies pi by.

    Analytic: Kingman's phi_k(u_j). Calibrated: the simulator's mean wait at u_j (:class:`CalibrationTable`).
    """
    if getattr(instance, "serving", "analytic") == "calibrated":
        return calibration_for(instance).wait_s.copy()
    edges = band_edges(instance)
    return instance.mix_waiting_coefficients[:, None] * (edges / (1.0 - edges))[None, :]


#: Tolerance [utilisation, a fraction] with which a utilisation on a band edge counts as inside that
#: band, in :func:`waiting_model` (and so in :func:`kvdro.joint.evaluate`) and in the utilisation
#: check of ``evaluate``. The MILP states ``work <= n u_j`` exactly, but HiGHS accepts a point that
#: violates a row by up to its feasibility tolerances (``primal_feasibility_tolerance`` 1e-7 and
#: ``mip_feasibility_tolerance`` 1e-6, which :mod:`kvdro.joint.exact` sets explicitly), so a solution it
#: places in band j may sit up to ~1e-6 above u_j. A tolerance ten times the larger of the two makes
#: ``evaluate`` put every solver-feasible point in the band the solver chose; a point more than
#: 1e-5 above an edge is in the next band. (An earlier tolerance of 1e-9 sent a point 1.6e-7 above an
#: edge to the next band: W jumped by a factor 2.5 with no violation reported.)
BAND_TOLERANCE = 1e-5


def waiting_model(instance, utilisation: np.ndarray) -> np.ndarray:
    """W_k [s] of the exact model: phi_k at the upper edge of u_k's band; 0 if u_k = 0, inf if u_k > u_max.

    A utilisation up to :data:`BAND_TOLERANCE` above an edge counts as inside that band (and up to it
    above u_max as inside the last band), so that this function and the MILP agree on the band of
    every point HiGHS accepts as feasible.

    Raises:
        ValueError: ``utilisation`` is not one non-negative number (or inf) per configuration.
    """
    try:
        u = np.asarray(utilisation, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"utilisation: must be an array of numbers, got {utilisation!r}") from None
    if u.shape != (instance.n_configs,) or np.any(np.isnan(u)) or np.any(u < 0):
        raise ValueError(f"utilisation: need one non-negative number per configuration ({instance.n_configs}), got {utilisation!r}")
    edges = band_edges(instance)
    table = band_waiting_s(instance)
    out = np.zeros(u.shape)
    for k, uk in enumerate(u):
        if uk <= 1e-12:
            continue
        j = int(np.searchsorted(edges, uk - BAND_TOLERANCE, side="left"))
        out[k] = table[k, j] if j < edges.size else np.inf
    return out


def band_of(instance, utilisation: np.ndarray) -> np.ndarray:
    """Index j of the band each u_k falls in (with :data:`BAND_TOLERANCE`); -1 for u_k = 0, B above u_max."""
    u = np.asarray(utilisation, dtype=float)
    edges = band_edges(instance)
    j = np.searchsorted(edges, u - BAND_TOLERANCE, side="left")
    return np.where(u <= 1e-12, -1, j)


@dataclass(frozen=True)
class GroupState:
    """Per-configuration queueing state of one decision (arrays of shape (K,)).

    utilisation: u_k of one group; waiting_s: W_k [s] of the exact model (:func:`waiting_model`);
    waiting_mix_s: diagnostic Kingman W with the group's own mix (``inf`` when u_k >= 1);
    arrival_scv, service_mean_s, service_scv: the inputs of that diagnostic.
    """

    utilisation: np.ndarray
    waiting_s: np.ndarray
    waiting_mix_s: np.ndarray
    arrival_scv: np.ndarray
    service_mean_s: np.ndarray
    service_scv: np.ndarray


def group_state(instance, z: np.ndarray, pi: np.ndarray, delta: np.ndarray) -> GroupState:
    """Utilisation and waiting times of each configuration's groups for a decision (z, pi, delta).

    Traffic lambda_i pi_ik is split evenly over the z_k groups.
    """
    z = np.asarray(z, dtype=float)
    pi = np.asarray(pi, dtype=float)
    d = np.asarray(delta, dtype=bool)
    lam = instance.rates
    T = np.where(d, instance.service_s[:, :, 1], instance.service_s[:, :, 0])
    V = instance.service_variance_s2
    cv2 = np.array([c.interarrival_cv**2 for c in instance.classes])
    K = instance.n_configs
    u = np.zeros(K)
    Wmix = np.zeros(K)
    ca2 = np.ones(K)
    mean = np.zeros(K)
    cs2 = np.zeros(K)
    for k in range(K):
        flow = lam * np.clip(pi[:, k], 0.0, None)
        if flow.sum() <= 0:
            continue
        if z[k] <= 0:
            u[k] = np.inf
            Wmix[k] = np.inf
            continue
        share = np.minimum(np.clip(pi[:, k], 0.0, None) / z[k], 1.0)
        rate_g = flow / z[k]
        ca2[k] = float(rate_g @ (share * cv2 + 1.0 - share) / rate_g.sum())
        mean[k], cs2[k] = mixture_service_moments(rate_g, T[:, k], V[:, k])
        u[k] = float(rate_g @ T[:, k])
        Wmix[k] = waiting_time(u[k], mean[k], cs2[k], ca2[k]) if u[k] < 1 else np.inf
    return GroupState(
        utilisation=u,
        waiting_s=waiting_model(instance, u),
        waiting_mix_s=Wmix,
        arrival_scv=ca2,
        service_mean_s=mean,
        service_scv=cs2,
    )


# ------------------------------------------------------------------------------------------------
# The calibrated serving model: the simulator's table
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CalibrationTable:
    """Simulator-measured serving coefficients per (configuration, utilisation band) of one source.

    Attributes:
        source: the traces it was measured on (``"real"``: the Azure 2023 training half;
            ``"synthetic"``: the large family's synthetic training half).
        frame: one row per (config, band) with :data:`CALIBRATION_COLUMNS` (``band`` 0-based, as
            :func:`band_of`).
    """

    source: str
    frame: pd.DataFrame = field(repr=False)

    def __post_init__(self) -> None:
        missing = [c for c in CALIBRATION_COLUMNS if c not in self.frame.columns]
        if missing:
            raise ValueError(f"frame: calibration table lacks column(s) {missing}")
        f = self.frame[self.frame["source"] == self.source]
        if f.empty:
            raise ValueError(f"source: no calibration rows for {self.source!r} (have {sorted(self.frame['source'].unique())})")
        num = [c for c in CALIBRATION_COLUMNS if c not in ("source", "config")]
        vals = f[num].to_numpy(dtype=float)
        if not np.all(np.isfinite(vals)):
            raise ValueError(f"frame: calibration rows of {self.source!r} hold a non-finite number")
        object.__setattr__(self, "frame", f.sort_values(["config", "band"]).reset_index(drop=True))

    @property
    def configs(self) -> tuple[str, ...]:
        return tuple(sorted(self.frame["config"].unique()))

    def rows(self, config: str) -> pd.DataFrame:
        """The rows of ``config`` (a name like ``"TP4-PP1"``), ordered by band."""
        r = self.frame[self.frame["config"] == config]
        if r.empty:
            raise ValueError(f"config: {config!r} is not in the calibration table ({', '.join(self.configs)})")
        return r

    def with_rows(self, updates: pd.DataFrame) -> CalibrationTable:
        """A copy with the (config, band) rows of ``updates`` replaced (the loop's refits)."""
        f = self.frame.set_index(["config", "band"])
        u = updates.assign(source=self.source).set_index(["config", "band"])
        f.update(u[[c for c in u.columns if c in f.columns]])
        return replace(self, frame=f.reset_index()[list(CALIBRATION_COLUMNS)])


@lru_cache(maxsize=4)
def _read(path: str, mtime: float) -> pd.DataFrame:
    return pd.read_csv(path)


def load_calibration(source: str = "real", path: Path | str | None = None) -> CalibrationTable:
    """The calibration table of ``source`` from ``path`` (default :data:`CALIBRATION_FILE`).

    Raises:
        ValueError: the file is missing (naming the command that writes it) or lacks a column/source.
    """
    p = Path(CALIBRATION_FILE if path is None else path)
    if not p.is_file():
        raise ValueError(f"path: {p} does not exist; write it with `python -m kvdro.bench calibration`")
    return CalibrationTable(source=source, frame=_read(str(p), p.stat().st_mtime).copy())


@dataclass(frozen=True)
class InstanceCalibration:
    """A :class:`CalibrationTable` aligned with an instance's configurations (arrays of K rows)."""

    work_scale: np.ndarray  # (K,)
    sat_rps: np.ndarray  # (K,)
    wait_s: np.ndarray  # (K, B)
    wait_short_share: np.ndarray  # (K, B)
    residence: np.ndarray  # (K, B, 3): a [s], b [s/input token], c [s/output token]
    kv_ratio: np.ndarray  # (K, B)
    e2e_ratio: np.ndarray  # (K, B, 9) deciles of e2e over the predicted e2e per request
    operating_bands: np.ndarray  # (K,) band index where H and m are read


def calibration_for(instance) -> InstanceCalibration:
    """The instance's calibration table as arrays over its configurations (cached on the instance).

    Raises:
        ValueError: a configuration is missing from the table, or the table's band edges are not
            the instance's (:func:`band_edges`: ``u_max`` and ``waiting_bands`` must match).
    """
    cached = instance.__dict__.get("_calibration_arrays")
    if cached is not None:
        return cached
    table = instance.calibration if instance.calibration is not None else load_calibration(instance.calibration_source)
    edges = band_edges(instance)
    B, K = edges.size, instance.n_configs
    out = {k: np.empty(s) for k, s in (("work_scale", K), ("sat_rps", K), ("wait_s", (K, B)), ("wait_short_share", (K, B)),
                                        ("residence", (K, B, 3)), ("kv_ratio", (K, B)), ("e2e_ratio", (K, B, 9)))}
    for k, cfg in enumerate(instance.configs):
        rows = table.rows(cfg.config.name)
        if len(rows) != B or not np.allclose(rows["u_edge"].to_numpy(dtype=float), edges, rtol=0, atol=1e-5):
            raise ValueError(
                f"calibration: the table's bands for {cfg.config.name} ({len(rows)} edges) are not the instance's "
                f"(u_max={instance.u_max}, waiting_bands={instance.waiting_bands}); regenerate it for these bands"
            )
        out["work_scale"][k] = float(rows["work_scale"].iloc[0])
        out["sat_rps"][k] = float(rows["sat_rps"].iloc[0])
        out["wait_s"][k] = rows["wait_mean_s"].to_numpy(dtype=float)
        out["wait_short_share"][k] = rows["wait_short_share"].to_numpy(dtype=float)
        out["residence"][k] = rows[["res_a_s", "res_b_s", "res_c_s"]].to_numpy(dtype=float)
        out["kv_ratio"][k] = rows["kv_ratio"].to_numpy(dtype=float)
        out["e2e_ratio"][k] = rows[[f"e2e_ratio_q{q}" for q in range(10, 100, 10)]].to_numpy(dtype=float)
    ob = instance.operating_bands
    bands = np.full(K, B - 1, dtype=int) if ob is None else np.asarray(ob, dtype=int)
    res = InstanceCalibration(operating_bands=bands, **out)
    instance.__dict__["_calibration_arrays"] = res
    return res


def residence_line(instance, k: int, band: int | None = None) -> np.ndarray:
    """(a, b, c) of the calibrated residence H = a + b L_in + c xi [s] of configuration k at ``band``
    (default its operating band)."""
    cal = calibration_for(instance)
    j = int(cal.operating_bands[k]) if band is None else int(band)
    return cal.residence[k, j]


def calibrated_service_table(instance, analytic: np.ndarray) -> np.ndarray:
    """Calibrated work T_ik [s], shape (I, K, 2): the analytic work times each configuration's work scale."""
    return analytic * calibration_for(instance).work_scale[None, :, None]


def calibrated_residence_table(instance) -> np.ndarray:
    """Calibrated residence H_ik [s], shape (I, K, 2), at each configuration's operating band."""
    cal = calibration_for(instance)
    L_in, L_pre = instance.input_tokens, instance.prefix_tokens
    xi = np.array([c.mean_output_tokens for c in instance.classes])
    out = np.empty((instance.n_classes, instance.n_configs, 2))
    for k in range(instance.n_configs):
        a, b, c = cal.residence[k, cal.operating_bands[k]]
        for cached in (0, 1):
            out[:, k, cached] = a + b * (L_in - cached * L_pre) + c * xi
    return np.maximum(out, 1e-6)


def kv_ratio(instance) -> np.ndarray:
    """KV occupancy per Little's-law token m_k at each configuration's operating band (1 for analytic)."""
    if getattr(instance, "serving", "analytic") != "calibrated":
        return np.ones(instance.n_configs)
    cal = calibration_for(instance)
    return cal.kv_ratio[np.arange(instance.n_configs), cal.operating_bands]


def ratio_cdf(deciles: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(R <= x) from the nine deciles of R >= 0: linear between deciles, from (0, 0) to the first,
    and from the last (0.9) to 1 at twice the last decile (a short tail; it moves goodput by < 10 %)."""
    q = np.maximum.accumulate(np.asarray(deciles, dtype=float))
    xs = np.concatenate([[0.0], q, [2.0 * q[-1]]])
    ps = np.concatenate([[0.0], RATIO_LEVELS, [1.0]])
    xs = xs + np.arange(xs.size) * 1e-12  # strictly increasing for interp
    return np.interp(np.asarray(x, dtype=float), xs, ps)
