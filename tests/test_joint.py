"""kvdro.joint: instance validation, candidate buffers, evaluate on hand-computed values, the exact
MILP against brute force, the two formulations against each other, rejection when overloaded."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import linprog

from kvdro.errors import SolverError
from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig, config_performance
from kvdro.joint import (
    FORMULATIONS,
    LADDER,
    Instance,
    Solution,
    build_milp,
    candidate_buffers,
    evaluate,
    solve_exact,
    solve_milp,
    solve_relaxation,
)
from kvdro.joint.serving import band_edges, band_waiting_s, waiting_model
from kvdro.wasserstein import worst_case_cost
from kvdro.workload import RequestClass

TP2 = config_performance(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
TP4 = config_performance(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))


def tiny_classes(rng: np.random.Generator, rates=(2.0, 1.5)) -> tuple[RequestClass, ...]:
    """Two classes with outputs in [1, 32] tokens (3 candidate buffers: 0, 16, 32)."""
    return (
        RequestClass("a", rates[0], np.full(20, 900), rng.integers(1, 33, 20), prefix_tokens=200, slo_s=1.5, max_output_tokens=32),
        RequestClass("b", rates[1], np.full(20, 2400), rng.integers(1, 33, 20), prefix_tokens=300, slo_s=2.5, max_output_tokens=32),
    )


def tiny_instance(rng: np.random.Generator, **kw) -> Instance:
    """2 classes, TP2 (memory cut to 9,600 tokens so that (6e) binds) and TP4, J = 4, 2 waiting bands."""
    configs = (replace(TP2, kv_capacity_tokens=9600, kv_capacity_blocks=600), TP4)
    args = dict(classes=tiny_classes(rng), configs=configs, total_gpus=4, waiting_bands=2, c_gpu=50.0)
    args.update(kw)
    return Instance(**args)


# ------------------------------------------------------------------------------------ validation


def test_candidate_buffers_are_whole_blocks_up_to_L_max():
    np.testing.assert_array_equal(candidate_buffers(32), [0, 16, 32])
    np.testing.assert_array_equal(candidate_buffers(33), [0, 16, 32, 48])
    np.testing.assert_array_equal(candidate_buffers(0), [0])
    with pytest.raises(ValueError, match="max_output_tokens"):
        candidate_buffers(-1)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("total_gpus", 1, "total_gpus"),  # J smaller than every configuration's GPU count (2)
        ("total_gpus", 0, "total_gpus"),
        ("eps", -0.5, "eps"),
        ("c_p", -1.0, "c_p"),
        ("c_rej", float("nan"), "c_rej"),
        ("kappa", -0.1, "kappa"),
        ("u_max", 1.0, "u_max"),
        ("classes", (), "classes"),
        ("configs", (), "configs"),
        ("waiting_bands", 0, "waiting_bands"),
    ],
)
def test_bad_instance_input_names_the_argument(rng, field, value, match):
    with pytest.raises(ValueError, match=match):
        tiny_instance(rng, **{field: value})


def test_bad_class_input_names_the_argument(rng):
    with pytest.raises(ValueError, match="arrival_rate"):
        RequestClass("x", -1.0, [10], [5])
    with pytest.raises(ValueError, match="output_tokens"):
        RequestClass("x", 1.0, [10], [])  # an empty class
    with pytest.raises(ValueError, match="output_tokens"):
        RequestClass("x", 1.0, [10], [-3])


def test_default_eps_is_15_percent_of_mean_output(rng):
    inst = tiny_instance(rng, eps=None)
    assert inst.eps == pytest.approx(tuple(0.15 * c.mean_output_tokens for c in inst.classes))


# ------------------------------------------------------------------------------ waiting bands


def test_band_edges_geometric_in_one_minus_u(rng):
    inst = tiny_instance(rng, waiting_bands=4, u_max=0.84)
    edges = band_edges(inst)
    np.testing.assert_allclose(1 - edges, 0.16 ** (np.arange(1, 5) / 4))
    assert edges[-1] == pytest.approx(0.84)
    # W at the upper edge of the band: 0 with no load, the band's value inside, inf above u_max
    W = waiting_model(inst, np.array([0.0, edges[1] - 1e-3]))
    assert W[0] == 0.0
    assert W[1] == pytest.approx(band_waiting_s(inst)[1, 1])
    assert np.isinf(waiting_model(inst, np.array([0.9, 0.0]))[0])
    coef = inst.mix_waiting_coefficients[0]
    assert band_waiting_s(inst)[0, 2] == pytest.approx(coef * edges[2] / (1 - edges[2]))


# ---------------------------------------------------------------------------------- evaluate


def test_evaluate_by_hand(rng):
    """One TP4 group serving class a fully (no caching), class b half-rejected, by-hand arithmetic."""
    inst = tiny_instance(rng, kappa=0.2, c_gpu=50.0, c_slo=5.0, c_rej=5000.0)
    r = inst.input_tokens + np.array([16.0, 32.0])
    sol = Solution(z=[0, 1], r=r, pi=[[0.0, 1.0], [0.0, 0.5]], delta=[[0, 0], [0, 0]])
    ev = evaluate(inst, sol)
    lam = inst.rates
    R = [
        worst_case_cost(c.output_tokens, eta, inst.c_p, inst.c_w, inst.eps[i], 32, method="dual_lp")
        for i, (c, eta) in enumerate(zip(inst.classes, (16.0, 32.0)))
    ]
    assert ev.terms["preempt_waste"] == pytest.approx(lam[0] * R[0] + lam[1] * 0.5 * R[1], rel=1e-6)
    assert ev.terms["gpu"] == pytest.approx(50.0 * 4)
    assert ev.terms["rejection"] == pytest.approx(5000.0 * lam[1] * 0.5)
    T = inst.service_s[:, 1, 0]
    u = lam[0] * T[0] + lam[1] * 0.5 * T[1]
    assert ev.utilisation[1] == pytest.approx(u)
    W = waiting_model(inst, np.array([0.0, u]))[1]
    H = inst.residence_s[:, 1, 0]
    s = np.maximum(0.0, np.array([W + H[0] - 1.5, 0.5 * (W + H[1]) - 0.5 * 2.5]))
    assert ev.terms["slo"] == pytest.approx(5.0 * lam @ s)
    mem = 1.2 * (lam[0] * H[0] * r[0] + lam[1] * 0.5 * H[1] * r[1])
    assert ev.memory_tokens[1] == pytest.approx(mem)
    assert ev.total == pytest.approx(sum(ev.terms.values()))
    assert ev.feasible


def test_evaluate_reports_violations(rng):
    inst = tiny_instance(rng)
    r = inst.input_tokens + 16
    # traffic to an undeployed configuration, and more GPUs than J
    ev = evaluate(inst, Solution(z=[3, 0], r=r, pi=[[0.5, 0.5], [0.0, 0.0]], delta=[[0, 0], [0, 0]]))
    assert ev.violations["gpu_budget"] == 2
    assert ev.violations["routing_undeployed"] == pytest.approx(0.5)
    assert not ev.feasible
    # a buffer below zero and more than 100% routed
    ev = evaluate(inst, Solution(z=[0, 1], r=inst.input_tokens - 5, pi=[[0.0, 1.2], [0.0, 0.0]], delta=[[0, 0], [0, 0]]))
    assert ev.violations["reservation"] == pytest.approx(5)
    assert ev.violations["routing_sum"] == pytest.approx(0.2)
    assert not np.isnan(ev.total) and not any(np.isnan(v) for v in ev.terms.values())  # never NaN


# ------------------------------------------------------------------------------- brute force


def brute_force(inst: Instance) -> float:
    """Enumerate z, delta, x (buffers) and the waiting band of each configuration; solve the LP in
    (pi, pi0, s) for each with scipy's HiGHS. Independent of kvdro.joint.formulations."""
    I, K = inst.n_classes, inst.n_configs
    lam, L_pre, D = inst.rates, inst.prefix_tokens, inst.slo_s
    H, T, M, g = inst.residence_s, inst.service_s, inst.capacity_tokens, inst.gpus
    edges, Wb = band_edges(inst), band_waiting_s(inst)
    best = np.inf
    z_range = [range(int(Z) + 1) for Z in inst.max_groups]
    for z in itertools.product(*z_range):
        z = np.array(z)
        if g @ z > inst.total_gpus:
            continue
        deployed = [k for k in range(K) if z[k] > 0]
        for d_bits in itertools.product((0, 1), repeat=I * len(deployed)):
            delta = np.zeros((I, K), dtype=int)
            for b, (i, k) in zip(d_bits, itertools.product(range(I), deployed)):
                delta[i, k] = b
            for c in itertools.product(*(range(len(e)) for e in inst.candidates)):
                eta = np.array([inst.candidates[i][c[i]] for i in range(I)])
                R = np.array([inst.candidate_costs[i][c[i]] for i in range(I)])
                r = inst.input_tokens + eta
                for bands in itertools.product(range(edges.size), repeat=len(deployed)):
                    band = dict(zip(deployed, bands))
                    # variables: pi (I*K), pi0 (I), s (I)
                    nv = I * K + 2 * I
                    cost = np.zeros(nv)
                    for i in range(I):
                        cost[i * K : (i + 1) * K] = lam[i] * R[i]
                        cost[I * K + i] = lam[i] * inst.c_rej
                        cost[I * K + I + i] = lam[i] * inst.c_slo
                    A_ub, b_ub, A_eq, b_eq = [], [], [], []
                    bounds = [(0, None)] * nv
                    for i in range(I):
                        row = np.zeros(nv)
                        row[i * K : (i + 1) * K] = 1
                        row[I * K + i] = 1
                        A_eq.append(row)
                        b_eq.append(1.0)
                        row = np.zeros(nv)  # SLO (6f): sum_k pi (W + H - D) - s <= 0
                        for k in deployed:
                            row[i * K + k] = Wb[k, band[k]] + H[i, k, delta[i, k]] - D[i]
                        row[I * K + I + i] = -1
                        A_ub.append(row)
                        b_ub.append(0.0)
                    for k in range(K):
                        if z[k] == 0:
                            for i in range(I):
                                bounds[i * K + k] = (0, 0)
                            continue
                        mem = np.zeros(nv)
                        util = np.zeros(nv)
                        for i in range(I):
                            dd = delta[i, k]
                            mem[i * K + k] = (1 + inst.kappa) * lam[i] * H[i, k, dd] * (r[i] - dd * L_pre[i])
                            util[i * K + k] = lam[i] * T[i, k, dd]
                        A_ub.append(mem)
                        b_ub.append(z[k] * M[k] - z[k] * (delta[:, k] @ L_pre))
                        A_ub.append(util)
                        b_ub.append(z[k] * edges[band[k]])
                    res = linprog(cost, A_ub=np.array(A_ub), b_ub=b_ub, A_eq=np.array(A_eq), b_eq=b_eq, bounds=bounds, method="highs")
                    if res.status == 0:
                        best = min(best, res.fun + inst.c_gpu * (g @ z))
    return best


