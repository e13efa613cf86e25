"""kvdro.experiments: the sweep runner (cache, processes, Dask), traces, analytic parts, verdicts, CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvdro import newsvendor
from kvdro.experiments import analytic, cache, paper, runner, verdicts
from kvdro.experiments import uncertainty as unc
from kvdro.experiments import traces as tr

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ runner
def square(x: int, log: str | None = None) -> dict:
    """A sweep cell for the tests; appends to ``log`` so a test can count real calls."""
    if log:
        with open(log, "a") as f:
            f.write(f"{x}\n")
    return {"y": x * x, "pid": os.getpid()}


def on_worker(x: int) -> dict:
    """Reports whether it runs inside a Dask worker."""
    try:
        from distributed import get_worker

        get_worker()
        where = "dask"
    except (ImportError, ValueError):
        where = "local"
    return {"y": x + 1, "where": where}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_run_sweep_rows_in_cell_order(cache_dir):
    df = runner.run_sweep(square, [{"x": x} for x in (3, 1, 2)], progress=False)
    assert df["x"].tolist() == [3, 1, 2] and df["y"].tolist() == [9, 1, 4]


def test_cache_hit_recomputes_nothing_and_code_change_recomputes(cache_dir, tmp_path, monkeypatch):
    log = tmp_path / "calls.txt"
    cells = [{"x": x, "log": str(log)} for x in range(4)]
    first = runner.run_sweep(square, cells, progress=False)
    assert log.read_text().split() == ["0", "1", "2", "3"]
    second = runner.run_sweep(square, cells, progress=False)
    assert log.read_text().split() == ["0", "1", "2", "3"]  # all four read from the cache
    pd.testing.assert_frame_equal(first, second)
    assert any(cache_dir.rglob("*.pkl")), "results must be on disk under the cache folder"
    monkeypatch.setattr(runner, "code_fingerprint", lambda: "changed-code")
    runner.run_sweep(square, cells, progress=False)
    assert len(log.read_text().split()) == 8  # a new fingerprint is a new key


def test_cache_off_always_computes(cache_dir, tmp_path):
    log = tmp_path / "calls.txt"
    cells = [{"x": 1, "log": str(log)}]
    runner.run_sweep(square, cells, progress=False, cache=False)
    runner.run_sweep(square, cells, progress=False, cache=False)
    assert log.read_text().split() == ["1", "1"]


def test_processes_give_the_same_rows(cache_dir):
    cells = [{"x": x} for x in range(6)]
    serial = runner.run_sweep(square, cells, n_jobs=1, cache=False, progress=False)
    parallel = runner.run_sweep(square, cells, n_jobs=2, cache=False, progress=False)
    assert parallel["y"].tolist() == serial["y"].tolist()
    assert set(parallel["pid"]) != {os.getpid()}  # really ran in worker processes


def test_dask_backend_runs_the_same_sweep_on_a_cluster(cache_dir):
    """The documented recipe: a distributed Client + joblib.parallel_config(backend="dask")."""
    joblib = pytest.importorskip("joblib")
    distributed = pytest.importorskip("distributed")
    cells = [{"x": x} for x in range(5)]
    local = runner.run_sweep(on_worker, cells, cache=False, progress=False)
    assert set(local["where"]) == {"local"}
    with distributed.Client(processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None, n_workers=1, threads_per_worker=2):
        with joblib.parallel_config(backend="dask"):
            remote = runner.run_sweep(on_worker, cells, cache=False, progress=False)
    assert set(remote["where"]) == {"dask"}
    assert remote["y"].tolist() == local["y"].tolist()


@pytest.mark.parametrize(
    "cells, match",
    [
        ({"x": 1}, "cells"),
        ([1, 2], r"cells\[0\]"),
        ([{"x": [1, 2]}], "scalar"),
        ([{"x": float("nan")}], "not finite"),
    ],
)
def test_run_sweep_rejects_bad_cells(cells, match, cache_dir):
    with pytest.raises(ValueError, match=match):
        runner.run_sweep(square, cells, progress=False)


def test_run_sweep_rejects_bad_n_jobs(cache_dir):
    with pytest.raises(ValueError, match="n_jobs"):
        runner.run_sweep(square, [{"x": 1}], n_jobs=0, progress=False)


def test_cache_dir_defaults_to_the_build_folder(monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    assert cache.cache_dir() == ROOT / "_build" / "kvdro-cache"


# ------------------------------------------------------------------------------------------ traces
def _toy(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "arrival_s": np.sort(rng.uniform(0, 100, n)),
            "input_tokens": rng.integers(1, 500, n),
            "output_tokens": rng.integers(1, 300, n),
            "request_class": pd.Series(np.where(rng.random(n) < 0.5, "a", "b"), dtype=object),
        }
    )


def test_train_test_is_a_cut_in_time():
    df = _toy()
    parts = tr.train_test(df, 0.4)
    assert len(parts.train) + len(parts.test) == len(df)
    offset = parts.test.attrs["offset_s"]
    assert parts.train["arrival_s"].max() < offset  # every training request came earlier
    assert parts.test["arrival_s"].min() == 0.0
    pd.testing.assert_series_equal(
        (parts.test["arrival_s"] + offset).reset_index(drop=True),
        df["arrival_s"].iloc[len(parts.train):].reset_index(drop=True),
        check_names=False,
    )


@pytest.mark.parametrize("fraction", [0, 1, -0.5, 1.5])
def test_train_test_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="train_fraction"):
        tr.train_test(_toy(), fraction)


def test_scale_load_multiplies_the_rate():
    df = _toy()
    fast = tr.scale_load(df, 2.0)
    span = lambda d: d["arrival_s"].max() - d["arrival_s"].min()  # noqa: E731
    assert span(fast) == pytest.approx(span(df) / 2)
    assert fast["output_tokens"].equals(df["output_tokens"])
    with pytest.raises(ValueError, match="factor"):
        tr.scale_load(df, 0)


def test_drift_shifts_each_window_by_its_factor():
    df = _toy(600)
    d = tr.drift(df, 3.0, 5)
    assert d.attrs["shifts"] == [1.0, 1.5, 2.0, 2.5, 3.0]
    for w, s in enumerate(d.attrs["shifts"]):
        m = (d["window"] == w).to_numpy()
        expect = np.maximum(1, np.rint(s * df["output_tokens"].to_numpy()[m]))
        assert np.array_equal(d["output_tokens"].to_numpy()[m], expect)
    assert set(d["window"]) == set(range(5))
    with pytest.raises(ValueError, match="n_windows"):
        tr.drift(df, 2.0, 1)


def test_synthetic_twin_is_seeded_and_calibrated():
    a, b, c = tr.load("synthetic-conv", seed=0), tr.load("synthetic-conv", seed=0), tr.load("synthetic-conv", seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert not a["output_tokens"].equals(c["output_tokens"])
    assert set(a["request_class"]) == {"conversation"}
    # calibrated: the fitted conversation models have a mean output of ~211 tokens, ~5.5 req/s
    assert 180 < a["output_tokens"].mean() < 240
    assert 4.5 < len(a) / tr.TWIN_DURATION_S < 6.5


def test_unknown_trace_is_an_error():
    with pytest.raises(ValueError, match="name"):
        tr.load("sharegpt")


# ------------------------------------------------------------------------------------------ analytic
def test_rule_buffers_match_their_definitions(rng):
    x = rng.integers(1, 500, 400).astype(float)
    b = analytic.rule_buffers(x, 10.0, eps_fraction=0.0)
    assert b["saa"] == b["dro"]  # eps = 0: DRO is SAA
    assert b["saa"] == newsvendor.saa_reservation(x, 10.0, 1.0)
    assert b["max"] == x.max() and b["mean"] == pytest.approx(x.mean())
    assert b["p90"] == np.quantile(x, 0.9, method="inverted_cdf")


@pytest.mark.parametrize("rho", [2.0, 10.0, 100.0])
def test_bounded_cost_theorem(rho, rng):
    """Chapter 8's proposition: in-sample, SAA costs at most c_w (L_max - mean) and DRO at most that
    plus c_w eps, for every rho; a quantile rule with q < 1 below the max grows linearly in rho."""
    x = np.concatenate([rng.integers(1, 300, 500), [1000]]).astype(float)
    L, mean, eps = x.max(), x.mean(), 0.15 * x.mean()
    b = analytic.rule_buffers(x, rho)
    bound = L - mean
    assert newsvendor.expected_cost(x, b["saa"], rho, 1.0) <= bound + 1e-9
    assert newsvendor.expected_cost(x, b["dro"], rho, 1.0) <= bound + eps + 1e-9
    shortfall = np.mean(np.maximum(x - b["p90"], 0))
    assert newsvendor.expected_cost(x, b["p90"], rho, 1.0) >= rho * shortfall - 1e-9 > 0


@pytest.fixture
def real_traces(data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    tr._real.cache_clear()
    yield
    tr._real.cache_clear()


def test_table2_analytic_in_sample_saa_is_optimal(real_traces):
    t = analytic.table2_analytic(rhos=(2, 10, 100))
    for (trace, rho), g in t.groupby(["trace", "rho"]):
        saa = g.set_index("rule").cost_train["saa"]
        assert (g.cost_train >= saa - 1e-9).all(), (trace, rho)


def test_fig2b_tracks_q_star_exactly_where_dro_is_saa(real_traces):
    f = analytic.fig2b()
    saa = f[f.is_saa]
    # on the training data the SAA buffer is the lower q*-quantile: F(eta) >= q* > F(eta-)
    assert (saa.level_train >= saa.q_star - 1e-12).all()
    jumped = f[~f.is_saa]
    assert set(jumped.trace) == {"azure-2023-conv"}  # the code class never leaves SAA at 0.15 E[xi]
    assert (jumped.threshold < 0.15).all() and (f[f.is_saa].threshold >= 0.15 - 1e-12).all()


def test_eps_premium_below_threshold_is_exactly_cp_eps(real_traces):
    e = analytic.eps_premium(rhos=(10,))
    row = e[(e.trace == "azure-2023-code") & (e.eps_fraction == 0.15)].iloc[0]
    parts = tr.train_test(tr.load("azure-2023-code"))
    x = parts.train["output_tokens"].to_numpy(float)
    v = newsvendor.expected_cost(x, newsvendor.saa_reservation(x, 10, 1), 10, 1)
    assert abs(row.in_sample) <= 1e-12  # the DRO buffer is the SAA buffer: same training cost
    assert row.value == pytest.approx(10 * 0.15 * x.mean() / v, rel=1e-9)


# ------------------------------------------------------------------------------------------ paper + verdicts
def test_paper_table2_gains_match_the_printed_ranges():
    t = paper.table2()
    for _, r in t.iterrows():
        lo, hi = (int(v) for v in r.printed_gain.rstrip("%").split("-"))
        gains = sorted([round(100 * r.gain_vs_p90), round(100 * r.gain_vs_p95)])
        assert gains == [lo, hi], r.scenario


# ------------------------------------------------------------------------------------------ uncertainty
def test_bootstrap_interval_is_seeded_and_covers_a_known_ratio():
    """Paired arms b = 1.25 a (plus noise): the gain 1 - a/b is 0.2; the interval holds it and not 0."""
    rng = np.random.default_rng(0)
    a = rng.gamma(4.0, 25.0, size=30)
    b = 1.25 * a * rng.normal(1.0, 0.05, size=30)
    units = np.stack([np.stack([a, np.ones(30)], 1), np.stack([b, np.ones(30)], 1)], axis=1)  # (30, 2 arms, 2)
    stat = lambda s: 1 - (s[:, 0, 0] / s[:, 0, 1]) / (s[:, 1, 0] / s[:, 1, 1])  # noqa: E731
    i1 = unc.bootstrap(stat, units)
    assert i1 == unc.bootstrap(stat, units)  # seeded
    assert i1.lo < 0.2 < i1.hi and i1.positive
    assert i1.point == pytest.approx(1 - a.sum() / b.sum())
    # unpaired noise of the same size as the effect: the interval straddles 0
    c = a * rng.normal(1.0, 0.3, size=30)
    null = unc.bootstrap(stat, np.stack([np.stack([a, np.ones(30)], 1), np.stack([c, np.ones(30)], 1)], axis=1))
    assert null.lo < 0 < null.hi


def test_moving_blocks_are_consecutive_runs():
    idx = unc._indices(30, 3, 50, np.random.default_rng(1))
    assert idx.shape == (50, 30)
    runs = idx.reshape(50, 10, 3)
    assert (np.diff(runs, axis=2) == 1).all() and idx.min() >= 0 and idx.max() <= 29


def test_quantile_from_hist_matches_the_sample_within_a_bin():
    x = np.random.default_rng(2).lognormal(2.0, 1.0, size=5000)
    h, _ = np.histogram(x, bins=unc.LATENCY_BINS)
    q = float(unc.quantile_from_hist(h[None], 0.99)[0])
    ratio = unc.LATENCY_BINS[1] / unc.LATENCY_BINS[0]
    assert np.percentile(x, 99) / ratio <= q <= np.percentile(x, 99) * ratio


def test_bootstrap_rejects_bad_units():
    with pytest.raises(ValueError, match="units"):
        unc.bootstrap(lambda s: s[:, 0], np.ones((1, 2)))
    with pytest.raises(ValueError, match="units"):
        unc.bootstrap(lambda s: s[:, 0], np.array([[1.0], [np.nan]]))


# ------------------------------------------------------------------------------------------ verdicts
def _row(trace, policy, rho, per_block_cost, *, preemptions=10, kv=0.7, seed=0, good=None, **extra):
    """A sweep row with per-block strings: ``per_block_cost`` per block, ten requests served per
    block, ``good`` of them within their deadline (default: more of them the cheaper the block)."""
    c = np.asarray(per_block_cost, dtype=float)
    g = np.clip(10.0 * 50.0 / (50.0 + c), 0, 10) if good is None else np.broadcast_to(np.asarray(good, dtype=float), c.shape)
    return {"trace": trace, "seed": seed, "policy": policy, "rho": rho, "preemptions": preemptions,
            "kv_utilisation_mean": kv, "newsvendor_per_req": c.mean(), verdicts.COST: c.mean(),
            "blk_nv": unc.encode(c), "blk_total": unc.encode(c), "blk_served": unc.encode(np.full(unc.N_BLOCKS, 10.0)),
            "blk_realised": unc.encode(c), "blk_good": unc.encode(g), **extra}


def _t2(dro_factor: dict, *, preemptions=10, kv=0.7) -> pd.DataFrame:
    """Table II rows: P90 = base, P95 = 1.1 base, DRO = factor x base per rho."""
    rng = np.random.default_rng(3)
    rows = []
    for rho, f in dro_factor.items():
        base = rng.gamma(5.0, 20.0, size=unc.N_BLOCKS)
        for policy, mult in (("p90", 1.0), ("p95", 1.1), ("saa", 1.0), ("dro", f)):
            rows.append(_row("t", policy, rho, base * mult * rng.normal(1, 0.01, unc.N_BLOCKS), preemptions=preemptions, kv=kv))
    return pd.DataFrame(rows)


def test_table2_rule_can_come_out_every_way():
    assert verdicts.table2_verdict(_t2({2: 0.4, 10: 0.5, 100: 0.6})).verdict == "holds"
    # DRO cheaper but by less than half the paper's 56%: not "holds"
    assert verdicts.table2_verdict(_t2({2: 0.9, 10: 0.9, 100: 0.9})).verdict == "holds partly"
    assert verdicts.table2_verdict(_t2({2: 1.3, 10: 1.3, 100: 0.5})).verdict == "does not hold"  # 1 of 3: no majority
    assert verdicts.table2_verdict(_t2({2: 0.5, 10: 0.5, 100: 1.3})).verdict == "holds partly"  # 2 of 3
    # no preemption and an idle cache are no reason: over-reservation is measurable without them
    v = verdicts.table2_verdict(_t2({2: 0.4, 10: 0.5}, preemptions=0, kv=0.05))
    assert v.verdict == "holds" and v.engine_verdict == "holds"


def test_table2_engine_reading_judges_goodput_not_cost():
    """Cheaper in the paper's accounting but fewer requests within their deadline: the readings differ."""
    df = _t2({2: 0.4, 10: 0.5, 100: 0.6})
    df.loc[df.policy == "dro", "blk_good"] = unc.encode(np.full(unc.N_BLOCKS, 2.0))
    df.loc[df.policy != "dro", "blk_good"] = unc.encode(np.full(unc.N_BLOCKS, 8.0))
    v = verdicts.table2_verdict(df)
    assert v.verdict == "holds" and v.engine_verdict == "does not hold"
    assert "-75" in v.engine_reason  # 2 / 8 - 1
    row = v.as_row()
    assert row["engine_verdict"] == "does not hold" and row["verdict"] == "holds" and row["engine_reason"]


