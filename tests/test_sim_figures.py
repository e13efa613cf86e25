"""Chapter 12's predicted-against-simulated scatter (kvdro.sim.figures.agreement_scatter)."""

import numpy as np
import pandas as pd
import pytest

from kvdro.sim.figures import agreement_scatter


def _frame() -> pd.DataFrame:
    rows = []
    for metric in ("mean e2e [s]", "goodput [1/s]"):
        for panel in ("in sample", "test"):
            for serving, err in (("analytic", 0.4), ("calibrated", 0.05)):
                rows.append({"metric": metric, "panel": panel, "serving": serving, "instance": "small",
                             "simulated": 10.0, "predicted": 10.0 * (1 + err)})
    rows.append({"metric": "mean e2e [s]", "panel": "test", "serving": "calibrated", "instance": "large",
                 "simulated": 20.0, "predicted": np.nan})  # an overloaded plan: left out
    return pd.DataFrame(rows)


def test_one_panel_per_metric_and_view_with_the_band_and_the_points():
    spec = agreement_scatter(_frame(), band=0.15).to_dict()
    rows = spec["vconcat"]
    assert len(rows) == 2 and all(len(r["hconcat"]) == 2 for r in rows)
    layer = rows[0]["hconcat"][1]["layer"]
    assert [lay["mark"]["type"] if isinstance(lay["mark"], dict) else lay["mark"] for lay in layer] == ["area", "line", "point"]
    points = pd.DataFrame(spec["datasets"][layer[2]["data"]["name"]])
    assert len(points) == 2 and points["predicted"].notna().all()  # the NaN prediction is not drawn
    shade = pd.DataFrame(spec["datasets"][layer[0]["data"]["name"]])
    assert np.allclose(shade["lo"], 0.85 * shade["x"]) and np.allclose(shade["hi"], 1.15 * shade["x"])


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="frame: missing column 'serving'"):
        agreement_scatter(_frame().drop(columns="serving"))
    with pytest.raises(ValueError, match="band"):
        agreement_scatter(_frame(), band=1.5)