@pytest.fixture(scope="module")
def tiny():
    return tiny_instance(np.random.default_rng(7))


@pytest.fixture(scope="module")
def tiny_optimum(tiny):
    return brute_force(tiny)


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_exact_equals_brute_force(tiny, tiny_optimum, formulation):
    """Every rung of the ladder reaches the same optimum as brute force (pruned or not)."""
    bf = tiny_optimum
    sol = solve_exact(tiny, formulation=formulation, prune=False)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(bf, rel=1e-6)
    assert solve_exact(tiny, formulation=formulation, prune=True).objective == pytest.approx(bf, rel=1e-6)
    ev = evaluate(tiny, sol)
    assert ev.feasible
    assert ev.total == pytest.approx(sol.objective, rel=1e-6)  # evaluate == solver objective
    # the optimum is not trivial: memory or utilisation binds somewhere, and the buffers differ from
    # the unconstrained DRO minimisers or some traffic is cached/rejected
    assert np.max(np.maximum(ev.memory_fraction, ev.utilisation / tiny.u_max)) > 0.5


def test_pruning_keeps_the_optimum(tiny):
    a = solve_exact(tiny, prune=True)
    b = solve_exact(tiny, prune=False)
    assert a.objective == pytest.approx(b.objective, rel=1e-7)


