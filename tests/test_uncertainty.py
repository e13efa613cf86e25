"""Intervals of a percentage change (kvdro.experiments.uncertainty): a ratio whose baseline comes near
zero in resamples is reported as a difference in the metric's unit (issue 34, item 5)."""

import numpy as np
import pandas as pd
import pytest

from kvdro.experiments import headroom
from kvdro.experiments import uncertainty as unc


def _units(base: np.ndarray, arm: np.ndarray) -> np.ndarray:
    """Per-block counts of two paired arms, shaped as the verdicts pass them: (blocks, arms, columns)."""
    return np.stack([arm, base], axis=1)[:, :, None].astype(float)


def _ratio(s):
    return s[:, 0, 0] / np.maximum(s[:, 1, 0], 1.0) - 1.0


def test_change_has_the_ratio_interval_of_bootstrap_and_a_steady_baseline_prints_a_percentage():
    rng = np.random.default_rng(3)
    base = rng.poisson(100, unc.N_BLOCKS)
    arm = base + rng.poisson(10, unc.N_BLOCKS)
    u = _units(base, arm)
    iv = unc.change(lambda s: s[:, 0, 0], lambda s: s[:, 1, 0], u, unit="requests")
    ref = unc.bootstrap(_ratio, u)
    assert (iv.point, iv.lo, iv.hi) == (ref.point, ref.lo, ref.hi)  # the same resamples, the same interval
    assert not iv.base_near_zero
    assert iv.diff.point == pytest.approx(arm.sum() - base.sum())
    assert iv.diff.lo < iv.diff.point < iv.diff.hi
    assert iv.pct(1) == ref.pct(1) and iv.pct(1).endswith("]") and "%" in iv.pct(1)


def test_a_baseline_in_two_blocks_is_near_zero_and_prints_its_difference():
    # a queue that grows: the baseline serves its requests in time only in the first two blocks
    base = np.zeros(unc.N_BLOCKS)
    base[:2] = [40, 20]
    arm = np.zeros(unc.N_BLOCKS)
    arm[:3] = [60, 40, 10]
    u = _units(base, arm)
    iv = unc.change(lambda s: s[:, 0, 0], lambda s: s[:, 1, 0], u, unit="requests in time")
    assert iv.base_near_zero
    # the ratio's interval is what the issue quotes: an upper end far above the point
    assert iv.hi > 20 * (1 + iv.point) - 1 or iv.lo <= -0.99
    assert iv.exploded
    assert iv.diff.point == pytest.approx(50.0)
    text = iv.pct(1)
    assert text.startswith("+50 requests in time [") and "a difference" in text and "%" not in text


def test_the_near_zero_rule_is_the_baselines_lower_quantile():
    """The rule reads the 2.5 % quantile of the baseline's resampled value against NEAR_ZERO of its point:
    a baseline zero in a quarter of its blocks (resamples stay well above 5 %) is not near zero."""
    base = np.r_[np.full(23, 100.0), np.zeros(7)]
    arm = base * 1.1
    iv = unc.change(lambda s: s[:, 0, 0], lambda s: s[:, 1, 0], _units(base, arm), unit="requests")
    assert not iv.base_near_zero and iv.pct(0) == "+10% [+10, +10]"
    # an empty baseline is near zero whatever the resamples
    iv0 = unc.change(lambda s: s[:, 0, 0], lambda s: s[:, 1, 0], _units(np.zeros(30), np.ones(30)), unit="requests")
    assert iv0.base_near_zero and iv0.diff.point == 30


def test_exploded_reads_a_cached_ratio_by_its_ends():
    # the book's own cached intervals (headroom map): the memory point is fine; the cell at load 0.9 is not
    assert not unc.Interval(0.0099, 0.0009, 0.0256).exploded
    assert not unc.Interval(-0.140, -0.20, -0.08).exploded
    assert unc.Interval(0.893, 0.581, 131.112).exploded  # +89.3% [+58.1, +13111.2]
    assert unc.Interval(0.145, -1.0, 0.403).exploded  # [-100.0, +40.3]: a resampled 0 / 0
    assert not unc.Interval(-0.95, -0.96, -0.94).exploded  # a real collapse with a steady baseline


def test_interval_rejects_a_near_zero_flag_without_a_difference_and_bad_floors():
    with pytest.raises(ValueError, match="diff"):
        unc.Interval(0.1, 0.0, 0.2, base_near_zero=True)
    with pytest.raises(ValueError, match="diff"):
        unc.Interval(0.1, 0.0, 0.2, diff=float("nan"), base_near_zero=True)
    with pytest.raises(ValueError, match="floor"):
        unc.change(lambda s: s[:, 0, 0], lambda s: s[:, 1, 0], _units(np.ones(30), np.ones(30)), unit="r", floor=0.0)
    assert unc.Interval(0.1, 0.05, 0.2).pct(1) == "+10.0% [+5.0, +20.0]"  # the ordinary format is unchanged


def _row(gain, lo, hi):
    return pd.Series({"goodput_rps": 0.295, "oracle_goodput_rps": 0.562, "soft0.5_goodput_rps": 0.30, "best_soft": "soft0.5",
                      "oracle_goodput_gain": gain, "oracle_goodput_gain_lo": lo, "oracle_goodput_gain_hi": hi,
                      "best_goodput_gain": gain, "best_goodput_gain_lo": lo, "best_goodput_gain_hi": hi})


def test_headroom_gain_interval_reports_req_per_s_where_the_cached_ratio_exploded():
    iv = headroom.gain_interval(_row(0.893, 0.581, 131.112), "oracle")
    assert iv.base_near_zero and iv.diff == pytest.approx(0.562 - 0.295)
    assert iv.pct(1) == "+0.267 req/s (a difference, no interval: the baseline comes near zero)"
    assert headroom.gain_interval(_row(0.145, -1.0, 0.403), "best").diff == pytest.approx(0.30 - 0.295)
    ok = headroom.gain_interval(_row(0.0099, 0.0009, 0.0256), "oracle")
    assert not ok.base_near_zero and ok.pct(1) == "+1.0% [+0.1, +2.6]"
    with pytest.raises(ValueError, match="dro_goodput_gain"):
        headroom.gain_interval(_row(0.1, 0.0, 0.2), "dro")
    with pytest.raises(ValueError, match="oracle_goodput_rps"):
        headroom.gain_interval(_row(0.893, 0.581, 131.112).drop("oracle_goodput_rps"), "oracle")


def test_seed_phrase_drops_an_exploded_pooled_interval():
    row = pd.Series({"n_seeds": 8, "seeds_positive": 4, "gain": 0.235, "lo": 0.094, "hi": 90.0, "gain_min": 0.04, "gain_max": 0.574})
    text = headroom.seed_phrase(row)
    assert "pooled +23.5%, no interval" in text and "9000" not in text
    row2 = row.copy()
    row2["hi"] = 0.5
    assert "pooled +23.5% [+9.4, +50.0]" in headroom.seed_phrase(row2)
