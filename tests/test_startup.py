"""Start-up stays light: the simulator and the math modules import CVXPY only where a model is built.

Timing lives in ``python -m kvdro.bench startup`` (a ratio against ``import pandas`` in the same
run); here only *what* is imported, in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("cvxpy", "highspy", "sklearn")


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