def test_relaxations_bound_the_optimum_and_tighten_up_the_ladder(tiny):
    """Up to "disaggregated" each rung adds constraints or only re-encodes (ordered), so its LP bound
    cannot fall; the counts rung trades relaxation strength for size (McCormick on delta z), so its
    bound lies between McCormick's and the disaggregated one's."""
    opt = solve_exact(tiny).objective
    bounds = dict(zip(LADDER, (solve_relaxation(tiny, formulation=f, prune=False) for f in LADDER)))
    assert all(b <= opt * (1 + 1e-7) for b in bounds.values())
    strong = [bounds[f] for f in LADDER[: LADDER.index("disaggregated") + 1]]
    assert all(a <= b + 1e-7 * abs(opt) for a, b in zip(strong, strong[1:]))
    assert strong[0] < strong[-1]  # McCormick is strictly weaker here
    # the ordered encoding is a change of variables: the same relaxation as the rung before it
    assert bounds["disaggregated"] == pytest.approx(bounds["routing-hull"], rel=1e-7)
    assert bounds["mccormick"] <= bounds["counts"] * (1 + 1e-7) and bounds["counts"] <= bounds["disaggregated"] * (1 + 1e-7)


def test_build_milp_returns_an_inspectable_problem(tiny):
    model = build_milp(tiny)
    assert model.problem.is_mixed_integer()
    assert model.formulation == "counts"  # the default
    with pytest.raises(ValueError, match="formulation"):
        build_milp(tiny, formulation="bigM")


