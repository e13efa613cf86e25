"""The paper's instance families built from the real Azure 2023 traces (skipped without the data)."""

from __future__ import annotations

import numpy as np
import pytest

from kvdro.joint import evaluate, paper_instance, solve_exact


@pytest.fixture(autouse=True)
def _data(data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))


def test_small_instance_shape_and_determinism():
    a = paper_instance("small", 3)
    b = paper_instance("small", 3)
    c = paper_instance("small", 4)
    assert a.n_classes == 6 and a.total_gpus == 8 and a.n_configs == 4
    assert {cl.n_samples for cl in a.classes} == {200}
    assert [cfg.config.name for cfg in a.configs] == ["TP2-PP1", "TP4-PP1", "TP2-PP2", "TP4-PP2"]
    for x, y in zip(a.classes, b.classes):
        np.testing.assert_array_equal(x.output_tokens, y.output_tokens)
    assert any(not np.array_equal(x.output_tokens, y.output_tokens) for x, y in zip(a.classes, c.classes))
    # rates: the trace's own (requests / span), halved by the default load
    from kvdro.datasets import load_trace

    own = sum(len(df) / df["arrival_s"].max() for df in map(load_trace, ("azure-2023-code", "azure-2023-conv")))
    assert a.rates.sum() == pytest.approx(0.5 * own, rel=1e-9)


def test_bad_paper_instance_arguments():
    with pytest.raises(ValueError, match="size"):
        paper_instance("medium", 0)
    with pytest.raises(ValueError, match="seed"):
        paper_instance("small", -1)
    with pytest.raises(ValueError, match="load"):
        paper_instance("small", 0, load=0.0)


def test_small_instance_proven_optimal_and_scored_consistently():
    inst = paper_instance("small", 0)
    sol = solve_exact(inst)
    ev = evaluate(inst, sol)
    assert sol.status == "optimal" and sol.mip_gap <= 1e-6
    assert ev.feasible
    assert ev.total == pytest.approx(sol.objective, rel=1e-6)
    assert sol.lower_bound <= sol.objective * (1 + 1e-9)
    # block granular: every buffer is a whole number of 16-token blocks
    eta = sol.r - inst.input_tokens
    np.testing.assert_allclose(eta / 16, np.round(eta / 16), atol=1e-9)
    assert inst.gpus @ sol.z <= inst.total_gpus


def test_band_edge_example_of_issue_12_on_the_small_instance():
    """The optimum's groups sit on a band edge; nudging one class's routing so that u rises by 1.6e-7
    must not move W or the total (it used to: W x2.5, total +2.8%, no violation)."""
    from kvdro.joint import Solution
    from kvdro.joint.serving import band_edges

    inst = paper_instance("small", 0)
    sol = solve_exact(inst)
    ev = evaluate(inst, sol)
    edges = band_edges(inst)
    k = int(np.argmax(ev.utilisation))
    assert np.min(np.abs(edges - ev.utilisation[k])) < 1e-6  # on an edge
    T = np.where(sol.delta, inst.service_s[:, :, 1], inst.service_s[:, :, 0])
    i = int(np.argmax(sol.pi[:, k]))
    pi = sol.pi.copy()
    pi[i, k] += 1.6e-7 * sol.z[k] / (inst.rates[i] * T[i, k])
    nudged = evaluate(inst, Solution(z=sol.z, r=sol.r, pi=pi, delta=sol.delta))
    assert nudged.utilisation[k] == pytest.approx(ev.utilisation[k] + 1.6e-7, abs=1e-12)
    np.testing.assert_allclose(nudged.waiting_s, ev.waiting_s)
    assert nudged.total == pytest.approx(ev.total, rel=1e-5)


def test_cached_base_models_equal_a_fresh_fit():
    """data/paper_base_models.json (the large family's EM fits, cached for speed) is what fitting the
    traces gives today; `python -m kvdro.bench exact --refit` rewrites it."""
    from kvdro.joint import paper
    from kvdro.workload import load_class_models

    assert paper.BASE_MODELS_FILE.exists()
    cached = load_class_models(paper.BASE_MODELS_FILE)
    fresh = paper.fit_base_models()
    assert [m.to_dict() for m in cached] == [m.to_dict() for m in fresh]
