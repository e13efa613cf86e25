"""kvdro.experiments.headroom: the work count behind the bound, the bound against the oracle, the
length predictors of the scheduling study, and the cached map (checked on every cell)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.experiments import headroom as h
from kvdro.sim import Deployment, simulate


def _closed_batch(rng, n=120):
    """A closed batch (everything queued at t = 0) whose long outputs overflow one small TP2 group."""
    return pd.DataFrame({"arrival_s": np.zeros(n), "input_tokens": rng.integers(50, 400, n),
                         "output_tokens": rng.integers(200, 1500, n), "request_class": "c"})


@pytest.fixture
def tight():
    """One TP2-PP1 group (37,744 KV tokens): 64 sequences of ~1,100 tokens overflow it, so vLLM preempts."""
    return Deployment(groups=("TP2-PP1",), max_num_seqs=64)


def test_vllm_feeds_exactly_the_work_plus_its_recompute_and_the_oracle_the_work(rng, tight):
    trace = _closed_batch(rng)
    v = simulate(trace, policy="vllm", deployment=tight, rng=np.random.default_rng(0))
    o = simulate(trace, policy="oracle", deployment=tight, rng=np.random.default_rng(0))
    sv, so = h.run_stats(v), h.run_stats(o)
    assert v.metrics["preemptions"] > 0 and o.metrics["preemptions"] == 0 and so["recomputed"] == 0
    assert sv["work_tokens"] == so["work_tokens"] == int((trace["input_tokens"] + trace["output_tokens"] - 1).sum())
    b = h.admission_gain_bound(sv, so)
    assert b["bound"] == pytest.approx(sv["recomputed"] / sv["work_tokens"]) and b["bound"] > 0
    # the identity behind the theorem: busy_v / busy_o = (c_v / c_o)(1 + R / W) for a policy that never preempts
    assert 1 + b["service_gain"] == pytest.approx((1 + b["bound"]) / b["cost_ratio"], rel=1e-12)
    # the theorem: under (A) the gain is at most R / W; where (A) fails the inequality must fail too
    assert (b["service_gain"] <= b["bound"] + 1e-12) == b["assumption_holds"]
    # a closed batch is saturated: the completion rate is bounded too (the slowest engine's makespan)
    thr = (o.metrics["completed"] / so["horizon_s"]) / (v.metrics["completed"] / sv["horizon_s"]) - 1
    if b["assumption_holds"]:
        assert thr <= b["engine_bound"] + 1e-9


def test_bound_is_zero_where_vllm_never_preempts_and_rejects_bad_input(rng):
    trace = _closed_batch(rng, 20).assign(output_tokens=lambda d: d["output_tokens"] // 10)
    v = simulate(trace, policy="vllm", deployment=Deployment(groups=("TP4-PP1",)), rng=np.random.default_rng(0))
    s = h.run_stats(v)
    assert v.metrics["preemptions"] == 0 and h.admission_gain_bound(s)["bound"] == 0.0
    with pytest.raises(ValueError, match="vllm"):
        h.admission_gain_bound({"work_tokens": 1})
    with pytest.raises(ValueError, match="vllm"):
        h.admission_gain_bound({**s, "work_tokens": 0})


def test_length_predictions_by_class_and_by_prompt_bin():
    train = pd.DataFrame({"input_tokens": [10, 20, 30, 40, 100, 200, 300, 400], "output_tokens": [1, 2, 3, 4, 50, 60, 70, 80],
                          "request_class": ["a"] * 4 + ["b"] * 4})
    test = pd.DataFrame({"input_tokens": [15, 35, 150, 1000], "output_tokens": [0, 0, 0, 0], "request_class": ["a", "a", "b", "b"]})
    assert h.length_predictions(train, test, "class").tolist() == [2.5, 2.5, 65.0, 65.0]
    by_bin = h.length_predictions(train, test, "prompt-bins", n_bins=2)
    # the edge is the lower median prompt (inverted CDF: 20 and 200), a bin holds prompts >= its edge
    assert by_bin.tolist() == [1.0, 3.0, 50.0, 70.0]
    with pytest.raises(ValueError, match="how"):
        h.length_predictions(train, test, "oracle")


def test_check_bound_flags_a_gain_above_the_bound():
    row = {"workload": "w", "deployment": "d", "load": 1.0, "stable": False, "saturated": True, "memory_bound": True,
           "preemptions": 10, "bound": 0.02, "engine_bound": 0.03, "oracle_service_gain": 0.01, "oracle_cost_ratio": 1.01,
           "oracle_throughput_gain": 0.025, "oracle_goodput_gain": 0.2, "oracle_goodput_gain_lo": 0.1, "oracle_goodput_gain_hi": 0.3}
    bad = dict(row, load=1.2, oracle_service_gain=0.05, oracle_cost_ratio=0.97, oracle_throughput_gain=0.05)
    chk = h.check_bound(pd.DataFrame([row, bad]))
    assert chk["service_ok"].tolist() == [True, False] and chk["throughput_ok"].tolist() == [True, False]
    assert chk["goodput_ok"].tolist() == [False, False]  # goodput is not what the theorem bounds


def test_cached_map_is_complete_classified_and_the_bound_checked_on_every_cell():
    from kvdro.sim.studies import DATA_DIR

    path = DATA_DIR / "headroom.csv"
    if not path.is_file():
        pytest.skip("no cached headroom map: run `python -m kvdro.bench headroom`")
    f = pd.read_csv(path)
    assert len(f) == len(h.WORKLOADS) * len(h.DEPLOYMENTS) * len(h.LOADS)
    assert set(f["workload"]) == set(h.WORKLOADS) and f["stable"].dtype == bool
    assert (f["oracle_preemptions"] == 0).all()  # the oracle never preempts, on any cell
    assert ((f["recompute_share"] >= 0) & (f["recompute_share"] < 1)).all()
    for arm in ("oracle", "best", "dro", "exact"):
        assert (f[f"{arm}_goodput_gain_lo"] <= f[f"{arm}_goodput_gain"] + 1e-12).all()
        assert (f[f"{arm}_goodput_gain"] <= f[f"{arm}_goodput_gain_hi"] + 1e-12).all()
    chk = pd.read_csv(DATA_DIR / "headroom_bound.csv")
    # the cache says what the check says (recomputed from the map's own columns)
    again = h.check_bound(f)
    assert chk["service_ok"].tolist() == again["service_ok"].tolist() and chk["goodput_ok"].tolist() == again["goodput_ok"].tolist()
    # where assumption (A) holds, the service-rate bound holds: the theorem on every cell
    holds = f["oracle_cost_ratio"] >= 1 - 1e-12
    assert (f.loc[holds, "oracle_service_gain"] <= f.loc[holds, "bound"] + 1e-9).all()


def test_tidy_has_one_row_per_cell_and_policy():
    f = pd.DataFrame([{"workload": "w", "deployment": "d", "load": 0.5, "stable": True, "memory_bound": False, "regime": "light",
                       "preemptions": 0, "recompute_share": 0.0, "bound": 0.0, "engine_bound": 0.0, "goodput_rps": 1.0,
                       "slo_violation": 0.1,
                       **{f"{a}_{m}_gain{s}": v for a in ("oracle", "exact", "best", "dro") for m in ("goodput", "slo", "ttft_p99")
                          for s, v in (("", 0.1), ("_lo", 0.0), ("_hi", 0.2))}}])
    t = h.tidy(f)
    assert len(t) == 4 and set(t["policy"]) == {"oracle", "exact", "best soft", "dro"}
    assert (t["goodput_gain"] == 0.1).all() and (t["ttft_p99_hi"] == 0.2).all()
    with pytest.raises(FileNotFoundError, match="bench headroom"):
        h.load_headroom("/nonexistent/headroom.csv")


def test_pooled_gain_is_the_ratio_of_pooled_counts_and_widens_when_draws_disagree(rng):
    base = rng.integers(20, 40, size=(8, 30)).astype(float)
    same = h.pooled_gain(base, 1.1 * base)
    assert same.point == pytest.approx(0.1) and same.lo == pytest.approx(0.1) and same.hi == pytest.approx(0.1)
    # half the draws gain 30 %, half lose 10 %: pooled +10 % again, but the draw-to-draw spread shows in the interval
    mixed = np.concatenate([1.3 * base[:4], 0.9 * base[4:]])
    iv = h.pooled_gain(base, mixed)
    assert iv.point == pytest.approx(mixed.sum() / base.sum() - 1)
    assert iv.lo < iv.point < iv.hi and iv.hi - iv.lo > 0.05
    with pytest.raises(ValueError, match="base, arm"):
        h.pooled_gain(base, base[:, :5])
    with pytest.raises(ValueError, match="base, arm"):
        h.pooled_gain(base[:1], base[:1])


def test_headroom_seeds_redraws_the_routing_only_and_summarises_the_draws(data_dir):
    cell = ("conversation", "4 x TP2-PP1", 0.4)
    f = h.headroom_seeds([cell], seeds=(0, 1), progress=False, cache=False)
    per, summ = f[f["kind"] == "seed"], f[f["kind"] == "summary"].set_index("policy")
    assert len(per) == 2 * len(h.SEED_ARMS) and len(summ) == len(h.SEED_ARMS)
    # routing seed 0 is the map's own draw: the same run as headroom_cell with seed 0
    ref = h.headroom_cell(workload=cell[0], deployment=cell[1], load=cell[2], seed=0, blocks=True)
    again = h.headroom_cell(workload=cell[0], deployment=cell[1], load=cell[2], seed=0, routing_seed=1, blocks=True)
    for arm in h.SEED_ARMS:
        row0 = per[(per["policy"] == arm) & (per["routing_seed"] == 0)].iloc[0]
        assert row0["gain"] == pytest.approx(ref[f"{arm}_goodput_gain"]) and row0["lo"] == pytest.approx(ref[f"{arm}_goodput_gain_lo"])
        s = summ.loc[arm]
        assert s["gain_min"] <= s["gain_median"] <= s["gain_max"] and s["n_seeds"] == 2
        assert s["lo"] <= s["gain"] <= s["hi"]
        pooled = h.pooled_gain(np.stack([h.unc.decode(ref["vllm_good_blocks"]), h.unc.decode(again["vllm_good_blocks"])]),
                               np.stack([h.unc.decode(ref[f"{arm}_good_blocks"]), h.unc.decode(again[f"{arm}_good_blocks"])]))
        assert s["gain"] == pytest.approx(pooled.point) and s["hi"] == pytest.approx(pooled.hi)
    # the same arrivals under another routing draw: the same requests, a different vLLM run
    assert ref["requests"] == again["requests"] and ref["preemptions"] != again["preemptions"]
    with pytest.raises(ValueError, match="seeds"):
        h.headroom_seeds([cell], seeds=(3, 3), progress=False, cache=False)
    with pytest.raises(ValueError, match="routing_seed"):
        h.headroom_cell(workload=cell[0], deployment=cell[1], load=cell[2], routing_seed=-1)
    with pytest.raises(ValueError, match="cells"):
        h.headroom_seeds([("nope", "4 x TP2-PP1", 0.4)], seeds=(0, 1), progress=False, cache=False)


def test_seed_counts_separates_cells_that_count_under_every_draw_from_some():
    rows = [{"kind": "seed", "workload": "w", "deployment": "d", "load": x, "policy": "oracle", "routing_seed": r,
             "counts": c, "stable": st} for x, r, c, st in
            [(0.9, 0, True, True), (0.9, 1, True, False), (1.0, 0, True, False), (1.0, 1, False, False), (1.2, 0, False, False),
             (1.2, 1, False, False)]]
    c = h.seed_counts(pd.DataFrame(rows))
    assert (c["all"], c["some"], c["none"]) == (1, 1, 1) and c["per_draw"].tolist() == [2, 1]
    st = h.seed_counts(pd.DataFrame(rows), stable=True)
    assert (st["all"], st["some"], st["none"]) == (0, 1, 2)


def test_cached_seed_study_agrees_with_the_map_under_the_maps_draw():
    from kvdro.sim.studies import DATA_DIR

    if not (DATA_DIR / "headroom_seeds.csv").is_file():
        pytest.skip("no cached seed study: run `python -m kvdro.bench headroom --parts seeds`")
    s, f = h.load_seeds(), h.load_headroom()
    cells = h.seed_cells(f)
    summ = s[s["kind"] == "summary"]
    assert len(summ) == len(cells) * len(h.SEED_ARMS)
    big = h.summary(f)["cells_with_5pct"]
    assert all(any(r.workload == w and r.deployment == d and np.isclose(r.load, x) for w, d, x in cells) for r in big.itertuples())
    zero = s[(s["kind"] == "seed") & (s["routing_seed"] == 0)]
    for r in zero.itertuples():
        m = f[(f["workload"] == r.workload) & (f["deployment"] == r.deployment) & np.isclose(f["load"], r.load)].iloc[0]
        assert np.isclose(r.gain, m[f"{r.policy}_goodput_gain"], rtol=1e-4, atol=1e-9)
        assert bool(r.stable) == bool(m["stable"])
