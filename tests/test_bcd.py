"""kvdro.bcd: Algorithm 1 against the exact solver, monotone descent where it is guaranteed, each
block against brute force, bad input, solver status, warm starts, the scaled and drifting instances."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import cvxpy as cp
import numpy as np
import pytest

from kvdro.bcd import run_bcd, solve_bcd
from kvdro.bcd.scaling import random_small_instance
from kvdro.bcd.blocks import (
    ReservationStep,
    RoutingLP,
    _solve,
    band_index,
    memory_rows,
    prefix_descent,
    prefix_rule,
    utilisation,
)
from kvdro.errors import SolverError
from kvdro.joint import Instance, Solution, evaluate, solve_exact



def random_instance(rng: np.random.Generator, n_classes: int = 3, **kw) -> Instance:
    """kvdro.bcd.scaling.random_small_instance: outputs up to 96 tokens, a memory-cut TP2 and TP4."""
    return random_small_instance(rng, n_classes, **kw)


@pytest.fixture(scope="module")
def instances():
    rng = np.random.default_rng(20261130)
    return [random_instance(rng, n_classes=int(rng.integers(2, 5))) for _ in range(24)]


def _read_only(sol: Solution) -> Solution:
    for a in (sol.z, sol.r, sol.pi, sol.delta):
        a.flags.writeable = False  # shared between tests: a test that changes it must work on a copy
    return sol


@pytest.fixture(scope="module")
def bcd_run(instances):
    """``bcd_run(i, rule)``: ``run_bcd(instances[i], delta_rule=rule)`` with the defaults, run once per
    module (several tests read the same run; ``solve_bcd`` is its ``.solution``). Read-only."""
    runs = {}

    def get(i: int, rule: str = "descent"):
        if (i, rule) not in runs:
            runs[i, rule] = run_bcd(instances[i], delta_rule=rule)
            _read_only(runs[i, rule].solution)
        return runs[i, rule]

    return get


@pytest.fixture(scope="module")
def exact_optimum(instances):
    """``exact_optimum(i)``: ``solve_exact(instances[i])``, solved once per module. Read-only."""
    optima = {}

    def get(i: int) -> Solution:
        if i not in optima:
            optima[i] = _read_only(solve_exact(instances[i]))
        return optima[i]

    return get


# ------------------------------------------------------------------------------------ the algorithm


def _fresh_block_pass(inst, sol, rule):
    """Every block run once more at ``sol`` with freshly built models: the objective each one reaches
    (LP1 at sol's bands, LP2, Block 2's proposal, Block 3), each scored by ``evaluate``."""
    from kvdro.bcd.blocks import ConfigIP

    z, r, pi, d = sol.z, sol.r, sol.pi, sol.delta

    def F(z_, r_, pi_, d_):
        ev = evaluate(inst, Solution(z=z_, r=r_, pi=pi_, delta=d_))
        return ev.total if ev.feasible else np.inf

    lp1 = RoutingLP(inst)
    pi1, _ = lp1.solve(z, r, d, lp1.bands_for(z, utilisation(inst, z, pi, d)))
    out = {"LP1": F(z, r, pi1, d), "LP2": F(z, ReservationStep(inst).solve(z, r, pi, d), pi, d)}
    if rule == "descent":
        out["delta"] = F(z, r, pi, prefix_descent(inst, z, r, pi, d))
    z3, pi3, value3 = ConfigIP(inst).solve(r, d)
    out["z"] = F(z3, r, pi3, d)
    out["z (model value)"] = value3
    return F(z, r, pi, d), out


@pytest.mark.parametrize("rule", ["descent", "paper"])
def test_a_converged_run_is_blockwise_optimal_against_fresh_block_models(instances, bcd_run, rule):
    """Where BCD says it converged, one more pass of every block -- each a model built afresh -- lowers
    the objective by no more than tol: no block can improve the returned point (chapter 6's definition
    of blockwise optimal), whatever the stop rule claims."""
    checked = 0
    for i, inst in enumerate(instances):
        run = bcd_run(i, rule)
        if not run.converged:
            continue
        f, fresh = _fresh_block_pass(inst, run.solution, rule)
        assert np.isfinite(f) and f == pytest.approx(run.solution.objective, rel=1e-12)
        for block, value in fresh.items():
            assert value >= f * (1 - 1e-7), (inst.name, rule, block, value, f)
        checked += 1
    assert checked >= 20


def test_caching_every_routed_pair_is_never_worse_than_the_paper_rule(instances, bcd_run):
    """With pi fixed and (6e) met, caching a routed pair only shortens T and H: the paper's rule
    (which un-caches routed pairs with fewer than one concurrent request) can only cost more."""
    for i, inst in enumerate(instances[:10]):
        sol = bcd_run(i).solution  # solve_bcd(inst)
        routed = (sol.pi > 0) & (sol.z[None, :] >= 1)
        rule = prefix_rule(inst, sol.z, sol.pi)
        all_routed = Solution(z=sol.z, r=sol.r, pi=sol.pi, delta=routed)
        lhs, cap = memory_rows(inst, sol.z, sol.r, sol.pi, routed)
        if np.all(lhs <= cap):
            by_rule = evaluate(inst, Solution(z=sol.z, r=sol.r, pi=sol.pi, delta=rule))
            assert evaluate(inst, all_routed).total <= by_rule.total * (1 + 1e-12) + 1e-12


@pytest.mark.parametrize("rule", ["descent", "paper"])
def test_never_below_the_exact_optimum_on_random_instances(instances, bcd_run, exact_optimum, rule):
    """A law: BCD returns a feasible point of the same model, so it cannot beat the proven optimum."""
    for i, inst in enumerate(instances[:12]):
        opt = evaluate(inst, exact_optimum(i)).total
        got = evaluate(inst, bcd_run(i, rule).solution)  # solve_bcd(inst, delta_rule=rule)
        assert got.feasible
        assert got.total >= opt * (1 - 1e-7)


def test_a_second_start_with_every_prefix_cached_is_a_valid_bcd_run(instances):
    for inst in instances[:6]:
        run = run_bcd(inst, init="cached")
        assert run.trace[0].cached == inst.n_classes * inst.n_configs
        assert evaluate(inst, run.solution).feasible and run.converged


def test_reservations_are_whole_blocks_within_the_candidates(instances, bcd_run):
    for i, inst in enumerate(instances[:6]):
        sol = bcd_run(i).solution  # solve_bcd(inst)
        eta = sol.r - inst.input_tokens
        for i, e in enumerate(eta):
            assert np.min(np.abs(inst.candidates[i] - e)) < 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_never_below_the_exact_optimum_on_small_seeds(data_dir, small_exact, seed):
    from kvdro.joint import paper_instance

    inst = paper_instance("small", seed)
    opt = small_exact[1] if seed == 0 else solve_exact(inst)  # seed 0's optimum: solved once (conftest.py)
    ev_opt = evaluate(inst, opt)
    ev = evaluate(inst, solve_bcd(inst))
    assert ev.feasible and ev_opt.feasible
    assert ev.total >= ev_opt.total * (1 - 1e-7)


# ------------------------------------------------------------------------------------ the blocks


def test_lp1_charges_an_upper_bound_and_never_beats_its_own_start(instances, bcd_run):
    inst = instances[0]
    run = bcd_run(0)  # run_bcd(inst)
    sol = run.solution
    lp1 = RoutingLP(inst)
    u = utilisation(inst, sol.z, sol.pi, sol.delta)
    bands = lp1.bands_for(sol.z, u)
    pi, value = lp1.solve(sol.z, sol.r, sol.delta, bands)
    new = evaluate(inst, Solution(z=sol.z, r=sol.r, pi=pi, delta=sol.delta))
    assert new.feasible
    assert new.total <= value * (1 + 1e-7) + 1e-7  # true W <= the band's W
    assert value <= evaluate(inst, sol).total * (1 + 1e-7) + 1e-7  # the start is feasible for LP1
    busy = band_index(inst, u) >= 0
    assert np.all(band_index(inst, utilisation(inst, sol.z, pi, sol.delta))[busy] <= band_index(inst, u)[busy])


def test_lp2_equals_brute_force_when_memory_binds():
    rng = np.random.default_rng(7)
    inst = random_instance(rng, n_classes=3)
    I, K = inst.n_classes, inst.n_configs
    z = np.array([1, 0])
    pi = np.zeros((I, K))
    pi[:, 0] = 0.5
    d = np.zeros((I, K), dtype=bool)
    step = ReservationStep(inst)
    own = inst.input_tokens + np.array([inst.candidates[i][b] for i, b in enumerate(step.best)])
    # shrink the capacity until the own minimisers no longer fit
    lhs, _ = memory_rows(inst, z, own, pi, d)
    inst = replace(inst, configs=(replace(inst.configs[0], kv_capacity_tokens=float(lhs[0] * 0.97)), inst.configs[1]))
    step = ReservationStep(inst)
    r = step.solve(z, own, pi, d)
    assert step.knapsacks == 1
    best, best_r = np.inf, None
    for combo in itertools.product(*[range(b + 1) for b in step.best]):
        rr = inst.input_tokens + np.array([inst.candidates[i][c] for i, c in enumerate(combo)])
        lhs, cap = memory_rows(inst, z, rr, pi, d)
        if lhs[0] <= cap[0]:
            cost = sum(inst.rates[i] * 0.5 * inst.candidate_costs[i][c] for i, c in enumerate(combo))
            if cost < best - 1e-12:
                best, best_r = cost, rr
    got = sum(inst.rates[i] * 0.5 * inst.worst_case_cost(i, r[i] - inst.input_tokens[i]) for i in range(I))
    assert got == pytest.approx(best, rel=1e-9)
    assert memory_rows(inst, z, r, pi, d)[0][0] <= inst.capacity_tokens[0] * (1 + 1e-9)
    assert best_r is not None


def test_prefix_rule_is_the_concurrency_threshold(instances, bcd_run):
    inst = instances[1]
    sol = bcd_run(1).solution  # solve_bcd(inst)
    n = inst.rates[:, None] * sol.pi * inst.residence_s[:, :, 1] / np.maximum(sol.z, 1)[None, :]
    np.testing.assert_array_equal(prefix_rule(inst, sol.z, sol.pi), (n > 1) & (sol.z[None, :] >= 1))
    d = prefix_descent(inst, sol.z, sol.r, sol.pi, np.zeros_like(sol.delta))
    assert not np.any(d & (sol.pi == 0))  # never caches where no traffic goes
    lhs, cap = memory_rows(inst, sol.z, sol.r, sol.pi, d)
    assert np.all(lhs <= cap * (1 + 1e-9))


# ------------------------------------------------------------------------------------ input and errors


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_iter": 0}, "max_iter"),
        ({"max_iter": -3}, "max_iter"),
        ({"max_iter": 2.5}, "max_iter"),
        ({"max_iter": True}, "max_iter"),
        ({"inner_iter": 0}, "inner_iter"),
        ({"tol": -1e-3}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"delta_rule": "always"}, "delta_rule"),
        ({"time_limit": 0.0}, "time_limit"),
        ({"init": "random"}, "init"),
    ],
)
def test_bad_arguments_are_named(instances, kwargs, name):
    with pytest.raises(ValueError, match=name):
        solve_bcd(instances[0], **kwargs)


def test_bad_warm_starts_are_named(instances):
    inst = instances[0]
    I, K = inst.n_classes, inst.n_configs
    wrong = Solution(z=np.zeros(K + 1), r=np.zeros(I), pi=np.zeros((I, K + 1)), delta=np.zeros((I, K + 1)))
    with pytest.raises(ValueError, match="init"):
        solve_bcd(inst, init=wrong)
    too_many = Solution(z=np.full(K, 99), r=inst.input_tokens, pi=np.zeros((I, K)), delta=np.zeros((I, K)))
    with pytest.raises(ValueError, match="init"):
        solve_bcd(inst, init=too_many)


def test_an_instance_without_a_feasible_configuration_is_refused():
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError, match="total_gpus"):
        random_instance(rng, total_gpus=1)


def test_a_solver_status_other_than_optimal_raises():
    x = cp.Variable()
    with pytest.raises(SolverError) as info:
        _solve(cp.Problem(cp.Minimize(x), [x >= 1, x <= 0]), "an infeasible LP")
    assert info.value.status == "infeasible"


def test_a_failing_block_solve_propagates_its_status(instances, monkeypatch):
    def broken(self, *args, **kwargs):
        raise SolverError("LP1 (routing, BCD block 1)", "infeasible_or_unbounded")

    monkeypatch.setattr(RoutingLP, "solve", broken)
    with pytest.raises(SolverError) as info:
        solve_bcd(instances[0])
    assert info.value.status == "infeasible_or_unbounded"


# ------------------------------------------------------------------------------------ warm start, windows


def test_a_warm_start_from_another_point_converges_blockwise_optimal(instances, bcd_run, exact_optimum):
    """Warm-started from the paper rule's answer (a different point), the descent run converges to a
    point no fresh block improves, and never below the proven optimum."""
    for i, inst in enumerate(instances[:5]):
        start = bcd_run(i, "paper").solution  # solve_bcd(inst, delta_rule="paper")
        run = run_bcd(inst, init=start)
        assert run.converged
        f, fresh = _fresh_block_pass(inst, run.solution, "descent")
        assert min(fresh.values()) >= f * (1 - 1e-7)
        assert f >= evaluate(inst, exact_optimum(i)).total * (1 - 1e-7)


def test_drifting_windows_scale_outputs_and_keep_the_support(instances):
    from kvdro.bcd.rolling import carry_over, drifting_windows, reoptimise

    inst = instances[2]
    wins = drifting_windows(inst, [1.0, 1.5])
    for a, b in zip(inst.classes, wins[0].classes):
        np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    for a, b in zip(inst.classes, wins[1].classes):
        assert b.mean_output_tokens > a.mean_output_tokens
        assert b.output_tokens.max() <= a.max_output_tokens == b.max_output_tokens
    assert wins[1].eps[0] == pytest.approx(0.15 * wins[1].classes[0].mean_output_tokens)
    warm = reoptimise(wins, [1.0, 1.5], method="bcd-warm")
    static = reoptimise(wins, [1.0, 1.5], method="static")
    exact = reoptimise(wins, [1.0, 1.5], method="exact")
    assert all(evaluate(w, r.solution).feasible for w, r in zip(wins, warm))
    assert evaluate(wins[1], carry_over(wins[1], warm[0].solution)).feasible
    # a law, not a construction: neither the warm-started BCD nor the carried-over decision beats the
    # proven optimum of the drifted window, and each objective is what evaluate says
    for w, a, b, e in zip(wins, warm, static, exact):
        assert a.objective == pytest.approx(evaluate(w, a.solution).total, rel=1e-12)
        assert min(a.objective, b.objective) >= e.objective * (1 - 1e-7)
    with pytest.raises(ValueError, match="shifts"):
        drifting_windows(inst, [1.0, -1.0])


def test_scaled_instance_matches_the_large_family_and_checks_its_arguments(data_dir):
    from kvdro.bcd.scaling import scaled_instance
    from kvdro.joint import paper_instance

    a, b = scaled_instance(15, 48, 0), paper_instance("large", 0)
    np.testing.assert_allclose(a.rates, b.rates)
    for ca, cb in zip(a.classes, b.classes):
        np.testing.assert_array_equal(ca.output_tokens, cb.output_tokens)
    big = scaled_instance(30, 96, 1, n_samples=50)
    assert big.n_classes == 30 and big.total_gpus == 96
    assert big.rates.sum() / 96 == pytest.approx(a.rates.sum() / 48)  # same load per GPU
    for kw, name in (({"n_classes": 0}, "n_classes"), ({"total_gpus": 0}, "total_gpus"), ({"seed": -1}, "seed")):
        args = {"n_classes": 3, "total_gpus": 8, "seed": 0} | kw
        with pytest.raises(ValueError, match=name):
            scaled_instance(**args)


def test_cli_bcd_has_the_exact_schema(small_solve):
    out = {}
    for method in ("bcd", "exact"):  # fresh processes, each run once per session (conftest.py)
        proc = small_solve(method)
        assert proc.returncode == 0, proc.stderr
        out[method] = json.loads(proc.stdout)
    b, e = out["bcd"], out["exact"]
    assert b.keys() == e.keys()
    assert b["solution"].keys() == e["solution"].keys() and b["cost"].keys() == e["cost"].keys()
    assert b["solution"]["method"] == "bcd-descent" and b["cost"]["feasible"] is True
    assert b["cost"]["total"] == pytest.approx(b["solution"]["objective"], rel=1e-9)
    assert b["cost"]["total"] >= e["cost"]["total"] * (1 - 1e-7)
