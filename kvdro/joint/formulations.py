"""Exact MILP formulations of the joint problem (6)/(8): one model, a ladder of linearisations.

Every formulation here has the *same* integer solutions and the same optimum; they differ only in
their LP relaxation, which is what a branch-and-bound solver lives on. Chapter 5 climbs the ladder
one change at a time (:data:`LADDER`).

The model (per second of operation; I classes, K configurations, candidates c of class i):

* ``x_ic in {0,1}``, ``sum_c x_ic = 1``: class i reserves r_i = L_in^i + eta_ic (block granular);
  R_ic is the closed-form worst-case cost of that buffer -- the value of (8c)-(8g) minimised over
  (gamma_i, theta_i) -- so no gamma or theta variable is needed.
* ``z_k in {0..Z_k}`` groups of configuration k, Z_k = floor(J / (tau_k p_k)); (6b).
* ``pi_ik >= 0`` routing, ``pi_i0 = 1 - sum_k pi_ik >= 0`` rejected (6d); ``pi_ik <= [z_k >= 1]`` (6c).
* ``delta_ik in {0,1}`` prefix caching: work T_ik and residence H_ik become those of a prompt
  ``L_in - L_pre``, the request reserves ``r_i - L_pre^i`` and the group stores the prefix once.
* memory (6e), per configuration k (Little's law with the residence time H)::

      (1+kappa) sum_i lambda_i pi_ik H_ik(delta) (r_i - delta_ik L_pre^i) + sum_i delta_ik z_k L_pre^i <= z_k M_k

* utilisation (compute stability, keeps (7) finite): ``sum_i lambda_i pi_ik T_ik(delta) <= u_j z_k``
  where u_j is the upper edge of the utilisation band j the configuration is in (u_j <= u_max).
* SLO (6f): ``s_i >= sum_k pi_ik (W_k + H_ik(delta)) - a_i D_i``, ``s_i >= 0``, with W_k the
  waiting time of :func:`kvdro.joint.serving.waiting_model`: phi_k at the upper edge u_j of the
  utilisation band j containing u_k. The calibrated serving model bands H as well,
  H_ikj(delta) = H_ik(delta) + dH_ikj (:func:`kvdro.joint.serving.band_residence_offset_s`), so
  the band split p_ikj = pi_ik [band_k = j] carries ``W_kj + dH_ikj``
  (:func:`kvdro.joint.serving.band_response_s`) in every state formulation below.
* objective (8a): ``sum_i lambda_i [sum_k pi_ik R_i(r_i) + c_slo s_i + c_rej pi_i0] + c_gpu sum_k tau_k p_k z_k``.

The products to linearise come in two families, and each family has a weak and a strong form.

**Routing x buffer** (pi_ik x_ic and pi_ik delta_ik x_ic: cost, memory of (6e)).

* ``routing="mccormick"`` -- ``w_ikc ~ pi_ik x_ic``, ``v_ik ~ pi_ik delta_ik``, ``y_ikc ~ v_ik x_ic``,
  each by the four McCormick inequalities of a product with a binary factor
  (``w <= x, w <= pi, w >= pi + x - 1, w >= 0``): exact at integer x, weak in the relaxation
  (a fractional x lets ``w = 0``: traffic routed, no cost, no memory).
* ``routing="disaggregated"`` -- ``w0_ikc = pi_ik (1 - delta_ik) x_ic``, ``w1_ikc = pi_ik delta_ik x_ic``::

      w0_ikc + w1_ikc <= x_ic,  sum_c w1_ikc <= delta_ik,  sum_c w0_ikc <= 1 - delta_ik,
      pi_ik = sum_c (w0_ikc + w1_ikc).

  This is McCormick plus one product of constraints (RLT): ``sum_c x_ic = 1`` multiplied by pi_ik
  gives ``sum_c w_ikc = pi_ik`` -- routed traffic is paid for by *some* candidate.

**Configuration state** (delta_ik z_k in (6e), pi_ik W_k in (6f), z_k u_j in the utilisation).

* ``state="mccormick"`` -- z_k an integer variable and a one-hot band binary b_kj; the products
  ``z_k b_kj``, ``delta_ik z_k`` and ``pi_ik b_kj`` by McCormick.
* ``state="disaggregated"`` -- the state s = (n, j) of configuration k (n groups, band j) one-hot:
  binaries ``e_ks`` (plus ``e_k0`` for z_k = 0), ``z_k = sum_s n_s e_ks``, utilisation capacity
  ``sum_s n_s u_j(s) e_ks``; ``q_ikn = delta_ik [z_k = n]`` with ``sum_n q_ikn = delta_ik``,
  ``q_ikn <= [z_k = n]``; ``p_ikj = pi_ik [band_k = j]`` with ``sum_j p_ikj = pi_ik``,
  ``p_ikj <= [band_k = j]`` (RLT again: ``sum_j [band_k = j] = 1`` times pi_ik and delta_ik).

* ``state="counts"`` -- per configuration k and band j a binary ``b_kj`` (k runs in band j;
  ``sum_j b_kj <= 1``, none: z_k = 0) and an *integer* group count ``h_kj`` with
  ``b_kj <= h_kj <= Z_k b_kj``, ``z_k = sum_j h_kj``, utilisation capacity ``sum_j u_j h_kj``;
  ``p_ikj = pi_ik [band_k = j]`` as in the disaggregated state; ``q_ik = delta_ik z_k`` by McCormick
  (``q >= z_k - Z_k (1 - delta_ik)``, ``q <= Z_k delta_ik``, ``q <= z_k``) and ``delta_ik <= sum_j b_kj``.
  The same integer points as the disaggregated state (one band, z_k groups), but 2 K |B| integer
  variables and O(I K |B|) continuous ones whatever J: the disaggregated state has Z_k |B| binaries
  and I Z_k products per configuration, which at J = 1,024 is most of a 150,000-variable model.
  Its relaxation of ``delta z`` is weaker (McCormick instead of one q per group count); HiGHS makes
  up for it with integer branching on h (chapter 5 measures both).

**Valid inequalities** (redundant at integer points, cut off fractional ones).

* ``band_cut`` -- per band: ``sum_i lambda_i T_ik(cached) p_ikj <= sum_{s in band j} n_s u_j e_ks``,
  the traffic that sees band j's waiting time fits band j's capacity (T with the cached prefix is the
  smaller work, so this holds for either delta).
* ``route_hull`` -- ``sum_k (w0_ikc + w1_ikc) <= x_ic``: RLT of ``sum_k pi_ik <= 1`` times x_ic (it implies
  the per-configuration ``w0_ikc + w1_ikc <= x_ic``). Without it the relaxation may route up to x_ic
  of class i through candidate c on *every* configuration.

**Branching variables** (same relaxation, different tree).

* ``ordered`` -- the one-hot choices (buffer x_i., state e_k.) are written through "at least"
  binaries, ``X_ic = [eta_i >= eta_ic]``, ``Y_kn = [z_k >= n]``, ``V_kj = [band_k >= j]``, and x, e become
  continuous (they are integral whenever X, Y, V are). The LP relaxation is the same (a unimodular
  change of variables); what changes is branching: ``Y_kn = 0 | 1`` splits the tree into "fewer than
  n groups | at least n", a balanced dichotomy, where branching on one e_ks = 0 removes one state of
  hundreds. It also leaves presolve far fewer binaries to probe.

Candidate pruning (``prune=True``): buffers larger than the smallest minimiser of R_i are dominated
(no smaller cost, more memory; nothing else depends on r), so they are dropped. This preserves the
optimum exactly -- and it means the solver *never* returns a buffer above argmin R_i.

Groups of one configuration are identical, and every formulation here counts them (z_k, or the
one-hot state (n, j)) instead of giving each group its own variables, so there is no symmetry between
groups for branch and bound to break: traffic is split evenly over the z_k groups by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from kvdro.joint.instance import Instance

__all__ = [
    "DEFAULT_FORMULATION", "FORMULATIONS", "LADDER", "Spec", "SPECS", "MilpModel", "build_milp", "kept_candidates",
]


@dataclass(frozen=True)
class Spec:
    """Which linearisation of each product family, which valid inequalities, which branching variables.

    routing: ``"mccormick"`` or ``"disaggregated"``; state: ``"mccormick"``, ``"disaggregated"`` or
    ``"counts"`` (module docstring); band_cut, route_hull: the valid inequalities; ordered: branch on
    "at least" variables (module docstring; with the counts state only the buffers x are ordered).
    """

    routing: Literal["mccormick", "disaggregated"]
    state: Literal["mccormick", "disaggregated", "counts"]
    band_cut: bool = False
    route_hull: bool = False
    ordered: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if self.routing not in ("mccormick", "disaggregated") or self.state not in ("mccormick", "disaggregated", "counts"):
            raise ValueError(
                f"formulation: routing must be 'mccormick' or 'disaggregated' and state one of 'mccormick', "
                f"'disaggregated', 'counts', got {self}"
            )
        if (self.band_cut or self.ordered) and self.state == "mccormick":
            raise ValueError("formulation: band_cut and ordered need the disaggregated or counts state")
        if self.route_hull and self.routing != "disaggregated":
            raise ValueError("formulation: route_hull needs the disaggregated routing")


#: The named formulations. Each rung of :data:`LADDER` changes one thing from the one before.
SPECS: dict[str, Spec] = {
    "mccormick": Spec("mccormick", "mccormick", label="McCormick everywhere (textbook)"),
    "routing": Spec("disaggregated", "mccormick", label="+ disaggregated routing x buffer"),
    "state": Spec("disaggregated", "disaggregated", label="+ disaggregated state (groups, band)"),
    "band-cut": Spec("disaggregated", "disaggregated", band_cut=True, label="+ per-band valid inequality"),
    "routing-hull": Spec(
        "disaggregated", "disaggregated", band_cut=True, route_hull=True, label="+ routing hull (sum over k)"
    ),
    "disaggregated": Spec(
        "disaggregated", "disaggregated", band_cut=True, route_hull=True, ordered=True,
        label="+ ordered branching variables",
    ),
    "counts": Spec(
        "disaggregated", "counts", band_cut=True, route_hull=True, ordered=True,
        label="+ integer group counts per band (size independent of J)",
    ),
}
#: The ladder of chapter 5, weakest relaxation first up to ``"disaggregated"``; the last rung,
#: ``"counts"``, trades some relaxation strength for a model whose size does not grow with J, and is
#: the default of :func:`kvdro.joint.solve_exact`. (``"band-cut"``, then ``"disaggregated"``, were
#: the defaults before.)
LADDER: tuple[str, ...] = ("mccormick", "routing", "state", "band-cut", "routing-hull", "disaggregated", "counts")
FORMULATIONS: tuple[str, ...] = tuple(SPECS)
#: The default of :func:`build_milp` and :func:`kvdro.joint.solve_exact`: the fastest formulation that
#: proves optimality on chapter 5's ladder and chapter 6's crossover (measured by ``python -m
#: kvdro.bench exact --parts ladder`` and ``python -m kvdro.bench bcd scaling``).
DEFAULT_FORMULATION = "counts"
Formulation = Literal["mccormick", "routing", "state", "band-cut", "routing-hull", "disaggregated", "counts"]


def kept_candidates(instance: Instance, prune: bool = True) -> tuple[np.ndarray, ...]:
    """Per class, the indices of the candidate buffers the MILP keeps (all, or those <= argmin R_i)."""
    out = []
    for R in instance.candidate_costs:
        if prune:
            best = int(np.flatnonzero(R <= R.min())[0])
            out.append(np.arange(best + 1))
        else:
            out.append(np.arange(R.size))
    return tuple(out)


@dataclass
class MilpModel:
    """A built (not yet solved) MILP: the CVXPY problem, its variables and how to read a solution.

    ``problem`` can be printed, inspected and re-solved. After a solve, :meth:`decision` returns
    (z, r, pi, delta) as arrays.
    """

    problem: cp.Problem
    formulation: str
    relaxed: bool
    variables: dict[str, object]
    class_of: np.ndarray  # class of each flattened candidate m
    eta: np.ndarray  # buffer of each flattened candidate [tokens]
    input_tokens: np.ndarray
    max_groups: np.ndarray
    info: dict = field(default_factory=dict)

    def decision(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(z, r, pi, delta) of the last solve, rounded to the integer lattice (MILP only)."""
        v = self.variables
        n_cls = self.input_tokens.size
        x = np.asarray(v["x"].value, dtype=float)
        r = np.empty(n_cls)
        for i in range(n_cls):
            idx = np.flatnonzero(self.class_of == i)
            r[i] = self.input_tokens[i] + self.eta[idx[int(np.argmax(x[idx]))]]
        z = np.array([int(round(float(zk.value if hasattr(zk, "value") else zk))) for zk in v["z"]])
        pi = np.clip(np.asarray(v["pi"].value, dtype=float), 0.0, 1.0)
        pi[pi < 1e-10] = 0.0
        pi[:, z == 0] = 0.0
        excess = pi.sum(axis=1)
        pi = pi / np.maximum(excess, 1.0)[:, None]
        delta = np.asarray(v["delta"].value, dtype=float) > 0.5
        return z, r, pi, delta


