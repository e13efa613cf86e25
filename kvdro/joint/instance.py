"""Problem data of the joint problem (6)/(8): :class:`Instance`, :class:`Solution`, candidate buffers.

An :class:`Instance` is everything the operator knows before deciding (z, r, pi, delta): the request
classes (:class:`kvdro.workload.RequestClass`: rate lambda_i [req/s], input length L_in^i [tokens],
shared prefix L_pre^i [tokens], SLO D_i [s], support bound L_max^i [tokens], N output-length samples),
the candidate serving configurations (:class:`kvdro.hardware.ConfigPerformance`: GPUs tau_k p_k,
KV capacity M_k [tokens], C_k, B_k), the GPU budget J, the costs and the Wasserstein radii.

Units and cost convention (the paper leaves them implicit; this is our reading, stated in chapter 5).
The objective (8a) is a cost **per second of operation**:

* ``c_w`` -- per token reserved but not used, per admitted request (3); ``c_p`` -- per token short,
  per admitted request (2). Multiplied by lambda_i [req/s] this is a cost per second.
* ``c_slo`` -- per second of expected lateness s_i (6f), per request.
* ``c_rej`` -- per rejected request (lambda_i pi_i0 rejected requests per second).
* ``c_gpu`` -- per GPU per second that a serving group occupies a GPU. The paper gives no value;
  :data:`DEFAULT_C_GPU` is our choice (see its comment).

Reservations are **block granular** (PagedAttention allocates whole 16-token blocks): the output
buffer eta_i = r_i - L_in^i is one of ``0, 16, 32, ..., 16*ceil(L_max^i/16)`` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from kvdro.costs import DEFAULT_C_GPU, PAPER_COSTS
from kvdro.hardware import BLOCK_TOKENS, LLAMA2_70B, ConfigPerformance, Model
from kvdro.workload import RequestClass

__all__ = [
    "DEFAULT_C_GPU",
    "PAPER_COSTS",
    "Instance",
    "Solution",
    "candidate_buffers",
]

# PAPER_COSTS (the paper's cost ratios, Sec. VI) and DEFAULT_C_GPU (our GPU price) live in
# kvdro.costs, which imports no solver (the simulator prices its runs with them); re-exported here.


def _number(value: object, name: str) -> float:
    """``value`` as a float; ValueError naming ``name`` for anything that is not a real number
    (strings -- even ``"5"`` --, booleans, None, arrays)."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None or np.ndim(value) != 0:
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a real number, got {value!r}") from None


def _finite(value: object, name: str, *, positive: bool = False) -> float:
    v = _number(value, name)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name}: must be a finite {'positive' if positive else 'non-negative'} number, got {value!r}")
    return v


