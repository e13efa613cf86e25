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
    *[("max_model_len", {"max_model_len": v}) for v in (0, -4096, 4096.5, "4096", False, math.inf)],  # None: the model's window
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


# ---------------------------------------------------------------------------------------------
# Issue 29: nothing silently wrong. Each case below gave a wrong answer, a traceback or an error
# that did not name its cause; the "before" is quoted in each docstring.

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROWS = ["2023-11-16 18:15:46.6805900,374,44\n", "2023-11-16 18:15:50.9951690,396,109\n",
              "2023-11-16 18:15:51.9241690,879,143\n"]


def _cli(argv, capsys):
    from kvdro.__main__ import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusals exit 2
        code = exc.code
    return code, capsys.readouterr().err


def test_a_stray_1900_timestamp_is_named_not_simulated(tmp_path, capsys):
    """Before: exit 0, e2e p50 = 9.2e6 s (the int64 picosecond clock wrapped), a numpy RuntimeWarning."""
    bad = tmp_path / "mine.csv"
    bad.write_text(AZURE_HEADER + AZURE_ROWS[0] + AZURE_ROWS[1] + "1900-01-01 00:00:00,879,47\n" + AZURE_ROWS[2])
    code, err = _cli(["simulate", "--trace", str(bad), "--policy", "vllm", "--quiet", "--json"], capsys)
    assert code == 2
    assert str(bad) in err and "'TIMESTAMP'" in err and "'1900-01-01 00:00:00' at data row 2 (line 4 of the file)" in err
    with pytest.raises(ValueError, match="max_span_s"):  # the reader's own limit, off by default
        datasets.read_azure_csv(bad, "x", max_span_s=86400.0)
    assert len(datasets.read_azure_csv(bad, "x")) == 4


def test_a_scale_that_overflows_the_clock_names_scale(tmp_path, capsys):
    """Before: `--scale 1e-9` exit 0, e2e p50 = 9.2e6 s, goodput 0."""
    good = tmp_path / "mine.csv"
    good.write_text(AZURE_HEADER + "".join(AZURE_ROWS))
    code, err = _cli(["simulate", "--trace", str(good), "--policy", "vllm", "--scale", "1e-9", "--quiet", "--json"], capsys)
    assert code == 2 and "--scale: 1e-09 stretches" in err and "use --scale >=" in err
    smallest = float(err.rsplit(">=", 1)[1])
    code, _ = _cli(["simulate", "--trace", str(good), "--policy", "vllm", "--scale", f"{smallest * 1.01:.6g}", "--quiet",
                    "--json"], capsys)
    assert code == 0  # the bound the message gives is enough


def test_an_arrival_past_the_clock_is_refused_naming_the_rows():
    """Before: simulate() returned e2e p50 2.1 s, goodput 0.58 for arrivals at 0, 1 and 1e12 s."""
    from kvdro.sim import simulate
    from kvdro.sim.simulate import check_trace
    from kvdro.sim.timing import MAX_HORIZON_S

    trace = _toy_trace().assign(arrival_s=[0.0, 1.0, 2.0, 3.0, 1e12, 5.0])
    with pytest.raises(ValueError, match=r"'arrival_s' spans 1e\+12 s, from row 0 \(0\.0 s\) to row 4"):
        simulate(trace, policy="vllm", rng=np.random.default_rng(0))
    # the limit is the clock's: just inside is accepted, just outside is not (shifted: the span counts)
    inside = _toy_trace().assign(arrival_s=[7.0, 8.0, 9.0, 10.0, 7.0 + 0.999 * MAX_HORIZON_S, 12.0])
    check_trace(inside)
    with pytest.raises(ValueError, match="arrival_s"):
        check_trace(inside.assign(arrival_s=inside["arrival_s"] * [1, 1, 1, 1, 1.002, 1]))


@pytest.mark.parametrize("value", [math.nan, None, "", "  "])
def test_an_empty_request_class_is_named(value):
    """Before: NaN -> TypeError "'<' not supported between instances of 'float' and 'str'" (or
    "no buffer for request class nan"); an empty string was served as a class of its own."""
    from kvdro.sim import simulate

    trace = _toy_trace().astype({"request_class": object})
    trace.loc[3, "request_class"] = value
    with pytest.raises(ValueError, match=r"column 'request_class' must name each request's class; row 3 has"):
        simulate(trace, policy="dro", rng=np.random.default_rng(0))