def test_overload_is_solved_by_rejecting(rng):
    """Ten times the traffic the cluster can carry: the optimum rejects, visibly, and stays feasible."""
    inst = tiny_instance(rng, classes=tiny_classes(rng, rates=(40.0, 30.0)))
    sol = solve_exact(inst)
    ev = evaluate(inst, sol)
    assert ev.feasible
    assert sol.rejected.sum() > 0.5
    assert ev.terms["rejection"] > 0
    assert np.max(ev.utilisation) <= inst.u_max + 1e-7
    # every admitted request fits: total admitted work <= u_max * deployed groups
    T = np.where(sol.delta, inst.service_s[:, :, 1], inst.service_s[:, :, 0])
    admitted_work = sum(inst.rates @ (sol.pi[:, k] * T[:, k]) for k in range(inst.n_configs))
    assert admitted_work <= inst.u_max * sol.z.sum() + 1e-6


def test_time_limit_raises_solver_error_with_status(tiny):
    big = tiny_instance(np.random.default_rng(3), waiting_bands=6)
    with pytest.raises(SolverError) as info:
        solve_exact(big, formulation="mccormick", time_limit=1e-3)
    assert info.value.status == "user_limit"


def test_solve_milp_reports_gap_and_bound(tiny):
    res = solve_milp(tiny)
    assert res.status == "optimal"
    assert res.mip_gap <= 1e-6
    assert res.bound <= res.objective * (1 + 1e-9)
    with pytest.raises(ValueError, match="time_limit"):
        solve_milp(tiny, time_limit=0)


# ------------------------------------------------------------------------- band edges (#12)


def _at_utilisation(inst: Instance, u: float) -> Solution:
    """One TP4 group serving part of class a only, at utilisation ``u`` exactly."""
    T = inst.service_s[0, 1, 0]
    pi_a = u / (inst.rates[0] * T)
    assert 0 < pi_a <= 1
    return Solution(z=[0, 1], r=inst.input_tokens + 16, pi=[[0.0, pi_a], [0.0, 0.0]], delta=[[0, 0], [0, 0]])


def test_a_point_just_above_a_band_edge_stays_in_that_band(rng):
    """The example of issue 12: u 1.6e-7 above an edge used to jump to the next band (W x2.5, total
    +2.8%) with no violation reported. HiGHS accepts such points as feasible for the lower band, so
    evaluate must too; a point clearly above (beyond BAND_TOLERANCE) is in the next band."""
    from kvdro.joint.exact import HIGHS_TOLERANCES
    from kvdro.joint.serving import BAND_TOLERANCE, band_of

    inst = tiny_instance(rng, classes=tiny_classes(rng, rates=(8.0, 1.5)), waiting_bands=4)
    edge = band_edges(inst)[1]
    on, above = evaluate(inst, _at_utilisation(inst, edge)), evaluate(inst, _at_utilisation(inst, edge + 1.6e-7))
    assert band_of(inst, on.utilisation)[1] == band_of(inst, above.utilisation)[1] == 1
    assert above.waiting_s[1] == on.waiting_s[1] == pytest.approx(band_waiting_s(inst)[1, 1])
    assert above.total == pytest.approx(on.total, rel=1e-6)
    beyond = evaluate(inst, _at_utilisation(inst, edge + 2 * BAND_TOLERANCE))
    assert beyond.waiting_s[1] == pytest.approx(band_waiting_s(inst)[1, 2]) and beyond.waiting_s[1] > 1.5 * on.waiting_s[1]
    # the tolerance covers every point HiGHS may return as feasible (its tolerances are passed explicitly)
    assert BAND_TOLERANCE >= 10 * max(HIGHS_TOLERANCES.values())
    # at u_max the same tolerance: feasible, last band, no violation
    top = evaluate(inst, _at_utilisation(inst, inst.u_max + 1e-7))
    assert top.feasible and np.isfinite(top.waiting_s[1]) and top.violations["utilisation"] == 0.0
    assert not evaluate(inst, _at_utilisation(inst, inst.u_max + 2 * BAND_TOLERANCE)).feasible


