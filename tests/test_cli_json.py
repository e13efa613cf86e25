"""Every ``--json`` output of every subcommand is exactly one JSON document on stdout (issue 18).

Each command runs as a fresh process (a solver banner written from C to fd 1 is only visible that
way) on the smallest case that still goes through its solvers: ``solve`` on the small instance,
``simulate`` on the Azure code trace with a reactive, a robust and a predictor policy, and every
``python -m kvdro.experiments`` sweep with ``--quick``. stdout must parse as one JSON value with
nothing before or after it; banners and progress bars belong on stderr. A command other test files
also read (the small and scaled solves, the calibrated plan) runs once per session (``cli`` and its
fixtures in conftest.py), still in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvdro.experiments.__main__ import EXPERIMENTS


def run_json(args: list[str], env_extra: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "--json"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env_extra})


def one_document(proc: subprocess.CompletedProcess, what: str):
    """The single JSON value on stdout; fails with the first lines of stdout/stderr otherwise."""
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    try:
        return json.loads(proc.stdout)  # rejects anything before or after the one value
    except json.JSONDecodeError as exc:
        pytest.fail(f"{what}: stdout is not one JSON document ({exc}); it begins {proc.stdout[:300]!r}")


def test_one_document_rejects_a_banner_before_the_json():
    """The check above fails on the issue's case (HiGHS's banner printed before the JSON)."""
    banner = "Running HiGHS 1.16.0 (git hash: f3f113d): Copyright (c) 2026 under MIT licence terms\n"
    for stdout in (banner + '{"a": 1}\n', '{"a": 1}\n{"b": 2}\n', '{"a": 1}\nwrote data/x.csv\n'):
        with pytest.raises(pytest.fail.Exception, match="not one JSON document"):
            one_document(subprocess.CompletedProcess([], 0, stdout, ""), "fake")
    assert one_document(subprocess.CompletedProcess([], 0, '{"a": 1}\n', "banner on stderr"), "fake") == {"a": 1}


@pytest.mark.parametrize("method", ["exact", "bcd"])
def test_solve_json(small_solve, method):
    out = one_document(small_solve(method), f"solve --method {method}")
    assert out["solution"]["status"] == {"exact": "optimal", "bcd": "converged"}[method]
    assert out["cost"]["total"] == pytest.approx(out["solution"]["objective"], rel=1e-6)


def test_solve_mccormick_json_or_nothing(data_dir):
    """The weak formulation may stop at its time limit: then exit 1 with nothing on stdout."""
    proc = run_json(["-m", "kvdro", "solve", "--instance", "small", "--method", "mccormick", "--seed", "0",
                     "--time-limit", "5"], {"KVDRO_DATA_DIR": str(data_dir)})
    if proc.returncode == 1:
        assert proc.stdout == "" and "kvdro solve" in proc.stderr
    else:
        assert one_document(proc, "solve --method mccormick")["solution"]["status"] == "optimal"


@pytest.mark.parametrize("policy", ["vllm", "dro", "lp2"])
def test_simulate_json(data_dir, policy):
    from kvdro.sim import METRIC_KEYS

    out = one_document(run_json(["-m", "kvdro", "simulate", "--trace", "azure-2023-code", "--policy", policy,
                                 "--seed", "0", "--breakdown"], {"KVDRO_DATA_DIR": str(data_dir)}),
                       f"simulate --policy {policy}")
    assert set(METRIC_KEYS) <= set(out) and "cost_breakdown" in out
    assert out["completed"] + out["rejected"] + out["ignored"] == 8819


# table4 --quick --json (the same command) is run, and its one JSON document checked field by field,
# by tests/test_experiments.py::test_cli_table4_quick_json
@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if e != "table4"])
def test_experiments_json(cli, experiment):
    out = one_document(cli("-m", "kvdro.experiments", experiment, "--quick", "--n-jobs", "1", "--json",
                           fresh_cache=True), f"experiments {experiment} --quick")
    assert out["experiment"] == experiment and out["quick"] is True
    assert out["rows"] and out["verdicts"]


def test_scaled_solve_json(scaled_solve):
    out = one_document(scaled_solve("bcd"), "solve --instance scaled")  # 3 classes, J = 16
    assert len(out["solution"]["r"]) == 3


def test_solve_then_simulate_plan_json(calibrated_plan_run):
    solve, simulate = calibrated_plan_run
    plan = one_document(solve, "solve --serving calibrated")
    out = one_document(simulate, "simulate --plan")
    assert out["predicted"] == plan["predicted"] and "observed" in out