def test_table2_reason_says_where_dro_is_saa():
    df = _t2({2: 0.4, 10: 0.5})
    for col in ("blk_total", "blk_nv", "blk_good", "blk_realised"):
        df.loc[df.policy == "saa", col] = df.loc[df.policy == "dro", col].to_numpy()
    assert "DRO = SAA there" in verdicts.table2_verdict(df).reason


def test_identical_plans_cannot_be_checked():
    df = _t2({2: 1.0})
    cols = ["blk_total", "blk_nv", "blk_good", "blk_realised"]
    df.loc[df.policy == "dro", cols] = df.loc[df.policy == "p90", cols].to_numpy()
    df.loc[df.policy == "p95", cols] = df.loc[df.policy == "p90", cols].to_numpy()
    v = verdicts.table2_verdict(df)
    assert v.verdict == "cannot be checked" and v.engine_verdict == "cannot be checked"
    assert "identical" in v.reason


def test_old_cache_without_goodput_is_an_error_naming_the_column():
    df = _t2({2: 0.4}).drop(columns="blk_good")
    with pytest.raises(ValueError, match="blk_good"):
        verdicts.table2_verdict(df)


def test_fig3_leaves_out_rules_identical_to_dro():
    """Where DRO = SAA, DRO is compared with the other rules only: a DRO costlier than every
    other rule but SAA fails, though it ties SAA."""
    rng = np.random.default_rng(8)
    rows = []
    for load in (0.5, 1.0):
        base = rng.gamma(5.0, 20.0, size=unc.N_BLOCKS)
        for p in verdicts.FIG3_RULES:
            mult = 2.0 if p in ("dro", "saa") else 1.0
            rows.append(_row("t", p, 10, base * mult, load=load))
    df = pd.DataFrame(rows)
    for col in ("blk_total", "blk_nv", "blk_good", "blk_realised"):
        df.loc[df.policy == "saa", col] = df.loc[df.policy == "dro", col].to_numpy()
    v = verdicts.fig3_verdict(df)
    assert v.verdict == "does not hold" and "identical to DRO left out: 2" in v.reason


