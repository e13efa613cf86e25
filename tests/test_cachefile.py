"""Cache files are written atomically and a grid's partial results live beside the file (issue 29).

Before: a SIGKILL while `python -m kvdro.bench exact --parts cgpu` wrote left
data/joint_cgpu_sweep.csv at 0 bytes; a SIGINT after the first cell of `bench bcd table3` replaced
the 12-row table with a 1-row one.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvdro.cachefile import atomic_path, partial_path, round_floats, run_grid, write_csv_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
OLD = "c_gpu,total\n0,1747.2039\n100,2475.2902\n"

# a child that writes a large frame to argv[1] with argv[2] ("atomic" or "plain") and says when it starts
_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np, pandas as pd
    from kvdro.cachefile import write_csv_atomic
    df = pd.DataFrame(np.random.default_rng(0).random((3_000_000, 4)), columns=list("abcd"))
    print("writing", flush=True)
    if sys.argv[2] == "atomic":
        write_csv_atomic(df, sys.argv[1], float_format="%.10g")
    else:
        df.to_csv(sys.argv[1], index=False, float_format="%.10g")
    """
)


def _kill_mid_write(target: Path, how: str) -> None:
    """Start the writer, wait until bytes are being written (the temporary file or the target
    grows), then SIGKILL it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), how], stdout=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        start = target.stat().st_size
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            temps = list(target.parent.glob(f".{target.name}.*.tmp"))
            grown = temps and temps[0].stat().st_size > 0 if how == "atomic" else target.stat().st_size != start
            if grown:
                break
            assert proc.poll() is None, "the writer finished before it could be killed"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "joint_cgpu_sweep.csv"
    # control: a plain to_csv killed the same way corrupts the file (so the kill lands mid-write)
    target.write_text(OLD)
    _kill_mid_write(target, "plain")
    assert target.read_text() != OLD
    # the atomic writer: the old file is intact, the killed writer's bytes sit in its temporary file
    target.write_text(OLD)
    _kill_mid_write(target, "atomic")
    assert target.read_text() == OLD
    (stale,) = target.parent.glob(f".{target.name}.*.tmp")
    assert stale.stat().st_size > 0
    # the next write of the file replaces it and removes the dead writer's leftover
    write_csv_atomic(pd.DataFrame({"c_gpu": [0], "total": [1.0]}), target)
    assert target.read_text() == "c_gpu,total\n0,1.0\n" and not stale.exists()


def test_an_exception_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "t.csv"
    target.write_text(OLD)
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_text("c_gpu,total\n0,")
        raise KeyboardInterrupt  # what a SIGINT raises in the middle of a write
    assert target.read_text() == OLD and list(tmp_path.iterdir()) == [target]


def test_atomic_writes_keep_the_permissions_and_refuse_bad_paths(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")
    target.chmod(0o640)
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    fresh = write_text_atomic(tmp_path / "fresh.txt", "x")
    assert stat.S_IMODE(fresh.stat().st_mode) & 0o044  # not the 0600 of a raw temporary file
    with pytest.raises(ValueError, match="path: the folder"):
        write_text_atomic(tmp_path / "missing" / "t.txt", "x")
    with pytest.raises(ValueError, match="path: .* is a directory"):
        write_text_atomic(tmp_path, "x")
    with pytest.raises(ValueError, match="df: must be a pandas DataFrame"):
        write_csv_atomic([1, 2], target)


def test_round_off_is_rounded_away_and_never_prints_minus_zero(tmp_path):
    df = pd.DataFrame({"rejection": [2.2409711e-12, -1e-13, 1490.4011], "n": [1, 2, 3]})
    assert round_floats(df, 6)["rejection"].tolist() == [0.0, 0.0, 1490.4011]
    path = write_csv_atomic(df, tmp_path / "r.csv", decimals=6, float_format="%.8g")
    assert path.read_text() == "rejection,n\n0,1\n0,2\n1490.4011,3\n"
    with pytest.raises(ValueError, match="decimals"):
        round_floats(df, -1)


def _cells():
    return [{"n": n, "limit": 60.0} for n in (3, 6, 10, 15)]


def test_an_interrupted_grid_keeps_the_old_table_and_resumes_from_the_partial_file(tmp_path):
    target = tmp_path / "bcd_table3.csv"
    target.write_text(OLD)
    calls = []

    def compute(cell):
        if len(calls) == 1:
            raise KeyboardInterrupt  # SIGINT after the first cell
        calls.append(cell["n"])
        return {"n": cell["n"], "objective": cell["n"] * 1.5}

    with pytest.raises(KeyboardInterrupt):
        run_grid(_cells(), compute, target, key=("n", "limit"))
    assert target.read_text() == OLD
    part = partial_path(target)
    assert part.name == "bcd_table3.partial.csv" and pd.read_csv(part)["n"].tolist() == [3]

    def finish(cell):
        calls.append(cell["n"])
        return {"n": cell["n"], "objective": cell["n"] * 1.5}

    resumed = []
    df = run_grid(_cells(), finish, target, key=("n", "limit"), on_row=lambda row, r: resumed.append(r))
    assert calls == [3, 6, 10, 15] and resumed == [True, False, False, False]  # the first cell is not redone
    assert df["n"].tolist() == [3, 6, 10, 15] and df["objective"].tolist() == pytest.approx([4.5, 9, 15, 22.5])
    assert pd.read_csv(target)["n"].tolist() == [3, 6, 10, 15] and not part.exists()


def test_a_partial_file_of_other_settings_is_not_reused(tmp_path):
    target = tmp_path / "t.csv"
    pd.DataFrame({"n": [3], "limit": [30.0], "objective": [-1.0]}).to_csv(partial_path(target), index=False)
    df = run_grid(_cells(), lambda c: {"objective": float(c["n"])}, target, key=("n", "limit"))
    assert df["objective"].tolist() == [3.0, 6.0, 10.0, 15.0]  # the 30-s row did not stand in for the 60-s cell
    df = run_grid(_cells()[:1], lambda c: {"objective": 0.0}, target, key=("n", "limit"), resume=False)
    assert df["objective"].tolist() == [0.0]


def test_bench_bcd_table3_interrupted_after_one_cell(tmp_path, monkeypatch):
    """The bench's own grid (`python -m kvdro.bench bcd table3`), its solvers replaced by stand-ins."""
    import kvdro.bench.bcd as bench

    monkeypatch.setattr(bench, "DATA", tmp_path)
    (tmp_path / "bcd_table3.csv").write_text(OLD)
    done = []

    def fake_child(target, args, wall, status, **kw):
        if len(done) == 1:
            raise KeyboardInterrupt
        done.append(args[0])
        return {"bcd_status": "converged", "bcd_time_s": 0.1, "bcd_objective": float(args[0][1])}

    monkeypatch.setattr(bench, "_in_child", fake_child)
    monkeypatch.setattr(bench, "run_exact", lambda spec, limit, wall, stop_at=None: {
        "exact_status": "optimal", "exact_time_s": 0.2, "exact_objective": float(spec[1])})
    with pytest.raises(KeyboardInterrupt):
        bench._grid(bench.TABLE3, 120.0, "bcd_table3.csv", "table III", baselines=False)
    assert (tmp_path / "bcd_table3.csv").read_text() == OLD
    part = pd.read_csv(tmp_path / "bcd_table3.partial.csv")
    assert part[["classes", "J"]].values.tolist() == [list(bench.TABLE3[0])]
    monkeypatch.setattr(bench, "_in_child", lambda target, args, wall, status, **kw: {
        "bcd_status": "converged", "bcd_time_s": 0.1, "bcd_objective": float(args[0][1])})
    df = bench._grid(bench.TABLE3, 120.0, "bcd_table3.csv", "table III", baselines=False)
    table = pd.read_csv(tmp_path / "bcd_table3.csv")
    assert len(table) == len(bench.TABLE3) == 12 and table[["classes", "J"]].values.tolist() == [list(c) for c in bench.TABLE3]
    assert np.allclose(df["exact_objective"], table["classes"]) and not (tmp_path / "bcd_table3.partial.csv").exists()
