"""The presets through simulate(): engine=/implementation=/max_new= keywords, bad input, capped requests."""

import numpy as np
import pandas as pd
import pytest

from kvdro.sim import default_deployment, simulate
from kvdro.sim.engines import ENGINES
from kvdro.sim.presets_compiled import COMPILED


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(3)
    n = 60
    trace = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 20, n)), "input_tokens": rng.integers(20, 800, n),
                          "output_tokens": rng.integers(1, 400, n), "request_class": rng.choice(["a", "b"], n)})
    return trace, default_deployment(config="TP2-PP1", groups=1)


def test_old_engine_values_mean_vllm_v0_with_that_implementation(small):
    trace, dep = small
    old = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="reference")
    new = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="vllm-v0",
                   implementation="reference")
    assert old.engine == new.engine == "vllm-v0" and old.implementation == new.implementation == "reference"
    pd.testing.assert_frame_equal(old.requests, new.requests)
    assert "capped" not in old.metrics  # vllm-v0 with max_new unset: today's metric keys


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_every_preset_serves_every_request(engine, small):
    trace, dep = small
    r = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine=engine)
    m = r.metrics
    assert r.engine == engine and r.implementation == ("fast" if engine in COMPILED else "reference")
    assert m["completed"] + m["capped"] + m["rejected"] + m["ignored"] == len(trace) and m["capped"] == 0
    served = r.requests[r.requests["outcome"] == "completed"]
    assert (served["generated_tokens"] == np.maximum(served["output_tokens"], 1)).all()


@pytest.mark.parametrize("engine", ["vllm-v0", "sglang", "trtllm-gne"])
def test_a_client_cap_ends_longer_requests_as_capped_not_served(engine, small):
    trace, dep = small
    r = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine=engine, max_new=100)
    capped = r.requests["outcome"] == "capped"
    assert capped.sum() == r.metrics["capped"] == (trace["output_tokens"] > 100).sum()
    assert (r.requests.loc[capped, "generated_tokens"] == 100).all()
    assert r.metrics["completed"] == len(trace) - capped.sum()


def test_the_policy_estimate_as_max_new(small):
    trace, dep = small
    r = simulate(trace, policy="dro", deployment=dep, rng=np.random.default_rng(0), engine="lightllm", max_new="policy")
    eta = r.requests["buffer_tokens"]
    assert (r.requests["outcome"] == "capped").sum() == (trace["output_tokens"] > np.ceil(eta)).sum()
    true = simulate(trace, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="lightllm", max_new="true")
    assert true.metrics["capped"] == 0


@pytest.mark.parametrize("kwargs, name", [
    ({"engine": "vllm-v2"}, "engine"),
    ({"engine": "sglang", "implementation": "compiled"}, "implementation"),
    ({"engine": "reference", "implementation": "fast"}, "engine"),
    ({"max_new": 0}, "max_new"),
    ({"max_new": "maybe"}, "max_new"),
    ({"max_new": True}, "max_new"),
    ({"engine": "sglang", "policy": "dro"}, "max_new"),
    ({"engine": "sglang", "max_new": "policy"}, "max_new"),
    ({"engine": "vllm-v1", "policy": "oracle"}, "policy"),
    ({"engine": "vllm-v1", "reservation": "hard"}, "reservation"),
    ({"engine": "sglang", "engine_options": {"new_token_ratio": 0.5}}, "engine_options"),
    ({"engine": "sglang", "engine_options": {"min_new_token_ratio_factor": -1}}, "min_new_token_ratio_factor"),
    ({"engine": "vllm-v1", "engine_options": {"max_num_batched_tokens": 15}}, "max_num_batched_tokens"),
    ({"engine": "trtllm-gne", "engine_options": {"capacity_scheduler_policy": "MAX_UTILIZATION"}},
     "capacity_scheduler_policy"),
    ({"engine_options": {"max_num_seqs": 8}}, "engine_options"),
])
def test_bad_input_names_the_argument(kwargs, name, small):
    trace, dep = small
    kw = {"policy": "vllm", **kwargs}
    with pytest.raises(ValueError, match=name):
        simulate(trace, deployment=dep, rng=np.random.default_rng(0), **kw)


