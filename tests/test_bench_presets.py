"""``python -m kvdro.bench presets``: the long-output cell (issue 32) and its cached table."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdro.bench import presets
from kvdro.cachefile import read_csv_checked
from kvdro.experiments import atlas


def test_long_output_cell_is_the_atlas_r1_cell():
    cell = presets.long_output_cell()
    assert cell.workload == "r1" and cell.gpu == "a100-80gb" and cell.window_s == atlas.R1_WINDOW_S
    assert cell in atlas.cells(["r1"], "primary")  # the rule's point, not a hand-picked load


def test_reduced_grid_is_labelled_and_never_written(capsys):
    assert presets.main(["--cell", "long-output", "--engines", "vllm-v0", "--max-new", "unset,1000", "--write"]) == 2
    out = capsys.readouterr().out
    assert "REDUCED" in out and "contiguous window" in out and "--write needs the full grid" in out
    assert " 32768 " in out  # the long-output cell's client cap, not the primary point's 1,000


def test_cached_long_output_table():
    path = Path(presets.LONG_CACHE)
    t = read_csv_checked(path, key=["engine", "max_new"], dtype={"max_new": str})
    assert set(t["cell"]) == {"long-output"} and set(t["window_s"]) == {atlas.R1_WINDOW_S}
    assert set(t["max_new"]) == {"unset", str(atlas.CLIENT_CAP["r1"]), "policy", "policy-soft", "true"}
    base = t[(t["engine"] == "vllm-v1") & (t["max_new"] == "unset")]
    assert float(base["served_vs_v1_pct"].iloc[0]) == pytest.approx(0.0, abs=1e-9)
    # capped requests are not served: never counted among those served in time
    capped = t[t["max_new"] == "policy"]
    assert (capped["capped"] > 0).all()
    assert (t["served_in_deadline"] <= t["completed"]).all()
    unset = t[t["max_new"] == "unset"].set_index("engine")
    for _, row in capped.iterrows():  # a capped request leaves the completed ones, one for one
        assert row["completed"] + row["capped"] == unset.loc[row["engine"], "completed"]
    assert (t.loc[t["max_new"].isin(["unset", "true", "policy-soft"]), "capped"] == 0).all()
