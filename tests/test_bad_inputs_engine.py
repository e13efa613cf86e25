"""Issue 36, the engine side: integers that cannot wrap, one envelope for both engines, tables
sized by the trace, and the weak messages of the Python API named. Each test quotes the "before"."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig
from kvdro.sim import Deployment, default_deployment, policy_buffers, simulate
from kvdro.sim import engine_compiled as ec
from kvdro.sim.engine_reference import run_reference
from kvdro.sim.envelope import MAX_TOKENS, check_envelope, drain_lower_bound_ps, prefill_tokens_bound
from kvdro.sim.scheduler import EngineInput, EngineSpec
from kvdro.sim.timing import MAX_CLOCK_PS, ClockLimitError, StepClock

CLOCK = StepClock.shared(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))


def _trace(n: int = 200, prompt: int = 100, output: int = 100, arrival: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": np.full(n, arrival), "input_tokens": np.full(n, prompt),
                         "output_tokens": np.full(n, output), "request_class": "a"})


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


# ------------------------------------------------------------------ 1. integers that cannot wrap


def test_a_huge_buffer_is_clipped_to_the_window_not_wrapped():
    """Before: buffers={"a": 1e19} wrapped in the int64 cast: reserved_blocks.min() = -576460752303423481 and
    the requests were admitted like vLLM's (2,000 concurrent: 750 preemptions instead of 0)."""
    tr = _trace(2000, prompt=100, output=300)
    window = 16_384 // 16
    runs = {eta: simulate(tr, policy="saa", buffers={"a": eta}, rng=_rng()) for eta in (1e19, 1e300, 16_284.0)}
    for eta, r in runs.items():
        assert (r.requests["reserved_blocks"] == window).all(), eta
        assert r.metrics["preemptions"] == 0, eta
    assert runs[1e19].clipped_buffers == 2000 and runs[1e300].clipped_buffers == 2000
    assert runs[16_284.0].clipped_buffers == 0  # exactly the room the window leaves: not clipped
    cols = ["reserved_blocks", "admit_s", "finish_s", "preemptions"]
    assert runs[1e19].requests[cols].equals(runs[16_284.0].requests[cols])
    assert runs[1e19].requests["buffer_tokens"].iloc[0] == 1e19  # the column keeps the buffer asked for