def test_cli_engine_and_max_new(tmp_path, capsys):
    import json

    from kvdro.__main__ import main

    csv = tmp_path / "mine.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{10 + i:02d}.000,{100 + 7 * i},{20 + 5 * i}\n" for i in range(30)))
    assert main(["simulate", "--trace", str(csv), "--policy", "vllm", "--engine", "trtllm-gne", "--max-new", "100",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    # outputs 20, 25, ..., 165: the 13 above 100 (20 + 5i > 100 for i >= 17) end at 100, capped
    assert out["engine"] == "trtllm-gne" and out["max_new"] == 100 and out["capped"] == 13
    assert out["completed"] == 17
    with pytest.raises(SystemExit) as exc:  # argparse refuses it
        main(["simulate", "--trace", str(csv), "--policy", "vllm", "--max-new", "0", "--quiet"])
    assert exc.value.code == 2
    assert "--max-new" in capsys.readouterr().err


def test_request_max_new_modes():
    from kvdro.sim.engine_choice import request_max_new

    room = np.array([100, 100, 5])
    true = np.array([0, 40, 30])
    assert request_max_new("unset", room=room, true_output=true, eta=None).tolist() == [100, 100, 5]
    assert request_max_new("true", room=room, true_output=true, eta=None).tolist() == [1, 40, 5]  # 0 -> 1; window
    assert request_max_new(60, room=room, true_output=true, eta=None).tolist() == [60, 60, 5]
    # eta rounded up, at least 1, clipped to the window
    assert request_max_new("policy", room=room, true_output=true, eta=np.array([0.2, 0.0, 1e300])).tolist() == [1, 1, 5]


def test_plan_refuses_a_bad_max_new(tmp_path, capsys):
    from kvdro.__main__ import main

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    with pytest.raises(SystemExit) as exc:  # argparse names the flag
        main(["simulate", "--plan", str(plan), "--max-new", "0", "--quiet"])
    assert exc.value.code == 2
    assert "--max-new" in capsys.readouterr().err


def test_policy_soft_reserves_the_estimate_without_a_cap(small):
    trace, dep = small
    r = simulate(trace, policy="dro", deployment=dep, rng=np.random.default_rng(0), engine="sglang", max_new="policy-soft")
    assert r.metrics["capped"] == 0 and r.metrics["completed"] == len(trace)
    for engine in ("vllm-v1", "trtllm-gne"):
        with pytest.raises(ValueError, match="max_new"):
            simulate(trace, policy="dro", deployment=dep, rng=np.random.default_rng(0), engine=engine, max_new="policy-soft")


def test_paired_interval_of_the_presets_bench():
    from kvdro.bench.presets import paired_interval

    ok = np.array([True, False, True, True])
    assert paired_interval(ok, 2.0, ok, 2.0) == (0.0, 0.0, 0.0)  # an arm against itself
    # the same requests served in half the time: +100 % in every resample (the ratio, paired)
    assert paired_interval(ok, 1.0, ok, 2.0) == pytest.approx((100.0, 100.0, 100.0))
    # an arm that serves nothing: -100 %, and the interval does not pass it
    none = np.zeros(4, dtype=bool)
    assert paired_interval(none, 1.0, ok, 1.0) == pytest.approx((-100.0, -100.0, -100.0))
    # one more request served of four: +33 %, the interval around it within [-100 %, +inf)
    more = np.array([True, True, True, True])
    pct, lo, hi = paired_interval(more, 1.0, ok, 1.0)
    assert pct == pytest.approx(100 / 3) and 0 <= lo <= pct <= hi
    with pytest.raises(ValueError, match="ok_base"):
        paired_interval(ok, 1.0, none, 1.0)
