"""The step-by-step comparison of ``python -m kvdro.bench conformance`` on hand-made records.

The vLLM replay itself (vLLM 0.11.0 in ``.venv-vllm``) is not run here; its cached result is checked
against its manifest when it exists.
"""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from kvdro.bench import conformance as cf


def rec(step, scheduled, preempted=(), finished=()):
    return {"step": step, "scheduled": dict(scheduled), "preempted": list(preempted), "finished": list(finished)}


# Two requests, a 40-token prompt under a 32-token budget (chunked), then b arrives and a is preempted.
THEIRS = [
    rec(0, {"a": 32}),
    rec(1, {"a": 8, "b": 20}),
    rec(2, {"a": 1}, preempted=["b"]),
    rec(3, {"a": 1, "b": 21}, finished=["a"]),
    rec(4, {"b": 1}, finished=["b"]),
]


def test_identical_replays_agree_on_every_step():
    cmp = cf.compare_steps(copy.deepcopy(THEIRS), THEIRS)
    assert (cmp.identical, cmp.compared, cmp.share_identical) == (5, 5, 1.0)
    assert cmp.first_divergence is None and cmp.difference == ""
    assert (cmp.preemptions_ours, cmp.preemptions_theirs, cmp.finished_ours, cmp.finished_theirs) == (1, 1, 2, 2)


def test_first_divergence_is_the_first_differing_step_with_both_records():
    ours = copy.deepcopy(THEIRS)
    ours[1]["scheduled"]["b"] = 16  # a smaller chunk for b
    ours[3]["finished"] = []
    cmp = cf.compare_steps(ours, THEIRS)
    assert cmp.identical == 3 and cmp.share_identical == pytest.approx(3 / 5)
    assert cmp.first_divergence == 1
    assert cmp.ours_at_divergence["scheduled"] == {"a": 8, "b": 16}
    assert cmp.theirs_at_divergence == THEIRS[1]
    assert cmp.difference == "token counts differ: b ours 16 / vLLM 20"


def test_a_missing_request_a_victim_and_a_finish_are_each_a_difference():
    base = rec(0, {"a": 1, "b": 1}, preempted=["c", "d"], finished=["a", "b"])
    assert cf.same_step(base, rec(0, {"b": 1, "a": 1}, preempted=["c", "d"], finished=["b", "a"]))  # finish order free
    assert not cf.same_step(base, rec(0, {"a": 1}, preempted=["c", "d"], finished=["a", "b"]))
    assert not cf.same_step(base, rec(0, {"a": 1, "b": 1}, preempted=["d", "c"], finished=["a", "b"]))  # victim order
    assert not cf.same_step(base, rec(0, {"a": 1, "b": 1}, preempted=["c", "d"], finished=["a"]))
    text = cf.describe_difference(rec(0, {"a": 1, "x": 5}, preempted=["c"]), rec(0, {"a": 1, "y": 7}, finished=["a"]))
    assert text == ("scheduled only by ours: x (5 tokens); scheduled only by vLLM: y (7 tokens); "
                    "preempted: ours ['c'] / vLLM []; finished: ours [] / vLLM ['a']")


def test_a_longer_replay_counts_its_extra_steps_as_differing():
    cmp = cf.compare_steps(THEIRS[:3], THEIRS)
    assert (cmp.identical, cmp.compared, cmp.first_divergence) == (3, 5, 3)
    assert cmp.ours_at_divergence is None and cmp.theirs_at_divergence == THEIRS[3]
    assert cmp.difference == "only vLLM has this step"
    assert cf.compare_steps([], []).share_identical == 1.0


@pytest.mark.parametrize("bad, message", [
    ([rec(1, {})], r"ours\[0\]\.step"),
    ([{"step": 0, "scheduled": {}}], r"ours\[0\]: missing key"),
    ([rec(0, {"a": 0})], r"ours\[0\]\.scheduled\['a'\]"),
    ([rec(0, {"a": True})], r"ours\[0\]\.scheduled\['a'\]"),
    ([{"step": 0, "scheduled": {}, "preempted": "ab", "finished": []}], r"ours\[0\]\.preempted"),
    ("records", r"ours: must be a list"),
])
def test_bad_records_name_the_record_and_field(bad, message):
    with pytest.raises(ValueError, match=message):
        cf.compare_steps(bad, THEIRS)


