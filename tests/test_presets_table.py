"""The engines' answer at the primary point as the book reads it (kvdro.bench.presets_table)."""

import numpy as np
import pytest

from kvdro.bench import presets
from kvdro.bench import presets_table as pt
from kvdro.sim.engines import ENGINES


@pytest.fixture(scope="module")
def table():
    return pt.read()


def test_read_gives_every_engine_and_arm_with_its_interval(table):
    assert set(table["engine"]) == set(ENGINES)
    for r in table.itertuples():
        assert r.change.lo <= r.change.point <= r.change.hi
        assert np.isclose(100 * r.change.point, r.goodput_vs_v1_pct)
    base = pt.cell(table, *presets.BASELINE)["change"]
    assert base.point == base.lo == base.hi == 0


def test_cell_names_a_missing_row(table):
    with pytest.raises(ValueError, match="engine, arm"):
        pt.cell(table, "vllm-v1", "policy-soft")  # vLLM v1 has no soft estimate
    with pytest.raises(ValueError, match="against"):
        pt.lookahead(("vllm-v9",))


def test_families_from_the_table(table):
    # the reactive engines never read max_new for memory; the reserving ones do
    assert all(pt.length_unused(table, e) for e in ENGINES if pt.FAMILY[e] == "reactive")
    assert not any(pt.length_unused(table, e) for e in ENGINES if pt.FAMILY[e] != "reactive")
    g = {a: pt.cell(table, "trtllm-gne", a)["goodput_rps"] for a in ("unset", "policy", "true")}
    assert np.isclose(pt.recovered(table, "trtllm-gne"), (g["policy"] - g["unset"]) / (g["true"] - g["unset"]))
    assert np.isnan(pt.recovered(table, "vllm-v1"))  # the true length gains nothing there


def test_grid_and_texts(table):
    grid = pt.grid(table)
    assert list(grid.index) == list(ENGINES) and "look-ahead" not in grid.columns
    assert grid.loc["vllm-v1", pt.ARMS["unset"]] == "baseline"
    assert grid.loc["vllm-v1", pt.ARMS["policy-soft"]] == "–"
    assert grid.loc["vllm-v1", pt.ARMS["true"]] == "±0 (the same run)"
    iv = pt.cell(table, "trtllm-gne", "true")["change"]
    assert pt.change_text(iv).startswith(f"{100 * iv.point:+.1f} % [")
    assert pt.point_text(iv) == f"{100 * iv.point:+.1f}%"


def test_lookahead_never_preempts_and_its_baseline_is_the_cached_run(table, data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    la = pt.lookahead(("vllm-v0",))  # compiled engine: about a second
    assert la.preemptions == 0
    assert np.isclose(la.baseline_goodput_rps["vllm-v0"], pt.cell(table, "vllm-v0", "unset")["goodput_rps"], rtol=1e-5)
    assert la.against["vllm-v0"].lo <= la.against["vllm-v0"].point <= la.against["vllm-v0"].hi


def test_decomposition_of_an_engine_that_reserves_and_of_one_that_does_not(table, data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    dec = pt.decomposition(("trtllm-gne", "vllm-v1")).set_index("engine")
    assert np.allclose(dec["busy_ratio"], dec["cost_ratio"] * dec["tokens_ratio"], rtol=1e-12)
    gne, v1 = dec.loc["trtllm-gne"], dec.loc["vllm-v1"]
    # TRT-LLM's default reserves max_new: it never preempts, so both arms feed the same tokens, and it is
    # slower per token (fewer requests fit in a batch)
    assert gne["reads_max_new"] and gne["tokens_ratio"] == 1.0 and gne["cost_ratio"] > 2
    # vLLM v1 never reads max_new: the default and the true-length arm are the same run
    assert not v1["reads_max_new"] and v1["busy_ratio"] == 1.0
    with pytest.raises(ValueError, match="engines"):
        pt.decomposition(("vllm-v2",))
