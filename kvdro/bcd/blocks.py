"""The three blocks of BCD-DRO (the paper's Algorithm 1), each a CVXPY model built once and re-solved.

Every model is built from an :class:`~kvdro.joint.Instance` with ``cp.Parameter`` s for whatever the
other blocks fix, so one iteration only writes parameter values and calls HiGHS again (CVXPY's DPP
caches the compiled problem). Notation as in chapter 5: lambda_i [req/s], T_ik work (1) [s],
H_ik residence [s], M_k KV capacity of one group [tokens], W_k waiting time (7) [s], R_i(r) the
worst-case preemption + waste cost of a buffer (8c)-(8g) [cost per admitted request].

* :class:`RoutingLP` -- **LP1**: routing pi (and SLO excess s) for fixed (z, r, delta) and a fixed
  utilisation band per configuration. The banded waiting time of :func:`kvdro.joint.serving.waiting_model`
  is a step function of the utilisation, so pi W_k is not linear in pi; LP1 holds the band j_k fixed,
  charges W_k = phi_k(u_{j_k}) (the band's upper-edge value) and caps u_k <= u_{j_k}. Whatever LP1
  returns then has a true W_k no larger than the one it was charged (W is non-decreasing in u), so
  the true objective is at most LP1's value.
* :class:`ReservationStep` -- **LP2**: block-granular reservations r for fixed (z, pi, delta).
  With pi fixed the problem separates by class except for the memory rows (6e): if every class's
  own minimiser of R_i fits, that is the answer (the closed form of chapter 3, per class); otherwise a
  multiple-choice knapsack over the candidate buffers (a small MILP) gives the exact block optimum.
* :func:`prefix_rule` / :func:`prefix_descent` -- **Block 2**: prefix caching delta.
* :class:`ConfigIP` -- **Block 3**: groups z within the GPU budget (6b), with routing and band
  re-optimised, for fixed (r, delta): a small integer program whose integer variables (a band and a
  group count per configuration and band, 2 K |B| of them) do not grow with J or with the classes.

All solves go through :func:`_solve`: HiGHS from scratch (no warm start: a re-solved model could
return its previous point as "optimal"), and :class:`kvdro.errors.SolverError` with the solver's
status unless it is optimal -- for the two integer programs, optimal *with* HiGHS's dual bound
within :data:`MIP_GAP_CHECK` of its objective.
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np

from kvdro.errors import SolverError
from kvdro.joint import Instance
from kvdro.joint.serving import band_edges, band_of, band_response_s

__all__ = [
    "ConfigIP",
    "ReservationStep",
    "RoutingLP",
    "band_index",
    "caching_tables",
    "prefix_descent",
    "prefix_rule",
    "repair_routing",
]

#: Relative MIP gap for the two small integer programs (Block 3 and the LP2 knapsack).
MIP_GAP = 1e-9

#: Largest gap (objective - HiGHS's dual bound) / max(1, |objective|) at which an "optimal" integer
#: program is accepted. HiGHS stops at :data:`MIP_GAP`; the slack is for its feasibility tolerances.
MIP_GAP_CHECK = 1e-6


def _solve(problem: cp.Problem, what: str, *, mip: bool = False, **opts) -> None:
    """Solve with HiGHS from scratch; raise SolverError unless the answer is proven optimal.

    Every model here is built once and re-solved with new parameter values. CVXPY's default
    ``warm_start=True`` hands HiGHS the *previous* point as a starting solution, and HiGHS 1.16 then
    sometimes returns that stale point with status optimal, mip_gap 0, one node, and a dual bound
    equal to the stale objective (chapter 6, "A stale warm start"): the point is feasible, just not
    optimal, and nothing HiGHS reports gives it away. So: no warm start (the fix), and for an
    integer program (``mip=True``) the status is trusted only when HiGHS's dual bound is finite and
    within :data:`MIP_GAP_CHECK` of its objective (a guard against other failures, e.g. a time limit
    reported as optimal; it would not have caught the stale point).
    """
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(solver=cp.HIGHS, warm_start=False, **opts)
    except cp.error.SolverError as exc:
        raise SolverError(what, f"solver_error: {exc}") from None
    if problem.status != cp.OPTIMAL:
        raise SolverError(what, str(problem.status))
    if mip:
        gap = proven_gap(problem)
        if not gap <= MIP_GAP_CHECK:
            raise SolverError(what, f"optimal without proof (objective - dual bound gap {gap:.3g})")


def proven_gap(problem: cp.Problem) -> float:
    """(objective - dual bound) / max(1, |objective|) of the last HiGHS MILP solve, both in HiGHS's
    own objective (without CVXPY's constant offset); nan when HiGHS reported no finite bound."""
    stats = problem.solver_stats
    info = None if stats is None else stats.extra_stats
    if info is None:
        return float("nan")
    obj = float(getattr(info, "objective_function_value", np.nan))
    bound = float(getattr(info, "mip_dual_bound", np.nan))
    if not (np.isfinite(obj) and np.isfinite(bound) and abs(bound) < 1e300):
        return float("nan")
    return max(0.0, obj - bound) / max(1.0, abs(obj))


def caching_tables(instance: Instance, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, H): work T_ik (1) and residence H_ik [s] at the caching decisions ``delta``, shape (I, K).

    H is :attr:`Instance.residence_s`: for the calibrated model the slowest band's, which the memory
    rows (6e) read; the SLO rows (6f) add the band offset (:func:`kvdro.joint.serving.band_response_s`)."""
    d = np.asarray(delta, dtype=bool)
    T = np.where(d, instance.service_s[:, :, 1], instance.service_s[:, :, 0])
    H = np.where(d, instance.residence_s[:, :, 1], instance.residence_s[:, :, 0])
    return T, H


def utilisation(instance: Instance, z: np.ndarray, pi: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """u_k = sum_i lambda_i pi_ik T_ik / z_k (0 where z_k = 0), shape (K,)."""
    T, _ = caching_tables(instance, delta)
    flow = (instance.rates[:, None] * pi * T).sum(axis=0)
    z = np.asarray(z, dtype=float)
    return np.divide(flow, z, out=np.zeros_like(flow), where=z > 0)


def band_index(instance: Instance, u: np.ndarray) -> np.ndarray:
    """Index j of the utilisation band holding u_k, exactly as :func:`kvdro.joint.serving.waiting_model`
    and the exact MILP see it (same :data:`kvdro.joint.serving.BAND_TOLERANCE`); -1 for an idle
    configuration (u_k = 0) and |B| beyond u_max."""
    return band_of(instance, u)


def memory_rows(instance: Instance, z, r, pi, delta) -> tuple[np.ndarray, np.ndarray]:
    """Left side of (6e) per configuration [tokens] and its capacity z_k M_k [tokens]."""
    _, H = caching_tables(instance, delta)
    d = np.asarray(delta, dtype=bool)
    L_pre = instance.prefix_tokens
    per_req = (1 + instance.kappa) * instance.rates[:, None] * pi * H * (np.asarray(r)[:, None] - d * L_pre[:, None])
    z = np.asarray(z, dtype=float)
    lhs = per_req.sum(axis=0) + z * (d * L_pre[:, None]).sum(axis=0)
    return lhs, z * instance.capacity_tokens


def repair_routing(instance: Instance, z, r, pi, delta, util_cap: np.ndarray | None = None) -> np.ndarray:
    """Project a solver's routing onto the feasible set it was meant to be in.

    HiGHS satisfies constraints to about 1e-7; a utilisation 1e-8 above a band edge would put a group
    in the next band of :func:`~kvdro.joint.serving.waiting_model` (a jump in W). So: clip pi to
    [0, 1], zero it where z_k = 0, scale down classes with sum_k pi_ik > 1, and scale down a
    configuration's column just enough to meet its utilisation cap (default u_max z_k) and (6e).
    The changes are of the order of the solver's tolerance.
    """
    z = np.asarray(z)
    pi = np.clip(np.asarray(pi, dtype=float), 0.0, 1.0)
    pi[pi < 1e-12] = 0.0
    pi[:, z == 0] = 0.0
    a = pi.sum(axis=1)
    pi = pi / np.maximum(a, 1.0)[:, None]
    T, _ = caching_tables(instance, delta)
    cap = instance.u_max * z if util_cap is None else np.asarray(util_cap, dtype=float)
    flow = (instance.rates[:, None] * pi * T).sum(axis=0)
    scale = np.ones(z.size)
    over = flow > cap
    scale[over] = cap[over] / flow[over] * (1 - 1e-12)
    pi = pi * scale[None, :]
    lhs, capm = memory_rows(instance, z, r, pi, delta)
    d = np.asarray(delta, dtype=bool)
    prefix = np.asarray(z, dtype=float) * (d * instance.prefix_tokens[:, None]).sum(axis=0)
    over = lhs > capm
    if np.any(over):
        var = lhs - prefix
        room = np.maximum(capm - prefix, 0.0)
        scale = np.ones(z.size)
        scale[over] = np.divide(room[over], var[over], out=np.zeros(int(over.sum())), where=var[over] > 0) * (1 - 1e-12)
        pi = pi * scale[None, :]
    return pi


class RoutingLP:
    """LP1: min over (pi, s) of (8a) for fixed (z, r, delta) and fixed bands (module docstring).

    Objective, per second: sum_i lambda_i [sum_k pi_ik R_i(r_i) + c_slo s_i + c_rej (1 - a_i)].
    Constraints: a_i <= 1 (6d); pi_ik <= [z_k >= 1] (6c); (6e) with r fixed; sum_i lambda_i pi_ik T_ik
    <= u_{j_k} z_k (the band cap, <= u_max z_k); s_i >= sum_k pi_ik (W_k + H_ik - D_i), s >= 0 (6f),
    with W_k and (calibrated model) H_ik read in the fixed band j_k.
    """

    def __init__(self, instance: Instance):
        self.instance = instance
        I, K = instance.n_classes, instance.n_configs
        lam = instance.rates
        self.cost = cp.Parameter((I, K), name="cost")  # lambda_i R_i(r_i) per unit of pi_ik
        self.open = cp.Parameter((I, K), nonneg=True, name="open")  # 1 where z_k >= 1
        self.mem = cp.Parameter((I, K), nonneg=True, name="mem")  # (1+kappa) lambda H (r - delta L_pre) / M_k
        self.mem_cap = cp.Parameter(K, name="mem_cap")  # z_k - z_k sum_i delta_ik L_pre / M_k
        self.util = cp.Parameter((I, K), nonneg=True, name="util")  # lambda_i T_ik
        self.util_cap = cp.Parameter(K, nonneg=True, name="util_cap")  # u_{j_k} z_k
        self.slo = cp.Parameter((I, K), name="slo")  # W_k + H_ik - D_i
        self.pi = cp.Variable((I, K), nonneg=True, name="pi")
        self.s = cp.Variable(I, nonneg=True, name="s")
        a = cp.sum(self.pi, axis=1)
        objective = (
            cp.sum(cp.multiply(self.cost, self.pi))
            + instance.c_slo * (lam @ self.s)
            + instance.c_rej * (lam @ (1 - a))
        )
        cons = [
            a <= 1,
            self.pi <= self.open,
            cp.sum(cp.multiply(self.mem, self.pi), axis=0) <= self.mem_cap,
            cp.sum(cp.multiply(self.util, self.pi), axis=0) <= self.util_cap,
            self.s >= cp.sum(cp.multiply(self.slo, self.pi), axis=1),
        ]
        self.problem = cp.Problem(cp.Minimize(objective), cons)
        self.solves = 0

    def bands_for(self, z: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The band j_k LP1 holds fixed: the current band of a busy configuration; the top band for an
        idle deployed one (its W does not enter the current objective, so any band keeps descent)."""
        j = band_index(self.instance, u)
        B = self.instance.waiting_bands
        return np.where(j < 0, B - 1, np.minimum(j, B - 1))

    def solve(self, z, r, delta, bands) -> tuple[np.ndarray, float]:
        """Routing pi (repaired, :func:`repair_routing`) and LP1's optimal value plus the (fixed) GPU
        cost: the objective (8a) LP1 charges [cost / s]."""
        inst = self.instance
        z = np.asarray(z)
        T, H = caching_tables(inst, delta)
        d = np.asarray(delta, dtype=bool)
        lam, L_pre, M = inst.rates, inst.prefix_tokens, inst.capacity_tokens
        eta = np.asarray(r) - inst.input_tokens
        R = np.array([_table_cost(inst, i, eta[i]) for i in range(inst.n_classes)])
        edges = band_edges(inst)
        resp = band_response_s(inst)[:, np.arange(inst.n_configs), np.asarray(bands)]  # (I, K): W_ikj + dH_ikj in the held band
        self.cost.value = (lam * R)[:, None] * np.ones((1, inst.n_configs))
        self.open.value = np.broadcast_to((z >= 1).astype(float), (inst.n_classes, inst.n_configs)).copy()
        self.mem.value = (1 + inst.kappa) * lam[:, None] * H * (np.asarray(r)[:, None] - d * L_pre[:, None]) / M[None, :]
        self.mem_cap.value = z * (1.0 - (d * L_pre[:, None]).sum(axis=0) / M)
        self.util.value = lam[:, None] * T
        cap = edges[np.asarray(bands)] * z
        self.util_cap.value = cap
        self.slo.value = resp + H - inst.slo_s[:, None]
        _solve(self.problem, "LP1 (routing, BCD block 1)")
        self.solves += 1
        pi = repair_routing(inst, z, r, self.pi.value, delta, util_cap=cap)
        return pi, float(self.problem.value) + inst.c_gpu * float(inst.gpus @ z)


def _table_cost(instance: Instance, i: int, eta: float) -> float:
    """R_i(eta) from the candidate table when eta is a candidate buffer, else by the closed form."""
    etas = instance.candidates[i]
    c = int(round(eta / instance.block_tokens))
    if 0 <= c < etas.size and abs(etas[c] - eta) < 1e-9:
        return float(instance.candidate_costs[i][c])
    return instance.worst_case_cost(i, eta)


def own_minimisers(instance: Instance) -> np.ndarray:
    """Index of the smallest minimiser of R_i over class i's candidate buffers (block-granular
    critical fractile of the worst-case distribution, chapter 3), shape (I,)."""
    return np.array([int(np.flatnonzero(R <= R.min())[0]) for R in instance.candidate_costs])


class ReservationStep:
    """LP2: block-granular reservations r for fixed (z, pi, delta): min sum_i lambda_i a_i R_i(r_i)
    subject to (6e). Closed form when every class's own minimiser fits; else the knapsack MILP
    (candidates above the own minimiser are dominated: more memory, no lower cost)."""

    def __init__(self, instance: Instance):
        self.instance = instance
        I, K = instance.n_classes, instance.n_configs
        self.best = own_minimisers(instance)
        keep = [np.arange(b + 1) for b in self.best]
        self.class_of = np.concatenate([np.full(idx.size, i) for i, idx in enumerate(keep)])
        self.eta = np.concatenate([instance.candidates[i][idx] for i, idx in enumerate(keep)])
        R = np.concatenate([instance.candidate_costs[i][idx] for i, idx in enumerate(keep)])
        n = self.class_of.size
        onehot = np.zeros((I, n))
        onehot[self.class_of, np.arange(n)] = 1.0
        self.x = cp.Variable(n, boolean=True, name="x")
        self.weight = cp.Parameter(n, nonneg=True, name="weight")  # lambda_i a_i for the candidate's class
        self.mem = cp.Parameter((K, n), nonneg=True, name="mem")  # memory of each candidate / M_k
        self.mem_cap = cp.Parameter(K, name="mem_cap")
        self.problem = cp.Problem(
            cp.Minimize(cp.sum(cp.multiply(cp.multiply(self.weight, R), self.x))),
            [onehot @ self.x == 1, self.mem @ self.x <= self.mem_cap],
        )
        self.solves = 0
        self.knapsacks = 0

    def solve(self, z, r, pi, delta) -> np.ndarray:
        """New reservations r [tokens]; classes with no admitted traffic keep their own minimiser."""
        inst = self.instance
        L_in = inst.input_tokens
        r_own = L_in + np.array([inst.candidates[i][b] for i, b in enumerate(self.best)])
        lhs, cap = memory_rows(inst, z, r_own, pi, delta)
        self.solves += 1
        if np.all(lhs <= cap * (1 + 1e-12)):
            return r_own
        _, H = caching_tables(inst, delta)
        d = np.asarray(delta, dtype=bool)
        lam, L_pre, M = inst.rates, inst.prefix_tokens, inst.capacity_tokens
        z = np.asarray(z, dtype=float)
        ci = self.class_of
        coef = (1 + inst.kappa) * lam[:, None] * pi * H / M[None, :]  # (I, K) per token of r - delta L_pre
        self.weight.value = (lam * pi.sum(axis=1))[ci]
        self.mem.value = (coef[ci, :] * (L_in[ci, None] + self.eta[:, None] - d[ci, :] * L_pre[ci, None])).T
        self.mem_cap.value = z * (1.0 - (d * L_pre[:, None]).sum(axis=0) / M)
        _solve(self.problem, "LP2 knapsack (reservations, BCD block 1)", mip=True, mip_rel_gap=MIP_GAP, random_seed=0)
        self.knapsacks += 1
        x = np.asarray(self.x.value)
        out = np.empty(inst.n_classes)
        for i in range(inst.n_classes):
            idx = np.flatnonzero(ci == i)
            out[i] = L_in[i] + self.eta[idx[int(np.argmax(x[idx]))]]
        return out


def concurrency(instance: Instance, z, pi) -> np.ndarray:
    """Expected number of class-i requests resident on one group of k, lambda_i pi_ik H_ik / z_k
    (Little's law with the residence time H with the prefix cached), shape (I, K)."""
    z = np.asarray(z, dtype=float)
    flow = instance.rates[:, None] * np.asarray(pi) * instance.residence_s[:, :, 1]
    return np.divide(flow, z[None, :], out=np.zeros_like(flow), where=z[None, :] > 0)


def prefix_rule(instance: Instance, z, pi) -> np.ndarray:
    """Block 2 as the paper writes it: delta_ik = 1[expected concurrent class-i requests on a group of
    k > 1], with the concurrency of :func:`concurrency` (residence time H, not the work T)."""
    return concurrency(instance, z, pi) > 1.0


def prefix_descent(instance: Instance, z, r, pi, delta) -> np.ndarray:
    """Block 2, descent variant: keep delta where traffic goes, drop it where none goes, then cache
    every other routed pair whose extra memory fits (6e), most concurrent first.

    With pi fixed, caching a routed pair never raises T_ik or H_ik (so neither u_k, W_k nor s_i), and
    un-caching an idle pair frees memory at no cost: the objective cannot increase and (6e) stays met.
    """
    z = np.asarray(z)
    routed = (np.asarray(pi) > 0) & (z[None, :] >= 1)
    d = np.asarray(delta, dtype=bool) & routed
    n = concurrency(instance, z, pi)
    order = np.argsort(-n, axis=None, kind="stable")
    for flat in order:
        i, k = np.unravel_index(flat, n.shape)
        if not routed[i, k] or d[i, k]:
            continue
        trial = d.copy()
        trial[i, k] = True
        lhs, cap = memory_rows(instance, z, r, pi, trial)
        if lhs[k] <= cap[k] * (1 - 1e-12):
            d = trial
    return d


class ConfigIP:
    """Block 3: min over (z, pi, s, band) of (8a) for fixed (r, delta) -- a small integer program.

    Per configuration k and band j: a binary b_kj (k runs in band j) and an integer h_kj (its groups
    when it does), z_k = sum_j h_kj, h_kj <= Z_k b_kj, sum_j b_kj <= 1. The routed traffic is split by
    band, pi_ik = sum_j p_ikj with p_ikj <= b_kj, so pi_ik W_k = sum_j W_kj p_ikj is linear, and each
    band's traffic fits its capacity, sum_i lambda_i T_ik p_ikj <= u_j h_kj. The GPU budget (6b),
    (6c)-(6f) as in LP1. 2 K |B| integer variables, whatever J and the number of classes.
    """

    def __init__(self, instance: Instance):
        self.instance = instance
        I, K, B = instance.n_classes, instance.n_configs, instance.waiting_bands
        lam = instance.rates
        edges, Rb = band_edges(instance), band_response_s(instance)  # (B,), (I, K, B): W_kj + dH_ikj
        Z = instance.max_groups.astype(float)
        self.cost = cp.Parameter((I, K), name="cost")
        self.mem = cp.Parameter((I, K), nonneg=True, name="mem")
        self.prefix = cp.Parameter(K, nonneg=True, name="prefix")  # sum_i delta_ik L_pre / M_k
        self.util = cp.Parameter((I, K), nonneg=True, name="util")
        self.slo = cp.Parameter((I, K), name="slo")  # H_ik - D_i
        self.b = cp.Variable((K, B), boolean=True, name="band")
        self.h = cp.Variable((K, B), integer=True, name="groups")
        self.p = [cp.Variable((I, B), nonneg=True, name=f"p{k}") for k in range(K)]
        self.s = cp.Variable(I, nonneg=True, name="s")
        pi_cols = [cp.sum(self.p[k], axis=1) for k in range(K)]
        self.pi = cp.hstack([cp.reshape(c, (I, 1), order="C") for c in pi_cols])
        self.z = cp.sum(self.h, axis=1)
        a = cp.sum(self.pi, axis=1)
        cons = [
            self.h >= self.b,  # a band is chosen only with at least one group
            self.h <= np.diag(Z) @ self.b,
            cp.sum(self.b, axis=1) <= 1,
            instance.gpus @ self.z <= instance.total_gpus,
            a <= 1,
            cp.sum(cp.multiply(self.mem, self.pi), axis=0) + cp.multiply(self.prefix, self.z) <= self.z,
        ]
        wait = 0
        for k in range(K):
            ones = np.ones((I, 1))
            cons.append(self.p[k] <= ones @ cp.reshape(self.b[k], (1, B), order="C"))
            cons.append(self.util[:, k] @ self.p[k] <= cp.multiply(edges, self.h[k]))
            wait = wait + cp.sum(cp.multiply(self.p[k], Rb[:, k, :]), axis=1)
        cons.append(self.s >= cp.sum(cp.multiply(self.slo, self.pi), axis=1) + wait)
        objective = (
            cp.sum(cp.multiply(self.cost, self.pi))
            + instance.c_slo * (lam @ self.s)
            + instance.c_rej * (lam @ (1 - a))
            + instance.c_gpu * (instance.gpus @ self.z)
        )
        self.problem = cp.Problem(cp.Minimize(objective), cons)
        self.solves = 0

    def solve(self, r, delta, time_limit: float = 60.0) -> tuple[np.ndarray, np.ndarray, float]:
        """(z, pi, value): the block optimum (pi repaired onto the chosen bands' caps)."""
        inst = self.instance
        T, H = caching_tables(inst, delta)
        d = np.asarray(delta, dtype=bool)
        lam, L_pre, M = inst.rates, inst.prefix_tokens, inst.capacity_tokens
        eta = np.asarray(r) - inst.input_tokens
        R = np.array([_table_cost(inst, i, eta[i]) for i in range(inst.n_classes)])
        self.cost.value = (lam * R)[:, None] * np.ones((1, inst.n_configs))
        self.mem.value = (1 + inst.kappa) * lam[:, None] * H * (np.asarray(r)[:, None] - d * L_pre[:, None]) / M[None, :]
        self.prefix.value = (d * L_pre[:, None]).sum(axis=0) / M
        self.util.value = lam[:, None] * T
        self.slo.value = H - inst.slo_s[:, None]
        _solve(self.problem, "Block 3 integer program (configurations z)", mip=True, mip_rel_gap=MIP_GAP,
               time_limit=float(time_limit), random_seed=0)
        self.solves += 1
        z = np.rint(np.asarray(self.z.value, dtype=float)).astype(int)
        b = np.asarray(self.b.value) > 0.5
        edges = band_edges(inst)
        cap = np.where(b.any(axis=1), (edges[None, :] * b).sum(axis=1), 0.0) * z
        pi = repair_routing(inst, z, r, np.asarray(self.pi.value, dtype=float), delta, util_cap=cap)
        return z, pi, float(self.problem.value)
