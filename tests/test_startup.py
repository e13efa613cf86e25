"""Start-up stays light: the simulator and the math modules import CVXPY only where a model is built,
and a simulation (API or CLI) imports no solver at all: neither CVXPY, HiGHS nor SciPy's statistics.

Timing lives in ``python -m kvdro.bench startup`` (a ratio against ``import pandas`` in the same
run); here only *what* is imported, in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("cvxpy", "highspy", "sklearn", "scipy.stats")


def loaded_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["kvdro.sim", "kvdro.newsvendor", "kvdro.wasserstein", "kvdro.sim.cli"])
def test_import_leaves_cvxpy_out(module):
    assert loaded_after(f"import {module}") == set(), f"import {module} loads a solver"


def test_the_probe_sees_cvxpy_when_a_model_is_built():
    """The check can fail: building an LP does import CVXPY."""
    assert "cvxpy" in loaded_after("from kvdro import newsvendor; newsvendor.saa_problem([1.0, 2.0, 3.0], 2.0, 1.0)")


def test_simulate_help_starts_without_a_solver():
    probe = ("import sys, runpy; sys.argv = ['kvdro', 'simulate', '--help']\n"
             "try:\n    runpy.run_module('kvdro', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             f"print('LOADED', ' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120).stdout
    assert "--policy" in out and out.strip().splitlines()[-1] == "LOADED"


def test_simulate_imports_no_solver(data_dir):
    """``kvdro.sim.simulate`` on a real trace (a reservation policy fitted in sample, priced with the
    paper's costs) leaves CVXPY, HiGHS and scipy.stats unloaded: the cost constants live in
    kvdro.costs, not behind kvdro.joint's solvers."""
    statement = ("import numpy as np, kvdro.sim; from kvdro.datasets import load_trace; "
                 "tr = load_trace('azure-2023-conv').head(2000); "
                 "[kvdro.sim.simulate(tr, policy=p, rng=np.random.default_rng(0)) for p in ('vllm', 'dro', 'p90')]")
    assert loaded_after(statement) == set()


def test_simulate_cli_imports_no_solver(data_dir):
    """``python -m kvdro simulate`` on the whole conversation trace, same check."""
    probe = ("import sys, runpy; sys.argv = ['kvdro', 'simulate', '--trace', 'azure-2023-conv', '--policy', 'dro', '--json']\n"
             "try:\n    runpy.run_module('kvdro', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             f"print('LOADED', ' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=300).stdout
    assert '"completed"' in out and out.strip().splitlines()[-1] == "LOADED"


def test_numba_is_imported_only_for_the_compiled_engine(data_dir):
    """numba (~0.2-0.8 s to import) is loaded by the compiled engine's first use -- any simulation with
    the default implementation since the pure-Python engine was retired (issue 32) -- not by ``import
    kvdro.sim`` nor by a run of the reference engine; the probe does see it once the compiled engine runs."""
    probe = ("import sys, numpy as np, kvdro.sim\n"
             "from kvdro.datasets import load_trace\n"
             "seen = ['numba' in sys.modules]\n"
             "tr = load_trace('azure-2023-conv').head(200)\n"
             "kvdro.sim.simulate(tr, policy='vllm', rng=np.random.default_rng(0), implementation='reference')\n"
             "seen.append('numba' in sys.modules)\n"
             "kvdro.sim.simulate(tr, policy='vllm', rng=np.random.default_rng(0))\n"
             "seen.append('numba' in sys.modules)\n"
             "print(*seen)\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=600).stdout.split()
    assert out == ["False", "False", "True"]
