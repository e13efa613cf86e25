"""kvdro.sim.regimes: the classification rules and the choice of operating points, on hand-made maps
whose answer is known, and on the cached map."""

from __future__ import annotations

import pandas as pd
import pytest

from kvdro.sim import regimes


def cell(deployment, load, kv, pre, slo, drain=0.0, trace="conversation", backlog=(1.0, 1.0)):
    return {"trace": trace, "deployment": deployment, "load": load, "kv_mean": kv, "kv_peak": min(1.0, 2 * kv),
            "preemptions": pre, "slo_violation": slo, "e2e_p99_s": 10.0 * load, "drain_share": drain,
            "backlog_first": backlog[0], "backlog_second": backlog[1]}


def test_classify_follows_the_written_rules():
    f = regimes.classify(pd.DataFrame([
        cell("4 x TP2-PP1", 0.2, 0.10, 0, 0.30),  # light (SLO floor 0.30)
        cell("4 x TP2-PP1", 0.6, 0.65, 12, 0.35),  # memory-bound, stable
        cell("4 x TP2-PP1", 0.75, 0.70, 80, 0.45),  # 15 points above the floor, but the queue is stable
        cell("4 x TP2-PP1", 1.0, 0.90, 400, 0.38, drain=0.2),  # the queue outgrows the trace
        cell("4 x TP2-PP1", 1.1, 0.90, 400, 0.38, backlog=(5.0, 6.5)),  # the backlog grows by 1.5 > 1 request
        cell("2 x TP4-PP1", 0.2, 0.01, 0, 0.02),
        cell("2 x TP4-PP1", 0.5, 0.55, 0, 0.05),  # no preemption but KV >= 50 %: between
        cell("2 x TP4-PP1", 0.8, 0.20, 0, 0.60, backlog=(5.0, 5.9)),  # stable, latency grown: not light
        cell("2 x TP4-PP1", 1.0, 0.20, 0, 0.60, drain=0.06),  # compute-saturated
    ]))
    assert list(f["regime"]) == ["light", "memory-bound", "memory-bound", "memory-bound, saturated",
                                 "memory-bound, saturated", "light", "between", "between", "compute-saturated"]
    assert f["stable"].tolist() == [True, True, True, False, False, True, True, True, False]
    assert f["slo_floor"].tolist()[:5] == [0.30] * 5


def test_backlog_halves_integrates_the_waiting_time():
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 5.0, 10.0], "admit_s": [0.0, 6.0, 9.0, 10.0]})
    first, second = regimes.backlog_halves(req)
    # span 10 s, halves [0, 5) and [5, 10): request 1 waits 4 s in the first, 1 s in the second; request 2 waits 4 s
    assert (first, second) == pytest.approx((4.0 / 5.0, 5.0 / 5.0))
    with pytest.raises(ValueError, match="requests"):
        regimes.backlog_halves(req.iloc[:0])


def test_operating_points_by_rule_and_the_nearest_when_none_fits():
    rows = [cell("4 x TP2-PP1", 0.2, 0.10, 0, 0.30), cell("4 x TP2-PP1", 0.6, 0.62, 5, 0.36),
            cell("4 x TP2-PP1", 0.65, 0.66, 9, 0.33), cell("2 x TP4-PP1", 0.2, 0.01, 0, 0.02),
            cell("2 x TP4-PP1", 0.5, 0.04, 0, 0.08), cell("2 x TP4-PP1", 0.6, 0.05, 0, 0.16),
            cell("TP4-PP1 + 2 x TP2-PP1", 0.6, 0.70, 50, 0.05)]  # a mixed deployment is never the memory point
    pts = regimes.choose_operating_points(pd.DataFrame(rows))
    assert (pts["memory"].deployment_label, pts["memory"].scale, pts["memory"].exact) == ("4 x TP2-PP1", 0.65, True)
    assert (pts["light"].deployment_label, pts["light"].scale) == ("2 x TP4-PP1", 0.5)  # 0.6 is 14 points above the floor
    assert pts["memory"].deployment().groups == pts["memory"].deployment().groups[:1] * 4
    # no memory-bound stable cell: the stable preempting cell with the most KV in use, flagged
    rows[1], rows[2] = cell("4 x TP2-PP1", 0.6, 0.49, 17, 0.34), cell("4 x TP2-PP1", 0.65, 0.62, 40, 0.50, drain=0.3)
    rows[6] = cell("TP4-PP1 + 2 x TP2-PP1", 0.6, 0.55, 50, 0.05)
    pts = regimes.choose_operating_points(pd.DataFrame(rows))
    assert (pts["memory"].deployment_label, pts["memory"].scale, pts["memory"].exact) == ("4 x TP2-PP1", 0.6, False)
    with pytest.raises(ValueError, match="trace"):
        regimes.choose_operating_points(pd.DataFrame(rows), trace="code")