def _flatten(instance: Instance, prune: bool):
    keep = kept_candidates(instance, prune)
    class_of = np.concatenate([np.full(idx.size, i) for i, idx in enumerate(keep)])
    eta = np.concatenate([instance.candidates[i][idx] for i, idx in enumerate(keep)])
    R = np.concatenate([instance.candidate_costs[i][idx] for i, idx in enumerate(keep)])
    n = class_of.size
    A = sp.csr_matrix((np.ones(n), (class_of, np.arange(n))), shape=(instance.n_classes, n))
    return class_of, eta, R, A


def _row(vec, rows: int):
    """Stack a 1-D expression ``rows`` times: shape (rows, len(vec))."""
    return np.ones((rows, 1)) @ cp.reshape(vec, (1, vec.shape[0]), order="C")


def _col(vec, cols: int):
    """Repeat a 1-D expression as ``cols`` columns: shape (len(vec), cols)."""
    return cp.reshape(vec, (vec.shape[0], 1), order="C") @ np.ones((1, cols))


def build_milp(
    instance: Instance,
    *,
    formulation: Formulation | Spec = DEFAULT_FORMULATION,
    relax: bool = False,
    prune: bool = True,
) -> MilpModel:
    """Build the MILP of (6)/(8) (module docstring) as a CVXPY problem.

    Args:
        instance: the problem data.
        formulation: a name of :data:`FORMULATIONS` (weakest ``"mccormick"``, strongest relaxation
            ``"disaggregated"``, default :data:`DEFAULT_FORMULATION`) or a :class:`Spec`.
        relax: the LP relaxation instead (binaries in [0, 1], z_k in [0, Z_k]).
        prune: drop dominated candidate buffers (exact; see :func:`kept_candidates`).
    """
    if isinstance(formulation, Spec):
        spec, name = formulation, formulation.label or "custom"
    elif formulation in SPECS:
        spec, name = SPECS[formulation], str(formulation)
    else:
        raise ValueError(f"formulation: must be one of {FORMULATIONS} or a Spec, got {formulation!r}")
    if not isinstance(instance, Instance):
        raise ValueError(f"instance: must be a kvdro.joint.Instance, got {type(instance).__name__}")
    from kvdro.joint.serving import band_edges, band_response_s

    K, I = instance.n_configs, instance.n_classes
    # (B,), (I, K, B): W_kj + dH_ikj, the banded part of the response time (6f)
    edges, Rb = band_edges(instance), band_response_s(instance)
    B = edges.size
    class_of, eta, R, A = _flatten(instance, prune)
    N = class_of.size
    lam = instance.rates
    L_in, L_pre, D = instance.input_tokens, instance.prefix_tokens, instance.slo_s
    H, T = instance.residence_s, instance.service_s
    M, g, Z, J = instance.capacity_tokens, instance.gpus, instance.max_groups, instance.total_gpus
    kap = 1.0 + instance.kappa
    r = L_in[class_of] + eta  # reservation of each flattened candidate [tokens]
    lam_m = lam[class_of]
    # (K, N) coefficient matrices; memory rows are scaled by 1/M_k (units of one group's capacity)
    mem0 = kap * lam_m[None, :] * H[class_of, :, 0].T * r[None, :] / M[:, None]
    mem1 = kap * lam_m[None, :] * H[class_of, :, 1].T * (r - L_pre[class_of])[None, :] / M[:, None]
    util0 = lam_m[None, :] * T[class_of, :, 0].T
    util1 = lam_m[None, :] * T[class_of, :, 1].T
    slo0 = H[class_of, :, 0].T - D[class_of][None, :]
    slo1 = H[class_of, :, 1].T - D[class_of][None, :]
    cost_m = lam_m * R  # cost per second of routing all of class i with candidate m

    integer = not relax
    x = cp.Variable(N, boolean=integer and not spec.ordered, name="x")
    delta = cp.Variable((I, K), boolean=integer, name="delta")
    rej = cp.Variable(I, nonneg=True, name="pi0")
    s = cp.Variable(I, nonneg=True, name="s")
    xrow = _row(x, K)
    cons = [A @ x == 1, x >= 0, x <= 1, delta >= 0, delta <= 1]
    if spec.ordered:
        # X_ic = [eta_i >= eta_ic] binary, c >= 1; x continuous: x_i0 = 1 - X_i1, x_ic = X_ic - X_i,c+1,
        # x_i,last = X_i,last (x >= 0 makes X non-increasing in c)
        rows, cols, vals, base, col = [], [], [], np.zeros(N), 0
        for i in range(I):
            idx = np.flatnonzero(class_of == i)
            base[idx[0]] = 1.0
            for c in range(1, idx.size):
                rows += [idx[c - 1], idx[c]]
                cols += [col, col]
                vals += [-1.0, 1.0]
                col += 1
        if col:
            X = cp.Variable(col, boolean=integer, name="xcum")
            cons += [x == base + sp.csr_matrix((vals, (rows, cols)), shape=(N, col)) @ X, X >= 0, X <= 1]
    variables: dict[str, object] = {"x": x, "delta": delta, "pi0": rej, "s": s}

    # ---- routing x buffer: pi, and per configuration the work, memory, cost and SLO terms --------
    if spec.routing == "disaggregated":
        W0 = cp.Variable((K, N), nonneg=True, name="w0")  # pi (1 - delta) x
        W1 = cp.Variable((K, N), nonneg=True, name="w1")  # pi delta x
        pi = A @ (W0 + W1).T  # (I, K)
        cached = A @ W1.T  # pi_ik delta_ik
        cons += [A @ W1.T <= delta, A @ W0.T <= 1 - delta]
        if spec.route_hull:
            cons += [cp.sum(W0 + W1, axis=0) <= x]  # implies W0 + W1 <= x for every k
        else:
            cons += [W0 + W1 <= xrow]
        work = [cp.sum(cp.multiply(util0[k], W0[k]) + cp.multiply(util1[k], W1[k])) for k in range(K)]
        memory = [cp.sum(cp.multiply(mem0[k], W0[k]) + cp.multiply(mem1[k], W1[k])) for k in range(K)]
        slo_route = cp.sum(A @ (cp.multiply(slo0, W0) + cp.multiply(slo1, W1)).T, axis=1)
        dro = cp.sum(cp.multiply(np.ones((K, 1)) @ cost_m[None, :], W0 + W1))
        variables.update({"w0": W0, "w1": W1})
    else:
        pi = cp.Variable((I, K), nonneg=True, name="pi")
        w = cp.Variable((K, N), nonneg=True, name="w")  # ~ pi_ik x_ic
        v = cp.Variable((I, K), nonneg=True, name="v")  # ~ pi_ik delta_ik
        y = cp.Variable((K, N), nonneg=True, name="y")  # ~ v_ik x_ic
        cached = v
        pi_m = (A.T @ pi).T  # (K, N): pi of the candidate's class
        v_m = (A.T @ v).T
        cons += [w <= xrow, w <= pi_m, w >= pi_m + xrow - 1]
        cons += [v <= pi, v <= delta, v >= pi + delta - 1]
        cons += [y <= xrow, y <= v_m, y >= v_m + xrow - 1]
        work = [lam @ (cp.multiply(T[:, k, 0], pi[:, k] - v[:, k]) + cp.multiply(T[:, k, 1], v[:, k])) for k in range(K)]
        memory = [cp.sum(cp.multiply(mem0[k], w[k] - y[k]) + cp.multiply(mem1[k], y[k])) for k in range(K)]
        slo_route = cp.sum(cp.multiply(H[:, :, 0] - D[:, None], pi - v) + cp.multiply(H[:, :, 1] - D[:, None], v), axis=1)
        dro = cp.sum(cp.multiply(np.ones((K, 1)) @ cost_m[None, :], w))
        variables.update({"w": w, "v": v, "y": y})

    # ---- configuration state: groups z_k, band, and the products delta z, pi W, z u ----------------
    zk: list = []
    w_slo = 0
    if spec.state == "disaggregated":
        # with ``ordered`` the binaries are the "at least" variables below and e is continuous
        state_integer = integer and not spec.ordered
        e0 = [cp.Variable(boolean=state_integer, name=f"e0_{k}") for k in range(K)]
        E = [cp.Variable(int(Z[k]) * B, boolean=state_integer, name=f"e{k}") if Z[k] > 0 else None for k in range(K)]
        Q = [cp.Variable((I, int(Z[k])), nonneg=True, name=f"q{k}") if Z[k] > 0 else None for k in range(K)]
        P = [cp.Variable((I, B), nonneg=True, name=f"p{k}") for k in range(K)]
        for k in range(K):
            nk = int(Z[k])
            cons += [e0[k] >= 0, e0[k] <= 1, pi[:, k] <= 1 - e0[k]]
            if nk == 0:
                cons += [e0[k] == 1, delta[:, k] == 0]
                zk.append(0.0)
                continue
            n_of = np.repeat(np.arange(1, nk + 1), B)  # state s = (n, j): n = 1..Z_k groups, band j
            j_of = np.tile(np.arange(B), nk)
            n_matrix = (n_of[None, :] == np.arange(1, nk + 1)[:, None]).astype(float)  # (Z_k, S)
            band_matrix = (j_of[None, :] == np.arange(B)[:, None]).astype(float)  # (B, S)
            o = n_matrix @ E[k]  # [z_k = n], n = 1..Z_k
            band = band_matrix @ E[k]  # [band_k = j]
            cap_s = n_of * edges[j_of]  # utilisation capacity of each state
            zk.append(n_of @ E[k])
            cons += [E[k] >= 0, E[k] <= 1, e0[k] + cp.sum(E[k]) == 1]
            if spec.ordered:
                # Y_n = [z_k >= n], V_j = [band_k >= j]: e has these margins, and a 0/1 matrix whose row
                # and column sums are 0/1 unit vectors is itself 0/1 -- so e is integral when Y, V are
                Y = cp.Variable(nk, boolean=integer, name=f"y{k}")
                cons += [Y >= 0, Y <= 1, e0[k] == 1 - Y[0], o[-1] == Y[-1]]
                if nk > 1:
                    cons += [o[:-1] == Y[:-1] - Y[1:]]
                if B > 1:
                    V = cp.Variable(B - 1, boolean=integer, name=f"v{k}")  # j = 1..B-1 (0-based bands)
                    cons += [V >= 0, V <= 1, band[0] == Y[0] - V[0], band[-1] == V[-1]]
                    if B > 2:
                        cons += [band[1:-1] == V[:-1] - V[1:]]
                else:
                    cons += [band[0] == Y[0]]
            cons += [cp.sum(Q[k], axis=1) == delta[:, k], Q[k] <= _row(o, I)]
            cons += [cp.sum(P[k], axis=1) == pi[:, k], P[k] <= _row(band, I)]
            if spec.band_cut:
                # the traffic that sees band j's waiting time fits band j's capacity; the cached-prefix
                # work T(1) is the smaller one, so this holds for either delta
                cons += [(lam * T[:, k, 1]) @ P[k] <= band_matrix @ cp.multiply(cap_s, E[k])]
            nvec = np.arange(1, nk + 1)
            cons += [memory[k] + L_pre @ (Q[k] @ nvec) / M[k] <= zk[k], work[k] <= cap_s @ E[k]]
            w_slo = w_slo + cp.sum(cp.multiply(P[k], Rb[:, k, :]), axis=1)
        variables.update({"e0": e0, "e": E, "q": Q, "p": P})
    elif spec.state == "counts":
        Zf = Z.astype(float)
        bnd = cp.Variable((K, B), boolean=integer, name="band")  # [band_k = j]
        hc = cp.Variable((K, B), integer=integer, name="groups")  # z_k [band_k = j]
        q = cp.Variable((I, K), nonneg=True, name="q")  # delta_ik z_k
        P = [cp.Variable((I, B), nonneg=True, name=f"p{k}") for k in range(K)]
        cons += [bnd >= 0, bnd <= 1, hc >= bnd, hc <= np.diag(Zf) @ bnd, cp.sum(bnd, axis=1) <= 1]
        for k in range(K):
            on = cp.sum(bnd[k])  # [z_k >= 1]
            z_k = cp.sum(hc[k])
            zk.append(z_k)
            cons += [cp.sum(P[k], axis=1) == pi[:, k], P[k] <= _row(bnd[k], I), delta[:, k] <= on]
            cons += [q[:, k] >= z_k - Zf[k] * (1 - delta[:, k]), q[:, k] <= Zf[k] * delta[:, k], q[:, k] <= z_k]
            if spec.band_cut:
                cons += [(lam * T[:, k, 1]) @ P[k] <= cp.multiply(edges, hc[k])]
            cons += [memory[k] + (L_pre / M[k]) @ q[:, k] <= z_k, work[k] <= edges @ hc[k]]
            w_slo = w_slo + cp.sum(cp.multiply(P[k], Rb[:, k, :]), axis=1)
        variables.update({"band": bnd, "groups": hc, "q": q, "p": P})
    else:
        z = cp.Variable(K, integer=integer, name="z")
        b = cp.Variable((K, B), boolean=integer, name="b")  # band of configuration k
        m = [cp.Variable((I, B), nonneg=True, name=f"m{k}") for k in range(K)]  # ~ pi_ik b_kj
        h = cp.Variable((K, B), nonneg=True, name="h")  # ~ z_k b_kj
        q = cp.Variable((I, K), nonneg=True, name="q")  # ~ delta_ik z_k
        Zf = Z.astype(float)
        cons += [z >= 0, z <= Z, b >= 0, b <= 1, cp.sum(b, axis=1) == 1]
        zrow = _row(z, I)
        cons += [q <= delta @ np.diag(Zf), q <= zrow, q >= zrow - (1 - delta) @ np.diag(Zf)]
        zcol = _col(z, B)
        cons += [h <= np.diag(Zf) @ b, h <= zcol, h >= zcol - np.diag(Zf) @ (1 - b)]
        cons += [pi <= zrow]  # (6c): z_k >= 1 wherever traffic goes
        for k in range(K):
            brow = _row(b[k], I)
            picol = _col(pi[:, k], B)
            cons += [m[k] <= brow, m[k] <= picol, m[k] >= picol + brow - 1]
            w_slo = w_slo + cp.sum(cp.multiply(m[k], Rb[:, k, :]), axis=1)
            cons += [memory[k] + (L_pre / M[k]) @ q[:, k] <= z[k], work[k] <= edges @ h[k]]
            zk.append(z[k])
        variables.update({"b": b, "m": m, "h": h, "q": q})

    z_total = sum(g[k] * zk[k] for k in range(K))
    cons += [cp.sum(pi, axis=1) + rej == 1, s >= slo_route + w_slo, z_total <= J]
    objective = dro + instance.c_gpu * z_total + instance.c_slo * (lam @ s) + instance.c_rej * (lam @ rej)
    problem = cp.Problem(cp.Minimize(objective), cons)
    variables["pi"] = pi
    variables["z"] = zk
    return MilpModel(
        problem=problem,
        formulation=name,
        relaxed=relax,
        variables=variables,
        class_of=class_of,
        eta=eta,
        input_tokens=L_in,
        max_groups=Z,
        info={"candidates": int(N), "pruned": bool(prune), "spec": spec},
    )
