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
  (replaces phi_k(u_j) in :func:`band_waiting_s`; still a step function of the band, read as a
  running maximum over the bands so that it bounds each band from above);
* the residence ``H_ikj = a_kj + b_k (L_in^i - delta L_pre^i) + c_kj E[xi_i]`` (a least-squares line
  over the simulated requests, with one prompt slope b_k per configuration and an intercept and an
  output slope per band), **banded by utilisation like W**: a group run at a lower utilisation holds
  its KV blocks for less time, so adding a group can shorten residence. Because b_k does not depend
  on the band, ``H_ikj(delta) = H_ik(delta) + dH_ikj`` with ``H_ik(delta) = max_j H_ikj(delta)``
  (:attr:`Instance.residence_s`) and a band offset ``dH_ikj <= 0`` that does not depend on delta
  (:func:`band_residence_offset_s`). The response time of (6f) is then ``sum_j p_ikj (W_kj + dH_ikj)
  + pi_ik H_ik(delta)`` with the same band split ``p_ikj = pi_ik [band_k = j]`` that already carries
  W (:func:`band_response_s`): still linear, in every formulation and in BCD's blocks;
* the memory constraint (6e) keeps the paper's form -- reserved tokens r_i held for the residence --
  with the largest residence over the bands, ``H_ik(delta)``: a bound that holds in every band, so
  (6e) needs no product of the band with the buffer choice. It is the planner's admission model;
  what a soft-reading engine actually holds is what :func:`kvdro.joint.objective.predict_serving`
  predicts: per request its prompt for the whole residence plus one token per decode step,
  ``(L_in - delta L_pre) H_ikj + c_kj E[xi_i^2] / 2`` tokens x seconds, times the occupancy ratio
  ``m_kj`` the simulator measured against that formula (block rounding, prefill and preemption).
* **per class** where the table has a class's own row (``data/calibration_classes.csv``, by class
  name, >= :data:`MIN_CLASS_REQUESTS` requests): W_ikj and H_ikj are that class's measured means
  (:func:`band_class_waiting_s`; a bursty class waits longer than the mix on the same group), and
  goodput reads the class's measured spread of end-to-end time; other classes use the
  configuration's W_kj and line. The MILP's band split carries W_ikj + dH_ikj either way.

What the calibrated model still cannot see is the mix a *plan* gives a group (a group that takes
all the bursty classes waits far longer than the single-group runs on the whole mix):
:func:`kvdro.calibration.calibration_loop` measures that one plan at a time.
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
    "calibrated_residence_table",
    "band_residence_offset_s",
    "band_response_s",
    "band_class_waiting_s",
    "response_at",
    "interpolated_at",
    "CLASS_CALIBRATION_FILE",
    "CLASS_COLUMNS",
    "E2E_RATIO_COLUMNS",
    "residence_at",
    "kv_token_seconds",
    "on_time_share",
    "ratio_cdf",
    "residence_bin",
    "RESIDENCE_BINS",
    "band_kv_ratio",
    "QUANTILE_LEVELS",
]

#: The two serving models of ``Instance(serving=...)``.
SERVING_MODELS = ("analytic", "calibrated")
#: The simulator-measured table (``python -m kvdro.bench calibration`` regenerates it).
CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "data" / "calibration_bands.csv"
#: Its columns: per (source, config, band): the band's upper edge, the arrival rate of the run
#: [req/s], the simulated saturation throughput [req/s] and work scale of the config, the mean wait
#: [s], the share of requests that waited under 1 s, the residence line (a [s], b [s per input
#: token, one value per configuration], c [s per output token]), the KV occupancy ratio m (simulated
#: KV tokens over the formula of :func:`kv_token_seconds`), the measured KV use, the number of
#: requests, and two spreads the means leave out (goodput reads them): the wait's quantiles [s]
#: and, per output-length bin of :data:`RESIDENCE_BINS`, the quantiles of each request's residence
#: over its line a + b L_in + c xi, at :data:`QUANTILE_LEVELS`.
CALIBRATION_COLUMNS = (
    "source", "config", "band", "u_edge", "rate_rps", "sat_rps", "work_scale", "wait_mean_s",
    "wait_short_share", "res_a_s", "res_b_s", "res_c_s", "kv_ratio", "kv_use", "requests",
) + tuple(f"wait_q{q:02d}_s" for q in range(5, 100, 10)) + tuple(
    f"res_ratio_b{b}_q{q:02d}" for b in range(3) for q in range(5, 100, 10))