@pytest.mark.parametrize("content", [b"", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n".encode("utf-16")],
                         ids=["empty", "utf16"])
def test_unreadable_csvs_name_the_file(tmp_path, capsys, content):
    """Before: "No columns to parse from file" / "'utf-8' codec can't decode byte 0xff ..." without the file."""
    path = tmp_path / "mine.csv"
    path.write_bytes(content)
    for read in (lambda: datasets.read_azure_csv(path, "x"), lambda: datasets.read_burstgpt_csv(path)):
        with pytest.raises(ValueError, match=str(path)) as err:
            read()
        assert ("empty" in str(err.value)) == (content == b"") and ("UTF-8" in str(err.value)) == (content != b"")
    code, err = _cli(["simulate", "--trace", str(path), "--policy", "vllm", "--quiet"], capsys)
    assert code == 2 and str(path) in err


@pytest.mark.parametrize("command", [["simulate", "--trace", "azure-2023-conv", "--policy", "vllm"], ["solve"]])
def test_a_negative_seed_is_named(command, capsys):
    """Before: `simulate --seed -1` said "expected non-negative integer" (no --seed); solve said "seed: ..."."""
    code, err = _cli([*command, "--seed", "-1"], capsys)
    assert code == 2 and "--seed: must be a non-negative integer, got -1" in err


def _eta_functions():
    from kvdro import ambiguity

    ws = {"samples": SAMPLES, "c_p": 10.0, "c_w": 1.0, "eps": 1.0, "L_max": 10.0}
    return [
        (newsvendor.loss, {"xi": SAMPLES, "c_p": 10.0, "c_w": 1.0}),
        (newsvendor.expected_cost, NV),
        (wasserstein.worst_case_cost, ws),
        (wasserstein.worst_case_cost, ws | {"method": "dual_lp"}),
        (wasserstein.worst_case_cost, ws | {"method": "primal_lp"}),
        (wasserstein.worst_case_distribution, ws),
        (wasserstein.dual_problem, ws),
        (wasserstein.primal_problem, ws),
        (ambiguity.scarf_worst_case_cost, NV),
        (ambiguity.scarf_problem, NV),
        (ambiguity.kl_worst_case_cost, NV | {"radius": 0.1}),
        (ambiguity.kl_problem, NV | {"radius": 0.1}),
        (ambiguity.ks_worst_case_cost, NV | {"radius": 0.1, "L_max": 10.0}),
        (ambiguity.ks_problem, NV | {"radius": 0.1, "L_max": 10.0}),
        (ambiguity.worst_case_cost, NV | {"kind": "wasserstein", "radius": 1.0, "L_max": 10.0}),
    ]


@pytest.mark.parametrize("index", range(15), ids=lambda i: f"{_eta_functions()[i][0].__module__}.{_eta_functions()[i][0].__name__}-{i}")
def test_a_negative_buffer_is_refused_everywhere(index):
    """Before: wasserstein.worst_case_cost(..., eta=-1, ...) returned 63.33."""
    function, good = _eta_functions()[index]
    function(**good, eta=2.0)  # the good arguments are good
    function(**good, eta=-1e-12)  # solver round-off is read as 0
    with pytest.raises(ValueError, match=r"eta must be >= 0 \(a buffer of output tokens"):
        function(**good, eta=-1.0)


def test_negative_buffers_are_refused_in_a_batch_too():
    with pytest.raises(ValueError, match="etas must be >= 0"):
        wasserstein.worst_case_cost_many(SAMPLES, [0.0, 3.0, -1.0], 10.0, 1.0, 1.0, 10.0)
    assert wasserstein.worst_case_cost_many(SAMPLES, [-1e-12], 10.0, 1.0, 1.0, 10.0)[0] == pytest.approx(
        wasserstein.worst_case_cost(SAMPLES, 0.0, 10.0, 1.0, 1.0, 10.0))


# --------------------------------------------------------------------------------- plans


@pytest.fixture(scope="module")
def small_plan(data_dir):
    """`python -m kvdro solve --instance small --seed 0 --json`, run in process."""
    import contextlib
    import io
    import json

    from kvdro.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["solve", "--instance", "small", "--seed", "0", "--json"]) == 0
    return json.loads(out.getvalue())


def _edited(plan, **solution):
    import copy

    p = copy.deepcopy(plan)
    p["solution"].update(solution)
    return p


def test_a_plan_carries_its_instance_fingerprint(small_plan):
    from kvdro.joint import paper_instance
    from kvdro.sim.plan import FINGERPRINT_KEYS, instance_fingerprint

    fp = small_plan["fingerprint"]
    assert tuple(fp) == FINGERPRINT_KEYS and fp["classes"] == 6 and fp["J"] == 8 and fp["seed"] == 0
    assert fp == instance_fingerprint(paper_instance("small", 0), size="small", seed=0, load=0.5)
    other = instance_fingerprint(paper_instance("small", 7), size="small", seed=7, load=0.5)
    assert other["samples_sha256"] != fp["samples_sha256"]  # the draw itself is fingerprinted


def test_a_plan_for_another_instance_size_is_refused(small_plan):
    """Before: a 6-class decision on the 15-class instance -> IndexError traceback (exit 1); a
    15-class decision on the 6-class instance -> rows 0-5 used silently (exit 0)."""
    from kvdro.joint import paper_instance
    from kvdro.sim.plan import instance_fingerprint, simulate_plan

    large = paper_instance("large", 0)
    on_large = dict(small_plan, instance=dict(small_plan["instance"], size="large", name=large.name),
                    fingerprint=instance_fingerprint(large, size="large", seed=0, load=0.5))
    with pytest.raises(ValueError, match=r"a decision for 6 classes x 4 configurations, but the instance "
                                         r"large-seed0-load0.5 has 15 classes"):
        simulate_plan(on_large)
    fifteen = _edited(small_plan, r=(small_plan["solution"]["r"] * 3)[:15],
                      pi=(small_plan["solution"]["pi"] * 3)[:15], delta=(small_plan["solution"]["delta"] * 3)[:15])
    with pytest.raises(ValueError, match=r"a decision for 15 classes x 4 configurations, but the instance "
                                         r"small-seed0-load0.5 has 6 classes"):
        simulate_plan(fifteen)