def test_clipped_buffers_counts_only_served_requests_above_the_window():
    tr = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "input_tokens": [100, 3000, 5000, 4000],
                       "output_tokens": [10, 10, 10, 10], "request_class": "a"})
    dep = default_deployment(max_model_len=4096)
    r = simulate(tr, policy="saa", buffers={"a": 1500.0}, deployment=dep, rng=_rng())
    # 100 + 1500 fits; 3000 + 1500 and 4000 + 1500 pass the window; the 5000-token prompt is ignored
    assert r.clipped_buffers == 2
    assert r.requests["reserved_blocks"].tolist()[:2] == [-(-1600 // 16), 4096 // 16]
    assert simulate(tr, policy="vllm", deployment=dep, rng=_rng()).clipped_buffers == 0


@pytest.mark.parametrize("column, values", [
    ("output_tokens", np.array([5, 99999999999999999999, 7], dtype=object)),  # before: -9223372036854775808
    ("output_tokens", np.array([5, 9223372036854775000, 7], dtype=np.int64)),
    ("output_tokens", np.array([5, 2**63 + 5, 7], dtype=np.uint64)),  # before: "mean_output_tokens: ..."
    ("input_tokens", np.array([5, 2**53 + 2, 7], dtype=np.int64)),
    ("output_tokens", np.array([5, 1e300, 7])),
])
def test_token_counts_above_2_53_are_named_by_column_and_row(column, values):
    tr = _trace(3)
    tr[column] = values
    with pytest.raises(ValueError, match=rf"trace: column '{column}' holds \S+ tokens in row 1, more than the 2\*\*53"):
        simulate(tr, policy="max", rng=_rng(), deployment=default_deployment(max_model_len=4096))


def test_token_counts_up_to_2_53_pass_the_trace_check():
    from kvdro.sim import check_trace

    tr = _trace(3)
    tr["output_tokens"] = np.array([5, MAX_TOKENS, 7], dtype=np.int64)
    assert check_trace(tr) is tr


def test_uint64_token_counts_in_range_give_the_int64_answer():
    """A uint64 column (a CSV reader's choice) is read as the same integers; only values past 2**53 are refused."""
    tr = _trace(50, output=40)
    a = simulate(tr, policy="p90", rng=_rng())
    b = simulate(tr.astype({"output_tokens": np.uint64, "input_tokens": np.uint64}), policy="p90", rng=_rng())
    assert a.requests.equals(b.requests)


@pytest.mark.parametrize("engine", ["reference", "compiled"])
def test_engines_refuse_token_counts_outside_their_integers(engine):
    """An EngineInput built by hand (no check_trace) is checked by the engine itself."""
    n = 3
    spec = EngineSpec(blocks=400, watermark_blocks=1, max_num_seqs=4, token_budget=400, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, np.int64), prompt=np.array([10, 2**53 + 1, 10], np.int64),
                      output=np.full(n, 5, np.int64), reserve_blocks=np.zeros(n, np.int64),
                      prefix_key=np.full(n, -1, np.int64), shared_blocks=np.zeros(n, np.int64))
    with pytest.raises(ValueError, match=r"prompt: token counts must be integers in \[1, 2\*\*53\]; request 1 has 9007199254740993"):
        _run(engine, spec, inp)


def test_a_decode_step_beyond_the_checked_integers_is_refused_naming_spec():
    """A pool of 10**9 blocks and 256 sequences of 10**6 tokens: a decode step would last ~20 s, beyond the
    2**43 ps for which every engine's int64 arithmetic is checked."""
    n = 300
    spec = EngineSpec(blocks=10**9, watermark_blocks=1, max_num_seqs=256, token_budget=2 * 10**6, free_block_rule=True)
    inp = EngineInput(arrival_ps=np.zeros(n, np.int64), prompt=np.full(n, 10**6, np.int64), output=np.full(n, 10, np.int64),
                      reserve_blocks=np.zeros(n, np.int64), prefix_key=np.full(n, -1, np.int64),
                      shared_blocks=np.zeros(n, np.int64))
    with pytest.raises(ValueError, match=r"spec/clock: a decode step of one TP4-PP1 engine .* could last"):
        check_envelope(spec, inp, CLOCK)


# ------------------------------------------------------------------ 4. one envelope for the engines


def _run(engine: str, spec: EngineSpec, inp: EngineInput):
    if engine == "reference":
        return run_reference(spec, inp, CLOCK)
    return ec.run_compiled(spec, inp, CLOCK)


def _late_burst(n: int = 30) -> tuple[EngineSpec, EngineInput]:
    """Requests arriving 10 s before the drain limit: serving 30 of them takes 18.5 s (their drain's lower
    bound is 3.0 s, so they are refused while running, not up front)."""
    spec = EngineSpec(blocks=4000, watermark_blocks=40, max_num_seqs=16, token_budget=16_384, free_block_rule=True)
    rng = np.random.default_rng(1)
    inp = EngineInput(arrival_ps=np.full(n, MAX_CLOCK_PS - 10 * 10**12, np.int64), prompt=rng.integers(500, 2000, n),
                      output=rng.integers(50, 200, n), reserve_blocks=np.zeros(n, np.int64),
                      prefix_key=np.full(n, -1, np.int64), shared_blocks=np.zeros(n, np.int64))
    return spec, inp


def _error(engine: str, spec: EngineSpec, inp: EngineInput) -> str:
    with pytest.raises(ClockLimitError) as err:
        _run(engine, spec, inp)
    return str(err.value)


def test_a_run_past_the_clock_is_refused_while_running_by_every_engine_with_one_message():
    """Before: the Python engines raised OverflowError when copying the finish times, the compiled one a
    ValueError about its 'exact integer range' at another point (3 x 2**61 ps instead of 2**63)."""
    spec, inp = _late_burst()
    assert drain_lower_bound_ps(spec, inp, CLOCK) < MAX_CLOCK_PS  # not refused up front: during the run
    messages = {e: _error(e, spec, inp) for e in ("reference", "compiled")}
    assert len(set(messages.values())) == 1, messages
    assert "the clock passed it before the queue drained" in messages["reference"]
    assert "30 requests sent to one TP4-PP1 engine" in messages["reference"]


def test_the_issue_drain_case_is_refused_up_front_by_every_engine():
    """Before: 40,000 requests at one timestamp with 16,000-token outputs on one TP2 group -> OverflowError
    traceback (Python engines); the compiled engine refused at 30,000 already, where Python completed."""
    tr = _trace(40_000, prompt=300, output=16_000)
    dep = default_deployment(config="TP2-PP1", groups=1)
    messages = set()
    for engine in ("reference", "fast"):
        with pytest.raises(ClockLimitError, match=r"serving them takes at least 8\.\d+e\+06 s \(a lower bound") as err:
            simulate(tr, policy="vllm", deployment=dep, rng=_rng(), implementation=engine)
        messages.add(str(err.value))
    assert len(messages) == 1
    assert "the 40,000 requests sent to one TP2-PP1 engine do not drain" in messages.pop()


def test_the_drain_bound_is_below_the_real_drain_on_the_issue_scale():
    """The lower bound is a bound (also checked on every property-test case in test_sim_engines.py), and a
    useful one: within 10 % of the drain of 3,000 long requests on one TP2 engine."""
    tr = _trace(3_000, prompt=300, output=16_000)
    r = simulate(tr, policy="vllm", deployment=default_deployment(config="TP2-PP1", groups=1), rng=_rng())
    (spec, out, inp) = (r.specs[0], r.outputs[0], r.inputs[0])
    clock = StepClock.shared(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
    bound = drain_lower_bound_ps(spec, inp, clock)
    assert 0.85 * out.end_ps < bound <= out.end_ps


@pytest.mark.parametrize("kwargs, name", [({"implementation": "fast-python"}, "implementation"),
                                          ({"engine": "fast-python"}, "engine"),
                                          ({"engine": "vllm-v1", "implementation": "fast-python"}, "implementation")])
def test_the_retired_python_engine_is_refused_saying_what_replaces_it(kwargs, name):
    """Issue 32 retired vLLM v0's pure-Python event engine (engine_fast.py): asking for it names the
    argument and points at the compiled engine (plain Python under NUMBA_DISABLE_JIT=1) and the reference."""
    with pytest.raises(ValueError, match=f"^{name}: 'fast-python' is retired") as err:
        simulate(_trace(4), policy="vllm", rng=_rng(), **kwargs)
    assert "implementation='fast'" in str(err.value) and "NUMBA_DISABLE_JIT=1" in str(err.value)
    assert "implementation='reference'" in str(err.value)


# ------------------------------------------------------------------ 5. tables sized by the trace


def test_the_compiled_tables_are_sized_by_the_trace_not_the_budget():
    """Before: Deployment(max_num_batched_tokens=10**8) tabulated 10**8 prefill times (~12 min, 800 MB)
    before serving 50 requests."""
    tr = pd.DataFrame({"arrival_s": np.arange(50) * 0.1, "input_tokens": 100 + 7 * np.arange(50),
                       "output_tokens": 30 + np.arange(50), "request_class": "a"})
    dep = default_deployment(max_num_batched_tokens=10**8, groups=1)
    ref = simulate(tr, policy="vllm", deployment=dep, rng=_rng(), implementation="reference")
    spec, inp = ref.specs[0], ref.inputs[0]
    clock = StepClock(dep.model, dep.gpu, dep.groups[0])  # a fresh clock: its tables start empty
    out = ec.run_compiled(spec, inp, clock)
    bound = prefill_tokens_bound(spec, inp)
    assert bound == int((inp.prompt + inp.output - 1).sum())  # 50 requests: all of them, far below 10**8
    assert ec._TABLES[clock][1].size == bound + 1
    assert ec._TABLES[clock][0].size == len(inp) + 1  # base(n): no more sequences than requests run at once
    assert out.totals() == ref.outputs[0].totals()
    np.testing.assert_array_equal(out.finish_ps, ref.outputs[0].finish_ps)


# ------------------------------------------------------------------ 7. the weak messages named


@pytest.mark.parametrize("kw, name", [
    ({"rho": "10"}, "rho"),  # before: TypeError from numpy's isfinite
    ({"rho": True}, "rho"),  # before: accepted as rho = 1
    ({"eps_fraction": "0.15"}, "eps_fraction"),
    ({"eps_fraction": True}, "eps_fraction"),
    ({"costs": {"c_w": "1"}}, "costs['c_w']"),
    ({"costs": {"c_rej": True}}, "costs['c_rej']"),
    ({"buffers": {"a": "10"}}, "buffers['a']"),  # before: float("10") accepted
    ({"buffers": {"a": True}}, "buffers['a']"),  # before: accepted as 1 token
])
def test_string_or_boolean_numbers_are_refused_naming_the_argument(kw, name):
    with pytest.raises(ValueError, match="^" + re.escape(name) + ": must be a finite number"):
        simulate(_trace(5), policy="saa", rng=_rng(), **kw)


@pytest.mark.parametrize("kw, name", [({"rho": "10"}, "rho"), ({"rho": True}, "rho"), ({"c_w": True}, "c_w"),
                                      ({"eps_fraction": "0.1"}, "eps_fraction")])
def test_policy_buffers_refuses_string_or_boolean_numbers(kw, name):
    with pytest.raises(ValueError, match=rf"^{name}: must be a finite number"):
        policy_buffers("dro", _trace(5), **({"rho": 10.0} | kw))


@pytest.mark.parametrize("column, value, message", [
    ("input_tokens", True, r"column 'input_tokens' must hold numbers \[tokens\], not True/False"),  # before: 1 token
    ("output_tokens", False, r"column 'output_tokens' must hold numbers \[tokens\], not True/False"),
    ("input_tokens", "100", r"column 'input_tokens' must hold numbers \[tokens\], not text.*row 0 has '100'"),
    ("arrival_s", pd.Timestamp("2023-11-16 18:15:46"), r"column 'arrival_s' must hold numbers \[s\], got datetime64"),
    ("arrival_s", pd.Timedelta(seconds=3), r"column 'arrival_s' must hold numbers \[s\], got timedelta64"),
])
def test_booleans_text_and_datetimes_in_a_trace_are_named(column, value, message):
    """Before: input_tokens=True served as 1-token prompts; datetime64 arrivals read as nanoseconds."""
    tr = _trace(4)
    tr[column] = value
    with pytest.raises(ValueError, match=rf"^trace: {message}"):
        simulate(tr, policy="vllm", rng=_rng())


@pytest.mark.parametrize("column", ["output_tokens", "input_tokens", "arrival_s"])
def test_a_repeated_column_is_refused_not_read_first(column):
    """Before: two output columns -> TypeError from pandas (a DataFrame), or, read from a CSV (pandas names
    the second 'output_tokens.1'), the first used silently."""
    tr = _trace(4)
    twice = pd.concat([tr, tr[[column]]], axis=1)
    with pytest.raises(ValueError, match=rf"trace: column '{column}' appears 2 times"):
        simulate(twice, policy="vllm", rng=_rng())
    mangled = tr.assign(**{f"{column}.1": tr[column] + 1})
    with pytest.raises(ValueError, match=rf"trace: column '{column}' appears 2 times \(\['{column}', '{column}\.1'\]"):
        simulate(mangled, policy="vllm", rng=_rng())


def test_a_repeated_request_class_column_is_refused():
    tr = _trace(4)
    with pytest.raises(ValueError, match="trace: column 'request_class' appears more than once"):
        simulate(pd.concat([tr, tr[["request_class"]]], axis=1), policy="vllm", rng=_rng())


def test_a_watermark_that_leaves_no_room_is_blamed_on_the_watermark():
    """Before: Deployment(watermark=0.999) -> "max_model_len: 16384 tokens do not fit one engine of TP4-PP1"."""
    with pytest.raises(ValueError, match=r"^watermark: 0\.999 keeps 30999 of the 31031 blocks"):
        Deployment(groups=("TP4-PP1",), watermark=0.999)
    with pytest.raises(ValueError, match=r"^max_model_len: "):  # a window too long for the pool itself
        Deployment(groups=("TP2-PP1",), max_model_len=10**6)
    assert Deployment(groups=("TP4-PP1",), watermark=0.9).watermark == 0.9  # room left: accepted


def test_kmax_outside_the_checked_range_is_refused():
    spec, inp = _late_burst(2)
    for kmax in (0, ec.KMAX + 1, 2.5, True):
        with pytest.raises(ValueError, match=r"^kmax: must be an integer in \[1, 65536\]"):
            ec.run_compiled(spec, inp, CLOCK, kmax=kmax)


@pytest.mark.parametrize("hint", [["5", "6", "7", "8"], [True, False, True, True]])
def test_a_length_hint_of_text_or_booleans_is_named(hint):
    with pytest.raises(ValueError, match=r"^length_hint: must hold numbers \[tokens\]"):
        simulate(_trace(4), policy="vllm", schedule="sof", length_hint=hint, rng=_rng())


@pytest.mark.parametrize("tp, pp", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_the_drain_bound_assumptions_hold_for_the_book_configurations(tp, pp):
    """drain_lower_bound_ps assumes the prefill floor S0(T) non-decreasing in the tokens T and the decode
    step's batch term base(n) non-decreasing in n up to its rounding (1 ps); both hold on the paper's
    four configurations (and were checked once on every model x GPU x (TP, PP) of kvdro.hardware,
    108 clocks, T up to 40,000)."""
    from kvdro.hardware import step_time

    clock = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(tp, pp))
    s0 = np.array([step_time(LLAMA2_70B, A100_80GB, clock.config, t, 0, 0, prefill_attention_tokens2=0)
                   for t in range(1, 16_385)])
    assert np.all(np.diff(s0) >= 0)
    base = np.array([clock.decode_base_ps(n) for n in range(1, 513)])
    assert np.all(np.diff(base) >= -1)


@pytest.mark.parametrize("column, value", [("output_tokens", "100"), ("output_tokens", True), ("input_tokens", "7")])
def test_policy_buffers_refuses_text_or_boolean_token_columns(column, value):
    """Before: a training trace whose outputs were text ("100") was fitted as numbers; booleans as 0/1 tokens."""
    train = _trace(5).assign(**{column: value})
    with pytest.raises(ValueError, match=rf"^train: column '{column}' must hold numbers \[tokens\]"):
        policy_buffers("p90", train, rho=10.0)


def test_the_context_window_is_the_models_own_and_never_exceeded():
    """Issue 33 item 3: a deployment of a model serves at most that model's window (unset: the window
    itself); the book's default Llama-2-70B-shaped model keeps its documented 16,384 tokens."""
    from kvdro.hardware import LLAMA2_7B, LLAMA31_70B
    from kvdro.sim.deployment import MAX_MODEL_LEN, Deployment

    assert Deployment(groups=("TP4-PP1",)).max_model_len == MAX_MODEL_LEN == 16_384
    assert Deployment(groups=("TP1-PP1",), model=LLAMA2_7B).max_model_len == 4096
    assert Deployment(groups=("TP4-PP1",), model=LLAMA31_70B, max_model_len=8192).max_model_len == 8192
    with pytest.raises(ValueError, match=r"max_model_len: 16384 tokens is beyond Llama-2-7B's context window of 4096"):
        Deployment(groups=("TP1-PP1",), model=LLAMA2_7B, max_model_len=16_384)


def test_the_presets_share_the_engines_envelope(monkeypatch):
    """Issue 36 item 4 for the issue-32 presets: a clock that passes the limit raises the same
    ClockLimitError as the vLLM v0 engines (their token and arrival checks are envelope.check_inputs, shared)."""
    import numpy as np
    import pandas as pd

    from kvdro.sim import simulate
    from kvdro.sim import engine_presets
    from kvdro.sim.timing import ClockLimitError

    tr = pd.DataFrame({"arrival_s": [0.0, 0.1], "input_tokens": [100, 100], "output_tokens": [10, 20],
                       "request_class": ["a", "a"]})
    monkeypatch.setattr(engine_presets, "MAX_CLOCK_PS", 10**6)  # one microsecond: the first step passes it
    with pytest.raises(ClockLimitError, match="do not drain"):
        simulate(tr, policy="vllm", engine="vllm-v1", rng=np.random.default_rng(0), implementation="reference")
