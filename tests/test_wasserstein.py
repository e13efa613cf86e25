"""kvdro.wasserstein: the W_1 worst case three ways, the robust buffer, and when it differs from SAA."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvdro import newsvendor as nv
from kvdro import wasserstein as ws

COSTS = st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0])


@st.composite
def instances(draw, max_size: int = 10):
    """(samples, L_max, eta, eps): integer samples (ties, duplicates) or floats; eta >= 0 anywhere,
    including 0, L_max, outside the sample range and above the support; eps from 0 to huge."""
    L = float(draw(st.integers(1, 60)))
    if draw(st.booleans()):
        xs = draw(st.lists(st.integers(0, int(L)), min_size=1, max_size=max_size))
    else:
        xs = draw(st.lists(st.floats(0, L, allow_nan=False), min_size=1, max_size=max_size))
    x = np.asarray(xs, dtype=float)
    eta = draw(
        st.one_of(
            st.sampled_from([0.0, L, float(x.min()), float(x.max()), L + 5.0]),  # a buffer is >= 0 (issue 29)
            st.floats(0, L, allow_nan=False),
        )
    )
    eps = draw(st.one_of(st.sampled_from([0.0, 1e-3, 0.5, L, 10 * L]), st.floats(0, 2 * L)))
    return x, L, eta, eps


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def w1_distance(atoms_a, probs_a, atoms_b, probs_b) -> float:
    """W_1 between two distributions on the line: the integral of |F_a - F_b|."""
    grid = np.unique(np.concatenate([atoms_a, atoms_b]))
    fa = np.array([probs_a[atoms_a <= t].sum() for t in grid])
    fb = np.array([probs_b[atoms_b <= t].sum() for t in grid])
    return float(np.sum(np.abs(fa - fb)[:-1] * np.diff(grid)))


# --------------------------------------------------------------------------- three methods agree
@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(), COSTS, COSTS)
def test_three_methods_agree(inst, c_p, c_w):
    x, L, eta, eps = inst
    closed = ws.worst_case_cost(x, eta, c_p, c_w, eps, L)
    dual = ws.worst_case_cost(x, eta, c_p, c_w, eps, L, method="dual_lp")
    primal = ws.worst_case_cost(x, eta, c_p, c_w, eps, L, method="primal_lp")
    assert close(closed, dual), (closed, dual)
    assert close(closed, primal), (closed, primal)


# --------------------------------------------------------------------------- laws of the worst case
@settings(max_examples=300, deadline=None, derandomize=True)
@given(instances(max_size=25), COSTS, COSTS)
def test_worst_case_laws(inst, c_p, c_w):
    x, L, eta, _ = inst
    radii = np.array([0.0, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, L, 2 * L])
    radii.sort()
    wc = np.array([ws.worst_case_cost(x, eta, c_p, c_w, e, L) for e in radii])
    saa = nv.expected_cost(x, eta, c_p, c_w)
    box = max(nv.loss(0.0, eta, c_p, c_w), nv.loss(L, eta, c_p, c_w))
    tol = 1e-9 * max(1.0, box)
    assert abs(wc[0] - saa) <= tol  # eps = 0: the SAA cost
    assert np.all(wc >= saa - tol)  # the empirical distribution is in the ball
    assert np.all(np.diff(wc) >= -tol)  # nondecreasing in eps
    assert np.all(wc <= saa + max(c_p, c_w) * radii + tol)  # the loss is max(c_p,c_w)-Lipschitz
    assert np.all(wc <= box + tol)  # no distribution on [0, L] beats the worst point
    assert abs(wc[-1] - box) <= tol  # eps >= L_max: every distribution on [0, L] is in the ball
    # concave in eps (the value of an LP in its right-hand side, maximised)
    mid = np.array([ws.worst_case_cost(x, eta, c_p, c_w, e, L) for e in (radii[:-1] + radii[1:]) / 2])
    assert np.all(mid >= (wc[:-1] + wc[1:]) / 2 - tol)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(instances(max_size=25), COSTS, COSTS)
def test_worst_case_distribution_is_feasible_and_worst(inst, c_p, c_w):
    x, L, eta, eps = inst
    atoms, probs = ws.worst_case_distribution(x, eta, c_p, c_w, eps, L)
    assert np.all(np.diff(atoms) > 0) and atoms[0] >= 0 and atoms[-1] <= L
    assert np.all(probs > 0) and math.isclose(probs.sum(), 1.0, rel_tol=1e-12)
    values, counts = np.unique(x, return_counts=True)
    assert w1_distance(atoms, probs, values, counts / x.size) <= eps * (1 + 1e-9) + 1e-9
    expected = float(probs @ nv.loss(atoms, eta, c_p, c_w))
    assert close(expected, ws.worst_case_cost(x, eta, c_p, c_w, eps, L), 1e-9)
    # a worst case only ever needs the samples themselves and the two ends of the support
    assert set(atoms) <= set(values) | {0.0, L}


def test_worst_case_cost_many_matches_single_and_keeps_shape(rng):
    x = rng.integers(0, 200, size=300)
    etas = np.arange(0, 224, 16.0).reshape(2, 7)
    many = ws.worst_case_cost_many(x, etas, 10, 1, 12.0, 250)
    assert many.shape == (2, 7)
    single = [ws.worst_case_cost(x, e, 10, 1, 12.0, 250) for e in etas.ravel()]
    np.testing.assert_allclose(many.ravel(), single, rtol=1e-12)


def test_single_point_by_hand():
    # one sample at 0, support [0, 1], c_p = c_w = 1: moving the mass to 1 gains 1 - 2 eta per unit
    # of transport, so WC(eta) = eta + eps * max(0, 1 - 2 eta) for eps <= 1.
    for eta in (0.0, 0.2, 0.5, 0.8, 1.0):
        for eps in (0.0, 0.3, 0.6, 1.0):
            expected = eta + eps * max(0.0, 1 - 2 * eta)
            assert ws.worst_case_cost([0.0], eta, 1, 1, eps, 1.0) == pytest.approx(expected, abs=1e-12)
    # the robust buffer stays at SAA's 0 until eps = 1/2, then jumps to the box-robust 1/2
    assert ws.saa_threshold_radius([0.0], 1, 1, 1.0) == pytest.approx(0.5)
    assert ws.dro_reservation([0.0], 1, 1, 0.49, 1.0) == 0.0
    assert ws.dro_reservation([0.0], 1, 1, 0.51, 1.0) == pytest.approx(0.5)


# --------------------------------------------------------------------------- the robust buffer
@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances(max_size=12), COSTS, COSTS)
def test_robust_buffer_is_the_minimum_over_all_buffers(inst, c_p, c_w):
    x, L, _, eps = inst
    sol = ws.dro_solution(x, c_p, c_w, eps, L)
    assert 0 <= sol.eta <= L
    # its worst-case cost is the robust value ...
    assert close(ws.worst_case_cost(x, sol.eta, c_p, c_w, eps, L), sol.cost, 1e-9)
    # ... no buffer does better (WC is piecewise linear: a fine grid plus the samples suffices
    # to catch a wrong minimiser) ...
    grid = np.concatenate([np.linspace(0, L, 1201), x])
    assert ws.worst_case_cost_many(x, grid, c_p, c_w, eps, L).min() >= sol.cost * (1 - 1e-9) - 1e-9
    # ... and the joint LP over (eta, gamma, theta) reaches the same value
    lp = ws.dro_solution(x, c_p, c_w, eps, L, method="lp")
    assert close(lp.cost, sol.cost)
    assert close(ws.worst_case_cost(x, lp.eta, c_p, c_w, eps, L), sol.cost)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(instances(max_size=25), COSTS, COSTS)
def test_threshold_theorem(inst, c_p, c_w):
    """SAA buffer is robust-optimal exactly up to the threshold radius, with cost V + c_max eps."""
    x, L, _, _ = inst
    eta_saa = nv.saa_reservation(x, c_p, c_w)
    v_saa = nv.expected_cost(x, eta_saa, c_p, c_w)
    star = ws.saa_threshold_radius(x, c_p, c_w, L)
    assert star >= 0
    below = 0.999 * star
    sol = ws.dro_solution(x, c_p, c_w, below, L)
    assert sol.eta == eta_saa
    assert close(sol.cost, v_saa + max(c_p, c_w) * below, 1e-9)
    assume(math.isfinite(star))
    above = star * 1.001 + 1e-6
    other_etas = {round(line.eta, 9) for line in ws.regime_lines(x, c_p, c_w, L)[1:]}
    assume(round(eta_saa, 9) not in other_etas)  # degenerate: another regime's buffer equals SAA's
    # degenerate: N q* an integer, so a whole interval of buffers is SAA-optimal (then for rho < 1
    # the robust buffers can keep touching its end, eta_SAA, past the threshold)
    assume((Fraction(x.size) * Fraction(c_p) / (Fraction(c_p) + Fraction(c_w))).denominator != 1)
    sol = ws.dro_solution(x, c_p, c_w, above, L)
    assert sol.cost < v_saa + max(c_p, c_w) * above
    assert ws.worst_case_cost(x, eta_saa, c_p, c_w, above, L) > sol.cost * (1 + 1e-12)


def _rooms_by_riemann(x, rho, L, n=200_001):
    """Room above / below the SAA buffer as left Riemann sums of the ECDF (independent of the package)."""
    eta, q = nv.saa_reservation(x, rho, 1.0), rho / (rho + 1)
    xs = np.sort(x)
    t = np.linspace(eta, L, n)
    f = np.searchsorted(xs, t, side="right") / x.size
    up = float(np.sum((f[:-1] - q) * np.diff(t)))
    t = np.linspace(0.0, eta, n)
    f = np.searchsorted(xs, t, side="right") / x.size
    down = float(np.sum((q - f[:-1]) * np.diff(t)))
    return up, down


@pytest.mark.parametrize("rho", [0.1, 0.5, 1.0, 2.0, 10.0, 100.0])
def test_threshold_is_the_room_above_below_or_both(rng, rho):
    """eps* = room above (rho > 1), room above + room below (rho = 1), room below (rho < 1)."""
    x = rng.integers(1, 400, size=500).astype(float)
    for L in (400.0, 800.0, 4000.0):
        up, down = _rooms_by_riemann(x, rho, L)
        assert ws.transport_room(x, rho, 1.0, L) == pytest.approx((up, down), rel=1e-3)
        expected = up if rho > 1 else down if rho < 1 else up + down
        assert ws.saa_threshold_radius(x, rho, 1.0, L) == pytest.approx(expected, rel=1e-3)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(instances(max_size=25), COSTS, COSTS)
def test_threshold_is_where_the_saa_line_leaves_the_envelope(inst, c_p, c_w):
    """The closed form agrees with the crossing of the regime lines, and for rho != 1 the crossing
    with the box-robust line comes later, by exactly room_down/rho (rho > 1) or rho * room_up (rho < 1)."""
    x, L, _, _ = inst
    lines = ws.regime_lines(x, c_p, c_w, L)
    star = ws.saa_threshold_radius(x, c_p, c_w, L)
    up, down = ws.transport_room(x, c_p, c_w, L)
    crossings = [(ln.intercept - lines[0].intercept) / (lines[0].gamma - ln.gamma) for ln in lines[1:]]
    assert star == pytest.approx(max(min(crossings), 0.0), rel=1e-9, abs=1e-9 * L * max(c_p, c_w))
    path = ws.robust_buffer_path(x, c_p, c_w, L)
    assert path[0].eps_to == pytest.approx(star, rel=1e-9, abs=1e-9 * L)
    box = crossings[-1]  # the gamma = 0 line
    rho = c_p / c_w
    if c_p > c_w:
        assert box - star == pytest.approx(down / rho, rel=1e-9, abs=1e-9 * L)
    elif c_p < c_w:
        assert box - star == pytest.approx(rho * up, rel=1e-9, abs=1e-9 * L)
    else:
        assert len(lines) == 2


def test_threshold_at_rho_one_example_from_the_review():
    """samples {5, 5, 100, 65}, L_max = 100, rho = 1: eps* = 11.25 (the old rho > 1 formula gave 8.75)."""
    x, L = [5.0, 5.0, 100.0, 65.0], 100.0
    eta, v = nv.saa_reservation(x, 1, 1), nv.expected_cost(x, 5.0, 1, 1)
    assert eta == 5.0 and v == pytest.approx(38.75, rel=1e-12)  # eta is a sample: exact
    assert ws.transport_room(x, 1, 1, L) == pytest.approx((8.75, 2.5))
    star = ws.saa_threshold_radius(x, 1, 1, L)
    assert star == pytest.approx(11.25)
    for eps in (8.75, 10.0, 11.25):  # still the SAA buffer past the room above
        sol = ws.dro_solution(x, 1, 1, eps, L)
        assert sol.eta == 5.0 and sol.cost == pytest.approx(v + eps)
        assert ws.worst_case_cost(x, 5.0, 1, 1, eps, L) == pytest.approx(v + eps)
    sol = ws.dro_solution(x, 1, 1, 11.5, L)
    assert sol.eta == pytest.approx(50.0) and sol.cost == pytest.approx(50.0)
    assert ws.worst_case_cost(x, 5.0, 1, 1, 11.5, L) > 50.0 + 0.2


def test_where_the_buffer_goes_past_the_threshold():
    """rho > 1: first up by (2q* - 1)(L - eta_SAA), then to q* L, which is *below* eta_SAA when
    eta_SAA > q* L: samples {90, 95, 100}, L_max = 100, rho = 2, eps = 150 gives 66.7 < 95."""
    x, L = [90.0, 95.0, 100.0], 100.0
    path = ws.robust_buffer_path(x, 2, 1, L)
    q = 2 / 3
    assert [p.eta for p in path] == pytest.approx([95.0, 95.0 + (2 * q - 1) * 5.0, q * L])
    assert ws.dro_reservation(x, 2, 1, 150.0, L) == pytest.approx(200 / 3)
    assert ws.dro_reservation(x, 2, 1, 150.0, L) < nv.saa_reservation(x, 2, 1)
    # rho < 1: the middle buffer is 2 q* eta_SAA (below SAA), then q* L
    y = [10.0, 20.0, 30.0, 40.0, 50.0]
    path = ws.robust_buffer_path(y, 0.5, 1, L)
    eta = nv.saa_reservation(y, 0.5, 1)
    assert [p.eta for p in path] == pytest.approx([eta, 2 * (1 / 3) * eta, L / 3])


def test_jump_to_the_middle_buffer_vanishes_as_rho_tends_to_one(rng):
    x = rng.integers(1, 400, size=300).astype(float)
    L = 500.0
    jumps = []
    for rho in (1.5, 1.1, 1.01, 1.001):
        path = ws.robust_buffer_path(x, rho, 1.0, L)
        eta = nv.saa_reservation(x, rho, 1.0)
        assert path[0].eta == eta
        assert path[1].eta - eta == pytest.approx((rho - 1) / (rho + 1) * (L - eta))
        jumps.append(path[1].eta - eta)
    assert np.all(np.diff(jumps) < 0) and jumps[-1] < 0.3


@settings(max_examples=100, deadline=None, derandomize=True)
@given(instances(max_size=15), COSTS, COSTS)
def test_buffer_path_agrees_with_dro_solution(inst, c_p, c_w):
    x, L, _, _ = inst
    path = ws.robust_buffer_path(x, c_p, c_w, L)
    assert path[-1].eps_to == math.inf and len(path) <= 3
    assert all(a.eps_to == b.eps_from for a, b in zip(path, path[1:]))
    for piece in path:
        hi = piece.eps_to if math.isfinite(piece.eps_to) else piece.eps_from + L
        for eps in np.linspace(piece.eps_from, hi, 5)[1:-1]:
            sol = ws.dro_solution(x, c_p, c_w, eps, L)
            assert sol.eta == pytest.approx(piece.eta, abs=1e-9 * L) or sol.gamma != piece.gamma
            assert sol.gamma == piece.gamma


def test_unbounded_support_limit(rng):
    """Mohajerin Esfahani & Kuhn: with unbounded support the worst case is SAA + c_max eps and the
    robust buffer is SAA's for every eps. Output lengths are bounded below by 0, so with support
    [0, L_max] and L_max -> inf this holds for rho >= 1 (mass can always go further up) ..."""
    x = rng.lognormal(4, 1, size=400)
    L = 1e7 * x.max()
    for rho in (1.0, 2.0, 20.0):
        eta = nv.saa_reservation(x, rho, 1)
        v = nv.expected_cost(x, eta, rho, 1)
        for eps in (0.1, 10.0, 300.0):
            assert ws.dro_reservation(x, rho, 1, eps, L) == eta
            assert ws.worst_case_cost(x, eta, rho, 1, eps, L) == pytest.approx(v + max(rho, 1) * eps)


def test_rho_below_one_is_limited_by_the_floor(rng):
    """... but for rho < 1 the worst case pushes mass *down*, and 0 is a hard floor: the threshold
    is (c_p mean - V_SAA)/(c_p + c_w) however large L_max is (the mirror of the rho > 1 formula)."""
    x = rng.lognormal(4, 1, size=400)
    rho = 0.5
    eta = nv.saa_reservation(x, rho, 1)
    expected = (rho * x.mean() - nv.expected_cost(x, eta, rho, 1)) / (rho + 1)
    for L in (2 * x.max(), 1e3 * x.max(), 1e7 * x.max()):
        assert ws.saa_threshold_radius(x, rho, 1, L) == pytest.approx(expected)
    assert ws.dro_reservation(x, rho, 1, 1.01 * expected, 1e7 * x.max()) < eta


def test_large_radius_gives_box_robust_buffer(rng):
    x = rng.integers(0, 100, size=50)
    for rho in (0.3, 1.0, 4.0, 50.0):
        sol = ws.dro_solution(x, rho, 1.0, 1e4, 100.0)
        assert sol.eta == pytest.approx(rho / (rho + 1) * 100.0)
        assert sol.cost == pytest.approx(rho * 1.0 * 100.0 / (rho + 1))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(instances(max_size=12), COSTS, COSTS)
def test_saddle_point(inst, c_p, c_w):
    """The robust buffer is a rho/(rho+1)-quantile of some worst-case distribution for it."""
    x, L, _, eps = inst
    sp = ws.saddle_distribution(x, c_p, c_w, eps, L)
    wc = ws.worst_case_cost(x, sp.eta, c_p, c_w, eps, L)
    assert close(sp.cost, wc)
    assert close(float(sp.probs @ nv.loss(sp.atoms, sp.eta, c_p, c_w)), wc, 1e-5)
    q = c_p / (c_p + c_w)
    assert sp.probs[sp.atoms <= sp.eta].sum() >= q - 1e-6
    assert sp.probs[sp.atoms < sp.eta].sum() <= q + 1e-6


# --------------------------------------------------------------------------- bad input
GOOD = {"samples": [1.0, 5.0], "eta": 2.0, "c_p": 10.0, "c_w": 1.0, "eps": 1.0, "L_max": 10.0}


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"samples": []}, "samples"),
        ({"samples": [1.0, math.nan]}, "samples"),
        ({"samples": [-1.0, 3.0]}, "samples"),
        ({"samples": [1.0, 11.0]}, "samples"),
        ({"eps": -0.1}, "eps"),
        ({"eps": math.inf}, "eps"),
        ({"eps": math.nan}, "eps"),
        ({"eta": math.nan}, "eta"),
        ({"c_p": -1.0}, "c_p"),
        ({"c_w": math.inf}, "c_w"),
        ({"L_max": math.nan}, "L_max"),
        ({"L_max": 0.0}, "L_max"),
    ],
)
@pytest.mark.parametrize("method", ws.METHODS)
def test_worst_case_rejects_bad_input(change, name, method):
    with pytest.raises(ValueError, match=name):
        ws.worst_case_cost(**(GOOD | change), method=method)


@pytest.mark.parametrize(
    ("change", "name"),
    [({"c_p": 0.0}, "c_p"), ({"c_w": -1.0}, "c_w"), ({"eps": -1.0}, "eps"), ({"samples": [12.0]}, "samples")],
)
def test_dro_rejects_bad_input(change, name):
    args = {k: v for k, v in (GOOD | change).items() if k != "eta"}
    with pytest.raises(ValueError, match=name):
        ws.dro_reservation(**args)


def test_unknown_methods_rejected():
    with pytest.raises(ValueError, match="method"):
        ws.worst_case_cost(**GOOD, method="simplex")
    with pytest.raises(ValueError, match="method"):
        ws.dro_reservation(GOOD["samples"], 10, 1, 1, 10, method="guess")
    with pytest.raises(ValueError, match="etas"):
        ws.worst_case_cost_many([1.0], [0.0, math.nan], 1, 1, 1, 2)
