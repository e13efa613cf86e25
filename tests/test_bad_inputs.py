"""Bad input raises ValueError naming the argument, for every public function of newsvendor,
wasserstein, hardware (KV bytes and capacity), datasets and workload.

Each case is (function, good keyword arguments, argument, bad value). The good arguments alone are
valid; replacing one argument by a bad value must raise ``ValueError`` whose message names it.
Bad values that used to slip through: strings that ``float()`` accepts (``"100"``), booleans
(``True == 1``), ``None``, 2-D arrays (silently flattened before), swapped model/GPU objects.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvdro import datasets, hardware, newsvendor, wasserstein, workload
from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig

SAMPLES = [1.0, 5.0, 7.0]
BAD_SAMPLES = [[], [[1.0, 5.0], [7.0, 2.0]], ["1", "5"], [True, False], None, "15", [1.0, math.nan], [-1.0, 2.0]]
BAD_REAL = ["5", True, None, math.nan, math.inf, [1.0, 2.0]]
BAD_COST = ["2", True, None, math.nan, -1.0]
BAD_LMAX = [None, "100", True, 0.0, -5.0, math.nan, math.inf]
BAD_EPS = ["1", True, None, -1.0, math.nan]

NV = {"samples": SAMPLES, "c_p": 10.0, "c_w": 1.0}
WS = NV | {"eps": 1.0, "L_max": 10.0}


def _cases(function, good: dict, bad: dict[str, list]) -> list:
    return [
        pytest.param(function, good, name, value, id=f"{function.__qualname__}-{name}-{value!r}"[:90])
        for name, values in bad.items()
        for value in values
    ]


def _toy_trace() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_s": np.arange(6, dtype=float),
            "input_tokens": np.array([100, 120, 140, 160, 180, 200]),
            "output_tokens": np.array([5, 6, 7, 8, 9, 10]),
            "request_class": "a",
        }
    )


LENGTH = {"weights": (1.0,), "mu": (3.0,), "sigma": (0.5,), "low": 1, "high": 100}
LM = workload.LengthModel(**LENGTH)
CLASS_MODEL = {
    "name": "a",
    "arrival_rate": 1.0,
    "interarrival_cv": 1.0,
    "input_model": LM,
    "output_model": LM,
    "prefix_tokens": 4.0,
    "slo_s": 5.0,
}
CM = workload.ClassModel(**CLASS_MODEL)
RC = workload.RequestClass("a", 1.0, np.arange(10, 130, 10), np.arange(1, 13))
RNG = np.random.default_rng(0)

CASES = [
    # ------------------------------------------------------------------ newsvendor
    *_cases(newsvendor.critical_fractile, {"rho": 2.0}, {"rho": ["2", True, None, math.nan, 0.0, -1.0, [2.0]]}),
    *_cases(newsvendor.check_costs, {"c_p": 2.0, "c_w": 1.0}, {"c_p": BAD_COST, "c_w": BAD_COST}),
    *_cases(newsvendor.support_bound, {"L_max": 10.0}, {"L_max": BAD_LMAX}),
    *_cases(newsvendor.as_samples, {"samples": SAMPLES, "L_max": 10.0},
            {"samples": BAD_SAMPLES + [[1.0, 11.0]], "L_max": BAD_LMAX[1:]}),
    *_cases(newsvendor.loss, {"xi": SAMPLES, "eta": 2.0, "c_p": 2.0, "c_w": 1.0},
            {"xi": [["a"], [True], [math.nan]], "eta": BAD_REAL[:-1], "c_p": BAD_COST, "c_w": BAD_COST}),
    *_cases(newsvendor.expected_cost, NV | {"eta": 2.0},
            {"samples": BAD_SAMPLES, "eta": BAD_REAL, "c_p": BAD_COST, "c_w": BAD_COST}),
    *_cases(newsvendor.saa_reservation, NV,
            {"samples": BAD_SAMPLES, "c_p": BAD_COST + [0.0], "c_w": BAD_COST + [0.0], "method": ["median", 3]}),
    *_cases(newsvendor.saa_problem, NV, {"samples": BAD_SAMPLES, "c_p": BAD_COST, "c_w": BAD_COST}),
    *_cases(newsvendor.solve_lp, {"problem": None, "what": "toy"}, {"problem": [None, "min x", 3]}),
    # ------------------------------------------------------------------ wasserstein
    *[
        case
        for function, extra in (
            (wasserstein.worst_case_cost, {"eta": 2.0}),
            (wasserstein.worst_case_distribution, {"eta": 2.0}),
            (wasserstein.dual_problem, {"eta": 2.0}),
            (wasserstein.primal_problem, {"eta": 2.0}),
            (wasserstein.dro_problem, {}),
            (wasserstein.dro_solution, {}),
            (wasserstein.dro_reservation, {}),
            (wasserstein.saddle_distribution, {}),
        )
        for case in _cases(
            function,
            WS | extra,
            {"samples": BAD_SAMPLES + [[1.0, 11.0]], "c_p": BAD_COST, "c_w": BAD_COST, "eps": BAD_EPS,
             "L_max": BAD_LMAX} | ({"eta": BAD_REAL} if extra else {}),
        )
    ],
    *_cases(wasserstein.worst_case_cost, WS | {"eta": 2.0}, {"method": ["simplex", None]}),
    *_cases(wasserstein.dro_solution, WS, {"method": ["guess", None], "c_p": [0.0]}),
    *_cases(wasserstein.primal_problem, WS | {"eta": 2.0}, {"grid_size": [1, 2.5, "65", True, None]}),
    *_cases(wasserstein.worst_case_cost_many, WS | {"etas": [0.0, 2.0]},
            {"etas": [["1", "2"], [True, False], [0.0, math.nan], None], "L_max": BAD_LMAX,
             "samples": BAD_SAMPLES, "eps": BAD_EPS}),
    *[
        case
        for function in (wasserstein.regime_lines, wasserstein.saa_threshold_radius,
                         wasserstein.transport_room, wasserstein.robust_buffer_path)
        for case in _cases(
            function,
            {"samples": SAMPLES, "c_p": 10.0, "c_w": 1.0, "L_max": 10.0},
            {"samples": BAD_SAMPLES + [[1.0, 11.0]], "c_p": BAD_COST + [0.0], "c_w": BAD_COST + [0.0],
             "L_max": BAD_LMAX},
        )
    ],
    # ------------------------------------------------------------------ hardware: KV bytes and capacity
    *_cases(hardware.kv_bytes_per_token, {"model": LLAMA2_70B}, {"model": ["llama", A100_80GB, None]}),
    *_cases(hardware.weight_bytes, {"model": LLAMA2_70B}, {"model": ["llama", A100_80GB, None]}),
    *_cases(
        hardware.kv_capacity_tokens,
        {"model": LLAMA2_70B, "gpu": A100_80GB, "tp": 4, "pp": 1},
        {
            "model": ["llama", A100_80GB, None],
            "gpu": ["a100", LLAMA2_70B, None],
            "tp": [3, 5, 6, 0, -2, "4", 4.0, True, None],  # 3 divides neither 64 heads nor 8 KV heads
            "pp": [0, "1", 1.0, True, None, 81],
            "gpu_memory_utilization": ["0.9", True, None, 0.0, 1.5, math.nan],
            "activation_reserve_bytes": ["1", None, -1, math.nan],
        },
    ),
    *_cases(hardware.config_performance,
            {"model": LLAMA2_70B, "gpu": A100_80GB, "config": ParallelConfig(4, 1)},
            {"model": [A100_80GB, "llama"], "gpu": [LLAMA2_70B], "config": [(4, 1), "TP4-PP1", None],
             "decode_batch": [0, 1.5, "64", True]}),
    *_cases(ParallelConfig, {"tp": 4, "pp": 1}, {"tp": [0, 2.0, "2", True, None], "pp": [0, 1.5, "1", False, None]}),
    *_cases(hardware.configs_for, {"gpus": 8}, {"gpus": [0, 8.0, "8", True, None]}),
    *_cases(hardware.prefill_flops_per_token, {"model": LLAMA2_70B, "prompt_tokens": 10.0},
            {"model": [A100_80GB, "llama"], "prompt_tokens": [-1.0, "10", None, math.nan]}),
    # ------------------------------------------------------------------ datasets (no file is read)
    *_cases(datasets.fetch, {"name": "azure-2023-code"},
            {"name": [3, None, "azure-2025"], "allow_unverified": ["yes", 1, 0.0]}),
    *_cases(datasets.load_trace, {"name": "azure-2023-code"},
            {"name": [3, "vidur-a100-allreduce"], "nrows": [0, -1, 1.5, "5", True], "allow_unverified": ["1"]}),
    *_cases(datasets.read_azure_csv, {"path": "missing.csv", "request_class": "code"},
            {"path": [None, 3], "request_class": [None, 5, ""], "nrows": [0, True, "3"]}),
    *_cases(datasets.read_burstgpt_csv, {"path": "missing.csv"}, {"path": [None, 3], "nrows": [0, True, 2.5]}),
    *_cases(datasets.sha256_of, {"path": "missing.csv"}, {"path": [None, 3]}),
    # ------------------------------------------------------------------ workload
    *_cases(workload.default_slo_s, {"mean_output_tokens": 10.0},
            {"mean_output_tokens": ["10", True, None, -1.0, math.nan]}),
    *_cases(workload.interarrival_cv, {"arrival_s": [0.0, 1.0, 3.0]},
            {"arrival_s": [["0", "1", "3"], [[0.0, 1.0], [2.0, 3.0]], [0.0, 1.0], [True, False, True], [0, 0, 0]]}),
    *_cases(workload.RequestClass,
            {"name": "a", "arrival_rate": 1.0, "input_tokens": [10, 20, 30], "output_tokens": [1, 2, 3]},
            {"name": ["", 3], "arrival_rate": ["1", True, None, 0.0], "input_tokens": [["10"], [[10, 20]], []],
             "output_tokens": [[1.5], [-1], [True]], "interarrival_cv": ["1", None, -1.0],
             "prefix_tokens": ["4", True, 99.0], "slo_s": ["5", True, 0.0], "max_output_tokens": ["5", True, 2, 3.5]}),
    *_cases(workload.LengthModel, LENGTH,
            {"weights": [(0.5,), (-1.0,)], "mu": [(math.nan,)], "sigma": [(0.0,)], "low": [0, None, "1", True, 1.5],
             "high": [None, "100", 0, 2.5], "cap_mass": [1.0, "0", None]}),
    *_cases(LM.cdf, {"x": [1, 2]}, {"x": [["1"], [True]]}),
    *_cases(LM.quantile, {"q": [0.5]}, {"q": [["0.5"], [1.5], [True]]}),
    *_cases(LM.sample, {"n": 3, "rng": RNG}, {"n": [-1, 2.0, "3", True], "rng": [0, None]}),
    *_cases(LM.scaled, {"factor": 2.0}, {"factor": ["2", True, 0.0], "high": ["10", 0, 2.5, True]}),
    *_cases(workload.ClassModel, CLASS_MODEL,
            {"name": ["", None], "arrival_rate": ["1", True], "interarrival_cv": [None, -1.0],
             "input_model": [LENGTH, None], "output_model": ["lm"], "prefix_tokens": ["4"], "slo_s": [0.0, True]}),
    *_cases(workload.ClassModel.from_dict, {"d": CM.to_dict()}, {"d": [None, "x", {"name": "a"}]}),
    *_cases(workload.classes_from_trace, {"df": _toy_trace()},
            {"df": [None, "trace", _toy_trace().drop(columns="arrival_s"), _toy_trace().iloc[:0]],
             "prefix_tokens": ["4", True], "slo_s": ["5", 0.0], "max_output_tokens": ["20", True, 5]}),
    *_cases(workload.split_by_input_quantile, {"df": _toy_trace()},
            {"df": [None], "n_buckets": [0, True, "3", 1.5]}),
    *_cases(workload.fit_length_model, {"samples": np.arange(1, 40)},
            {"samples": [["1", "2"], np.zeros(20, dtype=int), [[1, 2], [3, 4]], [1.5] * 20, np.arange(1, 5)],
             "n_components": [0, True, "2", 1.5], "max_components": [0, True, "8"], "low": ["1", 0, 5, True],
             "high": [10, "100", 2.5], "max_iter": [0, "9"], "tol": ["1e-9", -1.0, None],
             "sigma_floor": [0.0, "0.05"], "cap_tokens": [-1, True, 1.5]}),
    *_cases(workload.fit_class_model, {"rc": RC}, {"rc": [None, "a", CM], "max_components": [0, "8"]}),
    *_cases(workload.gamma_interarrivals, {"n": 3, "rate": 1.0, "cv": 1.0, "rng": RNG},
            {"n": [-1, 2.5, "3", True], "rate": ["1", 0.0, True, None], "cv": ["1", -1.0, None], "rng": [0, None]}),
    *_cases(workload.synthesize_trace, {"models": [CM], "duration_s": 10.0, "rng": RNG},
            {"models": [[], ["x"], "models", None], "duration_s": ["10", 0.0, True], "rng": [1, None]}),
    *_cases(workload.synthetic_classes, {"base": [CM], "n_classes": 2, "rng": RNG},
            {"base": [[], [LM], None], "n_classes": [0, True, "2"], "rng": [None],
             "length_scale": [(2.0, 1.0), (0.0, 1.0), ("0.5", "2"), None], "rate_scale": [(1.0,)],
             "cv_scale": [(-1.0, 1.0)], "max_output_tokens": [0, "4096", True], "max_input_tokens": [2.5]}),
    *_cases(workload.shift_outputs, {"output_tokens": [1, 2, 3], "s": 2.0},
            {"output_tokens": [["1"], [[1, 2]], [-1], [1.5]], "s": ["2", True, 0.0, None],
             "max_output_tokens": [0, True, "5", 2.5]}),
    *_cases(workload.shift_trace, {"df": _toy_trace(), "s": 2.0},
            {"df": [None, "x"], "s": ["2", True, 0.0], "max_output_tokens": [0, True, "5"]}),
    *_cases(workload.save_class_models, {"models": [CM], "path": "/nonexistent/never-written.json"},
            {"models": [[], ["x"], None], "path": [None, 3], "meta": ["x", 3]}),
    *_cases(workload.load_class_models, {"path": "/nonexistent/models.json"}, {"path": [None, 3]}),
]


@pytest.mark.parametrize(("function", "good", "name", "value"), CASES)
def test_bad_input_raises_value_error_naming_the_argument(function, good, name, value):
    with pytest.raises(ValueError) as info:
        function(**(good | {name: value}))
    message = str(info.value)
    assert name in message, f"{function.__qualname__}({name}={value!r}) raised without naming it: {message}"


def test_review_examples():
    """The review's cases, one by one."""
    x = [5.0, 5.0, 100.0, 65.0]
    with pytest.raises(ValueError, match="L_max"):
        wasserstein.worst_case_cost(x, 5.0, 1.0, 1.0, 1.0, L_max=None)  # was a TypeError
    with pytest.raises(ValueError, match="L_max"):
        wasserstein.worst_case_cost(x, 5.0, 1.0, 1.0, 1.0, L_max="100")  # was accepted as 100
    with pytest.raises(ValueError, match="eta"):
        wasserstein.worst_case_cost(x, "5", 1.0, 1.0, 1.0, 100.0)
    with pytest.raises(ValueError, match="eta"):
        wasserstein.worst_case_cost(x, True, 1.0, 1.0, 1.0, 100.0)  # was accepted as 1
    with pytest.raises(ValueError, match="samples"):
        wasserstein.worst_case_cost(["5", "5", "100"], 5.0, 1.0, 1.0, 1.0, 100.0)
    with pytest.raises(ValueError, match="samples"):
        newsvendor.saa_reservation(np.array([[5.0, 5.0], [100.0, 65.0]]), 1.0, 1.0)  # was flattened
    with pytest.raises(ValueError, match="model"):
        hardware.kv_bytes_per_token("llama")  # was an AttributeError
    with pytest.raises(ValueError, match="model"):
        hardware.kv_capacity_tokens(A100_80GB, LLAMA2_70B, 4, 1)  # model and GPU swapped
    with pytest.raises(ValueError, match="tp=3"):
        hardware.kv_capacity_tokens(LLAMA2_70B, A100_80GB, 3, 1)  # 3 divides neither 64 nor 8 heads
    # numpy numbers and 0-d arrays are numbers; good inputs keep working
    assert wasserstein.worst_case_cost(np.array(x), np.float64(5.0), np.int64(1), 1.0, np.array(1.0), 100) > 0
    assert hardware.kv_capacity_tokens(LLAMA2_70B, A100_80GB, np.int64(8), 1) > 0
    assert hardware.kv_capacity_tokens(LLAMA2_70B, A100_80GB, 16, 1) > 0  # KV heads replicated: allowed


