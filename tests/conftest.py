"""Shared fixtures. No test touches the network: sockets to anything but loopback are refused."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

_real_connect = socket.socket.connect


def _guarded_connect(self, address):  # pragma: no cover - exercised only by a misbehaving test
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and (host.startswith("127.") or host in {"localhost", "::1"} or "/" in host):
        return _real_connect(self, address)
    raise RuntimeError(f"tests must not touch the network (tried to connect to {address!r})")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Refuse every non-loopback connection for the duration of each test."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The folder of real traces (KVDRO_DATA_DIR, else ../shared/data); skip if neither exists."""
    configured = os.environ.get("KVDRO_DATA_DIR")
    path = Path(configured) if configured else SHARED_DATA
    if not path.is_dir():
        pytest.skip(f"real traces not available: set KVDRO_DATA_DIR (looked in {path})")
    return path


@pytest.fixture
def rng():
    """A seeded generator: every random test is reproducible."""
    import numpy as np

    return np.random.default_rng(20261129)


# ------------------------------------------------------------------ shared runs of the command line
#
# Several tests read the output of the same expensive command (a solve of the small instance, a
# calibrated plan and its simulation, a scaled exact/BCD pair). Each such command runs once per test
# session (per pytest-xdist worker) in a fresh process, and every test that needs it reads the same
# CompletedProcess: the assertions are the tests' own, only the duplicate runs are gone. Nothing is
# written to a fixed path: a run that needs a folder gets its own from tmp_path_factory.


@pytest.fixture(scope="session")
def cli(data_dir, tmp_path_factory):
    """``cli("-m", "kvdro", "solve", ...)``: the CompletedProcess of ``python <args>`` run once per
    session in a fresh process with ``KVDRO_DATA_DIR`` set (stdout and stderr captured, text).

    ``fresh_cache=True`` also points ``KVDRO_CACHE_DIR`` at an empty folder of its own, so that a
    sweep computes every cell (as ``python -m kvdro.experiments ... --quick`` from a clean clone)."""
    import subprocess
    import sys

    runs: dict[tuple, subprocess.CompletedProcess] = {}

    def run(*args: str, fresh_cache: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        key = (args, fresh_cache)
        if key not in runs:
            env = {**os.environ, "KVDRO_DATA_DIR": str(data_dir)}
            if fresh_cache:
                env["KVDRO_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvdro-cache"))
            runs[key] = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                                       env=env)
        return runs[key]

    return run


@pytest.fixture(scope="session")
def small_solve(cli):
    """``small_solve("exact"|"bcd"|..., serving="analytic")``: ``python -m kvdro solve --instance small
    --method M --serving S --seed 0 --json``, run once per session (see :func:`cli`)."""

    def run(method: str, serving: str = "analytic"):
        return cli("-m", "kvdro", "solve", "--instance", "small", "--method", method, "--serving", serving,
                   "--seed", "0", "--json")

    return run


@pytest.fixture(scope="session")
def scaled_solve(cli):
    """``scaled_solve("exact"|"bcd")``: ``python -m kvdro solve --instance scaled --classes 3 --gpus 16
    --method M --seed 1 --json`` (a chapter 6 cell), run once per session (see :func:`cli`)."""

    def run(method: str):
        return cli("-m", "kvdro", "solve", "--instance", "scaled", "--classes", "3", "--gpus", "16",
                   "--method", method, "--seed", "1", "--json")

    return run


@pytest.fixture(scope="session")
def calibrated_plan_run(cli, small_solve, tmp_path_factory):
    """The calibrated plan of the small instance (``small_solve("exact", serving="calibrated")``) and
    ``python -m kvdro simulate --plan <it> --seed 0 --json`` (progress bar on, to stderr): a pair of
    CompletedProcess. The plan file (the solve's stdout as it is) is in a folder of its own; if the
    solve failed, the simulation is None (the test that reads the solve reports why)."""
    solve = small_solve("exact", serving="calibrated")
    if solve.returncode != 0:
        return solve, None
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(solve.stdout)
    return solve, cli("-m", "kvdro", "simulate", "--plan", str(path), "--seed", "0", "--json")


@pytest.fixture(scope="session")
def small_exact(data_dir):
    """``(instance, solution)``: the small paper instance at seed 0 (analytic serving) and its proven
    optimum by :func:`kvdro.joint.solve_exact` (default formulation), solved once per session for the
    tests that read it. Read-only: a test that changes the routing or buffers works on a copy."""
    from kvdro.joint import paper_instance, solve_exact

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVDRO_DATA_DIR", str(data_dir))
        inst = paper_instance("small", 0)
        return inst, solve_exact(inst)