def test_solver_points_on_band_edges_score_as_the_solver_scored_them(tiny):
    """Every optimum the MILP returns is scored by evaluate exactly as the MILP scored it, even when a
    group's utilisation sits on a band edge (it usually does: the binding edge)."""
    for formulation in ("counts", "disaggregated", "band-cut", "mccormick"):
        sol = solve_exact(tiny, formulation=formulation)
        assert evaluate(tiny, sol).total == pytest.approx(sol.objective, rel=1e-7)


def test_ladder_specs_are_named_and_consistent():
    from kvdro.joint import SPECS, Spec

    assert LADDER[0] == "mccormick" and LADDER[-1] == "counts" and set(LADDER) == set(FORMULATIONS)
    assert all(SPECS[f].label for f in LADDER)
    with pytest.raises(ValueError, match="formulation"):
        Spec("mccormick", "mccormick", band_cut=True)  # the band cut needs the state variables
    with pytest.raises(ValueError, match="formulation"):
        Spec("mccormick", "disaggregated", route_hull=True)
    with pytest.raises(ValueError, match="formulation"):
        Spec("exact", "mccormick")


# ------------------------------------------------------------------- the counts formulation (#17)


@pytest.mark.parametrize("seed", range(4))
def test_counts_reaches_the_brute_force_optimum_on_random_tiny_instances(seed):
    """The counts formulation (integer groups per band) against enumeration on random tiny instances
    (rates, prefixes, GPU price and budget drawn), each with three waiting bands."""
    rng = np.random.default_rng(1700 + seed)
    classes = tiny_classes(rng, rates=tuple(rng.uniform(0.5, 6.0, 2)))
    inst = tiny_instance(rng, classes=classes, total_gpus=int(rng.choice([4, 6])), waiting_bands=3,
                         c_gpu=float(rng.uniform(10, 150)))
    sol = solve_exact(inst, formulation="counts")
    assert sol.status == "optimal" and sol.mip_gap <= 1e-7
    assert sol.objective == pytest.approx(brute_force(inst), rel=1e-6)
    assert evaluate(inst, sol).total == pytest.approx(sol.objective, rel=1e-7)


def test_counts_and_disaggregated_reach_the_same_optimum_on_random_small_instances():
    """Twelve random tight instances (chapter 6's family: memory binds, three bands, J in {4, 6, 8})."""
    from kvdro.bcd.scaling import random_small_instance

    rng = np.random.default_rng(17)
    for _ in range(12):
        inst = random_small_instance(rng, n_classes=int(rng.integers(2, 5)))
        a = solve_exact(inst, formulation="counts")
        b = solve_exact(inst, formulation="disaggregated")
        assert a.objective == pytest.approx(b.objective, rel=1e-6), inst
        assert evaluate(inst, a).feasible


def test_counts_model_size_does_not_grow_with_J(rng):
    """Same classes and configurations, J = 8 and J = 512: the counts model has the same number of
    variables; the disaggregated one grows (one binary per (groups, band) state)."""
    small, big = tiny_instance(rng, total_gpus=8), tiny_instance(rng, total_gpus=512)

    def size(inst, f):
        return solve_milp(inst, formulation=f, relax=True).n_variables

    assert size(small, "counts") == size(big, "counts")
    assert size(big, "disaggregated") > 10 * size(small, "disaggregated")