def test_fig6_is_judged_at_the_largest_stable_shift():
    rng = np.random.default_rng(9)
    rows = []
    for shift, drain in ((1.0, 0.01), (2.0, 0.02), (3.0, 0.3)):
        for variant, bins in (("bcd-dro", 20), ("no-dro", 20 if shift == 3.0 else 30)):
            h = np.zeros((unc.N_BLOCKS, len(unc.LATENCY_BINS) - 1))
            h[:, bins] = 5
            c = 100 * rng.normal(1, 0.01, unc.N_BLOCKS)
            rows.append(_row("x", "dro", 10, c, source="real", variant=variant, shift=shift, plan_key=variant,
                             blk_e2e_hist=unc.encode(h), drain_share=drain, backlog_first=1.0, backlog_second=1.0))
    df = pd.DataFrame(rows)
    v = verdicts.fig6_verdict(df)
    assert "s = 2" in v.reason and v.verdict == "holds"  # at s = 2 the SAA plan's P99 is ten bins up
    df.loc[df["shift"] == 2.0, "drain_share"] = 0.2  # now no shifted run is stable
    v = verdicts.fig6_verdict(df)
    assert v.verdict == "cannot be checked" and "no stable shifted run" in v.reason


def test_table4_rule_uses_worst_regret_with_an_interval():
    rng = np.random.default_rng(4)
    costs = {"dro": (10, 11, 12), "p90": (9, 20, 90), "max": (30, 30, 30)}
    rows = []
    for p in verdicts.PAPER_TABLE4:
        for rho, c in zip((2, 10, 100), costs.get(p, (50, 50, 50))):
            rows.append(_row("t", p, rho, c * rng.normal(1, 0.02, unc.N_BLOCKS)))
    df = pd.DataFrame(rows)
    assert verdicts.table4_verdict(df).verdict == "holds"
    df.loc[(df.policy == "dro") & (df.rho == 100), "blk_total"] = unc.encode(np.full(unc.N_BLOCKS, 200.0))
    assert verdicts.table4_verdict(df).verdict == "does not hold"