def test_mixed_deployment_routes_by_gpus():
    dep = regimes.deployment("TP4-PP1 + 2 x TP2-PP1")
    assert dep.total_gpus == 8
    assert list(dep.routing_matrix(["a"])[0]) == pytest.approx([0.0, 0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="deployment"):
        regimes.deployment("3 x TP2-PP1")


def test_cached_map_covers_the_grid_and_names_both_points():
    f = regimes.load_regime_map()
    assert len(f) == len(regimes.TRACES) * len(regimes.DEPLOYMENTS) * len(regimes.LOADS)
    assert not f[["kv_mean", "preemptions", "slo_violation", "e2e_p99_s"]].isna().any().any()
    pts = regimes.OPERATING_POINTS
    assert set(pts) == {"memory", "light"}
    row = f[(f["trace"] == "conversation") & (f["deployment"] == pts["memory"].deployment_label)
            & (f["load"] == pts["memory"].scale)].iloc[0]
    assert row["preemptions"] > 0 and row["stable"] and row["memory_bound"] and row["regime"] == "memory-bound"
    assert {"backlog_first", "backlog_second"} <= set(f.columns)
    # the memory point is the memory-bound, stable cell with the lowest SLO violation
    both = regimes.memory_bound_stable(f)
    both = both[(both["trace"] == "conversation") & (both["deployment"] == pts["memory"].deployment_label)]
    assert pts["memory"].slo_violation == pytest.approx(both["slo_violation"].min())
    assert f.loc[(f["deployment"] == pts["light"].deployment_label) & (f["load"] == pts["light"].scale)
                 & (f["trace"] == "conversation"), "regime"].iloc[0] == "light"


def test_resemblance_is_one_for_a_scaled_copy_and_lower_for_a_flat_one():
    from kvdro.sim.studies import resemblance

    paper = {"dro": (1270, 3083, 4807), "p90": (1852, 3095, 17080), "mean": (1275, 4666, 42811), "max": (4752, 4756, 4807)}
    rows = [{"policy": p, "rho": r, "cost": 3.0 * v[i]} for p, v in paper.items() for i, r in enumerate((2.0, 10.0, 100.0))]
    same = resemblance(pd.DataFrame(rows), paper)
    assert same["spearman"] == pytest.approx(1.0) and same["log10_error"] == pytest.approx(0.0, abs=1e-12)
    assert same["growth_spearman"] == pytest.approx(1.0) and same["growth_log10_error"] == pytest.approx(0.0, abs=1e-12)
    flat = pd.DataFrame([{"policy": p, "rho": r, "cost": v[0]} for p, v in paper.items() for r in (2.0, 10.0, 100.0)])
    looks = resemblance(flat, paper)
    assert looks["spearman"] < 0.8 and looks["growth_spearman"] == 0.0 and looks["growth_log10_error"] > 0.1
    with pytest.raises(ValueError, match="costs"):
        resemblance(flat[flat["rho"] != 100.0], paper)


def test_regime_chart_has_one_cell_per_load_and_deployment():
    from kvdro.sim.figures import regime_chart

    rows = [cell(d, load, 0.1 * k, k, 0.1) for k, d in enumerate(("2 x TP4-PP1", "4 x TP2-PP1")) for load in (0.2, 0.5)]
    chart = regime_chart(regimes.classify(pd.DataFrame(rows)), trace="conversation", marked={"light": ("2 x TP4-PP1", 0.5)})
    spec = chart.to_dict()
    data = [d for d in spec["datasets"].values()]
    assert sorted(len(d) for d in data) == [1, 4]


def test_goodput_judges_each_request_by_its_own_deadline_and_the_cost_by_its_class(rng):
    """deadline="request" (default): D = 2 s + 0.1 s x xi per request; "class": the class D_i; the
    cost's SLO term prices lateness against D_i either way."""
    import numpy as np

    from kvdro.sim import Deployment, simulate

    n = 400
    trace = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 40, n)), "input_tokens": rng.integers(20, 300, n),
                          "output_tokens": rng.geometric(1 / 200, n), "request_class": "c"})
    dep = Deployment(groups=("TP2-PP1",))
    own = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    cls = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), deadline="class")
    req = own.requests
    assert np.allclose(req["deadline_s"], 2.0 + 0.1 * trace["output_tokens"])
    assert np.allclose(cls.requests["deadline_s"], cls.requests["slo_s"])
    for r in (own, cls):
        ok = (r.requests["e2e_s"] <= r.requests["deadline_s"]).sum()
        assert r.metrics["goodput_rps"] == pytest.approx(ok / r.cost["horizon_s"])
        assert r.metrics["slo_violation_rate"] == pytest.approx(1 - ok / len(trace))
    assert own.cost["slo"] == pytest.approx(cls.cost["slo"]) and own.metrics["cost_total"] == pytest.approx(cls.metrics["cost_total"])
    # a long request misses its class's deadline (the class mean) where its own is long enough
    assert ((req["e2e_s"] > req["slo_s"]) & (req["e2e_s"] <= req["deadline_s"])).any()
    with pytest.raises(ValueError, match="deadline"):
        simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), deadline="paper")
