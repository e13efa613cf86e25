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


def test_scaled_cell_exact_and_bcd_share_the_schema(scaled_solve):
    out = {}
    for method in ("exact", "bcd"):  # 3 classes, J = 16, seed 1 (conftest.py; run once per session)
        proc = scaled_solve(method)
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


def test_bad_arguments_are_refused_before_a_solver_is_imported(data_dir):
    """Each bad ``solve`` command line exits 2 naming its argument, and in a fresh process that has run
    all of them neither cvxpy, HiGHS, scipy nor the instance builders (kvdro.joint, kvdro.bcd) have been
    imported: the refusal costs the parser's imports, not a solver's (issue 29)."""
    bad = [
        (("--instance", "scaled", "--classes", "3"), "--gpus"),
        (("--instance", "small", "--gpus", "8"), "--classes/--gpus"),
        (("--instance", "scaled", "--classes", "0", "--gpus", "8"), "--classes"),
        (("--instance", "scaled", "--classes", "3", "--gpus", "0"), "--gpus"),
        (("--load", "0"), "--load"),
        (("--load", "nan"), "--load"),
        (("--time-limit", "-1"), "--time-limit"),
    ]
    code = (
        "import contextlib, io, json, sys\n"
        "from kvdro.__main__ import main\n"
        "runs = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        runs.append([main(['solve', *args, '--method', 'bcd', '--json']), err.getvalue()])\n"
        "heavy = ('cvxpy', 'highspy', 'scipy', 'kvdro.joint', 'kvdro.bcd')\n"
        "print(json.dumps({'runs': runs, 'loaded': sorted(m for m in sys.modules if m.startswith(heavy))}))\n"
    )
    env = {**os.environ, "KVDRO_DATA_DIR": str(data_dir)}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([a for a, _ in bad])], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # nothing but the one document: the refusals printed no JSON
    for (args, name), (rc, err) in zip(bad, out["runs"], strict=True):
        assert rc == 2 and err.startswith("kvdro solve: ") and name in err, (args, rc, err)
    assert out["loaded"] == [], out["loaded"]
