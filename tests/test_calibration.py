"""The calibrated serving model (kvdro.calibration, Instance(serving=...)) and simulating a plan."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvdro.joint import evaluate, paper_instance, solve_exact
from kvdro.joint.serving import (
    CALIBRATION_FILE,
    band_residence_offset_s,
    band_waiting_s,
    calibration_for,
    load_calibration,
)


@pytest.fixture(scope="module")
def small(data_dir):
    return paper_instance("small", 0, serving="calibrated")


def test_bad_switch_and_table_raise(data_dir, tmp_path):
    with pytest.raises(ValueError, match="serving"):
        paper_instance("small", 0, serving="kingman")
    with pytest.raises(ValueError, match="path"):
        load_calibration("real", tmp_path / "none.csv")
    with pytest.raises(ValueError, match="source"):
        load_calibration("nowhere")
    with pytest.raises(ValueError, match="bands"):  # the table is measured on the default 10 bands
        paper_instance("small", 0, serving="calibrated", waiting_bands=5)
    slopes = pd.read_csv(CALIBRATION_FILE)
    slopes.loc[(slopes["config"] == "TP4-PP1") & (slopes["band"] == 3), "res_b_s"] *= 1.5
    slopes.to_csv(tmp_path / "slopes.csv", index=False)
    with pytest.raises(ValueError, match="res_b_s"):  # one prompt slope per configuration, or H is not banded linearly
        paper_instance("small", 0, serving="calibrated", calibration=load_calibration("real", tmp_path / "slopes.csv"))
    bad = pd.read_csv(CALIBRATION_FILE).drop(columns=["kv_ratio"])
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="kv_ratio"):
        load_calibration("real", tmp_path / "bad.csv")


def test_table_is_physical():
    """Measured, not assumed: waits and residence grow with the band, saturation throughput orders the
    configs as their KV capacity and compute do, and the KV held is close to what the requests'
    prompts and growing outputs account for (ratio m near 1 and about the same in every band)."""
    f = pd.read_csv(CALIBRATION_FILE)
    assert set(f["source"]) == {"real", "synthetic"} and len(f) == 2 * 4 * 10
    for (_, _), g in f.groupby(["source", "config"]):
        w = g.sort_values("band")["wait_mean_s"].to_numpy()
        assert w[-1] > 5 * w[0]  # the top band waits far longer than the bottom one
        assert g["sat_rps"].nunique() == 1 and g["work_scale"].nunique() == 1 and g["res_b_s"].nunique() == 1
        g = g.sort_values("band")
        h = (g["res_a_s"] + g["res_c_s"] * 250).to_numpy()  # a 250-token answer's residence per band
        assert h[-1] > 1.5 * h[0]  # a busy group holds a request's KV blocks far longer
        m = g["kv_ratio"].to_numpy()
        assert m.max() / m.min() < 1.3
    sat = f.groupby(["source", "config"])["sat_rps"].first()
    for src in ("real", "synthetic"):
        assert sat[(src, "TP2-PP1")] < sat[(src, "TP4-PP1")] < sat[(src, "TP4-PP2")]
    assert f["kv_ratio"].between(0.9, 1.35).all()


def test_switch_reaches_the_data_every_formulation_reads(small, data_dir):
    ana = paper_instance("small", 0)
    cal = calibration_for(small)
    assert np.allclose(small.service_s, ana.service_s * cal.work_scale[None, :, None])
    assert np.allclose(band_waiting_s(small), cal.wait_s)
    assert np.all(np.diff(cal.wait_s, axis=1) >= 0)  # read as non-decreasing in the band
    assert not np.allclose(band_waiting_s(small), band_waiting_s(ana))
    M = np.array([c.kv_capacity_tokens for c in small.configs], dtype=float)
    assert np.allclose(small.capacity_tokens, M) and np.allclose(ana.capacity_tokens, M)  # (6e) reads physical M
    # (6e) reads the slowest band's H; (6f) adds an offset <= 0 that is 0 in some band of every (class, config)
    off = band_residence_offset_s(small)
    assert off.shape == (small.n_classes, small.n_configs, small.waiting_bands)
    assert np.all(off <= 0) and np.allclose(off.max(axis=2), 0.0) and off.min() < -10.0
    assert np.all(band_residence_offset_s(ana) == 0)


def test_adding_a_group_shortens_residence(small):
    """Banded H: the same traffic on two groups instead of one runs in a lower band, and every class's
    residence -- and so its response time in (6f) and the SLO term of evaluate -- is shorter; the
    analytic model's one H per configuration cannot say this."""
    from kvdro.joint import Solution
    from kvdro.joint.serving import residence_at

    k = [c.config.name for c in small.configs].index("TP4-PP1")
    T = small.service_s[:, k, 0]
    pi = np.zeros((small.n_classes, small.n_configs))
    pi[:, k] = 0.8 / float(small.rates @ T)  # one group at utilisation 0.8
    r = small.input_tokens + 64.0
    d = np.zeros(pi.shape, dtype=bool)
    z1, z2 = np.eye(small.n_configs, dtype=int)[k], 2 * np.eye(small.n_configs, dtype=int)[k]
    e1, e2 = (evaluate(small, Solution(z=z, r=r, pi=pi, delta=d, method="test")) for z in (z1, z2))
    assert e1.utilisation[k] == pytest.approx(2 * e2.utilisation[k])
    H1, H2 = residence_at(small, e1.utilisation, d)[:, k], residence_at(small, e2.utilisation, d)[:, k]
    assert np.all(H2 < H1 - 1.0)  # at least a second shorter for every class
    assert e2.terms["slo"] <= e1.terms["slo"]
    ana = paper_instance("small", 0)
    assert np.array_equal(residence_at(ana, e1.utilisation, d), residence_at(ana, e2.utilisation, d))