def test_twins_bootstrap_over_seeds():
    rows = []
    rng = np.random.default_rng(5)
    for seed in range(10):
        base = rng.gamma(5.0, 20.0, size=unc.N_BLOCKS)
        for policy, mult in (("p90", 1.0), ("p95", 1.1), ("dro", 0.4)):
            rows.append(_row("synthetic-conv", policy, 2, base * mult, seed=seed))
    units, run = verdicts.arm_units(pd.DataFrame(rows), ["policy"], [("dro",), ("p90",)], ["blk_total", "blk_served"])
    assert units.shape == (10, 2, 2) and run == 1
    assert verdicts.table2_verdict(pd.DataFrame(rows)).verdict == "holds"


def test_fig2b_verdict_is_computed(real_traces):
    f = analytic.fig2b()
    v = verdicts.fig2b_verdict(f)
    d = v.detail()
    # where DRO = SAA the buffer is a q*-quantile by construction of SAA; where it jumped it is not
    assert d.set_index("group").passes[[f"{r.trace}, rho = {r.rho:g}" for r in f[f.is_saa].itertuples()]].all()
    assert not d.set_index("group").passes[[f"{r.trace}, rho = {r.rho:g}" for r in f[~f.is_saa].itertuples()]].any()
    assert v.verdict == ("holds partly" if f.is_saa.mean() > 0.5 else "does not hold")


