"""Bad input raises ValueError naming the argument, for every public function of kvdro.joint and
kvdro.queueing (the serving model the joint problem is built on).

Each case is (function, good keyword arguments, argument, bad value): the good arguments alone are
valid, and replacing one of them by a bad value must raise ``ValueError`` whose message names it.
Bad values that used to slip through or raised the wrong error: strings (``"abc"``, and ``"5"``,
which ``float()`` accepts), booleans (``True == 1``), ``None``, NaN, arrays where a number belongs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvdro import queueing as q
from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig, config_performance
from kvdro.joint import (
    Instance,
    Solution,
    build_milp,
    candidate_buffers,
    evaluate,
    paper_instance,
    solve_exact,
    solve_milp,
    solve_relaxation,
)
from kvdro.joint.serving import band_edges, group_state, waiting_model
from kvdro.workload import RequestClass

TP2 = config_performance(LLAMA2_70B, A100_80GB, ParallelConfig(2, 1))
TP4 = config_performance(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))
RNG = np.random.default_rng(11)
CLASSES = (
    RequestClass("a", 2.0, np.full(20, 900), RNG.integers(1, 33, 20), prefix_tokens=200, slo_s=1.5, max_output_tokens=32),
    RequestClass("b", 1.5, np.full(20, 2400), RNG.integers(1, 33, 20), prefix_tokens=300, slo_s=2.5, max_output_tokens=32),
)
INSTANCE_ARGS = {"classes": CLASSES, "configs": (TP2, TP4), "total_gpus": 4, "waiting_bands": 2}
INSTANCE = Instance(**INSTANCE_ARGS)
SOLUTION_ARGS = {"z": [0, 1], "r": list(INSTANCE.input_tokens + 16), "pi": [[0.0, 1.0], [0.0, 0.5]], "delta": [[0, 0], [0, 0]]}
SOLUTION = Solution(**SOLUTION_ARGS)

BAD_NUMBER = ["abc", "5", True, None, math.nan, [1.0, 2.0]]
BAD_COST = [*BAD_NUMBER, -1.0, math.inf]
BAD_COUNT = ["8", True, None, 2.5, -1, math.nan]


def _cases(function, good: dict, bad: dict[str, list]) -> list:
    return [
        pytest.param(function, good, name, value, id=f"{getattr(function, '__name__', function)}-{name}-{value!r}"[:90])
        for name, values in bad.items()
        for value in values
    ]


CASES = [
    # ------------------------------------------------------------------ kvdro.joint
    *_cases(Instance, INSTANCE_ARGS, {
        "total_gpus": [*BAD_COUNT, 0, 1],
        "c_p": [*BAD_COST, 0.0], "c_w": [*BAD_COST, 0.0], "c_gpu": BAD_COST, "c_slo": BAD_COST, "c_rej": BAD_COST,
        "kappa": BAD_COST, "eps": ["abc", "5", True, -1.0, math.nan, [1.0], [[1.0, 2.0]], ["a", "b"]],
        "u_max": [*BAD_NUMBER, 0.0, 1.0], "waiting_bands": [*BAD_COUNT, 0], "block_tokens": [*BAD_COUNT, 0],
        "classes": [(), None, "ab", (1, 2)], "configs": [(), None, ("TP2",)], "model": ["llama", None], "name": [3],
    }),
    *_cases(Solution, SOLUTION_ARGS, {
        "z": ["1", None, [0.5, 1], [[0, 1]], ["a", "b"]], "r": ["1", None, [math.nan, 1.0], ["a", "b"]],
        "pi": [None, "x", [[0.0, 1.0]], [[math.nan, 1.0], [0.0, 0.5]]], "delta": [None, [[0, 2], [0, 0]], [[0, 0]]],
        "objective": ["abc", None], "mip_gap": ["x"], "status": [3], "method": [None],
    }),
    *_cases(candidate_buffers, {"max_output_tokens": 32}, {"max_output_tokens": BAD_COUNT, "block_tokens": [*BAD_COUNT, 0]}),
    *_cases(paper_instance, {"size": "small", "seed": 0}, {
        "size": ["medium", None, 6], "seed": ["0", True, -1, 1.5, None], "load": ["abc", "0.5", True, None, 0.0, -1.0, math.nan, math.inf],
        "c_gpu": ["x", -1.0], "eps": ["abc"], "no_such_field": [1.0],
    }),
    *_cases(evaluate, {"instance": INSTANCE, "solution": SOLUTION}, {"instance": [None, "inst"], "solution": [None, {"z": [0, 1]}]}),
    *_cases(build_milp, {"instance": INSTANCE}, {"instance": [None], "formulation": ["bigM", None, 3]}),
    *_cases(solve_milp, {"instance": INSTANCE}, {
        "formulation": ["bigM"], "time_limit": ["abc", "5", True, None, 0.0, -1.0, math.nan, math.inf],
        "mip_rel_gap": ["x", -0.1, 1.0], "node_limit": [0, "10", 2.5, True], "prune": ["yes", None], "relax": [1],
        "highs_options": ["threads=1", {"threads": 1}],
    }),
    *_cases(solve_relaxation, {"instance": INSTANCE}, {"formulation": ["bigM"], "prune": ["no"]}),
    *_cases(solve_exact, {"instance": INSTANCE}, {"formulation": ["bigM", None], "time_limit": ["abc", 0.0, True], "mip_rel_gap": [2.0]}),
    *_cases(waiting_model, {"instance": INSTANCE, "utilisation": [0.1, 0.2]}, {
        "utilisation": ["abc", None, [0.1], [math.nan, 0.1], [-0.1, 0.2], [[0.1, 0.2]]],
    }),
    # ------------------------------------------------------------------ kvdro.queueing
    *_cases(q.prefill_time, {"model": LLAMA2_70B, "perf": TP4, "input_tokens": 1000.0}, {
        "input_tokens": [*BAD_NUMBER, -1.0], "prefix_tokens": ["abc", -1.0, 2000.0], "model": ["llama", None], "perf": ["TP4", None],
    }),
    *_cases(q.decode_time_per_token, {"model": LLAMA2_70B, "perf": TP4, "context_tokens": 1000.0}, {
        "context_tokens": [*BAD_NUMBER, -1.0], "batch": ["64", True, 0.0, -2.0, math.nan], "model": ["llama"], "perf": [None],
    }),
    *_cases(q.service_time, {"model": LLAMA2_70B, "perf": TP4, "input_tokens": 1000.0, "mean_output_tokens": 200.0}, {
        "input_tokens": BAD_NUMBER, "mean_output_tokens": [*BAD_NUMBER, -1.0], "prefix_tokens": ["abc", 5000.0], "perf": ["TP4"],
    }),
    *_cases(q.residence_time, {"model": LLAMA2_70B, "perf": TP4, "input_tokens": 1000.0, "mean_output_tokens": 200.0}, {
        "input_tokens": BAD_NUMBER, "mean_output_tokens": [*BAD_NUMBER, -1.0], "model": [None],
    }),
    *_cases(q.memory_occupancy_tokens, {"arrival_rate": 1.0, "service_time_s": 2.0, "reserved_tokens": 500.0}, {
        "arrival_rate": [*BAD_NUMBER, -1.0], "service_time_s": [*BAD_NUMBER, -1.0], "reserved_tokens": [*BAD_NUMBER, -1.0],
    }),
    *_cases(q.utilisation, {"arrival_rates": [1.0, 2.0], "service_times_s": [0.1, 0.2]}, {
        "arrival_rates": [[1.0], [], ["a", "b"], [-1.0, 1.0], None], "service_times_s": [[0.1], [math.nan, 0.1], None],
        "groups": ["2", True, 0.0, -1.0, None],
    }),
    *_cases(q.mixture_service_moments, {"arrival_rates": [1.0, 2.0], "mean_service_s": [0.1, 0.2], "var_service_s2": [0.01, 0.02]}, {
        "arrival_rates": [[1.0], [0.0, 0.0], ["a", "b"]], "mean_service_s": [[0.1], [0.0, 0.0]], "var_service_s2": [[-1.0, 0.0], None],
    }),
    *_cases(q.waiting_time, {"utilisation": 0.5, "mean_service_s": 1.0, "service_scv": 1.0}, {
        "utilisation": [*BAD_NUMBER, 1.0, -0.1], "mean_service_s": [*BAD_NUMBER, -1.0], "service_scv": [*BAD_NUMBER, -1.0],
        "arrival_scv": [*BAD_NUMBER, -1.0],
    }),
    *_cases(q.simulate_gg1_wait, {"arrival_rate": 0.5, "arrival_scv": 1.0, "mean_service_s": 1.0, "service_scv": 1.0,
                                  "n_customers": 100, "rng": np.random.default_rng(0)}, {
        "arrival_rate": [*BAD_NUMBER, 0.0], "arrival_scv": [*BAD_NUMBER, -1.0], "mean_service_s": ["abc", -1.0],
        "service_scv": ["abc", -1.0], "n_customers": ["100", 1, 2.5, True], "rng": [0, None], "warmup": [-1, 100, "5"],
    }),
]


@pytest.mark.parametrize("function, good, name, value", CASES)
def test_bad_input_raises_value_error_naming_the_argument(function, good, name, value):
    with pytest.raises(ValueError, match=name):
        function(**{**good, name: value})


@pytest.mark.parametrize("function, good", [
    (Instance, INSTANCE_ARGS), (Solution, SOLUTION_ARGS), (candidate_buffers, {"max_output_tokens": 32}),
    (evaluate, {"instance": INSTANCE, "solution": SOLUTION}),
    (waiting_model, {"instance": INSTANCE, "utilisation": [0.1, 0.2]}),
    (q.waiting_time, {"utilisation": 0.5, "mean_service_s": 1.0, "service_scv": 1.0}),
    (q.utilisation, {"arrival_rates": [1.0, 2.0], "service_times_s": [0.1, 0.2]}),
])
def test_the_good_arguments_are_good(function, good):
    """The cases above fail for the bad value, not for the rest."""
    function(**good)


def test_paper_instance_good_arguments_are_good(data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    assert paper_instance("small", 0, load=0.7, c_gpu=50.0).c_gpu == 50.0


def test_numpy_numbers_are_numbers():
    """Real numbers of any numeric type are accepted (only strings, bools, None are refused)."""
    inst = Instance(**{**INSTANCE_ARGS, "c_gpu": np.float32(50.0), "total_gpus": np.int64(4), "eps": np.array([1.0, 2.0])})
    assert inst.c_gpu == 50.0 and inst.total_gpus == 4 and inst.eps == (1.0, 2.0)
    assert np.array_equal(band_edges(inst), band_edges(INSTANCE))
    group_state(INSTANCE, np.array([0, 1]), np.array(SOLUTION_ARGS["pi"]), np.zeros((2, 2), dtype=bool))
    assert replace(INSTANCE, c_gpu=1).c_gpu == 1.0
