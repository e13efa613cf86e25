"""kvdro.sim: the public API, policies, deployments, accounting, invariants and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvdro.hardware import ParallelConfig
from kvdro.sim import (
    METRIC_KEYS,
    POLICIES,
    Deployment,
    SimResult,
    default_deployment,
    deployment_from_solution,
    policy_buffers,
    simulate,
)
from kvdro.sim.policies import request_buffers


def toy_trace(rng, n=400, rate=4.0, classes=("a", "b")) -> pd.DataFrame:
    gaps = rng.exponential(1.0 / rate, n)
    return pd.DataFrame({
        "arrival_s": np.cumsum(gaps),
        "input_tokens": rng.integers(50, 2000, n),
        "output_tokens": rng.integers(1, 600, n),
        "request_class": rng.choice(list(classes), n),
    })


def test_public_api_names():
    assert POLICIES == ("vllm", "max", "mean", "p90", "p95", "p99", "saa", "dro", "lp1", "lp2")
    assert len(METRIC_KEYS) == 19 and METRIC_KEYS[-1] == "e2e_mean_s"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_and_accounts_for_every_request(policy, rng):
    tr = toy_trace(rng)
    r = simulate(tr, policy=policy, rng=np.random.default_rng(1), deployment=default_deployment(config="TP2-PP1", groups=1))
    assert isinstance(r, SimResult)
    assert tuple(r.metrics) == METRIC_KEYS
    m = r.metrics
    assert m["completed"] + m["rejected"] + m["ignored"] == len(tr)
    assert len(r.requests) == len(tr) and (r.requests.index == tr.index).all()
    done = r.requests["outcome"].isin(["completed", "truncated"])
    assert m["e2e_mean_s"] == pytest.approx(r.requests.loc[done, "e2e_s"].mean(), rel=1e-12)
    assert (r.requests.loc[done, "generated_tokens"] == np.maximum(1, tr.loc[done, "output_tokens"])).all()
    assert np.isclose(m["cost_total"], sum(r.cost[k] for k in ("preemption", "waste", "slo", "rejection", "gpu")))
    assert np.isclose(r.cost["preemption"], 10.0 * m["recomputed_tokens"])


def test_policy_buffers_match_their_definitions(rng):
    tr = toy_trace(rng, n=2000)
    a = tr[tr.request_class == "a"]["output_tokens"].to_numpy()
    assert policy_buffers("vllm", tr, rho=10) == {}
    assert policy_buffers("max", tr, rho=10)["a"] == a.max()
    assert np.isclose(policy_buffers("mean", tr, rho=10)["a"], a.mean())
    p90 = policy_buffers("p90", tr, rho=10)["a"]
    assert (a <= p90).mean() >= 0.9 > (a < p90).mean()
    saa = policy_buffers("saa", tr, rho=10)["a"]  # lower 10/11 quantile
    assert (a <= saa).mean() >= 10 / 11 > (a < saa).mean()
    dro = policy_buffers("dro", tr, rho=10)["a"]
    assert saa <= dro <= a.max()  # robustness moves the buffer up, within the support
    lp1, lp2 = policy_buffers("lp1", tr, rho=10), policy_buffers("lp2", tr, rho=10)
    assert lp2["a"] > lp1["a"] > 0
    # the predictor's buffer varies with the prompt along the fitted slope
    eta = request_buffers(lp1, np.array(["a", "a"]), np.array([900, 1100]))
    expected = np.clip(lp1["a"] + lp1.slope["a"] * (np.array([900, 1100]) - lp1.mean_input["a"]), 0, a.max())
    np.testing.assert_allclose(eta, expected)
    assert np.isclose(eta[1] - eta[0], 200 * lp1.slope["a"]) or eta.min() == 0 or eta.max() == a.max()
    with pytest.raises(ValueError, match="policy"):
        policy_buffers("p80", tr, rho=10)
    with pytest.raises(ValueError, match="rho"):
        policy_buffers("saa", tr, rho=0)


def test_max_never_preempts_but_mean_does_under_memory_pressure(rng):
    tr = toy_trace(rng, n=600, rate=8.0)
    dep = default_deployment(config="TP2-PP1", groups=1)
    mx = simulate(tr, policy="max", rng=np.random.default_rng(0), deployment=dep)
    mean = simulate(tr, policy="mean", rng=np.random.default_rng(0), deployment=dep)
    assert mx.metrics["preemptions"] == 0 and mx.metrics["recomputed_tokens"] == 0
    assert mean.metrics["preemptions"] > 0 and mean.metrics["recomputed_tokens"] > 0
    assert mx.cost["waste_tokens"] > mean.cost["waste_tokens"]


def test_engines_agree_through_simulate(rng):
    tr = toy_trace(rng, n=300, rate=10.0)
    dep = Deployment(groups=("TP2-PP1", "TP2-PP2"), prefix_tokens={"a": 100, "b": 40},
                     prefix_caching={"a": [True, True], "b": [False, True]}, routing={"a": [0.5, 0.4]})
    for policy in ("vllm", "p90"):
        f = simulate(tr, policy=policy, rng=np.random.default_rng(5), deployment=dep, engine="fast")
        r = simulate(tr, policy=policy, rng=np.random.default_rng(5), deployment=dep, engine="reference")
        assert {k: v for k, v in f.metrics.items() if k != "wall_s"} == {k: v for k, v in r.metrics.items() if k != "wall_s"}
        pd.testing.assert_frame_equal(f.requests, r.requests)
        assert f.metrics["rejected"] > 0  # class a is rejected with probability 0.1


def test_routing_is_seeded_and_follows_the_probabilities(rng):
    tr = toy_trace(rng, n=3000, rate=50.0, classes=("a",))
    dep = Deployment(groups=("TP4-PP1", "TP4-PP1"), routing={"a": [0.6, 0.3]})
    r1 = simulate(tr, policy="vllm", rng=np.random.default_rng(9), deployment=dep)
    r2 = simulate(tr, policy="vllm", rng=np.random.default_rng(9), deployment=dep)
    pd.testing.assert_frame_equal(r1.requests, r2.requests)
    share = r1.requests["group"].value_counts(normalize=True)
    assert abs(share[0] - 0.6) < 0.03 and abs(share[1] - 0.3) < 0.03 and abs(share[-1] - 0.1) < 0.02


def test_prefix_caching_shortens_prefill_and_shares_blocks(rng):
    tr = toy_trace(rng, n=400, rate=6.0, classes=("a",))
    base = dict(groups=("TP4-PP1",), prefix_tokens={"a": 512})
    off = simulate(tr, policy="vllm", rng=np.random.default_rng(0), deployment=Deployment(**base))
    on = simulate(tr, policy="vllm", rng=np.random.default_rng(0),
                  deployment=Deployment(**base, prefix_caching={"a": [True]}))
    assert on.metrics["ttft_p50_s"] < off.metrics["ttft_p50_s"]
    assert on.outputs[0].kv_integral < off.outputs[0].kv_integral


def test_context_limit_ignores_and_truncates_and_counts(rng):
    tr = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "input_tokens": [5000, 4000, 100, 4096],
                       "output_tokens": [10, 200, 50, 5], "request_class": ["a"] * 4})
    r = simulate(tr, policy="vllm", rng=np.random.default_rng(0),
                 deployment=default_deployment(config="TP4-PP1", groups=1, max_model_len=4096))
    assert list(r.requests["outcome"]) == ["ignored", "truncated", "completed", "truncated"]
    # generation stops once prompt + output exceeds the window: 4096 - 4000 + 1 = 97 tokens
    assert list(r.requests["generated_tokens"]) == [0, 97, 50, 1]
    assert r.metrics["ignored"] == 1 and r.metrics["truncated"] == 2 and r.metrics["completed"] == 3


def test_bad_input_names_the_argument(rng):
    tr = toy_trace(rng, n=20)
    with pytest.raises(ValueError, match="policy"):
        simulate(tr, policy="lru", rng=rng)
    with pytest.raises(ValueError, match="rng"):
        simulate(tr, policy="vllm", rng=0)
    bad = tr.copy()
    bad.loc[bad.index[3], "output_tokens"] = -1
    with pytest.raises(ValueError, match="output_tokens.*row 3"):
        simulate(bad, policy="vllm", rng=rng)
    with pytest.raises(ValueError, match="missing column"):
        simulate(tr.drop(columns="request_class"), policy="vllm", rng=rng)
    with pytest.raises(ValueError, match="buffers: no buffer"):
        simulate(tr, policy="dro", buffers={"a": 10.0}, rng=rng)
    with pytest.raises(ValueError, match="routing"):
        Deployment(groups=("TP4-PP1",), routing={"a": [1.2]})
    with pytest.raises(ValueError, match="max_model_len"):
        Deployment(groups=("TP2-PP1",), max_model_len=200_000)
    with pytest.raises(ValueError, match="config"):
        default_deployment(config="TP4")


def test_deployment_from_a_joint_solution():
    from kvdro.joint import Instance, Solution
    from kvdro.hardware import A100_80GB, LLAMA2_70B, PAPER_CONFIGS, config_performance
    from kvdro.workload import RequestClass

    rng = np.random.default_rng(0)
    classes = (RequestClass("a", 1.0, rng.integers(100, 500, 50), rng.integers(1, 300, 50), prefix_tokens=64),
               RequestClass("b", 2.0, rng.integers(100, 500, 50), rng.integers(1, 300, 50)))
    inst = Instance(classes=classes, configs=tuple(config_performance(LLAMA2_70B, A100_80GB, c) for c in PAPER_CONFIGS), total_gpus=8)
    sol = Solution(z=np.array([0, 2, 0, 0]), r=np.array([500.0, 600.0]),
                   pi=np.array([[0, 0.8, 0, 0], [0, 1.0, 0, 0]]), delta=np.array([[0, 1, 0, 0], [0, 0, 0, 0]]))
    dep = deployment_from_solution(inst, sol)
    assert dep.groups == (ParallelConfig(4, 1),) * 2
    np.testing.assert_allclose(dep.routing_matrix(["a", "b"]), [[0.2, 0.4, 0.4], [0.0, 0.5, 0.5]])
    assert dep.prefix_caching["a"] == [True, True] and dep.prefix_tokens["a"] == 64


def test_cli_json_keys_and_bad_csv(tmp_path, capsys):
    from kvdro.__main__ import main

    csv = tmp_path / "mine.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{10 + i:02d}.000,{100 + 7 * i},{20 + i}\n" for i in range(30)))
    assert main(["simulate", "--trace", str(csv), "--policy", "dro", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert tuple(out) == METRIC_KEYS and out["completed"] == 30
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:10.000,100,5\n2023-11-16 18:15:11.000,100,x\n")
    assert main(["simulate", "--trace", str(bad), "--policy", "vllm", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "GeneratedTokens" in err and "row 1" in err


def test_azure_conversation_trace_end_to_end(data_dir, capsys):
    """Must show: the whole conversation trace, every request accounted for; Max never preempts."""
    from kvdro.__main__ import main

    assert main(["simulate", "--trace", "azure-2023-conv", "--policy", "dro", "--rho", "10", "--seed", "0", "--json", "--quiet"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert tuple(m) == METRIC_KEYS
    assert m["completed"] + m["rejected"] + m["ignored"] == 19_366
    assert main(["simulate", "--trace", "azure-2023-conv", "--policy", "max", "--scale", "3", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["preemptions"] == 0


@pytest.mark.parametrize("policy", ["vllm", "mean", "dro"])
def test_every_policy_keeps_the_watermark_and_the_free_block_rule(policy, rng):
    """Issue 15: a reservation is an extra admission condition on top of vLLM's rules, not instead of them."""
    tr = toy_trace(rng, n=500, rate=12.0)
    dep = default_deployment(config="TP2-PP1", groups=1)
    wm = dep.watermark_blocks(dep.groups[0])
    assert wm >= 20
    r = simulate(tr, policy=policy, rng=np.random.default_rng(0), deployment=dep, engine="reference", record=True)
    rows = r.outputs[0].trace
    after_prefill = [free for _, _, kind, free, _ in rows if kind == "prefill"]
    assert min(after_prefill) >= wm
    # the free-block rule: a decode step never starts with an empty pool (free >= 1 before each sequence)
    assert min(free for _, _, kind, free, _ in rows if kind == "decode") >= 0
    if policy != "vllm":
        old = simulate(tr, policy=policy, rng=np.random.default_rng(0), deployment=dep, engine="reference",
                       record=True, safety_rules=False)
        assert min(free for _, _, kind, free, _ in old.outputs[0].trace if kind == "prefill") < wm  # the old rule did not
        assert old.metrics["preemptions"] >= r.metrics["preemptions"]


