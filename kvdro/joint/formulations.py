"""Two exact MILP formulations of the joint problem (6)/(8).

Both formulations have the *same* integer solutions and the same optimum; they differ only in their
LP relaxation, which is what a branch-and-bound solver lives on. Chapter 5 shows the contrast.

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

* utilisation (compute stability, keeps (7) finite): ``sum_i lambda_i pi_ik T_ik(delta) <= u_max z_k``.
* SLO (6f): ``s_i >= sum_k pi_ik (W_k + H_ik(delta)) - a_i D_i``, ``s_i >= 0``, with W_k the
  waiting time of :func:`kvdro.joint.serving.waiting_model`: phi_k at the upper edge u_j of the
  utilisation band j containing u_k. The MILP picks the band with a binary and enforces
  ``sum_i lambda_i pi_ik T_ik <= u_j z_k``; W_k pi_ik is a product of a binary and pi.
* objective (8a): ``sum_i lambda_i [sum_k pi_ik R_i(r_i) + c_slo s_i + c_rej pi_i0] + c_gpu sum_k tau_k p_k z_k``.

**Disaggregated** (``"disaggregated"``, the strong one). One non-negative variable per (i, k, c) and
caching state: ``w0_ikc = pi_ik (1 - delta_ik) x_ic`` and ``w1_ikc = pi_ik delta_ik x_ic``, with

    w0_ikc + w1_ikc <= x_ic,   sum_c w1_ikc <= delta_ik,   sum_c w0_ikc <= 1 - delta_ik,
    pi_ik = sum_c (w0_ikc + w1_ikc),

and the *state* s = (n, j) of configuration k one-hot (number of groups n, utilisation band j):
binaries ``e_ks`` (plus ``e_k0`` for z_k = 0), ``z_k = sum_s n_s e_ks``, utilisation capacity
``sum_s n_s u_j(s) e_ks``. The products delta_ik z_k and pi_ik W_k are disaggregated over that state:
``q_ikn = delta_ik [z_k = n]`` with ``sum_n q_ikn = delta_ik``, ``q_ikn <= [z_k = n]``;
``p_ikj = pi_ik [band_k = j]`` with ``sum_j p_ikj = pi_ik``, ``p_ikj <= [band_k = j]``, and per band
``sum_i lambda_i T_ik(cached) p_ikj <= sum_{s in band j} n_s u_j e_ks`` -- the traffic that sees band
j's waiting time fits band j's capacity: redundant at integer points, it tightens the relaxation
(root gap about 3.5% instead of 6.6% on the small instance). Every product of (6e)/(6f)/(8a) is then a linear
function of (w0, w1, q, p, e).

**McCormick** (``"mccormick"``, the textbook one). ``w_ikc ~ pi_ik x_ic``, ``v_ik ~ pi_ik delta_ik``,
``y_ikc ~ v_ik x_ic`` and ``q_ik ~ delta_ik z_k`` (z_k an integer variable) each replaced by the four
McCormick inequalities of a product with one binary factor, and so are ``pi_ik b_kj`` and
``z_k b_kj`` for the band binaries b_kj -- exact at integer points, weak in the relaxation
(``w >= pi + x - 1`` lets a fractional x zero out both memory and cost).

Candidate pruning (``prune=True``): buffers larger than the smallest minimiser of R_i are dominated
(no smaller cost, more memory; nothing else depends on r), so they are dropped. This preserves the
optimum exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from kvdro.joint.instance import Instance

__all__ = ["FORMULATIONS", "MilpModel", "build_milp", "kept_candidates"]

FORMULATIONS = ("disaggregated", "mccormick")
Formulation = Literal["disaggregated", "mccormick"]


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


def build_milp(
    instance: Instance,
    *,
    formulation: Formulation = "disaggregated",
    relax: bool = False,
    prune: bool = True,
) -> MilpModel:
    """Build the MILP of (6)/(8) (module docstring) as a CVXPY problem.

    Args:
        instance: the problem data.
        formulation: ``"disaggregated"`` (strong) or ``"mccormick"`` (textbook); module docstring.
        relax: the LP relaxation instead (binaries in [0, 1], z_k in [0, Z_k]).
        prune: drop dominated candidate buffers (exact; see :func:`kept_candidates`).
    """
    if formulation not in FORMULATIONS:
        raise ValueError(f"formulation: must be one of {FORMULATIONS}, got {formulation!r}")
    K, I = instance.n_configs, instance.n_classes
    from kvdro.joint.serving import band_edges, band_waiting_s

    edges, Wb = band_edges(instance), band_waiting_s(instance)  # (B,), (K, B)
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
    x = cp.Variable(N, boolean=integer, name="x")
    delta = cp.Variable((I, K), boolean=integer, name="delta")
    rej = cp.Variable(I, nonneg=True, name="pi0")
    s = cp.Variable(I, nonneg=True, name="s")
    xrow = np.ones((K, 1)) @ cp.reshape(x, (1, N), order="C")
    cons = [A @ x == 1, x >= 0, x <= 1, delta >= 0, delta <= 1]
    variables: dict[str, object] = {"x": x, "delta": delta, "pi0": rej, "s": s}

    if formulation == "disaggregated":
        W0 = cp.Variable((K, N), nonneg=True, name="w0")
        W1 = cp.Variable((K, N), nonneg=True, name="w1")
        e0 = [cp.Variable(boolean=integer, name=f"e0_{k}") for k in range(K)]
        # state s = (n, j) of configuration k: n = 1..Z_k groups, utilisation band j = 1..B
        n_of = [np.repeat(np.arange(1, int(Z[k]) + 1), B) for k in range(K)]
        j_of = [np.tile(np.arange(B), int(Z[k])) for k in range(K)]
        E = [cp.Variable(int(Z[k]) * B, boolean=integer, name=f"e{k}") for k in range(K)]
        Q = [cp.Variable((I, int(Z[k])), nonneg=True, name=f"q{k}") for k in range(K)]
        P = [cp.Variable((I, B), nonneg=True, name=f"p{k}") for k in range(K)]
        pi = A @ (W0 + W1).T  # (I, K)
        cons += [W0 + W1 <= xrow, A @ W1.T <= delta, A @ W0.T <= 1 - delta]
        zk, w_slo = [], 0
        for k in range(K):
            nk, S = int(Z[k]), int(Z[k]) * B
            cons += [e0[k] >= 0, e0[k] <= 1, pi[:, k] <= 1 - e0[k]]
            if nk == 0:
                cons += [e0[k] == 1, delta[:, k] == 0]
                zk.append(0.0)
                continue
            n = np.arange(1, nk + 1)
            n_matrix = (n_of[k][None, :] == n[:, None]).astype(float)  # (Z_k, S)
            o = n_matrix @ E[k]  # [z_k = n], n = 1..Z_k
            cap_s = n_of[k] * edges[j_of[k]]  # utilisation capacity of each state
            zk.append(n_of[k] @ E[k])
            cons += [E[k] >= 0, E[k] <= 1, e0[k] + cp.sum(E[k]) == 1]
            cons += [cp.sum(Q[k], axis=1) == delta[:, k], Q[k] <= np.ones((I, 1)) @ cp.reshape(o, (1, nk), order="C")]
            band_matrix = (j_of[k][None, :] == np.arange(B)[:, None]).astype(float)  # (B, S)
            band = band_matrix @ E[k]  # [band_k = j]
            cons += [cp.sum(P[k], axis=1) == pi[:, k], P[k] <= np.ones((I, 1)) @ cp.reshape(band, (1, B), order="C")]
            # per band (valid, tightening): the traffic that sees band j's waiting time fits the capacity
            # of band j's states; the cached-prefix work T(1) is the smaller one, so this holds for either delta
            cons += [(lam * T[:, k, 1]) @ P[k] <= band_matrix @ cp.multiply(cap_s, E[k])]
            prefix_store = L_pre @ (Q[k] @ n) / M[k]
            cons += [
                cp.sum(cp.multiply(mem0[k], W0[k]) + cp.multiply(mem1[k], W1[k])) + prefix_store <= zk[k],
                cp.sum(cp.multiply(util0[k], W0[k]) + cp.multiply(util1[k], W1[k])) <= cap_s @ E[k],
            ]
            w_slo = w_slo + P[k] @ Wb[k]
        slo_lhs = cp.sum(A @ (cp.multiply(slo0, W0) + cp.multiply(slo1, W1)).T, axis=1) + w_slo
        dro = cp.sum(cp.multiply(np.ones((K, 1)) @ cost_m[None, :], W0 + W1))
        z_total = sum(g[k] * zk[k] for k in range(K))
        variables.update({"w0": W0, "w1": W1, "e0": e0, "e": E, "q": Q, "p": P, "z": zk})
    else:
        pi = cp.Variable((I, K), nonneg=True, name="pi")
        z = cp.Variable(K, integer=integer, name="z")
        w = cp.Variable((K, N), nonneg=True, name="w")  # ~ pi_ik x_ic
        v = cp.Variable((I, K), nonneg=True, name="v")  # ~ pi_ik delta_ik
        y = cp.Variable((K, N), nonneg=True, name="y")  # ~ v_ik x_ic
        q = cp.Variable((I, K), nonneg=True, name="q")  # ~ delta_ik z_k
        b = cp.Variable((K, B), boolean=integer, name="b")  # band of configuration k
        m = [cp.Variable((I, B), nonneg=True, name=f"m{k}") for k in range(K)]  # ~ pi_ik b_kj
        h = cp.Variable((K, B), nonneg=True, name="h")  # ~ z_k b_kj
        pi_m = (A.T @ pi).T  # (K, N): pi of the candidate's class
        v_m = (A.T @ v).T
        Zf = Z.astype(float)
        cons += [z >= 0, z <= Z, b >= 0, b <= 1, cp.sum(b, axis=1) == 1]
        cons += [w <= xrow, w <= pi_m, w >= pi_m + xrow - 1]
        cons += [v <= pi, v <= delta, v >= pi + delta - 1]
        cons += [y <= xrow, y <= v_m, y >= v_m + xrow - 1]
        zrow = np.ones((I, 1)) @ cp.reshape(z, (1, K), order="C")
        cons += [q <= delta @ np.diag(Zf), q <= zrow, q >= zrow - (1 - delta) @ np.diag(Zf)]
        zcol = cp.reshape(z, (K, 1), order="C") @ np.ones((1, B))
        cons += [h <= np.diag(Zf) @ b, h <= zcol, h >= zcol - np.diag(Zf) @ (1 - b)]
        cons += [pi <= zrow]
        w_slo = 0
        for k in range(K):
            brow = np.ones((I, 1)) @ cp.reshape(b[k], (1, B), order="C")
            picol = cp.reshape(pi[:, k], (I, 1), order="C") @ np.ones((1, B))
            cons += [m[k] <= brow, m[k] <= picol, m[k] >= picol + brow - 1]
            w_slo = w_slo + m[k] @ Wb[k]
            cons += [
                cp.sum(cp.multiply(mem0[k], w[k] - y[k]) + cp.multiply(mem1[k], y[k])) + (L_pre / M[k]) @ q[:, k] <= z[k],
                lam @ (cp.multiply(T[:, k, 0], pi[:, k] - v[:, k]) + cp.multiply(T[:, k, 1], v[:, k])) <= edges @ h[k],
            ]
        slo_c0 = H[:, :, 0] - D[:, None]
        slo_c1 = H[:, :, 1] - D[:, None]
        slo_lhs = cp.sum(cp.multiply(slo_c0, pi - v) + cp.multiply(slo_c1, v), axis=1) + w_slo
        dro = cp.sum(cp.multiply(np.ones((K, 1)) @ cost_m[None, :], w))
        z_total = g @ z
        variables.update({"z": [z[k] for k in range(K)], "w": w, "v": v, "y": y, "q": q, "b": b, "m": m, "h": h})

    cons += [cp.sum(pi, axis=1) + rej == 1, s >= slo_lhs, z_total <= J]
    objective = dro + instance.c_gpu * z_total + instance.c_slo * (lam @ s) + instance.c_rej * (lam @ rej)
    problem = cp.Problem(cp.Minimize(objective), cons)
    variables["pi"] = pi
    return MilpModel(
        problem=problem,
        formulation=formulation,
        relaxed=relax,
        variables=variables,
        class_of=class_of,
        eta=eta,
        input_tokens=L_in,
        max_groups=Z,
        info={"candidates": int(N), "pruned": bool(prune)},
    )