def test_a_plan_with_negative_groups_or_routing_to_no_group_is_refused(small_plan):
    """Before: z = [1, -1, -1, -1] silently rejected 11,375 of 12,902 requests; pi routing to a
    configuration with z = 0 silently rejected the requests sent there."""
    from kvdro.sim.plan import simulate_plan

    with pytest.raises(ValueError, match=r"plan: 'solution': z: groups per configuration must be >= 0, got \[1, -1, -1, -1\]"):
        simulate_plan(_edited(small_plan, z=[1, -1, -1, -1]))
    z = small_plan["solution"]["z"]
    empty = z.index(0)
    pi = np.asarray(small_plan["solution"]["pi"])
    pi[0, empty], pi[0, int(np.argmax(pi[0]))] = 0.25, pi[0].max() - 0.25
    with pytest.raises(ValueError, match=rf"pi\[0, {empty}\] = 0.25 routes class .* which has z = 0 groups"):
        simulate_plan(_edited(small_plan, pi=pi.tolist()))
    with pytest.raises(ValueError, match=r"routing fractions must be >= 0"):
        simulate_plan(_edited(small_plan, pi=(-pi).tolist()))


def test_solution_check_names_shapes_routing_and_budget():
    from kvdro.joint import Solution, paper_instance

    inst = paper_instance("small", 0)
    I, K = inst.n_classes, inst.n_configs
    r, d = inst.input_tokens + 16, np.zeros((I, K))
    ok = Solution(z=[1, 1, 0, 0], r=r, pi=np.tile([0.5, 0.5, 0.0, 0.0], (I, 1)), delta=d)
    assert ok.check(inst) is ok
    with pytest.raises(ValueError, match="z: groups per configuration must be >= 0"):
        Solution(z=[1, -1, 0, 0], r=r, pi=np.zeros((I, K)), delta=d)
    with pytest.raises(ValueError, match=r"which has z = 0 groups"):
        Solution(z=[1, 1, 0, 0], r=r, pi=np.tile([0.5, 0.0, 0.5, 0.0], (I, 1)), delta=d).check(inst)
    with pytest.raises(ValueError, match=r"routes 1.2 of class"):
        Solution(z=[1, 1, 0, 0], r=r, pi=np.tile([0.6, 0.6, 0.0, 0.0], (I, 1)), delta=d).check(inst)
    with pytest.raises(ValueError, match=r"uses 24 GPUs, more than J = 8"):
        Solution(z=[4, 4, 0, 0], r=r, pi=np.zeros((I, K)), delta=d).check(inst)


def test_a_plan_of_another_seed_is_refused_or_warned(small_plan):
    """Before: a plan made for seed 0 ran on the seed-7 instance without a word."""
    from kvdro.joint.paper import paper_trace
    from kvdro.sim.plan import PlanMismatchWarning, simulate_plan

    seven = dict(small_plan, instance=dict(small_plan["instance"], seed=7, name="small-seed7-load0.5"))
    with pytest.raises(ValueError, match=r"plan: made for instance small-seed0-load0.5 .*seed 0.*, but its "
                                         r"'instance' block rebuilds small-seed7-load0.5 .*seed 7.*differ: name, seed, "
                                         r"samples_sha256"):
        simulate_plan(seven)
    trace = paper_trace("small", 7, load=0.5, part="test").iloc[:400]
    with pytest.warns(PlanMismatchWarning, match=r"small-seed0-load0.5 .* small-seed7-load0.5"):
        result, _ = simulate_plan(seven, trace)
    assert result.metrics["completed"] > 0


def test_a_plan_without_a_fingerprint_says_how_to_regenerate(small_plan):
    from kvdro.sim.plan import simulate_plan

    old = {k: v for k, v in small_plan.items() if k != "fingerprint"}
    with pytest.raises(ValueError, match=r"no 'fingerprint'.*regenerate the plan: `python -m kvdro solve --instance small "
                                         r"--seed 0 --load 0.5 --serving analytic --json > plan.json`"):
        simulate_plan(old)


def test_a_config_larger_than_the_cluster_is_named():
    """TP9-PP1 cannot fit 8 GPUs: the error names config (not a derived 'groups = 0')."""
    from kvdro.sim import default_deployment

    with pytest.raises(ValueError, match=r"^config: TP9-PP1 needs 9 GPUs"):
        default_deployment(config="TP9-PP1")
    assert len(default_deployment(config="TP4-PP1").groups) == 2
