"""``python -m kvdro solve --instance scaled --classes C --gpus J --method exact|bcd --json`` (issue 17)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _solve(data_dir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVDRO_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "kvdro", "solve", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_scaled_cell_exact_and_bcd_share_the_schema(data_dir):
    out = {}
    for method in ("exact", "bcd"):
        proc = _solve(data_dir, "--instance", "scaled", "--classes", "3", "--gpus", "16", "--method", method,
                      "--seed", "1", "--json")
        assert proc.returncode == 0, proc.stderr
        out[method] = json.loads(proc.stdout)  # exactly one JSON document on stdout
    e, b = out["exact"], out["bcd"]
    assert e.keys() == b.keys() and e["solution"].keys() == b["solution"].keys()
    for doc in (e, b):
        assert {"status", "objective", "mip_gap", "solve_time_s"} <= doc["solution"].keys()
        assert doc["instance"]["J"] == 16 and doc["instance"]["classes"] == 3 and doc["instance"]["size"] == "scaled"
    assert e["solution"]["status"] == "optimal" and e["solution"]["mip_gap"] <= 1e-7
    assert e["solution"]["method"] == "exact-counts"
    assert b["solution"]["objective"] >= e["solution"]["objective"] * (1 - 1e-7)


@pytest.mark.parametrize("args, name", [
    (("--instance", "scaled", "--classes", "3"), "--gpus"),
    (("--instance", "small", "--gpus", "8"), "--classes/--gpus"),
    (("--instance", "scaled", "--classes", "0", "--gpus", "8"), "n_classes"),
])
def test_bad_scaled_arguments_are_named(data_dir, args, name):
    proc = _solve(data_dir, *args, "--method", "bcd", "--json")
    assert proc.returncode == 2 and name in proc.stderr and proc.stdout == ""