def _whole(value: object, name: str, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; ValueError naming ``name`` otherwise (no bools, no 2.5, no "8")."""
    ok = isinstance(value, (int, np.integer)) or (isinstance(value, (float, np.floating)) and float(value).is_integer())
    if isinstance(value, (bool, np.bool_)) or not ok or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def candidate_buffers(max_output_tokens: int, block_tokens: int = BLOCK_TOKENS) -> np.ndarray:
    """Block-granular output buffers eta = 16 c for c = 0, ..., ceil(L_max / 16) [tokens].

    The last candidate is the first multiple of the block size >= L_max: it never preempts.
    """
    L_max = _whole(max_output_tokens, "max_output_tokens", minimum=0)
    block = _whole(block_tokens, "block_tokens", minimum=1)
    n = math.ceil(L_max / block)
    return (np.arange(n + 1) * block).astype(float)


@dataclass(frozen=True, eq=False)
class Instance:
    """One instance of the joint problem (6)/(8).

    Attributes:
        classes: request classes i (lambda_i [req/s], L_in^i = mean input [tokens], L_pre^i [tokens],
            D_i [s], L_max^i [tokens], output samples xi_i^(n) [tokens], inter-arrival CV).
        configs: candidate configurations k (tau_k p_k GPUs, M_k [tokens], C_k, B_k, t_ar).
        total_gpus: J, the GPU budget of (6b).
        c_p, c_w, c_gpu, c_slo, c_rej: costs (module docstring for units).
        kappa: memory headroom kappa of (6e) (fraction).
        eps: Wasserstein radius eps_i per class [tokens] (5); ``None`` -> the paper's 0.15 E[xi_i];
            a single number applies to every class.
        u_max: utilisation cap per serving group (< 1 keeps the waiting time (7) finite).
        waiting_bands: |B|, the number of utilisation bands of the waiting-time model
            (:func:`kvdro.joint.serving.band_edges`, :func:`kvdro.joint.serving.waiting_model`).
        serving: ``"analytic"`` (chapter 4's model) or ``"calibrated"`` (the simulator's table,
            :mod:`kvdro.joint.serving`): sets T, H, the banded W and the memory coefficient that every
            formulation, BCD and :func:`kvdro.joint.evaluate` read.
        calibration: a :class:`kvdro.joint.serving.CalibrationTable` (``None``: ``data/calibration_bands.csv``
            of ``calibration_source``); only read when ``serving="calibrated"``.
        calibration_source: ``"real"`` (Azure 2023 training half) or ``"synthetic"`` (the large family's).
        model: the served model (for the service time (1)).
        name: a label.
    """

    classes: tuple[RequestClass, ...]
    configs: tuple[ConfigPerformance, ...]
    total_gpus: int
    c_p: float = PAPER_COSTS["c_p"]
    c_w: float = PAPER_COSTS["c_w"]
    c_gpu: float = DEFAULT_C_GPU
    c_slo: float = PAPER_COSTS["c_slo"]
    c_rej: float = PAPER_COSTS["c_rej"]
    kappa: float = PAPER_COSTS["kappa"]
    eps: tuple[float, ...] | float | None = None
    u_max: float = 0.9
    model: Model = LLAMA2_70B
    name: str = ""
    block_tokens: int = field(default=BLOCK_TOKENS)
    waiting_bands: int = 10
    serving: str = "analytic"
    calibration: object | None = None
    calibration_source: str = "real"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        classes = tuple(self.classes) if isinstance(self.classes, Sequence) else self.classes
        if not isinstance(classes, tuple) or len(classes) == 0:
            raise ValueError("classes: need at least one request class")
        for i, c in enumerate(classes):
            if not isinstance(c, RequestClass):
                raise ValueError(f"classes[{i}]: must be a kvdro.workload.RequestClass, got {type(c).__name__}")
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: class names must be distinct, got {names}")
        set_(self, "classes", classes)
        configs = tuple(self.configs) if isinstance(self.configs, Sequence) else self.configs
        if not isinstance(configs, tuple) or len(configs) == 0:
            raise ValueError("configs: need at least one serving configuration")
        for k, cfg in enumerate(configs):
            if not isinstance(cfg, ConfigPerformance):
                raise ValueError(f"configs[{k}]: must be a kvdro.hardware.ConfigPerformance, got {type(cfg).__name__}")
            if cfg.gpus < 1 or cfg.kv_capacity_tokens <= 0:
                raise ValueError(f"configs[{k}]: needs gpus >= 1 and a positive KV capacity")
        set_(self, "configs", configs)
        j = _whole(self.total_gpus, "total_gpus", minimum=1)
        smallest = min(cfg.gpus for cfg in configs)
        if j < smallest:
            raise ValueError(
                f"total_gpus: J={j} is smaller than every configuration's GPU count (smallest {smallest}); "
                "no serving group can be deployed"
            )
        set_(self, "total_gpus", int(j))
        for name in ("c_p", "c_w"):
            set_(self, name, _finite(getattr(self, name), name, positive=True))
        for name in ("c_gpu", "c_slo", "c_rej", "kappa"):
            set_(self, name, _finite(getattr(self, name), name))
        u = _number(self.u_max, "u_max")
        if not (0 < u < 1):
            raise ValueError(f"u_max: must be in (0, 1), got {self.u_max!r}")
        set_(self, "u_max", u)
        if self.eps is None:
            eps = tuple(0.15 * c.mean_output_tokens for c in classes)
        elif isinstance(self.eps, (str, bytes)) or np.ndim(self.eps) == 0:
            eps = (_number(self.eps, "eps"),) * len(classes)
        else:
            if np.ndim(self.eps) != 1:
                raise ValueError(f"eps: must be None, a number or one number per class, got {self.eps!r}")
            eps = tuple(_number(e, f"eps[{i}]") for i, e in enumerate(self.eps))
            if len(eps) != len(classes):
                raise ValueError(f"eps: need one radius per class ({len(classes)}), got {len(eps)}")
        for i, e in enumerate(eps):
            if not math.isfinite(e) or e < 0:
                raise ValueError(f"eps: radius of class {classes[i].name!r} must be finite and >= 0, got {e!r}")
        set_(self, "eps", eps)
        set_(self, "block_tokens", _whole(self.block_tokens, "block_tokens", minimum=1))
        set_(self, "waiting_bands", _whole(self.waiting_bands, "waiting_bands", minimum=1))
        if not isinstance(self.model, Model):
            raise ValueError(f"model: must be a kvdro.hardware.Model, got {type(self.model).__name__}")
        if not isinstance(self.name, str):
            raise ValueError(f"name: must be a string, got {self.name!r}")
        from kvdro.joint.serving import SERVING_MODELS, CalibrationTable

        if self.serving not in SERVING_MODELS:
            raise ValueError(f"serving: must be one of {SERVING_MODELS}, got {self.serving!r}")
        if self.calibration is not None and not isinstance(self.calibration, CalibrationTable):
            raise ValueError(f"calibration: must be a kvdro.joint.serving.CalibrationTable or None, got {type(self.calibration).__name__}")
        if not isinstance(self.calibration_source, str):
            raise ValueError(f"calibration_source: must be a string, got {self.calibration_source!r}")
        if self.serving == "calibrated":
            from kvdro.joint.serving import calibration_for

            calibration_for(self)  # fail early: missing table, config or band mismatch

    # -- sizes and per-class vectors ------------------------------------------------------------

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_configs(self) -> int:
        return len(self.configs)

    @cached_property
    def rates(self) -> np.ndarray:
        """lambda_i [requests/s]."""
        return np.array([c.arrival_rate for c in self.classes])

    @cached_property
    def input_tokens(self) -> np.ndarray:
        """L_in^i [tokens] (mean prompt length of the class)."""
        return np.array([c.mean_input_tokens for c in self.classes])

    @cached_property
    def prefix_tokens(self) -> np.ndarray:
        """L_pre^i [tokens]."""
        return np.array([float(c.prefix_tokens) for c in self.classes])

    @cached_property
    def slo_s(self) -> np.ndarray:
        """D_i [s]."""
        return np.array([float(c.slo_s) for c in self.classes])

    @cached_property
    def max_output_tokens(self) -> np.ndarray:
        """L_max^i [tokens]."""
        return np.array([int(c.max_output_tokens) for c in self.classes])

    @cached_property
    def gpus(self) -> np.ndarray:
        """tau_k p_k, GPUs per group of configuration k."""
        return np.array([cfg.gpus for cfg in self.configs], dtype=int)

    @cached_property
    def capacity_tokens(self) -> np.ndarray:
        """M_k [tokens], KV capacity of one group, as (6e) reads it (both serving models)."""
        return np.array([cfg.kv_capacity_tokens for cfg in self.configs], dtype=float)

    @cached_property
    def max_groups(self) -> np.ndarray:
        """Upper bound of z_k implied by (6b): floor(J / (tau_k p_k))."""
        return self.total_gpus // self.gpus

    # -- derived tables -------------------------------------------------------------------------

    @cached_property
    def service_s(self) -> np.ndarray:
        """Work T_ik of (1) [s of group time], shape (I, K, 2): ``[..., 0]`` without, ``[..., 1]`` with
        the cached prefix. Sets the utilisation and the queue's service time in (7)."""
        from kvdro.joint.serving import calibrated_service_table, service_table

        T = service_table(self)
        return calibrated_service_table(self, T) if self.serving == "calibrated" else T

    @cached_property
    def residence_s(self) -> np.ndarray:
        """Residence time H_ik [s] (KV blocks held; Little's law in (6e), latency in (6f)), shape (I, K, 2).

        Calibrated model: the slowest band's, max_j H_ikj; (6f) adds the band offset
        :func:`kvdro.joint.serving.band_residence_offset_s` (:func:`kvdro.joint.serving.residence_at`)."""
        from kvdro.joint.serving import calibrated_residence_table, residence_table

        return calibrated_residence_table(self) if self.serving == "calibrated" else residence_table(self)

    @cached_property
    def service_variance_s2(self) -> np.ndarray:
        """Within-class variance of the work T_ik [s^2], shape (I, K) (an input of (7))."""
        from kvdro.joint.serving import service_variance_table

        return service_variance_table(self)

    @cached_property
    def mix_waiting_coefficients(self) -> np.ndarray:
        """(c_a^2 + c_s^2)/2 * Tbar_k [s] of the whole workload mix: W_k = coef_k u/(1-u) (7)."""
        from kvdro.joint.serving import mix_waiting_coefficients

        return mix_waiting_coefficients(self)

    @cached_property
    def candidates(self) -> tuple[np.ndarray, ...]:
        """Per class, the block-granular buffers eta_ic [tokens] (see :func:`candidate_buffers`)."""
        return tuple(candidate_buffers(int(c.max_output_tokens), self.block_tokens) for c in self.classes)

    @cached_property
    def candidate_costs(self) -> tuple[np.ndarray, ...]:
        """Per class, R_ic = sup_{P in ball (5)} E_P[c_p (xi - eta)^+ + c_w (eta - xi)^+] at each
        candidate buffer [cost per admitted request]: the value of (8c)-(8g) minimised over
        (gamma_i, theta_i) for the fixed r_i = L_in^i + eta_ic, by the closed form."""
        from kvdro.wasserstein import worst_case_cost_many

        return tuple(
            np.asarray(
                worst_case_cost_many(
                    c.output_tokens, etas, self.c_p, self.c_w, self.eps[i], int(c.max_output_tokens)
                ),
                dtype=float,
            )
            for i, (c, etas) in enumerate(zip(self.classes, self.candidates))
        )

    def worst_case_cost(self, i: int, eta: float) -> float:
        """R_i(eta): the class-i worst-case expected preemption + waste cost of buffer ``eta`` [tokens]."""
        from kvdro.wasserstein import worst_case_cost

        c = self.classes[i]
        return float(worst_case_cost(c.output_tokens, float(eta), self.c_p, self.c_w, self.eps[i], int(c.max_output_tokens)))

    def describe(self) -> str:
        """A short human-readable summary."""
        return (
            f"Instance {self.name or '(unnamed)'}: {self.n_classes} classes, {self.n_configs} configs "
            f"({', '.join(cfg.config.name for cfg in self.configs)}), J={self.total_gpus}, "
            f"total rate {self.rates.sum():.3g} req/s"
        )


@dataclass(frozen=True, eq=False)
class Solution:
    """A decision (z, r, pi, delta) of (6) and how it was found.

    Attributes:
        z: groups per configuration z_k (int, shape (K,)).
        r: reservations r_i = L_in^i + eta_i [tokens] (shape (I,)).
        pi: routing fractions pi_ik (shape (I, K)); the rejected fraction is pi_i0 = 1 - sum_k pi_ik.
        delta: prefix-caching decisions delta_ik (bool, shape (I, K)).
        objective: the solver's objective value (8a) [cost per second] (``nan`` if not from a solver).
        status: solver status (``"optimal"`` for a proven optimum).
        solve_time_s: wall time of the solve [s].
        mip_gap: relative MIP gap reported by the solver at termination (0 for proven optimal).
        lower_bound: the solver's proven lower bound on the optimum [cost per second].
        waiting_s: the waiting times W_k [s] of the model at this decision, shape (K,).
        method: the method / formulation name.
    """

    z: np.ndarray
    r: np.ndarray
    pi: np.ndarray
    delta: np.ndarray
    objective: float = float("nan")
    status: str = "unknown"
    solve_time_s: float = 0.0
    mip_gap: float = float("nan")
    lower_bound: float = float("nan")
    waiting_s: np.ndarray | None = None
    method: str = ""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        z = _real_array(self.z, "z")
        if z.ndim != 1 or not np.all(np.isfinite(z)) or np.any(z != np.round(z)):
            raise ValueError("z: must be a 1-D array of integers (groups per configuration)")
        if np.any(z < 0):
            raise ValueError(f"z: groups per configuration must be >= 0, got {np.round(z).astype(int).tolist()}")
        set_(self, "z", np.round(z).astype(int))
        r = _real_array(self.r, "r")
        if r.ndim != 1 or not np.all(np.isfinite(r)):
            raise ValueError("r: must be a 1-D array of finite reservations [tokens]")
        set_(self, "r", r)
        pi = _real_array(self.pi, "pi")
        if pi.shape != (r.size, z.size) or not np.all(np.isfinite(pi)):
            raise ValueError(f"pi: must be a finite array of shape (I, K) = ({r.size}, {z.size})")
        if np.any(pi < 0):
            i, k = (int(v[0]) for v in np.nonzero(pi < 0))
            raise ValueError(f"pi: routing fractions must be >= 0; pi[{i}, {k}] = {pi[i, k]!r}")
        set_(self, "pi", pi)
        d = _real_array(self.delta, "delta")
        if d.shape != pi.shape or not np.all(np.isin(d, (0, 1))):
            raise ValueError(f"delta: must be a 0/1 array of shape {pi.shape}")
        set_(self, "delta", d.astype(bool))
        if self.waiting_s is not None:
            set_(self, "waiting_s", _real_array(self.waiting_s, "waiting_s"))
        for a in ("objective", "solve_time_s", "mip_gap", "lower_bound"):
            set_(self, a, _number(getattr(self, a), a))
        if not isinstance(self.status, str) or not isinstance(self.method, str):
            raise ValueError(f"status, method: must be strings, got {self.status!r}, {self.method!r}")
        for a in ("z", "r", "pi", "delta"):
            getattr(self, a).setflags(write=False)

    def check(self, instance: Instance, argument: str = "solution", tol: float = 1e-9) -> Solution:
        """This decision as a plan for ``instance``: shapes (I,), (K,), (I, K) of the instance, every
        routed fraction on a deployed configuration (pi_ik > 0 only where z_k > 0), at most all of a
        class routed (6d), and z within the GPU budget J (6b). Returns ``self``.

        A solution object may describe an infeasible decision (:func:`kvdro.joint.evaluate` reports
        its violations); a plan to *serve* must pass this check (``tol`` absorbs solver round-off).

        Raises:
            ValueError: naming ``argument``, the mismatched shape, or the class and configuration.
        """
        if not isinstance(instance, Instance):
            raise ValueError(f"instance: must be a kvdro.joint.Instance, got {type(instance).__name__}")
        I, K = instance.n_classes, instance.n_configs
        if self.z.shape != (K,) or self.r.shape != (I,):
            raise ValueError(f"{argument}: a decision for {self.r.size} classes x {self.z.size} configurations, "
                             f"but the instance {instance.name or ''} has {I} classes x {K} configurations")
        names = [c.config.name for c in instance.configs]
        off = (self.pi > tol) & (self.z == 0)[None, :]
        if off.any():
            i, k = (int(v[0]) for v in np.nonzero(off))
            raise ValueError(f"{argument}: pi[{i}, {k}] = {self.pi[i, k]:.6g} routes class "
                             f"{instance.classes[i].name!r} to configuration {names[k]}, which has z = 0 groups")
        over = self.pi.sum(axis=1) > 1 + tol
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ValueError(f"{argument}: pi routes {self.pi[i].sum():.6g} of class {instance.classes[i].name!r} "
                             "(at most 1: the rest is rejected, (6d))")
        gpus = int(sum(int(n) * cfg.config.gpus for n, cfg in zip(self.z, instance.configs)))
        if gpus > instance.total_gpus:
            raise ValueError(f"{argument}: z = {self.z.tolist()} uses {gpus} GPUs, more than J = {instance.total_gpus} (6b)")
        return self

    @property
    def admitted(self) -> np.ndarray:
        """a_i = sum_k pi_ik, the admitted fraction of class i."""
        return self.pi.sum(axis=1)

    @property
    def rejected(self) -> np.ndarray:
        """pi_i0 = 1 - a_i, the rejected fraction of class i (6d)."""
        return 1.0 - self.admitted

    def to_dict(self, instance: Instance | None = None) -> dict:
        """A JSON-serialisable dict (names from ``instance`` when given)."""
        out: dict = {
            "method": self.method,
            "status": self.status,
            "objective": _num(self.objective),
            "lower_bound": _num(self.lower_bound),
            "mip_gap": _num(self.mip_gap),
            "solve_time_s": float(self.solve_time_s),
            "z": [int(v) for v in self.z],
            "r": [float(v) for v in self.r],
            "pi": [[float(v) for v in row] for row in self.pi],
            "delta": [[bool(v) for v in row] for row in self.delta],
            "rejected": [float(v) for v in self.rejected],
            "waiting_s": None if self.waiting_s is None else [_num(v) for v in self.waiting_s],
        }
        if instance is not None:
            out["classes"] = [c.name for c in instance.classes]
            out["configs"] = [cfg.config.name for cfg in instance.configs]
            out["buffer_tokens"] = [float(v) for v in self.r - instance.input_tokens]
        return out


def _real_array(value: object, name: str) -> np.ndarray:
    """``value`` as a float array; ValueError naming ``name`` for strings, None or ragged input."""
    if value is None or isinstance(value, (str, bytes)):
        raise ValueError(f"{name}: must be an array of numbers, got {value!r}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a (non-ragged) array of numbers, got {value!r}") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name}: must be an array of numbers, got dtype {arr.dtype}")
    return arr.astype(float)


def _num(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None