#: Levels of the quantile columns: the mid-points of the ten deciles, 0.05, 0.15, ..., 0.95 -- each
#: stands for a tenth of the requests in the goodput prediction.
QUANTILE_LEVELS = np.arange(5, 100, 10) / 100.0
WAIT_QUANTILE_COLUMNS = tuple(f"wait_q{q:02d}_s" for q in range(5, 100, 10))
#: The per-class table (``python -m kvdro.bench calibration`` writes it beside :data:`CALIBRATION_FILE`):
#: per (source, config, band, request class) of the same runs, the class's served requests, mean
#: wait [s], mean residence [s], mean prompt and output [tokens], and the quantiles of its requests'
#: end-to-end time over the class's mean end-to-end time at :data:`QUANTILE_LEVELS`.
CLASS_CALIBRATION_FILE = CALIBRATION_FILE.with_name("calibration_classes.csv")
E2E_RATIO_COLUMNS = tuple(f"e2e_ratio_q{q:02d}" for q in range(5, 100, 10))
CLASS_COLUMNS = ("source", "config", "band", "request_class", "requests", "wait_mean_s", "res_mean_s",
                 "input_mean", "output_mean") + E2E_RATIO_COLUMNS
#: Fewest served requests of a class in a band run for its own row to be used (else the line).
MIN_CLASS_REQUESTS = 30

