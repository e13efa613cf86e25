"""The busy-time decomposition across the atlas's cells (issue 34, item 3): one ratio function, shared."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.experiments import atlas
from kvdro.experiments.decomposition import ratios


def _identity_error(dec: pd.DataFrame) -> float:
    return float(np.max(np.abs(dec["busy_ratio"] - dec["cost_ratio"] * dec["tokens_ratio"])))


def test_identity_on_the_cached_atlas():
    runs = atlas.read()
    dec = atlas.decomposition(runs)
    assert len(dec) == runs["cell"].nunique() * len(atlas.ENGINES)  # every engine has a default and a true arm
    assert _identity_error(dec) < 1e-9
    # where admission never reads max_new, the true-length arm is the default's run, measured
    assert dec.loc[~dec["reads_max_new"], "same_run"].all()
    assert np.allclose(dec.loc[dec["same_run"], ["busy_ratio", "tokens_ratio", "cost_ratio"]], 1.0)
    # the ratios are those of the cached columns (K = W + R)
    d = runs[runs["arm"] == "default"].set_index(["cell", "engine"])
    t = runs[runs["arm"] == "true"].set_index(["cell", "engine"])
    assert (d["tokens_fed"] == d["work_tokens"] + d["recomputed_tokens"]).all()
    row = dec.iloc[-1]
    key = (row["cell"], row["engine"])
    assert row["busy_ratio"] == pytest.approx(d.loc[key, "busy_s"] / t.loc[key, "busy_s"], rel=1e-12)
    assert row["tokens_ratio"] == pytest.approx(d.loc[key, "tokens_fed"] / t.loc[key, "tokens_fed"], rel=1e-12)


def test_identity_on_a_fresh_run_and_its_columns_are_run_stats():
    from kvdro.experiments.headroom import run_stats
    from kvdro.sim import simulate

    cell = atlas.cells(["conversation"], "primary")[0]
    rows = [atlas.run_arm(cell, e, a, quick_requests=60) for e in ("vllm-v1", "trtllm-gne") for a in ("default", "true")]
    dec = atlas.decomposition(pd.DataFrame(rows)).set_index("engine")
    assert _identity_error(dec.reset_index()) < 1e-9
    assert dec.loc["vllm-v1", "same_run"] and dec.loc["vllm-v1", "busy_ratio"] == 1.0
    # TRT-LLM's default reserves the whole window: the same tokens, more busy time per token
    assert not dec.loc["trtllm-gne", "same_run"] and dec.loc["trtllm-gne", "cost_ratio"] > 1
    # the recorded columns are run_stats of the same simulation
    test, _, dep = atlas.cell_inputs(cell, 60)
    r = simulate(test, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine="trtllm-gne", max_new="unset")
    s = run_stats(r)
    assert rows[2]["busy_s"] == pytest.approx(s["busy_s"], rel=1e-12)
    assert rows[2]["tokens_fed"] == s["work_tokens"] + s["recomputed"]


def test_bad_names_are_refused():
    runs = atlas.read(["sharegpt"])
    with pytest.raises(ValueError, match="engines"):
        atlas.decomposition(runs, engines=("vllm-v2",))
    with pytest.raises(ValueError, match="cells"):
        atlas.decomposition(runs, cells=("sharegpt a100 4 x TP2-PP1 @ 99",))
    with pytest.raises(ValueError, match="runs"):
        atlas.decomposition(runs.drop(columns=["busy_s"]))
    one = atlas.decomposition(runs, cells=runs["cell"].iloc[0], engines="lightllm")
    assert list(one["engine"]) == ["lightllm"]


def test_the_ratio_function_is_shared_and_checks_its_input():
    import kvdro.bench.presets_table as pt

    assert "ratios(" in __import__("inspect").getsource(pt.decomposition)
    r = ratios(6.0, 100, 2.0, 50)
    assert r["busy_ratio"] == 3.0 and r["tokens_ratio"] == 2.0 and r["cost_ratio"] == 1.5
    with pytest.raises(ValueError, match="tokens_t"):
        ratios(1.0, 1, 1.0, 0)
    with pytest.raises(ValueError, match="busy_d_s"):
        ratios(np.array([1.0, np.nan]), 1, 1.0, 1)