def test_replay_requests_cut_the_trace_and_derive_arrival_steps():
    trace = pd.DataFrame({"arrival_s": [10.0, 10.04, 10.05, 10.26, 11.0],
                          "input_tokens": [100, 5000, 30, 40, 50], "output_tokens": [10, 10, 20, 30, 40],
                          "request_class": ["conversation"] * 5})
    s = cf.Settings(requests=3, step_ms=50.0, max_model_len=4096)
    req = cf.replay_requests(s, trace)
    assert req["request_id"].tolist() == ["0", "2", "3"]  # row 1 does not fit the window
    assert req["arrival_step"].tolist() == [0, 1, 5]
    assert req["input_tokens"].tolist() == [100, 30, 40]
    with pytest.raises(ValueError, match="requests: only 4"):
        cf.replay_requests(cf.Settings(requests=5), trace)
    with pytest.raises(ValueError, match="step_ms"):
        cf.replay_requests(cf.Settings(step_ms=0.0), trace)


def test_cached_result_matches_its_manifest_and_is_consistent():
    if not cf.CACHE.exists():
        pytest.skip("no cached conformance result")
    df = cf.load_cached()
    assert set(df["variant"]) == set(cf.VARIANTS) | {cf.CONTROL}
    assert {(True, True), (False, False), (True, False)} == set(zip(df.vllm_prefix_caching, df.ours_prefix_caching))
    for row in df.itertuples():
        assert row.identical <= row.compared == max(row.steps_ours, row.steps_theirs)
        assert row.share_identical == pytest.approx(row.identical / row.compared, rel=1e-9)
        assert (row.first_divergence == -1) == (row.identical == row.compared)
        assert row.finished_theirs == row.requests  # vLLM finished every request
    control = df[df["variant"] == cf.CONTROL].iloc[0]
    assert control.ours_num_blocks == control.num_blocks - 1
    shown = cf.summary(df)
    assert len(shown) == len(df) and shown["share"].str.endswith("%").all()
    assert (shown["first divergence"] == "").tolist() == (df["first_divergence"] == -1).tolist()


def test_the_vllm_driver_refuses_bad_input_before_importing_vllm():
    from kvdro.bench import _vllm_replay as vr

    engine = cf.Settings().engine(False)
    good = {"request_id": "a", "arrival_step": 0, "input_tokens": 10, "output_tokens": 5}
    assert vr._check_input({"requests": [good], "engine": engine}) == ([good], engine)
    with pytest.raises(ValueError, match="engine: missing keys"):
        vr._check_input({"requests": [good], "engine": {"block_size": 16}})
    with pytest.raises(ValueError, match=r"engine\.num_gpu_blocks"):
        vr._check_input({"requests": [good], "engine": {**engine, "num_gpu_blocks": 0}})
    with pytest.raises(ValueError, match=r"requests\[1\]\.request_id"):
        vr._check_input({"requests": [good, good], "engine": engine})
    with pytest.raises(ValueError, match=r"requests\[0\]: input_tokens \+ output_tokens"):
        vr._check_input({"requests": [{**good, "input_tokens": 4095}], "engine": engine})


@pytest.mark.parametrize("argv, flag", [(["--requests", "0"], "--requests"), (["--step-ms", "0"], "--step-ms"),
                                        (["--num-blocks", "-1"], "--num-blocks"),
                                        (["--long-prefill-token-threshold", "-5"], "--long-prefill-token-threshold")])
def test_bench_refuses_bad_settings(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        cf.main(argv)
    assert e.value.code == 2 and f"{flag}:" in capsys.readouterr().err


def test_bench_without_vllm_venv_names_the_install_target(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cf, "VLLM_PYTHON", tmp_path / ".venv-vllm" / "bin" / "python")
    assert cf.main([]) == 2
    assert "make conformance-install" in capsys.readouterr().err


def test_bench_all_skips_the_replay_without_its_install(monkeypatch, capsys):
    """`python -m kvdro.bench all` skips the vLLM replay (saying so) when .venv-vllm is missing; the
    replay alone still refuses with exit 2."""
    import kvdro.bench.__main__ as dispatch
    from kvdro.bench import conformance

    monkeypatch.setattr(conformance, "VLLM_PYTHON", conformance.VLLM_PYTHON.parent / "no-such-python")
    monkeypatch.setattr(dispatch, "available", lambda: ["conformance"])
    assert dispatch.main(["all"]) == 0
    assert "[SKIP] conformance" in capsys.readouterr().out
    assert dispatch.main(["conformance"]) == 2
