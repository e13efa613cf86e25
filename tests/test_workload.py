"""kvdro.workload: request classes, bucket split, length models, synthetic traces, shift operator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdro import datasets, workload

ROOT = Path(__file__).resolve().parents[1]
QS = np.array([0.5, 0.9, 0.95, 0.99])


def _toy_trace() -> pd.DataFrame:
    """Two classes over 100 s with known counts and lengths."""
    a = pd.DataFrame(
        {
            "arrival_s": np.linspace(0, 100, 41),
            "input_tokens": np.arange(41) * 10 + 100,
            "output_tokens": np.arange(41) + 1,
            "request_class": "a",
        }
    )
    b = pd.DataFrame(
        {
            "arrival_s": np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 99.0]),
            "input_tokens": np.full(8, 400),
            "output_tokens": np.array([5, 6, 7, 8, 9, 10, 11, 500]),
            "request_class": "b",
        }
    )
    return pd.concat([a, b], ignore_index=True).sort_values("arrival_s", ignore_index=True)


# --------------------------------------------------------------------------- request classes


def test_classes_from_trace_rates_cv_and_defaults():
    a, b = workload.classes_from_trace(_toy_trace())
    assert (a.name, b.name) == ("a", "b")
    assert a.arrival_rate == pytest.approx(41 / 100) and b.arrival_rate == pytest.approx(8 / 100)
    assert a.interarrival_cv == pytest.approx(0.0, abs=1e-9)  # evenly spaced arrivals
    gaps = np.diff([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 99.0])
    assert b.interarrival_cv == pytest.approx(gaps.std() / gaps.mean())
    assert a.mean_input_tokens == pytest.approx(300.0) and b.mean_output_tokens == pytest.approx(556 / 8)
    # defaults for what no trace records: L_pre = min(128, floor(L_in/2)); D = 2 s + 0.1 s x E[xi]
    assert a.prefix_tokens == 128 and b.prefix_tokens == 128
    assert b.slo_s == pytest.approx(2.0 + 0.1 * 556 / 8)
    assert b.max_output_tokens == 500


def test_classes_from_trace_explicit_parameters_per_class():
    a, b = workload.classes_from_trace(
        _toy_trace(), prefix_tokens={"a": 50}, slo_s=3.0, max_output_tokens={"b": 1000}
    )
    assert a.prefix_tokens == 50 and b.prefix_tokens == 128
    assert a.slo_s == b.slo_s == 3.0 and b.max_output_tokens == 1000 and a.max_output_tokens == 41


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"arrival_rate": 0.0}, "arrival_rate"),
        ({"output_tokens": [3, -1]}, "output_tokens"),
        ({"input_tokens": [1.5, 2]}, "input_tokens"),
        ({"input_tokens": []}, "input_tokens"),
        ({"prefix_tokens": 500}, "prefix_tokens"),
        ({"max_output_tokens": 5}, "max_output_tokens"),
        ({"slo_s": -1}, "slo_s"),
        ({"interarrival_cv": float("nan")}, "interarrival_cv"),
    ],
)
def test_request_class_rejects_bad_input(kwargs, argument):
    base = dict(name="x", arrival_rate=1.0, input_tokens=[100, 200], output_tokens=[3, 10])
    with pytest.raises(ValueError, match=argument):
        workload.RequestClass(**{**base, **kwargs})


def test_request_class_is_immutable_and_subsample_is_seeded():
    rc = workload.classes_from_trace(_toy_trace())[0]
    with pytest.raises(ValueError):
        rc.output_tokens[0] = 99  # read-only array
    with pytest.raises(AttributeError):
        rc.arrival_rate = 2.0  # type: ignore[misc]
    s1 = rc.subsample(10, np.random.default_rng(3))
    s2 = rc.subsample(10, np.random.default_rng(3))
    np.testing.assert_array_equal(s1.output_tokens, s2.output_tokens)
    assert s1.n_samples == 10 and set(s1.output_tokens) <= set(rc.output_tokens)
    assert s1.max_output_tokens == rc.max_output_tokens and s1.arrival_rate == rc.arrival_rate
    with pytest.raises(ValueError, match="n"):
        rc.subsample(1000, np.random.default_rng(0))


def test_split_by_input_quantile_makes_disjoint_equal_buckets():
    df = _toy_trace()
    out = workload.split_by_input_quantile(df[df["request_class"] == "a"].reset_index(drop=True), 3)
    counts = out["request_class"].value_counts()
    assert set(counts.index) == {"a-short", "a-medium", "a-long"}
    assert counts.max() - counts.min() <= 1
    lo = out.groupby("request_class")["input_tokens"].agg(["min", "max"])
    assert lo.loc["a-short", "max"] < lo.loc["a-medium", "min"] <= lo.loc["a-medium", "max"] < lo.loc["a-long", "min"]
    assert len(out) == 41 and out.attrs["input_edges"]["a"][0] == 100
    with pytest.raises(ValueError, match="n_buckets"):
        workload.split_by_input_quantile(df, 3)  # class b has one distinct input length


# --------------------------------------------------------------------------- length models


def test_length_model_cdf_quantile_sample_agree(rng):
    m = workload.LengthModel((0.7, 0.3), (np.log(20), np.log(300)), (0.5, 0.4), 2, 2000, cap_mass=0.02)
    grid = np.arange(m.low, m.high + 1)
    c = m.cdf(grid)
    assert np.all(np.diff(c) >= 0) and c[-1] == 1.0 and m.cdf(m.low - 1) == 0.0
    assert c[-2] == pytest.approx(0.98, abs=1e-3)  # the point mass at `high`
    q = m.quantile(QS)
    assert np.all(m.cdf(q) >= QS) and np.all(m.cdf(q - 1) < QS)
    x = m.sample(200_000, rng)
    assert x.min() >= m.low and x.max() <= m.high and x.dtype == np.int64
    assert x.mean() == pytest.approx(m.mean(), rel=0.01)
    np.testing.assert_allclose(np.quantile(x, QS), q, rtol=0.03)
    assert np.mean(x == m.high) == pytest.approx(1 - m.cdf(m.high - 1), abs=0.002)


def test_fit_recovers_a_known_mixture(rng):
    truth = workload.LengthModel((0.6, 0.4), (np.log(15), np.log(400)), (0.4, 0.3), 1, 5000)
    fitted = workload.fit_length_model(truth.sample(20_000, rng), n_components=2, high=5000)
    np.testing.assert_allclose(fitted.weights, truth.weights, atol=0.02)
    np.testing.assert_allclose(np.exp(fitted.mu), np.exp(truth.mu), rtol=0.05)
    np.testing.assert_allclose(fitted.quantile(QS), truth.quantile(QS), rtol=0.05)


def test_fit_is_deterministic_and_validates():
    x = np.array([5, 6, 7, 9, 12, 15, 30, 70, 200, 1000, 11, 13])
    assert workload.fit_length_model(x) == workload.fit_length_model(x)
    with pytest.raises(ValueError, match="samples"):
        workload.fit_length_model([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="low/high"):
        workload.fit_length_model(x, high=500)
    with pytest.raises(ValueError, match="weights"):
        workload.LengthModel((0.5, 0.6), (1.0, 2.0), (1.0, 1.0), 1, 10)


@pytest.fixture(scope="module")
def azure_classes(data_dir):
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    df = pd.concat([datasets.load_trace("azure-2023-code"), datasets.load_trace("azure-2023-conv")])
    mp.undo()
    return workload.classes_from_trace(df.sort_values("arrival_s", kind="stable", ignore_index=True))


def test_fitted_output_quantiles_match_real_azure(azure_classes):
    for rc in azure_classes:
        model = workload.fit_length_model(rc.output_tokens, high=rc.max_output_tokens)
        emp = np.quantile(rc.output_tokens, QS)
        np.testing.assert_allclose(model.quantile(QS), emp, rtol=0.06, err_msg=rc.name)
    # a single log-normal does NOT fit the code tail: P99 is far too low (the reason for the mixture)
    code = azure_classes[0]
    one = workload.fit_length_model(code.output_tokens, n_components=1)
    assert one.quantile(0.99) < 0.6 * np.quantile(code.output_tokens, 0.99)


def test_saved_class_models_are_calibrated_to_real_azure(azure_classes):
    models = {m.name: m for m in workload.load_class_models(ROOT / "data" / "azure2023_class_models.json")}
    assert len(models) == 8
    for rc in azure_classes:
        m = models[rc.name]
        assert m.arrival_rate == pytest.approx(rc.arrival_rate, rel=1e-9)
        assert m.interarrival_cv == pytest.approx(rc.interarrival_cv, rel=1e-9)
        np.testing.assert_allclose(m.output_model.quantile(QS), np.quantile(rc.output_tokens, QS), rtol=0.06)
        np.testing.assert_allclose(m.input_model.quantile(QS), np.quantile(rc.input_tokens, QS), rtol=0.11)
    # the code prompts pile up at the ~7.4k-token limit: the fitted input model has a point mass there
    assert models["code"].input_model.cap_mass == pytest.approx(0.04, abs=0.01)


# --------------------------------------------------------------------------- synthetic traces


@pytest.mark.parametrize("cv", [0.0, 0.5, 1.0, 2.0])
def test_gamma_interarrivals_mean_and_cv(cv, rng):
    gaps = workload.gamma_interarrivals(400_000, 4.0, cv, rng)
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.03)


def _toy_models():
    lm_in = workload.LengthModel((1.0,), (np.log(500),), (0.5,), 10, 4000)
    lm_out = workload.LengthModel((1.0,), (np.log(50),), (0.8,), 1, 1000)
    return [
        workload.ClassModel("p", 5.0, 1.0, lm_in, lm_out, 64.0, 5.0),
        workload.ClassModel("q", 2.0, 3.0, lm_in, lm_out.scaled(3.0), 0.0, 8.0),
    ]


def test_synthesize_trace_schema_rates_determinism():
    models = _toy_models()
    t1 = workload.synthesize_trace(models, 2000.0, np.random.default_rng(7))
    t2 = workload.synthesize_trace(models, 2000.0, np.random.default_rng(7))
    pd.testing.assert_frame_equal(t1, t2)
    assert list(t1.columns) == list(datasets.SCHEMA) and t1["arrival_s"].is_monotonic_increasing
    assert t1["arrival_s"].between(0, 2000).all()
    n_p = int((t1["request_class"] == "p").sum())
    assert n_p == pytest.approx(5.0 * 2000, rel=0.05)  # Poisson class: 10,000 +- 100
    back = {c.name: c for c in workload.classes_from_trace(t1)}
    assert back["p"].interarrival_cv == pytest.approx(1.0, rel=0.05)
    assert back["q"].interarrival_cv == pytest.approx(3.0, rel=0.25)
    with pytest.raises(ValueError, match="duration_s"):
        workload.synthesize_trace(models, -1.0, np.random.default_rng(0))


def test_synthetic_classes_are_distinct_bounded_and_seeded():
    base = _toy_models()
    a = workload.synthetic_classes(base, 15, np.random.default_rng(11), max_output_tokens=2048)
    b = workload.synthetic_classes(base, 15, np.random.default_rng(11), max_output_tokens=2048)
    assert a == b and len({m.name for m in a}) == 15
    medians = [int(m.output_model.quantile(0.5)) for m in a]
    assert len(set(medians)) >= 10  # distinct output scales
    assert all(m.output_model.high <= 2048 for m in a)
    assert all(0.25 * base[j % 2].arrival_rate <= m.arrival_rate <= base[j % 2].arrival_rate for j, m in enumerate(a))
    assert all(m.slo_s == pytest.approx(workload.default_slo_s(m.output_model.mean())) for m in a)
    rc = a[0].to_request_class(300, np.random.default_rng(1))
    assert rc.n_samples == 300 and rc.max_output_tokens == a[0].output_model.high


def test_class_models_json_round_trip(tmp_path):
    models = _toy_models()
    path = tmp_path / "m.json"
    workload.save_class_models(models, path, meta={"seed": 1})
    assert workload.load_class_models(path) == tuple(models)
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a class-model file"):
        workload.load_class_models(path)


# --------------------------------------------------------------------------- shift operator


def test_shift_outputs_rounding_floor_and_clipping():
    x = np.array([1, 3, 5, 10, 600])
    np.testing.assert_array_equal(workload.shift_outputs(x, 1.0), x)
    np.testing.assert_array_equal(workload.shift_outputs(x, 0.5), [1, 2, 2, 5, 300])  # rint: 1.5->2, 2.5->2
    np.testing.assert_array_equal(workload.shift_outputs(x, 2.0, max_output_tokens=1000), [2, 6, 10, 20, 1000])
    with pytest.raises(ValueError, match="s"):
        workload.shift_outputs(x, 0.0)
    with pytest.raises(ValueError, match="max_output_tokens"):
        workload.shift_outputs(x, 2.0, max_output_tokens=0)


def test_shift_trace_records_clipping():
    out = workload.shift_trace(_toy_trace(), 3.0, max_output_tokens=100)
    assert out.attrs["shift"] == 3.0 and out.attrs["clipped"] == int(np.sum(3 * _toy_trace()["output_tokens"] > 100))
    assert out["output_tokens"].max() == 100


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=50),
    st.floats(0.1, 5.0),
    st.floats(0.1, 5.0),
    st.integers(1, 4000),
)
def test_shift_is_monotone_in_s_and_respects_lmax(xs, s1, s2, lmax):
    lo, hi = sorted((s1, s2))
    a = workload.shift_outputs(xs, lo, max_output_tokens=lmax)
    b = workload.shift_outputs(xs, hi, max_output_tokens=lmax)
    assert np.all(a <= b) and np.all(b <= lmax) and np.all(a >= 1)