#: Output-length bin edges [tokens] of the residence spread: xi < 32, 32 <= xi < 256, xi >= 256. A
#: short answer's residence is mostly other requests' prefills interleaved with its few decode steps
#: (0.7 to 11 s for xi < 10 where the line says 1 s); a long one's stays near its line.
RESIDENCE_BINS = (32, 256)
RESIDENCE_QUANTILE_COLUMNS = tuple(tuple(f"res_ratio_b{b}_q{q:02d}" for q in range(5, 100, 10)) for b in range(3))


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
        classes: ``None`` or one row per (config, band, request class) with :data:`CLASS_COLUMNS`:
            where an instance's class has a row (by name, with >= :data:`MIN_CLASS_REQUESTS`
            requests), its wait and residence are the class's own; else the configuration's wait
            and residence line.
    """

    source: str
    frame: pd.DataFrame = field(repr=False)
    classes: pd.DataFrame | None = field(default=None, repr=False)

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
        if self.classes is not None:
            missing = [c for c in CLASS_COLUMNS if c not in self.classes.columns]
            if missing:
                raise ValueError(f"classes: per-class calibration table lacks column(s) {missing}")
            c = self.classes[self.classes["source"] == self.source]
            num = [col for col in CLASS_COLUMNS if col not in ("source", "config", "request_class")]
            if not np.all(np.isfinite(c[num].to_numpy(dtype=float))):
                raise ValueError(f"classes: per-class calibration rows of {self.source!r} hold a non-finite number")
            object.__setattr__(self, "classes", c.sort_values(["config", "band", "request_class"]).reset_index(drop=True))

    @property
    def configs(self) -> tuple[str, ...]:
        return tuple(sorted(self.frame["config"].unique()))

    def rows(self, config: str) -> pd.DataFrame:
        """The rows of ``config`` (a name like ``"TP4-PP1"``), ordered by band."""
        r = self.frame[self.frame["config"] == config]
        if r.empty:
            raise ValueError(f"config: {config!r} is not in the calibration table ({', '.join(self.configs)})")
        return r

    def with_rows(self, updates: pd.DataFrame, class_updates: pd.DataFrame | None = None) -> CalibrationTable:
        """A copy with the (config, band) rows of ``updates`` replaced, and the (config, band, class)
        rows of ``class_updates`` replaced or added (the loop's refits)."""
        f = self.frame.set_index(["config", "band"])
        u = updates.assign(source=self.source).set_index(["config", "band"])
        f.update(u[[c for c in u.columns if c in f.columns]])
        classes = self.classes
        if class_updates is not None and len(class_updates):
            key = ["config", "band", "request_class"]
            new = class_updates.assign(source=self.source)[list(CLASS_COLUMNS)]
            old = self.classes if self.classes is not None else new.iloc[:0]
            classes = pd.concat([old.set_index(key).drop(new.set_index(key).index, errors="ignore").reset_index(), new],
                                ignore_index=True)[list(CLASS_COLUMNS)]
        return replace(self, frame=f.reset_index()[list(CALIBRATION_COLUMNS)], classes=classes)


@lru_cache(maxsize=4)
def _read(path: str, mtime: float, checked: bool = False) -> pd.DataFrame:
    if checked:  # the committed cache in data/: refused if it differs from its manifest (issue 36)
        from kvdro.cachefile import read_csv_checked

        return read_csv_checked(path, remake="python -m kvdro.bench calibration --parts bands")
    return pd.read_csv(path)


def load_calibration(source: str = "real", path: Path | str | None = None,
                     classes_path: Path | str | None = None) -> CalibrationTable:
    """The calibration table of ``source`` from ``path`` (default :data:`CALIBRATION_FILE`) and its
    per-class rows from ``classes_path`` (default :data:`CLASS_CALIBRATION_FILE` when ``path`` is the
    default, else none: every class then reads its configuration's wait and residence line).

    Raises:
        ValueError: a file is missing (naming the command that writes it) or lacks a column/source.
    """
    p = Path(CALIBRATION_FILE if path is None else path)
    if not p.is_file():
        raise ValueError(f"path: {p} does not exist; write it with `python -m kvdro.bench calibration`")
    q = CLASS_CALIBRATION_FILE if (classes_path is None and path is None) else classes_path
    classes = None
    if q is not None:
        q = Path(q)
        if not q.is_file():
            raise ValueError(f"classes_path: {q} does not exist; write it with `python -m kvdro.bench calibration`")
        classes = _read(str(q), q.stat().st_mtime, classes_path is None).copy()
    return CalibrationTable(source=source, frame=_read(str(p), p.stat().st_mtime, path is None).copy(), classes=classes)


@dataclass(frozen=True)
class InstanceCalibration:
    """A :class:`CalibrationTable` aligned with an instance's configurations (arrays of K rows)."""

    work_scale: np.ndarray  # (K,)
    sat_rps: np.ndarray  # (K,)
    wait_s: np.ndarray  # (K, B) read as non-decreasing in the band
    wait_measured_s: np.ndarray  # (K, B) as measured
    wait_short_share: np.ndarray  # (K, B)
    residence: np.ndarray  # (K, B, 3): a [s], b [s/input token] (one per k), c [s/output token]
    kv_ratio: np.ndarray  # (K, B)
    wait_quantiles: np.ndarray  # (K, B, 10) the wait's quantiles at QUANTILE_LEVELS [s]
    residence_quantiles: np.ndarray  # (K, B, 3, 10) residence over its line per output-length bin, same levels
    class_wait_s: np.ndarray  # (I, K, B) the class's own mean wait [s], nan where it has no row
    class_residence_s: np.ndarray  # (I, K, B) its mean residence at the instance's L_in [s], nan likewise
    class_e2e_ratio: np.ndarray  # (I, K, B, 10) its e2e over its mean e2e at QUANTILE_LEVELS, nan likewise


#: Relative tolerance with which the prompt slope b of a configuration must be one number over its bands.
PROMPT_SLOPE_RTOL = 1e-6


def calibration_for(instance) -> InstanceCalibration:
    """The instance's calibration table as arrays over its configurations (cached on the instance).

    Raises:
        ValueError: a configuration is missing from the table, the table's band edges are not the
            instance's (:func:`band_edges`: ``u_max`` and ``waiting_bands`` must match), or a
            configuration's prompt slope ``res_b_s`` differs between its bands (a table written
            before H was banded: regenerate it).
    """
    cached = instance.__dict__.get("_calibration_arrays")
    if cached is not None:
        return cached
    table = instance.calibration if instance.calibration is not None else load_calibration(instance.calibration_source)
    edges = band_edges(instance)
    B, K = edges.size, instance.n_configs
    out = {k: np.empty(s) for k, s in (("work_scale", K), ("sat_rps", K), ("wait_s", (K, B)), ("wait_measured_s", (K, B)),
                                        ("wait_short_share", (K, B)),
                                        ("residence", (K, B, 3)), ("kv_ratio", (K, B)),
                                        ("wait_quantiles", (K, B, 10)), ("residence_quantiles", (K, B, 3, 10)))}
    for k, cfg in enumerate(instance.configs):
        rows = table.rows(cfg.config.name)
        if len(rows) != B or not np.allclose(rows["u_edge"].to_numpy(dtype=float), edges, rtol=0, atol=1e-5):
            raise ValueError(
                f"calibration: the table's bands for {cfg.config.name} ({len(rows)} edges) are not the instance's "
                f"(u_max={instance.u_max}, waiting_bands={instance.waiting_bands}); regenerate it for these bands"
            )
        b = rows["res_b_s"].to_numpy(dtype=float)
        if not np.allclose(b, b[0], rtol=PROMPT_SLOPE_RTOL, atol=0):
            raise ValueError(
                f"calibration: column 'res_b_s' of {cfg.config.name} differs between bands ({b.min():.3g} to {b.max():.3g}); "
                "the banded residence needs one prompt slope per configuration: regenerate the table with "
                "`python -m kvdro.bench calibration --parts bands`"
            )
        out["work_scale"][k] = float(rows["work_scale"].iloc[0])
        out["sat_rps"][k] = float(rows["sat_rps"].iloc[0])
        # W and H are read as non-decreasing in the band (a running maximum of the measured values):
        # the step function then bounds each band from above, as Kingman's phi_k(u_j) does
        out["wait_measured_s"][k] = rows["wait_mean_s"].to_numpy(dtype=float)
        out["wait_s"][k] = np.maximum.accumulate(out["wait_measured_s"][k])
        out["wait_short_share"][k] = rows["wait_short_share"].to_numpy(dtype=float)
        out["residence"][k] = rows[["res_a_s", "res_b_s", "res_c_s"]].to_numpy(dtype=float)
        out["kv_ratio"][k] = rows["kv_ratio"].to_numpy(dtype=float)
        out["wait_quantiles"][k] = rows[list(WAIT_QUANTILE_COLUMNS)].to_numpy(dtype=float)
        for bin_, cols in enumerate(RESIDENCE_QUANTILE_COLUMNS):
            out["residence_quantiles"][k, :, bin_] = rows[list(cols)].to_numpy(dtype=float)
    I = instance.n_classes
    for name, shape in (("class_wait_s", (I, K, B)), ("class_residence_s", (I, K, B)), ("class_e2e_ratio", (I, K, B, 10))):
        out[name] = np.full(shape, np.nan)
    if table.classes is not None:
        index = {c.name: i for i, c in enumerate(instance.classes)}
        kindex = {cfg.config.name: k for k, cfg in enumerate(instance.configs)}
        bands = np.arange(B)
        for row in table.classes.itertuples(index=False):
            i, k = index.get(row.request_class), kindex.get(row.config)
            if i is None or k is None or row.band not in bands or row.requests < MIN_CLASS_REQUESTS:
                continue
            b = out["residence"][k, 0, 1]
            out["class_wait_s"][i, k, row.band] = row.wait_mean_s
            out["class_residence_s"][i, k, row.band] = row.res_mean_s + b * (instance.input_tokens[i] - row.input_mean)
            out["class_e2e_ratio"][i, k, row.band] = [getattr(row, c) for c in E2E_RATIO_COLUMNS]
    res = InstanceCalibration(**out)
    instance.__dict__["_calibration_arrays"] = res
    return res


def residence_line(instance, k: int, band: int) -> np.ndarray:
    """(a, b, c) of the calibrated residence H = a + b L_in + c xi [s] of configuration k in ``band``."""
    return calibration_for(instance).residence[k, int(band)]


def calibrated_service_table(instance, analytic: np.ndarray) -> np.ndarray:
    """Calibrated work T_ik [s], shape (I, K, 2): the analytic work times each configuration's work scale."""
    return analytic * calibration_for(instance).work_scale[None, :, None]


def _band_residence_without_prompt(instance) -> np.ndarray:
    """a_kj + c_kj E[xi_i] [s], shape (I, K, B): the part of the calibrated H_ikj that changes with the
    band, as a running maximum over the bands (the measured lines are noisy; a busier band does not
    hold KV for less time)."""
    cal = calibration_for(instance)
    xi = np.array([c.mean_output_tokens for c in instance.classes])
    per = cal.residence[None, :, :, 0] + cal.residence[None, :, :, 2] * xi[:, None, None]
    own = cal.class_residence_s - cal.residence[None, :, 0, 1][:, :, None] * instance.input_tokens[:, None, None]
    per = np.where(np.isfinite(own), own, per)  # the class's own measurement where it has one
    return np.maximum.accumulate(per, axis=2)  # non-decreasing in the band, like W (calibration_for)


def calibrated_residence_table(instance) -> np.ndarray:
    """Calibrated residence H_ik(delta) = max_j H_ikj(delta) [s], shape (I, K, 2) (module docstring):
    the residence of the slowest band, which (6e) reads; (6f) adds :func:`band_residence_offset_s`."""
    cal = calibration_for(instance)
    top = _band_residence_without_prompt(instance).max(axis=2)  # (I, K)
    b = cal.residence[:, 0, 1]  # (K,) one prompt slope per configuration
    L_in, L_pre = instance.input_tokens, instance.prefix_tokens
    out = np.empty((instance.n_classes, instance.n_configs, 2))
    for cached in (0, 1):
        out[:, :, cached] = top + b[None, :] * (L_in - cached * L_pre)[:, None]
    return np.maximum(out, 1e-6)


def band_residence_offset_s(instance) -> np.ndarray:
    """dH_ikj = H_ikj - max_j' H_ikj' [s] (<= 0), shape (I, K, B): how much shorter class i's residence
    on a group of k is in band j than in k's slowest band; the same with and without the cached
    prefix (one prompt slope per configuration). All zeros for the analytic model (one H per k)."""
    if getattr(instance, "serving", "analytic") != "calibrated":
        return np.zeros((instance.n_classes, instance.n_configs, instance.waiting_bands))
    per = _band_residence_without_prompt(instance)
    return per - per.max(axis=2, keepdims=True)


def band_class_waiting_s(instance) -> np.ndarray:
    """W_ikj [s], shape (I, K, B): the wait of class i on a group of k in band j. Analytic model and
    classes without their own calibration row: the configuration's W_kj (:func:`band_waiting_s`);
    calibrated with a row: the class's own mean wait (a bursty class waits longer than the mix),
    as a running maximum over the bands."""
    W = np.broadcast_to(band_waiting_s(instance)[None, :, :], (instance.n_classes, instance.n_configs, instance.waiting_bands))
    if getattr(instance, "serving", "analytic") != "calibrated":
        return W.copy()
    own = calibration_for(instance).class_wait_s
    return np.maximum.accumulate(np.where(np.isfinite(own), own, W), axis=2)


def band_response_s(instance) -> np.ndarray:
    """W_ikj + dH_ikj [s], shape (I, K, B): what (6f) charges per unit of the band split p_ikj =
    pi_ik [band_k = j], on top of pi_ik (H_ik(delta) - D_i). Analytic model: W_kj for every class."""
    return band_class_waiting_s(instance) + band_residence_offset_s(instance)


def response_at(instance, utilisation: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """W_ik + H_ik [s] of a decision, shape (I, K): the response time of (6f) of class i on k, with
    W and H in the band of k's utilisation; W = 0 on an idle configuration and inf above u_max (as
    :func:`waiting_model`)."""
    u = np.asarray(utilisation, dtype=float)
    H = residence_at(instance, u, delta)
    j = np.asarray(band_of(instance, u))
    B = instance.waiting_bands
    W = band_class_waiting_s(instance)[:, np.arange(instance.n_configs), np.clip(j, 0, B - 1)]
    W = np.where((j < 0)[None, :], 0.0, np.where((j >= B)[None, :], np.inf, W))
    return W + H


def interpolated_at(instance, utilisation: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W_ik, H_ik) [s], shape (I, K) each, of the calibrated model *between* its band edges: linear in
    u from one measured edge u_j to the next (below the first edge: the first edge's values; W = 0 on
    an idle configuration, inf above u_max). The MILP and :func:`kvdro.joint.evaluate` charge the
    band's upper edge, a step that bounds W and H from above and keeps the model linear; a
    prediction of what the engine will deliver (:func:`kvdro.joint.objective.predict_serving`) reads
    the measurements where the plan actually runs. Analytic model: the step values (no measurements
    between edges to interpolate)."""
    u = np.asarray(utilisation, dtype=float)
    if getattr(instance, "serving", "analytic") != "calibrated":
        resp, H = response_at(instance, u, delta), residence_at(instance, u, delta)
        return resp - H, H
    d = np.asarray(delta, dtype=bool)
    edges = band_edges(instance)
    Wb = band_class_waiting_s(instance)  # (I, K, B)
    Hb = np.where(d[:, :, None], instance.residence_s[:, :, 1:2], instance.residence_s[:, :, 0:1]) + band_residence_offset_s(instance)
    I, K = d.shape
    W, H = np.empty((I, K)), np.empty((I, K))
    for k in range(K):
        for i in range(I):
            W[i, k] = np.interp(u[k], edges, Wb[i, k])
            H[i, k] = np.interp(u[k], edges, Hb[i, k])
    W[:, u <= 1e-12] = 0.0
    W[:, u > instance.u_max + BAND_TOLERANCE] = np.inf
    return W, H


def residence_at(instance, utilisation: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """H_ik [s] of a decision, shape (I, K): the residence of each class on k with the caching
    ``delta``, in the band of k's utilisation (idle configurations and u above u_max: the slowest band)."""
    d = np.asarray(delta, dtype=bool)
    H = np.where(d, instance.residence_s[:, :, 1], instance.residence_s[:, :, 0])
    if getattr(instance, "serving", "analytic") != "calibrated":
        return H
    j = np.asarray(band_of(instance, utilisation))
    j = np.where(j < 0, instance.waiting_bands - 1, np.minimum(j, instance.waiting_bands - 1))
    off = band_residence_offset_s(instance)
    return H + off[:, np.arange(instance.n_configs), j]


def kv_token_seconds(L_prompt: np.ndarray, H: np.ndarray, c: np.ndarray, xi2: np.ndarray) -> np.ndarray:
    """KV tokens x seconds one request holds [token s]: its prompt L (after the cached prefix) for its
    whole residence H, plus one token per decode step of c seconds, ``L H + c E[xi^2] / 2``."""
    return L_prompt * H + c * xi2 / 2.0


def band_kv_ratio(instance, utilisation: np.ndarray) -> np.ndarray:
    """Calibrated occupancy ratio m_k at the band of each configuration's utilisation, shape (K,)."""
    cal = calibration_for(instance)
    j = np.asarray(band_of(instance, utilisation))
    j = np.where(j < 0, instance.waiting_bands - 1, np.minimum(j, instance.waiting_bands - 1))
    return cal.kv_ratio[np.arange(instance.n_configs), j]


def ratio_cdf(quantiles: np.ndarray, x) -> np.ndarray:
    """P(R <= x) from R's quantiles at :data:`QUANTILE_LEVELS` (R >= 0): linear between them, from
    (0, 0) to the first and from the last to 1 at twice the last (a short tail)."""
    q = np.maximum.accumulate(np.asarray(quantiles, dtype=float))
    xs = np.concatenate([[0.0], q, [2.0 * q[-1]]]) + np.arange(q.size + 2) * 1e-12  # strictly increasing
    ps = np.concatenate([[0.0], QUANTILE_LEVELS, [1.0]])
    return np.interp(np.asarray(x, dtype=float), xs, ps)


def residence_bin(xi: np.ndarray) -> np.ndarray:
    """Index of the :data:`RESIDENCE_BINS` bin of each output length ``xi`` [tokens]."""
    return np.searchsorted(np.asarray(RESIDENCE_BINS), np.asarray(xi, dtype=float), side="right")


def on_time_share(wait_quantiles: np.ndarray, residence_quantiles: np.ndarray, xi: np.ndarray,
                  residence_s: np.ndarray, deadline_s: float) -> float:
    """P(wait + R x H(xi) <= D): the share of requests that finish within ``deadline_s`` when the wait
    and the residence ratio R are independent, each drawn from its ten quantiles (one tenth each),
    R from the quantiles of the output length's bin (``residence_quantiles``: shape (3, 10), rows
    :data:`RESIDENCE_BINS`), and H(xi) = ``residence_s`` (one value per output-length sample ``xi``).

    The wait does not depend on the request's own length under FCFS; the residence's spread does
    (drawing one ratio for the whole end-to-end time, or one residence ratio for every length,
    under-predicted goodput by 20-30 %: short answers finish far sooner than a long one's spread says)."""
    xi = np.asarray(xi, dtype=float)
    w = np.asarray(wait_quantiles, dtype=float)[:, None, None]
    r = np.asarray(residence_quantiles, dtype=float)[residence_bin(xi)].T[None, :, :]  # (1, 10, N)
    h = np.asarray(residence_s, dtype=float)[None, None, :]
    return float(np.mean(w + r * h <= float(deadline_s)))