def test_exact_and_bcd_read_the_calibrated_model(small, small_exact):
    from kvdro.bcd import solve_bcd

    ex = solve_exact(small)
    ev = evaluate(small, ex)
    assert ex.status == "optimal" and ev.feasible
    assert ex.mip_gap <= 1e-6 and ex.lower_bound <= ex.objective * (1 + 1e-9)
    assert ev.total == pytest.approx(ex.objective, rel=1e-6)  # the MILP optimised the calibrated model
    _, ana = small_exact  # solve_exact(paper_instance("small", 0)): the analytic model's optimum
    assert evaluate(small, ana).total >= ev.total * (1 - 1e-7)  # the analytic plan is no better under it
    bcd = solve_bcd(small)
    assert evaluate(small, bcd).total >= ev.total * (1 - 1e-6)


def test_one_row_remeasured_matches_the_cache(data_dir):
    """A stale table fails: one (config, band) row measured live equals the cached one."""
    from kvdro.calibration import measure_bands

    live = measure_bands("real", configs=("TP4-PP1",), bands=(4,)).iloc[0]
    cached = pd.read_csv(CALIBRATION_FILE).query("source == 'real' and config == 'TP4-PP1' and band == 4").iloc[0]
    for col in ("sat_rps", "wait_mean_s", "res_c_s", "kv_ratio"):
        assert live[col] == pytest.approx(cached[col], rel=1e-4), col


def test_loop_validates(small):
    from kvdro.calibration import calibration_loop

    trace = pd.DataFrame({"arrival_s": [0.0], "input_tokens": [1], "output_tokens": [1], "request_class": ["x"]})
    with pytest.raises(ValueError, match="instance"):
        calibration_loop(paper_instance("small", 0), trace=trace)
    with pytest.raises(ValueError, match="max_iter"):
        calibration_loop(small, trace=trace, max_iter=0)


def test_solve_then_simulate_plan_cli(calibrated_plan_run, tmp_path, capsys):
    """``solve --serving calibrated --json`` then ``simulate --plan`` (fresh processes, run once per
    session: conftest.py), and the plan errors of ``simulate`` in this process."""
    from kvdro.__main__ import main

    solve, simulate = calibrated_plan_run
    assert solve.returncode == 0, solve.stderr
    plan = json.loads(solve.stdout)
    pred = plan["predicted"]
    assert pred["serving"] == "calibrated" and plan["instance"]["load"] == 0.5
    assert set(pred["per_class_e2e_mean_s"]) == {c.name for c in paper_instance("small", 0).classes}
    assert pred["e2e_mean_s"] > 0 and pred["goodput_rps"] > 0 and 0 < pred["kv_utilisation_mean"] < 1
    assert simulate.returncode == 0, simulate.stderr
    out = json.loads(simulate.stdout)
    obs = out["observed"]
    assert out["e2e_mean_s"] == obs["e2e_mean_s"] > 0 and out["predicted"] == pred
    # the test half of the small instance at load 0.5: every request accounted for
    from kvdro.joint.paper import paper_trace

    n = len(paper_trace("small", 0, load=0.5, part="test"))
    assert out["completed"] + out["rejected"] + out["ignored"] == n
    assert out["rejected"] == 0  # the plan admits every class
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["simulate", "--plan", str(tmp_path / "broken.json"), "--json", "--quiet"]) == 2
    assert "--plan" in capsys.readouterr().err
    (tmp_path / "empty.json").write_text("{}")
    assert main(["simulate", "--plan", str(tmp_path / "empty.json"), "--quiet"]) == 2
    assert "instance" in capsys.readouterr().err