# ------------------------------------------------------------------ the simulator's deployment
def _deployment(**kw):
    from kvdro.sim.deployment import Deployment

    return Deployment(**({"groups": ("TP4-PP1", "TP4-PP1")} | kw))


DEPLOYMENT_CASES = [
    # vLLM refuses these at start-up (SchedulerConfig, no chunked prefill)
    ("max_num_batched_tokens", {"max_num_batched_tokens": 2048}),  # below max_model_len = 16,384
    ("max_num_batched_tokens", {"max_model_len": 4096, "max_num_batched_tokens": 4095}),
    ("max_num_batched_tokens", {"max_model_len": 128, "max_num_batched_tokens": 200}),  # < max_num_seqs = 256
    *[("max_num_batched_tokens", {"max_num_batched_tokens": v}) for v in (0, 1.5, "4096", True, math.nan)],
    *[("max_num_seqs", {"max_num_seqs": v}) for v in (0, -1, 2.5, "256", True, None, math.nan)],
    *[("max_model_len", {"max_model_len": v}) for v in (0, 4096.5, "4096", False, None, math.inf)],
    ("max_model_len", {"max_model_len": 10**7}),  # one sequence does not fit an engine's KV cache
    *[("watermark", {"watermark": v}) for v in (-0.1, 1.0, math.nan, "0.01", True, None)],
    *[("groups", {"groups": v}) for v in ((), ("TP3-PP1",), ("4x1",))],
    ("routing['a']", {"routing": {"a": [0.7, 0.7]}}),
    ("routing['a']", {"routing": {"a": [0.5]}}),
    ("routing['a']", {"routing": {"a": ["0.5", "0.5"]}}),
    ("routing['a']", {"routing": {"a": [math.nan, 0.5]}}),
    ("default_routing", {"default_routing": [0.5, -0.1]}),
    ("prefix_caching['a']", {"prefix_caching": {"a": [True]}}),
    ("prefix_caching['a']", {"prefix_caching": {"a": [1, 2]}}),
    ("prefix_caching['a']", {"prefix_caching": {"a": "yes"}}),
    ("prefix_tokens['a']", {"prefix_tokens": {"a": -1.0}}),
    ("prefix_tokens['a']", {"prefix_tokens": {"a": "64"}}),
    ("prefix_tokens['a']", {"prefix_tokens": {"a": 20_000}}),  # longer than the context window
    ("slo_s['a']", {"slo_s": {"a": 0.0}}),
    ("slo_s['a']", {"slo_s": {"a": "3"}}),
    ("routing", {"routing": [0.5, 0.5]}),
    ("model", {"model": A100_80GB}),
    ("gpu", {"gpu": LLAMA2_70B}),
    ("name", {"name": 3}),
]