def test_hard_reservation_caps_restarts_and_terminates(rng):
    tr = toy_trace(rng, n=400, rate=6.0)
    dep = default_deployment(config="TP2-PP1", groups=1)
    buffers = {"a": 64.0, "b": 64.0}
    soft = simulate(tr, policy="mean", buffers=buffers, rng=np.random.default_rng(0), deployment=dep)
    runs = {e: simulate(tr, policy="mean", buffers=buffers, rng=np.random.default_rng(0), deployment=dep,
                        reservation="hard", engine=e) for e in ("fast", "reference")}
    hard = runs["fast"]
    pd.testing.assert_frame_equal(runs["fast"].requests, runs["reference"].requests)
    assert hard.reservation == "hard" and soft.reservation == "soft"
    rq = hard.requests
    L, xi = rq["input_tokens"].to_numpy(), np.maximum(1, rq["output_tokens"].to_numpy())
    reserved = 16 * rq["reserved_blocks"].to_numpy()
    over = L + xi - 1 > reserved  # the cache would outgrow the reservation
    assert over.sum() > 50
    # every request that outgrows its reservation is preempted at least once, and only those are at the cap
    assert (rq.loc[over, "preemptions"] >= 1).all()
    # doubling: the number of restarts of a request is at most log2 of its growth in buffer blocks, + 1
    base = -(-L // 16)
    need = -(-(L + xi - 1) // 16) - base
    bound = np.ceil(np.log2(np.maximum(need, 1) / np.maximum(rq["reserved_blocks"].to_numpy() - base, 1))).clip(0) + 1
    assert (rq["preemptions"].to_numpy() <= bound + 1).all()
    assert hard.metrics["completed"] == len(tr) and (rq["generated_tokens"].to_numpy() == xi).all()
    assert hard.metrics["preemptions"] > 5 * max(soft.metrics["preemptions"], 1)


def test_bad_reading_names_the_argument(rng):
    tr = toy_trace(rng, n=20)
    with pytest.raises(ValueError, match="reservation"):
        simulate(tr, policy="dro", rng=rng, reservation="firm")
    with pytest.raises(ValueError, match="safety_rules"):
        simulate(tr, policy="dro", rng=rng, safety_rules="no")


def test_cli_reservation_hard(data_dir, capsys):
    from kvdro.__main__ import main

    args = ["simulate", "--trace", "azure-2023-conv", "--config", "TP2-PP1", "--groups", "4", "--scale", "0.6",
            "--policy", "mean", "--rho", "10", "--json", "--quiet"]
    assert main(args + ["--reservation", "hard"]) == 0
    hard = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    soft = json.loads(capsys.readouterr().out)
    assert tuple(hard) == METRIC_KEYS and hard["completed"] == soft["completed"] == 19_366
    assert hard["preemptions"] > 10 * max(soft["preemptions"], 1)
