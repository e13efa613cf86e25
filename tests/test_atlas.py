"""The atlas (issue 34, items 1-2): cells by rule, arms, capped requests, the lower bound, reruns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.bench import atlas as bench
from kvdro.experiments import atlas

ENGINES = ("vllm-v0", "vllm-v1", "trtllm-gne")
QUICK = 40


def _sweep(out, **kw):
    args = dict(workloads=["conversation"], engines=ENGINES, quick=QUICK, points="primary", out_dir=out, n_jobs=1,
                verbose=False)
    return bench.run_family("conversation", **(args | kw))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("atlas")
    table, value, _ = _sweep(out)
    return out, table, value


def test_arms_per_engine():
    names = {e: [a.name for a in atlas.arms_for(e)] for e in atlas.ENGINES}
    for e, arms in names.items():
        for a in ("default", "client-cap", "saa", "dro", "p90", "p95", "p99", "true"):
            assert a in arms, (e, a)
        assert ("dro-soft" in arms) == (e in ("vllm-v0", "sglang", "lightllm"))
        for a in ("look-ahead", "sof-true", "look-ahead+sof", "sof-predicted"):
            assert (a in arms) == (e == "vllm-v0"), (e, a)
        assert "oracle" not in arms  # the look-ahead is named for what it is
    assert set(atlas.TRUE_LENGTH_ARMS) == {"true", "look-ahead", "sof-true", "look-ahead+sof"}
    assert "sof-predicted" in atlas.ESTIMATE_ARMS and "sof-predicted" not in atlas.TRUE_LENGTH_ARMS


def test_pick_point_rules():
    rows = pd.DataFrame({"stable": [True, True, True, False], "memory_bound": [False, True, True, True],
                         "slo_violation": [0.0, 0.5, 0.3, 0.1], "kv_mean": [0.2, 0.7, 0.8, 0.9], "load": [1, 2, 3, 4]})
    row, rule = atlas.pick_point(rows)
    assert rule == atlas.RULE_MEMORY and row["load"] == 3
    row, rule = atlas.pick_point(rows.assign(memory_bound=False))
    assert rule == atlas.RULE_EDGE and row["load"] == 3  # the stable cell with the highest KV use
    with pytest.raises(ValueError, match="rows"):
        atlas.pick_point(rows.assign(stable=False))


def test_cells_follow_the_named_primary_point():
    cl = atlas.cells()
    assert {c.family for c in cl} == set(atlas.FAMILIES)
    assert all(c.rule in (atlas.RULE_MEMORY, atlas.RULE_EDGE, atlas.RULE_RANGE) for c in cl)
    assert all(c.rule in (atlas.RULE_MEMORY, atlas.RULE_EDGE) for c in atlas.cells(points="primary"))
    conv = next(c for c in cl if c.workload == "conversation" and c.rule != atlas.RULE_RANGE)
    from kvdro.sim.regimes import NAMED_POINTS

    _, dep, load = NAMED_POINTS["memory"]
    assert (conv.deployment, conv.load, conv.rule) == (dep, load, atlas.RULE_MEMORY)
    assert len({c.key for c in cl}) == len(cl)
    # around the primary point: every stable load of its deployment from the highest light one up
    loads = [c.load for c in cl if c.workload == "conversation"]
    assert loads == sorted(loads) and 0.7 in loads and all(c.deployment == dep for c in cl if c.workload == "conversation")
    assert [c.load for c in atlas.cells(["conversation"], "primary") if c.workload == "conversation"] == [0.7]
    with pytest.raises(ValueError, match="points"):
        atlas.cells(points="some")


def test_every_arm_runs_and_is_labelled_reduced(sweep):
    _, table, value = sweep
    for e in ENGINES:
        assert set(table.loc[table["engine"] == e, "arm"]) == {a.name for a in atlas.arms_for(e)}
    assert table["sweep"].str.startswith("REDUCED").all() and value["sweep"].str.startswith("REDUCED").all()
    assert (table["requests"] == QUICK).all()
    d = table[table["arm"] == "default"]
    assert np.allclose(d["vs_default_pct"], 0.0)
    v1 = table[(table["engine"] == "vllm-v1") & (table["arm"] == "default")]
    assert np.allclose(v1["vs_v1_pct"], 0.0)


def test_capped_requests_are_not_served(sweep):
    _, table, _ = sweep
    t = table.assign(rejected=0)
    assert (t["completed"] + t["truncated"] + t["capped"] + t["ignored"] == t["requests"]).all()
    assert (t["served_in_deadline"] <= t["completed"] + t["truncated"]).all()
    capped = t[t["capped"] > 0]
    assert len(capped) > 0  # the estimates as caps cut some requests short on this slice
    assert (capped["served_in_deadline"] <= capped["requests"] - capped["capped"]).all()


def test_lower_bound_is_best_true_arm_minus_default(sweep):
    _, table, value = sweep
    for _, v in value.iterrows():
        part = table[(table["cell"] == v["cell"]) & (table["engine"] == v["engine"])].set_index("arm")
        true = part.loc[[a for a in atlas.TRUE_LENGTH_ARMS if a in part.index], "served_in_deadline"]
        lb = (true.max() - part.loc["default", "served_in_deadline"]) / part.loc["default", "span_s"]
        assert v["length_value_lower_bound_rps"] == pytest.approx(lb, abs=1e-6)
        assert v["best_true_served"] == true.max() and v["best_true_arm"] in true.index
        if lb > 0:
            dro = (part.loc["dro", "served_in_deadline"] - part.loc["default", "served_in_deadline"]) / (
                true.max() - part.loc["default", "served_in_deadline"])
            assert v["recovered_dro"] == pytest.approx(dro, abs=1e-6)
        else:
            assert np.isnan(v["recovered_dro"])


def test_rerun_and_resume_are_byte_identical(sweep, tmp_path, monkeypatch):
    out, _, _ = sweep
    files = ("atlas_reduced_conversation.csv", "atlas_value_reduced_conversation.csv")
    again = tmp_path / "again"
    _sweep(again)
    for f in files:
        assert (again / f).read_bytes() == (out / f).read_bytes(), f
    # interrupted after a few runs, then resumed: the same bytes
    real, calls = bench.run_one, []

    def dies(*a):
        calls.append(a)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return real(*a)

    cut = tmp_path / "cut"
    monkeypatch.setattr(bench, "run_one", dies)
    with pytest.raises(KeyboardInterrupt):
        _sweep(cut)
    assert (cut / "atlas_reduced_conversation.partial.csv").is_file() and not (cut / files[0]).exists()
    monkeypatch.setattr(bench, "run_one", real)
    _sweep(cut)
    for f in files:
        assert (cut / f).read_bytes() == (out / f).read_bytes(), f
    assert not (cut / "atlas_reduced_conversation.partial.csv").exists()


@pytest.mark.parametrize("kw, name", [
    ({"family": "nope"}, "families"),
    ({"engines": ["vllm-v9"]}, "engines"),
    ({"workloads": ["r1"]}, "workloads"),
    ({"n_jobs": 0}, "n_jobs"),
    ({"backend": "spark"}, "backend"),
    ({"quick": 1}, "quick"),
])
def test_bad_input_names_the_argument(kw, name, tmp_path):
    args = dict(family="conversation", workloads=["conversation"], engines=ENGINES, quick=QUICK, points="primary",
                out_dir=tmp_path, n_jobs=1, verbose=False) | kw
    with pytest.raises(ValueError, match=name):
        bench.run_family(args.pop("family"), **args)


def test_reduced_sweep_refused_in_data():
    with pytest.raises(ValueError, match="out_dir"):
        bench.run_family("conversation", quick=QUICK, out_dir=bench.DATA, verbose=False)
    with pytest.raises(ValueError, match="arm"):
        atlas.run_arm(atlas.cells(["conversation"], "primary")[0], "vllm-v1", "look-ahead", quick_requests=QUICK)


def test_readers_verdict_and_value(sweep):
    _, table, value = sweep
    primary = atlas.cells(["conversation"], "primary")[:1]
    v = atlas.verdict(table, primary)
    assert list(v["engine"]) == list(ENGINES) and set(v["cell"]) == {primary[0].key}
    assert (v.set_index("engine").loc[["vllm-v1", "trtllm-gne"], ["dro-soft", "look-ahead", "sof-true"]] == "—").all().all()
    idx = table.set_index(["cell", "engine", "arm"])
    for _, r in v.iterrows():
        src = idx.loc[(r["cell"], r["engine"], "dro")]
        assert r["dro"] == atlas.change_text(src)
        lo, hi = ((src["vs_default_diff_lo"], src["vs_default_diff_hi"]) if src["vs_default_base_near_zero"]
                  else (src["vs_default_lo"], src["vs_default_hi"]))
        assert r["sign_dro"] == (1 if lo > 0 else -1 if hi < 0 else 0)
    said = atlas.verdict_sentences(v)
    assert set(said) == set(atlas.ENGINE_FAMILIES) and "`vllm-v0`" in said["vLLM"]
    s = atlas.value_summary(table, value, primary)
    m = s.merge(value, on=["cell", "engine"]).merge(table[table["arm"] == "default"][["cell", "engine", "requests"]])
    np.testing.assert_allclose(m["bound_pts"], 100 * (m["best_true_served"] - m["default_served"]) / m["requests"],
                               atol=0.02)  # the csv's rounding of req/s
    assert (s.loc[s["engine"].isin(atlas.MAX_NEW_UNREAD), "bound_pts"] == 0).all()
    with pytest.raises(ValueError, match="frame"):
        atlas.verdict(table.iloc[:0], primary)
    with pytest.raises(ValueError, match="value"):
        atlas.value_summary(table[table["engine"] != "vllm-v0"], value, primary)


def test_cached_atlas_size_and_unread_max_new():
    runs, value = atlas.read(), atlas.read(value=True)
    n_arms = sum(len(atlas.arms_for(e)) for e in atlas.ENGINES)
    assert atlas.size(runs) == {"cells": len(atlas.cells()), "runs": len(atlas.cells()) * n_arms, "arms_per_cell": n_arms}
    s = atlas.value_summary(runs, value)
    assert (s.loc[s["by_construction"], "bound_pts"] == 0).all() and (s["bound_pts"] >= 0).all()