def test_premium_rule_reads_one_way():
    rows = [{"eps_units": u, "rho": r, "eps_fraction": e, "obj_saa": 100.0, "obj_robust": 100.0 * (1 + p)}
            for u, p in (("mean", 0.3), ("tokens", 0.001)) for r in (2, 10, 100) for e in (0.1, 0.15, 0.2, 0.5)]
    ej = pd.DataFrame(rows)
    assert verdicts.premium_verdict(ej).verdict == "does not hold"  # the tokens reading passing changes nothing
    ej.loc[ej.eps_units == "mean", "obj_robust"] = 100.4
    assert verdicts.premium_verdict(ej).verdict == "holds"


def test_verdict_rejects_unknown_label():
    with pytest.raises(ValueError, match="verdict"):
        verdicts.Verdict("c", "maybe", "r")


# ------------------------------------------------------------------------------------------ CLI (must show)
def test_cli_table4_quick_json(data_dir, tmp_path):
    """`python -m kvdro.experiments table4 --quick --json`: every policy x rho in {2, 10, 100}, each
    with finite cost, P99 latency, SLO-violation rate and preemptions, and no request lost."""
    from kvdro.experiments.sweeps import TABLE4_POLICIES as POLICIES

    env = dict(os.environ, KVDRO_DATA_DIR=str(data_dir), KVDRO_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "kvdro.experiments", "table4", "--quick", "--json"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True,
    )
    payload = json.loads(out.stdout)
    rows = payload["rows"]
    assert payload["regime"] == "memory"
    assert {(r["policy"], r["rho"]) for r in rows} == {(p, rho) for p in POLICIES for rho in (2, 10, 100)}
    assert all(r["preemptions"] >= 0 and 0 <= r["kv_utilisation_mean"] <= 1 for r in rows)
    assert all(r["regime"] == "memory" and not any(k.startswith("blk_") for k in r) for r in rows)
    assert len(rows) == len(POLICIES) * 3
    for r in rows:
        for key in ("cost_paper", "cost_realised", "e2e_p99_s", "slo_violation_rate", "preemptions"):
            assert r[key] is not None and math.isfinite(r[key]), (r["policy"], r["rho"], key)
        assert r["lost"] == 0
        assert r["completed"] + r["rejected"] + r["ignored"] == r["n_requests"] > 0
    assert payload["verdicts"] and payload["verdicts"][0]["verdict"] in verdicts.VERDICTS