def test_loop_refits_the_band_the_plan_visits(data_dir):
    """One turn of plan -> simulate -> recalibrate: the table's rows of the visited bands become what
    the plan's run measured (the prompt slope b_k kept), and nothing else moves."""
    from kvdro.calibration import at_rate, calibration_loop, measured_rows
    from kvdro.joint.paper import paper_trace
    from kvdro.joint.serving import band_of, group_state
    from kvdro.sim.plan import simulate_solution

    inst = paper_instance("small", 0, load=1.0, serving="calibrated")
    train = at_rate(paper_trace("small", 0, load=1.0, part="train"), float(inst.rates.sum()))
    loop, final, sol = calibration_loop(inst, trace=train, max_iter=1)  # one plan, then its refit
    assert list(loop["iteration"]) == [0]
    assert {"pred_e2e_s", "sim_e2e_s", "pred_kv", "sim_kv", "objective", "wall_s"} <= set(loop.columns)
    assert loop["wall_s"].gt(0).all() and loop.attrs["wall_s"] >= loop["wall_s"].sum() * 0.99
    first = solve_exact(inst)
    u = group_state(inst, first.z, first.pi, first.delta).utilisation
    rows, class_rows = measured_rows(inst, first, simulate_solution(inst, first, train, seed=0))
    assert not rows.empty
    before, after = calibration_for(inst), calibration_for(final)
    touched = set()
    for _, row in rows.iterrows():
        k, j = int(row["k"]), int(row["band"])
        touched.add((k, j))
        assert j == band_of(inst, u)[k]
        new = final.calibration.rows(row["config"]).set_index("band").loc[j]
        for col in ("wait_mean_s", "res_a_s", "res_c_s", "kv_ratio", "wait_q95_s", "res_ratio_b0_q05", "res_ratio_b2_q95"):
            assert new[col] == pytest.approx(row[col], rel=1e-9), col
        assert after.residence[k, j, 1] == before.residence[k, j, 1]  # b_k is not refitted
    assert touched
    for k in range(inst.n_configs):
        for j in range(inst.waiting_bands):
            if (k, j) not in touched:
                assert after.kv_ratio[k, j] == before.kv_ratio[k, j]


def test_kv_and_goodput_formulas_by_hand():
    """The prediction's two formulas on numbers one can check by hand."""
    from kvdro.joint.serving import kv_token_seconds, on_time_share, ratio_cdf

    # a 1,000-token prompt held for 20 s, 100 output tokens at 0.1 s each (E[xi^2] = 10,000): 20,000 + 500
    assert kv_token_seconds(np.array([1000.0]), np.array([20.0]), np.array([0.1]), np.array([1e4]))[0] == pytest.approx(20500.0)
    q = np.linspace(0.5, 1.5, 10)  # a spread centred on 1
    assert ratio_cdf(q, 0.0) == 0.0 and ratio_cdf(q, 3.0 + 1e-9) == 1.0
    assert ratio_cdf(q, q[4]) == pytest.approx(0.45) and ratio_cdf(q, 1.0) == pytest.approx(0.5)
    # no spread: on time exactly when wait + residence fits the deadline
    wq, rq = np.full(10, 2.0), np.ones((3, 10))
    xi, h = np.array([10.0, 100.0, 1000.0]), np.array([1.0, 3.0, 9.0])
    assert on_time_share(wq, rq, xi, h, 5.0) == pytest.approx(2 / 3)
    assert on_time_share(wq, rq, xi, h, 4.9) == pytest.approx(1 / 3)
    # the residence spread of a sample's own length bin is the one used: a long answer's bin doubles it
    rq_long = rq.copy()
    rq_long[2] = 2.0
    assert on_time_share(wq, rq_long, xi, h, 12.0) == pytest.approx(2 / 3)
    assert on_time_share(wq, rq, xi, h, 12.0) == 1.0


