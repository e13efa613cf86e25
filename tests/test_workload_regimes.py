"""The regime map on the new workloads (kvdro.experiments.workload_regimes): chapter 9's rules applied."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.experiments import workload_regimes as wr
from kvdro.sim import regimes


@pytest.fixture(scope="module")
def tiny_trace():
    """400 Azure conversation requests, with the prompts of three made longer than Llama-2-7B's window."""
    from kvdro.datasets import load_trace

    t = load_trace("azure-2023-conv").head(400).reset_index(drop=True)
    t.loc[[5, 50, 300], "input_tokens"] = [5000, 4097, 9000]
    return t


@pytest.fixture(scope="module")
def tiny_map(tiny_trace):
    """Llama-2-7B on 8 x TP1-PP1 and 1 x TP8-PP1 (A100) at a light and a crushing load."""
    rows = [wr.regime_cell({"workload": "azure-conv-7b", "gpu": "a100-80gb", "deployment": d, "load": x}, trace=tiny_trace)
            for d in ("8 x TP1-PP1", "1 x TP8-PP1") for x in (1.0, 400.0)]
    return wr.classify(pd.DataFrame(rows))


def test_rules_of_chapter_8_label_each_cell(tiny_map):
    f = tiny_map
    stable = (f["drain_share"] <= regimes.DRAIN_SATURATED) & (f["backlog_second"] <= f["backlog_first"] + regimes.BACKLOG_SLACK)
    memory = (f["kv_mean"] >= regimes.KV_MEMORY_BOUND) & (f["preemptions"] > 0)
    assert (f["stable"] == stable).all() and (f["memory_bound"] == memory).all()
    # the light load is light and the crushing one is not stable, on both deployments
    assert f.loc[f["load"] == 1.0, "regime"].eq("light").all()
    assert not f.loc[f["load"] == 400.0, "stable"].any()
    # the SLO floor is each deployment's own at its lowest load (regimes.classify, per workload and GPU)
    for _, g in f.groupby("deployment"):
        assert np.allclose(g["slo_floor"], g.loc[g["load"].idxmin(), "slo_violation"])


def test_window_refuses_long_prompts_and_counts_them(tiny_map, tiny_trace):
    assert (tiny_map["ignored"] == int((tiny_trace["input_tokens"] > 4096).sum())).all()
    assert (tiny_map["ignored"] >= 3).all()  # the three made long, and any of the trace's own
    assert (tiny_map["requests"] == len(tiny_trace)).all()
    assert tiny_map["preempted_share"].between(0, 1).all() and tiny_map["recompute_share"].between(0, 1).all()


def test_preempted_and_recompute_shares_are_vllms(tiny_trace):
    """A load where vLLM preempts: the shares are the run's own counts."""
    from kvdro.sim import simulate

    cell = {"workload": "azure-conv-7b", "gpu": "a100-80gb", "deployment": "8 x TP1-PP1", "load": 400.0}
    row = wr.regime_cell(cell, trace=tiny_trace)
    r = simulate(regimes.at_load(tiny_trace, 400.0), policy="vllm", deployment=wr.deployments("azure-conv-7b", "a100-80gb")["8 x TP1-PP1"],
                 rng=np.random.default_rng(0))
    served = r.requests["outcome"].isin(["completed", "truncated"])
    assert row["preemptions"] == r.metrics["preemptions"]
    assert row["preempted_share"] == pytest.approx(float((r.requests.loc[served, "preemptions"] > 0).mean()))
    work = int((r.requests.loc[served, "input_tokens"] + r.requests.loc[served, "generated_tokens"] - 1).sum())
    assert row["recompute_share"] == pytest.approx(r.metrics["recomputed_tokens"] / (work + r.metrics["recomputed_tokens"]))


def test_operating_points_rule():
    """Lowest SLO violation among memory-bound stable cells; else the stable, preempting cell of highest KV."""
    base = {"workload": "w", "gpu": "g", "e2e_p99_s": 1.0, "preempted_share": 0.1, "recompute_share": 0.01}
    cells = [  # deployment A: two memory-bound stable loads; B: none (one stable preempting cell at KV 0.5)
        dict(base, deployment="A", load=1.0, kv_mean=0.3, preemptions=0, slo_violation=0.00, drain_share=0.0, backlog_first=0, backlog_second=0),
        dict(base, deployment="A", load=2.0, kv_mean=0.7, preemptions=5, slo_violation=0.30, drain_share=0.0, backlog_first=1, backlog_second=1),
        dict(base, deployment="A", load=3.0, kv_mean=0.8, preemptions=9, slo_violation=0.20, drain_share=0.01, backlog_first=1, backlog_second=1.5),
        dict(base, deployment="A", load=4.0, kv_mean=0.9, preemptions=9, slo_violation=0.10, drain_share=0.50, backlog_first=1, backlog_second=99),
        dict(base, deployment="B", load=1.0, kv_mean=0.2, preemptions=0, slo_violation=0.00, drain_share=0.0, backlog_first=0, backlog_second=0),
        dict(base, deployment="B", load=2.0, kv_mean=0.5, preemptions=3, slo_violation=0.05, drain_share=0.0, backlog_first=0, backlog_second=0),
        dict(base, deployment="B", load=3.0, kv_mean=0.9, preemptions=3, slo_violation=0.90, drain_share=0.2, backlog_first=0, backlog_second=9),
    ]
    pts = wr.operating_points(pd.DataFrame(cells)).set_index("deployment")
    assert pts.loc["A", "exact"] and pts.loc["A", "load"] == 3.0 and pts.loc["A", "memory_bound_stable_loads"] == 2
    assert not pts.loc["B", "exact"] and pts.loc["B", "load"] == 2.0