def test_cli_verdicts_json_is_one_document_with_the_fields(data_dir):
    """`python -m kvdro.experiments verdicts --regime light --json`: one verdict per claim, from the cached sweeps."""
    env = dict(os.environ, KVDRO_DATA_DIR=str(data_dir))
    out = subprocess.run([sys.executable, "-m", "kvdro.experiments", "verdicts", "--regime", "light", "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True)
    payload = json.loads(out.stdout)  # exactly one JSON document
    assert isinstance(payload, list) and [v["claim"] for v in payload] == list(verdicts.CLAIMS)
    for v in payload:
        assert set(v) == {"claim", "regime", "verdict", "reason", "engine_verdict", "engine_reason", "preemptions",
                          "kv_utilisation_mean"}
        assert v["regime"] == "light" and v["verdict"] in verdicts.VERDICTS and v["reason"]
        assert v["engine_verdict"] in verdicts.VERDICTS + (verdicts.NO_ENGINE,) and v["engine_reason"]


def test_regimes_are_the_documented_operating_points():
    from kvdro.experiments.regimes import operating_point

    m, light = operating_point("memory"), operating_point("light")
    assert m.groups * int(m.config[2]) == light.groups * int(light.config[2]) == 8
    assert m.config.startswith("TP2") and 0.5 <= m.load <= 0.75
    with pytest.raises(ValueError, match="regime"):
        operating_point("heavy")


def test_cli_refuses_write_with_quick():
    out = subprocess.run([sys.executable, "-m", "kvdro.experiments", "table4", "--quick", "--write"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "--write" in out.stderr


def test_table5_routing_cannot_be_checked_when_the_plan_is_the_same():
    """Uniform routing over one configuration is the full plan itself: no verdict either way."""
    rng = np.random.default_rng(6)
    rows = []
    for variant, mult, key in (("bcd-dro", 1.0, "A"), ("no-routing", 1.0, "A"), ("no-dro", 1.2, "B"), ("no-prefix", 1.0, "C")):
        c = 100 * mult * rng.normal(1, 0.01, unc.N_BLOCKS)
        h = np.zeros((unc.N_BLOCKS, len(unc.LATENCY_BINS) - 1))
        h[:, 30 if variant == "no-prefix" else 20] = 5
        rows.append(_row("x", "dro", 10, c, source="real", variant=variant, plan_key=key, blk_e2e_hist=unc.encode(h),
                         plan="x: 2 x TP4-PP1 (8 GPUs)"))
    out = verdicts.table5_verdicts(pd.DataFrame(rows))
    assert out[0].verdict == "cannot be checked" and "identical" in out[0].reason
    assert out[1].verdict == "holds partly"  # +20%: worse beyond noise, but under half the paper's +85%
    assert out[2].verdict == "holds"  # P99 ten bins up (~ x 3.6) against the paper's +22%


def test_class_deadline_is_a_sensitivity_of_the_engine_reading_only():
    df = _t2({2: 0.4, 10: 0.5, 100: 0.6})
    df["blk_good_class"] = df["blk_good"]
    df.loc[df.policy == "dro", "blk_good_class"] = unc.encode(np.full(unc.N_BLOCKS, 1.0))  # DRO misses its class D_i
    v_own = verdicts.table2_verdict(df)
    v_cls = verdicts.table2_verdict(df.assign(blk_good=df["blk_good_class"]))
    assert v_own.verdict == v_cls.verdict == "holds"
    assert v_own.engine_verdict == "holds" and v_cls.engine_verdict == "does not hold"
    with pytest.raises(ValueError, match="deadline"):
        verdicts.verdicts("memory", {}, deadline="paper")


def test_cli_verdicts_class_deadline(data_dir):
    env = dict(os.environ, KVDRO_DATA_DIR=str(data_dir))
    out = subprocess.run([sys.executable, "-m", "kvdro.experiments", "verdicts", "--regime", "memory", "--json", "--deadline", "class"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True)
    payload = json.loads(out.stdout)
    assert [v["claim"] for v in payload] == list(verdicts.CLAIMS)
    assert all(v["engine_verdict"] in verdicts.VERDICTS + (verdicts.NO_ENGINE,) for v in payload)


def test_the_code_fingerprint_covers_every_module_a_cached_cell_imports():
    """A cached cell is recomputed when code it runs changes: every kvdro module that the cell code
    (sweeps, headroom, traces, analytic) loads is in DEPENDENCIES, but for the caching machinery itself."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import kvdro.experiments.sweeps, kvdro.experiments.headroom, kvdro.experiments.traces, kvdro.experiments.analytic\n"
        "from kvdro.experiments.cache import DEPENDENCIES, _PACKAGE\n"
        "covered = set()\n"
        "for name in DEPENDENCIES:\n"
        "    p = _PACKAGE / name\n"
        "    covered |= set(p.rglob('*.py')) if p.is_dir() else {p}\n"
        "loaded = sorted(Path(m.__file__).resolve() for n, m in list(sys.modules.items())\n"
        "                if n.startswith('kvdro') and getattr(m, '__file__', None))\n"
        "print('\\n'.join(str(p.relative_to(_PACKAGE)) for p in loaded if p not in covered))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    machinery = {"__init__.py", "errors.py", "experiments/__init__.py", "experiments/cache.py", "experiments/runner.py"}
    assert set(out) <= machinery, f"modules a cached cell runs but the fingerprint ignores: {sorted(set(out) - machinery)}"
