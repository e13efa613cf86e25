"""The calibrated serving model (kvdro.calibration, Instance(serving=...)) and simulating a plan."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvdro.joint import evaluate, paper_instance, solve_exact
from kvdro.joint.serving import (
    CALIBRATION_FILE,
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
    with pytest.raises(ValueError, match="operating_bands"):
        paper_instance("small", 0, serving="calibrated", operating_bands=(9, 9, 9))
    bad = pd.read_csv(CALIBRATION_FILE).drop(columns=["kv_ratio"])
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match="kv_ratio"):
        load_calibration("real", tmp_path / "bad.csv")


def test_table_is_physical():
    """Measured, not assumed: waits grow with the band, saturation throughput orders the configs as
    their KV capacity and compute do, and the KV occupancy per Little's-law token is close to 1."""
    f = pd.read_csv(CALIBRATION_FILE)
    assert set(f["source"]) == {"real", "synthetic"} and len(f) == 2 * 4 * 10
    for (_, _), g in f.groupby(["source", "config"]):
        w = g.sort_values("band")["wait_mean_s"].to_numpy()
        assert w[-1] > 5 * w[0]  # the top band waits far longer than the bottom one
        assert g["sat_rps"].nunique() == 1 and g["work_scale"].nunique() == 1
    sat = f.groupby(["source", "config"])["sat_rps"].first()
    for src in ("real", "synthetic"):
        assert sat[(src, "TP2-PP1")] < sat[(src, "TP4-PP1")] < sat[(src, "TP4-PP2")]
    assert f["kv_ratio"].between(0.8, 1.2).all()


def test_switch_reaches_the_data_every_formulation_reads(small, data_dir):
    ana = paper_instance("small", 0)
    cal = calibration_for(small)
    assert np.allclose(small.service_s, ana.service_s * cal.work_scale[None, :, None])
    assert np.allclose(band_waiting_s(small), cal.wait_s)
    assert not np.allclose(band_waiting_s(small), band_waiting_s(ana))
    M = np.array([c.kv_capacity_tokens for c in small.configs], dtype=float)
    top = cal.kv_ratio[:, -1]
    assert np.allclose(small.capacity_tokens * top, M)
    assert np.allclose(ana.capacity_tokens, M)


def test_lower_band_shortens_residence(small):
    """Banded H (through operating_bands): a group run at a lower utilisation holds KV for less time --
    what the analytic model's one H per configuration cannot say."""
    low = replace(small, operating_bands=(0, 0, 0, 0))
    assert np.all(low.residence_s < small.residence_s)


def test_exact_and_bcd_read_the_calibrated_model(small):
    from kvdro.bcd import solve_bcd

    ex = solve_exact(small)
    ev = evaluate(small, ex)
    assert ex.status == "optimal" and ev.feasible
    assert ex.mip_gap <= 1e-6 and ex.lower_bound <= ex.objective * (1 + 1e-9)
    assert ev.total == pytest.approx(ex.objective, rel=1e-6)  # the MILP optimised the calibrated model
    ana = solve_exact(paper_instance("small", 0))
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


def test_solve_then_simulate_plan_cli(data_dir, tmp_path, capsys):
    from kvdro.__main__ import main

    assert main(["solve", "--instance", "small", "--method", "exact", "--serving", "calibrated", "--seed", "0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    pred = plan["predicted"]
    assert pred["serving"] == "calibrated" and plan["instance"]["load"] == 0.5
    assert set(pred["per_class_e2e_mean_s"]) == {c.name for c in paper_instance("small", 0).classes}
    assert pred["e2e_mean_s"] > 0 and pred["goodput_rps"] > 0 and 0 < pred["kv_utilisation_mean"] < 1
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["simulate", "--plan", str(path), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
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
    the plan's run measured, and H/m are then read at those bands."""
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
    rows = measured_rows(inst, first, simulate_solution(inst, first, train, seed=0))
    assert not rows.empty
    cal = calibration_for(final)
    for _, row in rows.iterrows():
        k = int(row["k"])
        assert row["band"] == band_of(inst, u)[k] == cal.operating_bands[k]
        assert cal.wait_s[k, int(row["band"])] == pytest.approx(row["wait_mean_s"], rel=1e-9)
        assert cal.kv_ratio[k, int(row["band"])] == pytest.approx(row["kv_ratio"], rel=1e-9)
