"""The command line: ``python -m kvdro solve ... --json``."""

from __future__ import annotations

import json

import pytest

from kvdro.__main__ import main


def test_cli_solve_json(small_solve):
    out = small_solve("exact")  # a fresh process, run once per session (conftest.py)
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)  # stdout is pure JSON (HiGHS's banner goes to stderr)
    sol, cost = payload["solution"], payload["cost"]
    assert sol["status"] == "optimal"
    assert len(sol["z"]) == 4 and len(sol["r"]) == 6
    assert set(cost["terms"]) == {"preempt_waste", "gpu", "slo", "rejection"}
    assert cost["total"] == pytest.approx(sum(cost["terms"].values()))
    assert cost["total"] == pytest.approx(sol["objective"], rel=1e-6)
    assert cost["feasible"] is True


def test_cli_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["solve", "--method", "simplex"])
    assert info.value.code == 2
    assert main(["solve", "--seed", "-1"]) == 2
    assert "seed" in capsys.readouterr().err
