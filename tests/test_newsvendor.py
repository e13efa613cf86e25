"""kvdro.newsvendor: loss (2)-(3), SAA cost, critical fractile (9)-(10), the SAA LP."""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdro import newsvendor as nv
from kvdro.errors import SolverError

COSTS = st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 10.0, 100.0])
SAMPLES = st.one_of(
    st.lists(st.integers(0, 40), min_size=1, max_size=15),  # integer token counts: many ties
    st.lists(st.floats(0, 500, allow_nan=False), min_size=1, max_size=15),
)


def test_critical_fractile_values():
    assert nv.critical_fractile(1) == 0.5
    assert nv.critical_fractile(10) == pytest.approx(10 / 11)
    assert nv.critical_fractile(100) == pytest.approx(100 / 101)


@pytest.mark.parametrize("rho", [0, -1, math.nan, math.inf, "ten", None])
def test_critical_fractile_rejects_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        nv.critical_fractile(rho)


def test_loss_by_hand():
    # under-reserve by 3 tokens at c_p = 10 -> 30; over-reserve by 4 at c_w = 1 -> 4
    np.testing.assert_allclose(nv.loss([13.0, 6.0, 10.0], 10.0, 10.0, 1.0), [30.0, 4.0, 0.0], rtol=1e-12, atol=0)
    assert nv.expected_cost([13, 6, 10], 10, 10, 1) == pytest.approx(34 / 3)


def test_saa_reservation_by_hand():
    xs = [5, 1, 4, 2, 3]  # sorted 1..5
    assert nv.saa_reservation(xs, 1, 1) == 3.0  # q* = 0.5, ceil(2.5) = 3rd
    assert nv.saa_reservation(xs, 4, 1) == 4.0  # q* = 0.8, exactly the 4th: the lower quantile
    assert nv.saa_reservation(xs, 100, 1) == 5.0
    assert nv.saa_reservation(xs, 0.01, 1) == 1.0


def test_tie_is_exact_not_rounded():
    # q* = 0.1/0.3 = 1/3 exactly in binary fractions; with N = 3, N q* = 1: the 1st order statistic.
    # Floating point gives 3*0.1/0.3 = 1.0000000000000002, whose ceiling would pick the 2nd.
    xs = [7.0, 3.0, 9.0]
    eta = nv.saa_reservation(xs, 0.1, 0.2)
    assert eta == 3.0
    # and every buffer between the 1st and 2nd order statistics costs the same (flat optimum)
    costs = [nv.expected_cost(xs, e, 0.1, 0.2) for e in np.linspace(3, 7, 9)]
    assert np.ptp(costs) < 1e-12


@settings(max_examples=200, deadline=None, derandomize=True)
@given(SAMPLES, COSTS, COSTS)
def test_saa_reservation_is_the_lower_quantile_and_optimal(xs, c_p, c_w):
    x = np.asarray(xs, dtype=float)
    eta = nv.saa_reservation(x, c_p, c_w)
    q = c_p / (c_p + c_w)
    assert eta in x
    assert np.mean(x <= eta) >= q - 1e-12  # F_N(eta) >= q*
    assert np.mean(x < eta) < q + 1e-12  # F_N(eta-) <= q*  (10b changes sign at eta)
    best = nv.expected_cost(x, eta, c_p, c_w)
    # the cost is piecewise linear with kinks at the samples: checking kinks and beyond suffices
    candidates = np.concatenate([x, [max(x.min() - 1, 0.0), x.max() + 1]])  # buffers are >= 0
    assert all(nv.expected_cost(x, e, c_p, c_w) >= best - 1e-9 * max(1, best) for e in candidates)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(SAMPLES, COSTS, COSTS)
def test_saa_lp_matches_quantile(xs, c_p, c_w):
    x = np.asarray(xs, dtype=float)
    eta_q = nv.saa_reservation(x, c_p, c_w)
    model = nv.saa_problem(x, c_p, c_w)
    value = nv.solve_lp(model.problem, "SAA LP")
    best = nv.expected_cost(x, eta_q, c_p, c_w)
    assert math.isclose(value, best, rel_tol=1e-7, abs_tol=1e-7)
    # the LP's buffer is optimal too (at exact ties it may sit between two order statistics)
    eta_lp = nv.saa_reservation(x, c_p, c_w, method="lp")
    assert math.isclose(nv.expected_cost(x, eta_lp, c_p, c_w), best, rel_tol=1e-6, abs_tol=1e-6)


def test_saa_lp_is_inspectable_and_merges_repeats():
    model = nv.saa_problem([3, 3, 3, 8, 8, 20], 10, 1)
    assert isinstance(model.problem, cp.Problem)
    assert model.problem.is_dcp()
    assert model.theta.shape == (3,)  # three distinct values
    assert len(model.problem.constraints) == 2
    nv.solve_lp(model.problem, "SAA LP")
    assert model.eta.value == pytest.approx(20, abs=1e-6)  # q* = 10/11 > 4/6: the largest value


def test_solve_lp_raises_with_status():
    x = cp.Variable()
    infeasible = cp.Problem(cp.Minimize(x), [x >= 1, x <= 0])
    with pytest.raises(SolverError) as info:
        nv.solve_lp(infeasible, "toy")
    assert info.value.status == cp.INFEASIBLE
    unbounded = cp.Problem(cp.Minimize(x), [x <= 0])
    with pytest.raises(SolverError, match="unbounded"):
        nv.solve_lp(unbounded, "toy")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"samples": []}, "samples"),
        ({"samples": [1.0, math.nan]}, "samples"),
        ({"samples": [1.0, math.inf]}, "samples"),
        ({"samples": [-1.0, 2.0]}, "samples"),
        ({"c_p": -1.0}, "c_p"),
        ({"c_p": math.inf}, "c_p"),
        ({"c_w": math.nan}, "c_w"),
        ({"c_w": -0.5}, "c_w"),
        ({"eta": math.nan}, "eta"),
        ({"eta": math.inf}, "eta"),
    ],
)
def test_expected_cost_rejects_bad_input(kwargs, name):
    args = {"samples": [1.0, 2.0], "eta": 1.0, "c_p": 2.0, "c_w": 1.0} | kwargs
    with pytest.raises(ValueError, match=name):
        nv.expected_cost(**args)


@pytest.mark.parametrize(("c_p", "c_w", "name"), [(0.0, 1.0, "c_p"), (1.0, 0.0, "c_w"), (-2, 1, "c_p")])
def test_saa_reservation_needs_positive_costs(c_p, c_w, name):
    with pytest.raises(ValueError, match=name):
        nv.saa_reservation([1, 2, 3], c_p, c_w)


def test_saa_reservation_rejects_unknown_method():
    with pytest.raises(ValueError, match="method"):
        nv.saa_reservation([1, 2, 3], 2, 1, method="bisection")
