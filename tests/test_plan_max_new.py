"""A plan carries ``max_new`` into the engine it is served on (issue 32, item 1: plans and sweeps)."""

import numpy as np
import pytest

from kvdro.joint.paper import paper_trace
from kvdro.sim.plan import simulate_solution


def test_plan_with_a_client_cap_caps_exactly_the_longer_requests(small_exact, data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    instance, solution = small_exact
    trace = paper_trace("small", 0, load=1.0, part="test").head(3000)
    cap = 200
    base = simulate_solution(instance, solution, trace)
    capped = simulate_solution(instance, solution, trace, max_new=cap)
    longer = int((trace["output_tokens"].to_numpy() > cap).sum())
    assert 0 < longer < len(trace)  # the cap bites on some requests, not all
    assert base.max_new == "unset" and capped.max_new == cap
    q = capped.requests
    assert capped.metrics["capped"] == longer == int((q["outcome"] == "capped").sum())
    assert np.all(q.loc[q["outcome"] == "capped", "generated_tokens"] == cap)
    # capped requests are not served: they count neither as completed nor toward goodput
    assert capped.metrics["completed"] == base.metrics["completed"] - longer


def test_plan_on_a_reserving_engine_needs_the_plans_estimate(small_exact, data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    instance, solution = small_exact
    trace = paper_trace("small", 0, load=1.0, part="test").head(200)
    with pytest.raises(ValueError, match="max_new"):
        simulate_solution(instance, solution, trace, engine="trtllm-gne")