def test_deployments_fit_the_window():
    # Llama-3.1-70B with its 131,072-token window: a TP2 group's KV pool cannot hold one sequence
    assert set(wr.deployments("mooncake-conv", "a100-80gb")) == {"2 x TP4-PP1", "1 x TP8-PP1"}
    deps = wr.deployments("azure-conv-7b", "h100-80gb")
    assert "8 x TP1-PP1" in deps and all(d.max_model_len == 4096 and d.total_gpus == 8 for d in deps.values())
    assert all(len(wr.LOADS[w]) == 10 and np.allclose(np.diff(np.log2(wr.LOADS[w])), 0.5, atol=1e-5) for w in wr.WORKLOADS)


def test_map_round_trip(tiny_map, tmp_path):
    path = wr.write_map(tiny_map, tmp_path / "regimes_workloads.csv")
    back = wr.load_map(path)
    assert list(back["regime"]) == list(tiny_map["regime"])
    assert np.allclose(back["kv_mean"], tiny_map["kv_mean"], rtol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="workload"):
        wr.deployments("sharegpt", "a100-80gb")
    with pytest.raises(ValueError, match="name"):
        wr.deployments("r1", "tpu-v5")
    with pytest.raises(ValueError, match="n_jobs"):
        wr.regime_map([], n_jobs=0)
    with pytest.raises(ValueError, match="grid"):
        wr.regime_map([], n_jobs=1)
    with pytest.raises(FileNotFoundError, match="regimes-new"):
        wr.load_map("/nonexistent/regimes_workloads.csv")


def test_a_cut_cache_is_refused(tiny_map, tmp_path):
    path = wr.write_map(tiny_map, tmp_path / "regimes_workloads.csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="regimes_workloads.csv"):
        wr.load_map(path)


def test_llama2_70b_is_mapped_on_h100_only_with_the_books_window():
    """Llama-2-70B on H100 (its A100 map is the headroom map): served as there, 16,384-token window."""
    from kvdro.sim import regimes as rg

    assert wr.gpus_of("azure-conv-70b") == ("h100-80gb",) and wr.gpus_of("r1") == wr.GPUS
    grid = wr.cells(("azure-conv-70b",))
    assert {c["gpu"] for c in grid} == {"h100-80gb"} and len(grid) == 10 * len(wr.deployments("azure-conv-70b", "h100-80gb"))
    dep = wr.deployments("azure-conv-70b", "h100-80gb")["4 x TP2-PP1"]
    a100 = rg.deployment("4 x TP2-PP1")  # the headroom map's deployment of the same model
    assert dep.max_model_len == a100.max_model_len == wr.max_model_len("azure-conv-70b") and dep.model == a100.model
    assert wr.max_model_len("azure-conv-7b") == 4096
    with pytest.raises(ValueError, match="workloads"):
        wr.cells(("azure-conv-13b",))


def test_merge_map_replaces_one_workload_and_keeps_the_others(tiny_map, tmp_path):
    measured = tiny_map[[c for c in tiny_map.columns if c not in ("slo_floor", "slo_excess", "backlog_growing", "stable",
                                                                   "saturated", "memory_bound", "light", "regime")]]
    other = measured.assign(workload="mooncake-conv")
    old_path = wr.write_map(pd.concat([other, measured], ignore_index=True), tmp_path / "regimes_workloads.csv")
    before = old_path.read_text().splitlines()
    new = measured.assign(kv_mean=measured["kv_mean"] + 0.01)
    merged = wr.merge_map(new, pd.read_csv(old_path))
    after = wr.write_map(merged, old_path).read_text().splitlines()
    keep = lambda lines: [ln for ln in lines[1:] if ln.startswith("mooncake-conv,")]  # noqa: E731
    assert keep(after) == keep(before) and after[0] == before[0] and len(after) == len(before)
    assert np.allclose(wr.load_map(old_path).query("workload == 'azure-conv-7b'")["kv_mean"], new["kv_mean"], rtol=1e-5)
    with pytest.raises(ValueError, match="new"):
        wr.merge_map(pd.concat([new, new]), pd.read_csv(old_path))