@pytest.mark.parametrize(("field", "kw"), DEPLOYMENT_CASES, ids=[f"{f}={kw}"[:80] for f, kw in DEPLOYMENT_CASES])
def test_inconsistent_deployment_raises_value_error_naming_the_field(field, kw):
    with pytest.raises(ValueError) as info:
        _deployment(**kw)
    assert field.split("[")[0] in str(info.value), str(info.value)
    if "[" in field:
        assert field in str(info.value), str(info.value)


def test_consistent_deployments_are_accepted():
    assert _deployment().token_budget == 16_384
    d = _deployment(max_model_len=4096, max_num_batched_tokens=4096, routing={"a": np.array([0.5, 0.25])},
                    prefix_caching={"a": [True, np.bool_(False)]}, prefix_tokens={"a": np.int64(64)}, slo_s={"a": 3})
    assert d.prompt_limit == 4096 and d.routing_matrix(["a"])[0, 0] == pytest.approx(0.25)
    assert _deployment(max_num_batched_tokens=np.int64(20_000)).token_budget == 20_000


def test_issue_small_token_budget_is_refused_before_any_simulation():
    """Issue 18: Deployment(max_num_batched_tokens=2048) was accepted; a preempted request then needed
    more than the budget and the run died with InvariantError. It is refused at construction."""
    with pytest.raises(ValueError, match=r"max_num_batched_tokens: 2048 is smaller than max_model_len \(16384\)"):
        _deployment(max_num_batched_tokens=2048)


def test_cli_names_the_file_its_column_and_the_row(tmp_path, capsys):
    """Issue 18: a CSV with ContextTokens = 0 said "trace: column 'input_tokens' ... row 0 has np.int64(0)"."""
    from kvdro.__main__ import main

    bad = tmp_path / "mine.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,12,5\n2023-11-16 18:17:04.9,0,5\n")
    assert main(["simulate", "--trace", str(bad), "--policy", "vllm", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'ContextTokens'" in err and "data row 1 (line 3 of the file)" in err
    assert "input_tokens" not in err and "np.int64" not in err


def test_check_trace_prints_plain_values():
    """A bad cell is quoted as the number it is (0), not as numpy's repr (np.int64(0))."""
    import pandas as pd

    from kvdro.sim.simulate import check_trace

    bad = pd.DataFrame({"arrival_s": [0.0, 1.0], "input_tokens": [12, 0], "output_tokens": [5, 5], "request_class": ["a", "a"]})
    with pytest.raises(ValueError, match=r"row 1 has 0$") as err:
        check_trace(bad)
    assert "np." not in str(err.value)
    with pytest.raises(ValueError, match=r"row 0 has 'x'$"):
        check_trace(bad.assign(input_tokens=[12, 3], output_tokens=["x", 5]))
