"""Routing draws near thresholds (issue 34, item 1): the rule, the rerun's reader, bad arguments."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.bench import atlas_draws as bench
from kvdro.experiments import atlas
from kvdro.experiments import atlas_draws as ad

KEY = "toy a100 4 x TP2-PP1 @ 1"


def _verdict(engine, arm, lo, hi):
    """A row of atlas.compare with the difference's interval [lo, hi] (req/s) and a ratio's of the same signs."""
    return {"cell": KEY, "engine": engine, "arm": arm, "vs_default_lo": 10 * lo, "vs_default_hi": 10 * hi,
            "vs_default_diff_lo": lo, "vs_default_diff_hi": hi, "vs_default_base_near_zero": False}


FRAME = pd.DataFrame([
    _verdict("sglang", "dro", 0.1, 2.0),         # beats, zero 0.1 from its lower end, half-width 0.95: near
    _verdict("sglang", "dro-soft", 5.0, 7.0),    # beats, zero 5 half-widths away: far
    _verdict("lightllm", "dro", -3.0, 1.0),      # within noise: near
    _verdict("trtllm-gne", "dro", -9.0, -1.5),   # loses, 1.5 of a half-width 3.75: near
    _verdict("trtllm-gne", "true", -9.0, -8.0),  # loses, 17 half-widths away: far
    _verdict("sglang", "true", 0.0, 0.0),        # a tie in every block: at the threshold
    _verdict("vllm-v0", "true", 0.0, 0.0),       # the default's run by construction: left out
    _verdict("sglang", "client-cap", 0.0, 1.0),  # not a verdict arm
])


def test_rule_selects_near_and_not_far():
    v = ad.near(FRAME, primary=[KEY]).set_index(["engine", "arm"])
    assert len(v) == 7  # client-cap is not a verdict
    assert list(v.index[v["selected"]]) == [("sglang", "dro"), ("sglang", "true"), ("trtllm-gne", "dro"),
                                             ("lightllm", "dro")]
    assert v.loc[("sglang", "dro"), "cls"] == 1 and v.loc[("trtllm-gne", "dro"), "cls"] == -1
    assert v.loc[("lightllm", "dro"), "cls"] == 0
    assert v.loc[("sglang", "dro"), "nearness"] == pytest.approx(0.1 / 0.95)
    assert v.loc[("sglang", "dro-soft"), "nearness"] == pytest.approx(5.0)
    assert "construction" in v.loc[("vllm-v0", "true"), "reason"] and not v.loc[("vllm-v0", "true"), "selected"]
    # the control band: far, but zero within two half-widths (none here: the far ones are 5 and 16 away)
    assert set(v["role"]) == {"near", ""} and (v["role"] == "near").equals(v["selected"])
    assert v.loc[("sglang", "dro-soft"), "role"] == ""
    # the margin is the rule: at 0 half-widths only the tie is near, at 20 every verdict but the one left out
    assert ad.near(FRAME, primary=[KEY], margin=0)["selected"].sum() == 1
    assert ad.near(FRAME, primary=[KEY], margin=20)["selected"].sum() == 6


def test_rule_on_the_cached_atlas_and_its_calibration():
    v = ad.near(atlas.read())
    assert len(v) == len(atlas.cells(points="primary")) * sum(
        len([a for a in atlas.arms_for(e) if a.name in ad.ARMS]) for e in atlas.ENGINES)
    assert (v.loc[v["cls"] == 0, "selected"] | v.loc[v["cls"] == 0, "reason"].str.contains("construction")).all()
    assert 0 < v["selected"].sum() < len(v)
    cal = ad.calibration()
    assert cal["flips"] > 0 and cal["flip_nearness_max"] <= ad.NEAR_HALF_WIDTHS  # the margin covers every change seen


def test_reader_on_the_cached_rerun():
    runs, draws = atlas.read(), ad.read()
    st = ad.stability(draws, runs)  # raises if stale or if draw 0 is not the atlas's run
    sel = ad.near(runs)
    assert (st["role"] == "near").sum() == int(sel["selected"].sum())
    control = sel[sel["role"] == "control"]
    assert (control["nearness"] > ad.NEAR_HALF_WIDTHS).all() and (control["nearness"] <= ad.CONTROL_HALF_WIDTHS).all()
    assert (st["role"] == "control").sum() == len(control)
    assert (st["draws"] == len(ad.DRAWS)).all()
    assert sorted(draws["draw"].unique()) == list(ad.DRAWS)
    assert (st["point_min"] <= st["point_max"]).all()
    ok = draws["vs_default_lo"].notna()
    assert ok.all()
    for lo, mid, hi in (("lo", "pct", "hi"), ("diff_lo", "diff_rps", "diff_hi")):
        a, b, c = (draws[f"vs_default_{x}"].to_numpy() for x in (lo, mid, hi))
        assert (a <= b + 1e-9).all() and (b <= c + 1e-9).all(), lo
    base = draws[draws["arm"] == "default"]
    assert (base["vs_default_pct"] == 0).all() and (base["cls"] == 0).all()
    near = st[st["role"] == "near"]
    assert near["holds"].sum() == len(near) - len(ad.changes(st))
    assert sum(int(t.split()[0]) for t in ad.engine_counts(st).values()) == near["holds"].sum()
    assert sum(int(t.split()[2]) for t in ad.engine_counts(st, "control").values()) == len(control)


def test_run_passes_the_draw_as_the_routing_seed(monkeypatch):
    seen = []
    monkeypatch.setattr(atlas, "run_arm", lambda *a, routing_seed, **kw: seen.append(routing_seed) or {"cell": a[0]})
    assert ad.run("c", "vllm-v1", "dro", 3) == {"draw": 3, "cell": "c"}
    assert seen == [3]


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="frame"):
        ad.near(FRAME.drop(columns=["vs_default_diff_lo"]), primary=[KEY])
    with pytest.raises(ValueError, match="margin"):
        ad.near(FRAME, primary=[KEY], margin=-1)
    with pytest.raises(ValueError, match="routing_seed"):
        atlas.run_arm(atlas.cells(points="primary")[0], "vllm-v1", "default", routing_seed=-1)
    with pytest.raises(ValueError, match="draws"):
        ad.tasks(ad.near(atlas.read()), draws=(1, 2))
    with pytest.raises(ValueError, match="k"):
        bench.run_draws(out_dir=tmp_path, k=0, verbose=False)
    with pytest.raises(ValueError, match="k"):
        bench.run_draws(out_dir=ad.DATA, k=len(ad.DRAWS), verbose=False)
    with pytest.raises(ValueError, match="role"):
        ad.changes(pd.DataFrame(columns=["cell", "engine", "arm", "role", "cls", "classes", "holds", "point_min",
                                         "point_max", "unit"]), role="far")
    with pytest.raises(ValueError, match="n_jobs"):
        bench.run_draws(out_dir=tmp_path, n_jobs=0, verbose=False)