def test_classes_read_their_own_rows(small):
    """Where a class has its own calibration row, its wait and residence are the class's: bursty code
    classes wait longer than the mix at a busy band; the prediction interpolates between the edges."""
    from kvdro.joint.serving import band_class_waiting_s, band_edges, interpolated_at, response_at

    cal = calibration_for(small)
    assert np.isfinite(cal.class_wait_s).all() and np.isfinite(cal.class_residence_s).all()
    W = band_class_waiting_s(small)
    code = [i for i, c in enumerate(small.classes) if c.name.startswith("code")]
    conv = [i for i, c in enumerate(small.classes) if c.name.startswith("conversation")]
    k = [c.config.name for c in small.configs].index("TP4-PP1")
    assert W[code, k, 4].min() > W[conv, k, 4].max()
    edges = band_edges(small)
    u = np.full(small.n_configs, edges[4])
    d = np.zeros((small.n_classes, small.n_configs), dtype=bool)
    Wi, Hi = interpolated_at(small, u, d)
    assert np.allclose(Wi + Hi, response_at(small, u, d))  # at an edge: the step's value
    mid = np.full(small.n_configs, (edges[3] + edges[4]) / 2)
    Wm, Hm = interpolated_at(small, mid, d)
    assert np.all(Wm + Hm <= response_at(small, mid, d) + 1e-9)  # between edges: below the step's bound


def test_family_of_names_the_trace_a_class_came_from():
    from kvdro.calibration import family_of

    assert list(family_of(["code-long", "conversation-short-s03"])) == ["code", "conversation"]
    with pytest.raises(ValueError, match="request_class"):
        family_of(["code-long", "chat-short"])


def test_mix_runs_reproduce_the_table_and_split_u(data_dir):
    """The whole-mix run of measure_mixes is the table's own band run (its families' waits average to
    the table's W); the families' parts of u add up to u; the code family alone, at the same u, waits
    longer than the code requests of the whole mix (what the single-group table cannot see)."""
    from kvdro.calibration import measure_mixes

    m = measure_mixes("real", configs=("TP4-PP1",), bands=(3,))
    table = load_calibration("real").frame.query("config == 'TP4-PP1' and band == 3").iloc[0]
    whole = m[m["mix"] == "whole"]
    assert np.isclose(np.average(whole["wait_mean_s"], weights=whole["requests"]), table["wait_mean_s"], rtol=1e-5)
    assert np.isclose(whole["u_family"].sum(), table["u_edge"], rtol=1e-5)
    alone = m[m["mix"] != "whole"]
    assert (alone["mix"] == alone["family"]).all() and np.allclose(alone["u_family"], table["u_edge"], rtol=1e-5)
    code = m[m["family"] == "code"].set_index("mix")["wait_mean_s"]
    assert code["code"] > 2 * code["whole"]
    with pytest.raises(ValueError, match="bands"):
        measure_mixes("real", configs=("TP4-PP1",), bands=(10,))


def test_plan_groups_splits_a_run_by_group_and_family(small):
    """plan_groups' rows are the run's served requests by group and family, with their mean wait."""
    from types import SimpleNamespace

    from kvdro.calibration import plan_groups
    from kvdro.joint import Solution

    I, K = small.n_classes, small.n_configs
    pi = np.zeros((I, K))
    pi[:3, 1] = 1.0  # the code classes on TP4-PP1, the conversation classes on TP2-PP2
    pi[3:, 2] = 1.0
    sol = Solution(z=np.array([0, 1, 1, 0]), r=small.input_tokens + 100.0, pi=pi, delta=np.zeros((I, K), dtype=bool),
                   method="test", status="test")
    req = pd.DataFrame({
        "request_class": ["code-long", "code-short", "conversation-long", "conversation-long", "code-long"],
        "group": [0, 0, 1, 1, 0], "wait_s": [1.0, 3.0, 0.5, 1.5, 8.0],
        "outcome": ["completed", "truncated", "completed", "completed", "rejected"],
    })
    rows = plan_groups(small, sol, SimpleNamespace(requests=req)).set_index(["group", "family"])
    assert list(rows.index) == [(0, "code"), (1, "conversation")]
    assert rows.loc[(0, "code"), "requests"] == 2 and rows.loc[(0, "code"), "wait_sim_s"] == pytest.approx(2.0)
    assert rows.loc[(1, "conversation"), "wait_sim_s"] == pytest.approx(1.0)
    assert rows.loc[(0, "code"), "config"] == "TP4-PP1" and rows.loc[(0, "code"), "code_share"] == 1.0
    assert rows["wait_table_s"].gt(0).all()
