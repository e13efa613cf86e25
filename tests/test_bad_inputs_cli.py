"""The command lines, the benchmarks and the cached results refuse what they cannot do (issue 36).

Before: ``simulate --plan`` ignored --scale/--policy/--rho/...; a plan could not run on a registry
trace; a cut ``data/experiments_table4_memory.csv`` was judged (exit 0) and a renamed header was an
AttributeError; a row deleted from ``data/sim_regimes.csv`` moved the memory point from 0.7 to 0.75;
``bench exact --seeds -3`` printed PASS over nothing; ``--n-jobs 0``/``--repeats 0`` were tracebacks;
``KVDRO_CACHE_DIR`` pointing at a file was a FileExistsError; ``--rho 1e308`` printed ``Infinity``;
``solve --load 1e300`` was cvxpy's "Cannot unpack invalid solution"; ``solve --instance scaled
--classes 100000 --time-limit 20`` printed nothing for minutes.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvdro.cachefile import (FolderNotWritableError, ensure_writable, manifest_path, read_csv_checked, write_csv_atomic,
                             write_manifest)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------------------ cached results: manifests
def test_every_committed_cached_table_matches_its_manifest():
    from kvdro.bench import manifests

    files = manifests.cached_files()
    assert len(files) >= 50
    assert all(manifest_path(p).is_file() for p in files), [p.name for p in files if not manifest_path(p).is_file()]
    assert manifests.main([]) == 0


@pytest.fixture
def table(tmp_path) -> Path:
    df = pd.DataFrame({"policy": ["dro", "saa", "vllm"], "rho": [10, 10, 10], "cost": [1.5, 2.25, 3.0]})
    return write_csv_atomic(df, tmp_path / "t.csv", key=["policy", "rho"])


def test_the_writer_leaves_a_manifest_and_the_reader_checks_it(table):
    doc = json.loads(manifest_path(table).read_text())
    assert doc["rows"] == 3 and doc["columns"] == ["policy", "rho", "cost"] and doc["key"] == ["policy", "rho"]
    assert read_csv_checked(table)["cost"].tolist() == [1.5, 2.25, 3.0]


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) * 6 // 10], "rows"),
    (lambda b: b.replace(b"policy", b"Policy", 1), "missing ['policy'], unexpected ['Policy']"),
    (lambda b: b.replace(b"2.25", b"2.26"), "sha256"),
    (lambda b: b.replace(b"saa", b"dro"), "repeat a key"),
])
def test_a_damaged_table_is_refused_naming_the_file_and_the_fault(table, damage, words):
    table.write_bytes(damage(table.read_bytes()))
    with pytest.raises(ValueError, match="t.csv") as e:
        read_csv_checked(table, remake="make it")
    assert words in str(e.value) and "make it" in str(e.value)


def test_a_table_without_a_manifest_is_refused(table):
    manifest_path(table).unlink()
    with pytest.raises(ValueError, match="no manifest"):
        read_csv_checked(table)


def test_a_reader_names_a_column_it_needs(table):
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['goodput'\]"):
        read_csv_checked(table, columns=["goodput"])


def test_a_grid_keeps_no_manifest_for_its_partial_file(tmp_path):
    from kvdro.cachefile import partial_path, run_grid

    seen = []
    run_grid([{"n": 1}, {"n": 2}], lambda c: {"sq": c["n"] ** 2}, tmp_path / "g.csv", key=["n"],
             on_row=lambda row, resumed: seen.append(manifest_path(partial_path(tmp_path / "g.csv")).exists()))
    assert seen == [False, False] and json.loads(manifest_path(tmp_path / "g.csv").read_text())["key"] == ["n"]


@pytest.fixture
def sweeps(tmp_path, monkeypatch) -> Path:
    """A copy of the cached sweeps of chapter 10 the verdicts read, in a folder of its own."""
    from kvdro.experiments import results

    for p in DATA.glob("experiments_*"):
        shutil.copy(p, tmp_path / p.name)
    monkeypatch.setattr(results, "DATA", tmp_path)
    return tmp_path


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) * 6 // 10], "(cut short?)"),  # issue 36: exit 0 on the remnant
    (lambda b: b.replace(b",policy,", b",Policy,", 1), "missing ['policy']"),  # was an AttributeError
])
def test_verdicts_refuse_a_damaged_sweep(sweeps, capsys, damage, words):
    from kvdro.experiments.__main__ import main

    f = sweeps / "experiments_table4_memory.csv"
    f.write_bytes(damage(f.read_bytes()))
    assert main(["verdicts", "--json", "--regime", "memory"]) == 2
    err = capsys.readouterr().err
    assert "experiments_table4_memory.csv" in err and words in err and "Traceback" not in err


@pytest.fixture
def regime_map(tmp_path, monkeypatch) -> Path:
    """A copy of data/sim_regimes.csv (and its manifest) where ``kvdro.sim.regimes`` reads it."""
    from kvdro.sim import regimes, studies

    for p in (DATA / "sim_regimes.csv", manifest_path(DATA / "sim_regimes.csv")):
        shutil.copy(p, tmp_path / p.name)
    monkeypatch.setattr(studies, "DATA_DIR", tmp_path)
    monkeypatch.setattr(regimes, "_CACHE", {})
    return tmp_path / "sim_regimes.csv"


def test_the_memory_point_is_the_named_row(regime_map):
    from kvdro.sim import regimes

    mem = regimes.OPERATING_POINTS["memory"]
    assert (mem.trace, mem.deployment_label, mem.scale) == regimes.NAMED_POINTS["memory"]
    assert regimes.OPERATING_POINTS["light"].deployment_label == regimes.NAMED_POINTS["light"][1]


def test_a_cut_regime_map_is_refused(regime_map):
    from kvdro.sim import regimes

    b = regime_map.read_bytes()
    regime_map.write_bytes(b[: len(b) // 3])  # mid-row: a KeyError in the sweeps before
    with pytest.raises(ValueError, match="sim_regimes.csv: refused"):
        regimes.OPERATING_POINTS
    from kvdro.experiments.regimes import operating_point  # what every chapter-9 sweep calls

    with pytest.raises(ValueError, match="sim_regimes.csv: refused"):
        operating_point("memory")


def test_a_regime_map_without_the_named_row_is_refused(regime_map):
    """Before: the memory point moved silently from 0.7 to 0.75. Even with a manifest rewritten to
    vouch for the remnant, the named row is missing and the point is not taken from another row."""
    from kvdro.sim import regimes

    _, dep, load = regimes.NAMED_POINTS["memory"]
    f = pd.read_csv(regime_map)
    keep = ~((f["trace"] == "conversation") & (f["deployment"] == dep) & np.isclose(f["load"], load))
    with pytest.raises(ValueError, match=f"sim_regimes.csv: refused, it has {len(f) - 1} rows, its manifest {len(f)}"):
        write_csv_atomic(f[keep], regime_map, manifest=False, float_format="%.6g")
        regimes.OPERATING_POINTS
    write_manifest(regime_map)
    with pytest.raises(ValueError, match=r"memory operating point \(conversation, 4 x TP2-PP1, load 0.7\) is missing"):
        regimes.OPERATING_POINTS


# ------------------------------------------------------------------------------ benchmarks: no empty work
@pytest.mark.parametrize("argv, flag", [
    (["exact", "--parts", "small", "--seeds", "-3"], "--seeds"),  # was exit 0, "PASS" over zero seeds
    (["exact", "--parts", ","], "--parts"),  # was exit 0 having run nothing
    (["exact", "--parts", "ladder", "--ladder-nodes", "0"], "--ladder-nodes"),
    (["calibration", "--parts", ","], "--parts"),
    (["headroom", "--n-jobs", "0"], "--n-jobs"),  # was a ValueError traceback
    (["headroom", "--parts"], "--parts"),
    (["sim", "--repeats", "0"], "--repeats"),  # was statistics.StatisticsError
    (["experiments", "--n-jobs", "0"], "--n-jobs"),
    (["experiments", "--only"], "--only"),
    (["bcd", "--seeds", "-3"], "--seeds"),
    (["wasserstein", "--n", "0"], "--n"),
])
def test_benches_refuse_empty_or_negative_work(capsys, argv, flag):
    from kvdro.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"{flag}:" in capsys.readouterr().err


def test_an_unwritable_data_folder_is_named(tmp_path, monkeypatch, capsys):
    from kvdro.bench import calibration
    from kvdro.bench.__main__ import main

    blocker = tmp_path / "data"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setattr(calibration, "DATA", blocker)
    assert main(["calibration", "--parts", "bands"]) == 2
    assert f"{blocker} (where this benchmark writes its tables): is a file, not a folder" in capsys.readouterr().err


def test_a_read_only_folder_is_named_by_the_writer(tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "touch", read_only)
    with pytest.raises(FolderNotWritableError, match=f"{tmp_path}: the folder is not writable, cannot write t.csv"):
        write_csv_atomic(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(FolderNotWritableError, match="not writable"):
        ensure_writable(tmp_path)


def test_a_cache_dir_that_is_a_file_is_named(tmp_path, monkeypatch, capsys):
    from kvdro.experiments.__main__ import main

    f = tmp_path / "cache"
    f.write_text("x")
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(f))
    assert main(["table4", "--quick", "--json"]) == 2  # was FileExistsError
    assert f"KVDRO_CACHE_DIR={f}: is a file, not a folder" in capsys.readouterr().err


def test_n_jobs_is_capped_at_the_cells_and_the_cpus(monkeypatch, capsys):
    from kvdro.experiments import runner

    monkeypatch.setattr(runner, "available_cpus", lambda: 2)
    assert runner._capped(1000, 3, "sweep") == 2
    assert "sweep: n_jobs = 1000 capped at 2 = min(3 cells, 2 CPUs)" in capsys.readouterr().err
    assert runner._capped(1000, 1, "sweep") == 1 and runner._capped(-1, 5, "sweep") == -1
    assert runner._capped(2, 5, "sweep") == 2 and runner._capped(None, 5, "sweep") is None
    assert capsys.readouterr().err.count("capped") == 1
    df = runner.run_sweep(_square, [{"x": 3}], n_jobs=1000, cache=False, progress=False)
    assert df["y"].tolist() == [9] and "capped at 1" in capsys.readouterr().err


def _square(x):
    return {"y": x * x}


# ------------------------------------------------------------------------------ solve
@pytest.mark.parametrize("argv, words", [
    (["--load", "1e300"], "--load: 1e+300 is beyond the 1e+06"),  # was cvxpy's "Cannot unpack invalid solution"
    (["--load", "1e9"], "--load: 1e+09"),  # HiGHS called the feasible MILP infeasible
])
def test_solve_refuses_a_load_it_cannot_solve(capsys, argv, words):
    from kvdro.__main__ import main

    assert main(["solve", *argv]) == 2 and words in capsys.readouterr().err


def test_solve_bounds_the_build_of_a_scaled_instance(data_dir, monkeypatch, capsys):
    import time

    from kvdro.__main__ import main

    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    import kvdro.bcd.scaling  # noqa: F401  (imported before the clock starts)

    start = time.perf_counter()
    assert main(["solve", "--instance", "scaled", "--classes", "100000", "--gpus", "64", "--time-limit", "1"]) == 2
    assert time.perf_counter() - start < 30  # was minutes of silence (3,000 classes: 107 s)
    err = capsys.readouterr().err
    assert "--classes 100000 --gpus 64: the instance was not built within --time-limit 1 s" in err


# ------------------------------------------------------------------------------ simulate
@pytest.mark.parametrize("flag, value", [("--policy", "vllm"), ("--rho", "3"), ("--config", "TP2-PP1"),
                                         ("--groups", "2")])
def test_simulate_plan_refuses_the_flags_a_plan_fixes(tmp_path, capsys, flag, value):
    from kvdro.__main__ import main

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(["simulate", "--plan", str(plan), flag, value]) == 2
    assert f"{flag} cannot be combined with --plan" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--implementation", "--engine"])
def test_simulate_refuses_the_retired_python_engine_naming_the_flag(capsys, flag):
    """Issue 32 retired ``fast-python`` (vLLM v0's pure-Python event engine): exit 2, the flag named,
    and what replaces it (the compiled engine, plain Python under NUMBA_DISABLE_JIT=1; the reference)."""
    from kvdro.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--trace", "azure-2023-conv", "--policy", "vllm", flag, "fast-python"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert f"argument {flag}: 'fast-python' is retired" in err
    assert "NUMBA_DISABLE_JIT=1" in err and "implementation='reference'" in err


@pytest.fixture(scope="module")
def plan(small_solve) -> dict:
    run = small_solve("exact")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_simulate_plan_honours_the_run_flags(plan, data_dir, monkeypatch):
    """--scale, --reservation, --schedule, --max-model-len (and --engine) change the run they name."""
    from kvdro.sim.plan import simulate_plan

    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    base, _ = simulate_plan(plan)
    run, summary = simulate_plan(plan, scale=2.0, reservation="hard", schedule="sof", max_model_len=8192,
                                 engine="reference")
    assert run.deployment.max_model_len == 8192 and base.deployment.max_model_len != 8192
    assert (summary["scale"], summary["reservation"], summary["schedule"]) == (2.0, "hard", "sof")
    assert (run.engine, run.implementation, base.implementation) == ("vllm-v0", "reference", "fast")
    span = lambda r: float(r.requests["arrival_s"].max() - r.requests["arrival_s"].min())  # noqa: E731
    assert span(run) == pytest.approx(span(base) / 2.0, rel=1e-9)


def test_a_plan_runs_on_a_registry_trace(plan, data_dir, monkeypatch):
    from kvdro.datasets import load_trace
    from kvdro.joint import paper_instance
    from kvdro.sim.plan import match_plan_classes

    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    inst = paper_instance("small", 0)
    conv = load_trace("azure-2023-conv")
    mapped = match_plan_classes(conv, inst)
    shares = mapped["request_class"].value_counts(normalize=True)
    assert set(shares.index) == {"conversation-short", "conversation-medium", "conversation-long"}
    assert shares.between(0.28, 0.39).all()  # terciles of the whole trace (ties at an edge stay together)
    assert (mapped.drop(columns="request_class") == conv.drop(columns="request_class")).all().all()
    mine = conv.assign(request_class="chat")
    with pytest.raises(ValueError, match=r"--trace: no plan class for the trace's class\(es\) \['chat'\].*request_class"):
        match_plan_classes(mine, inst)


def test_simulate_plan_on_a_registry_trace_from_the_cli(plan, data_dir, tmp_path, monkeypatch, capsys):
    from kvdro.__main__ import main

    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    # was: "no buffer for request class 'conversation'" (exit 2)
    assert main(["simulate", "--plan", str(path), "--trace", "azure-2023-conv", "--scale", "4", "--json",
                 "--quiet"]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["completed"] > 0 and out["scale"] == 4.0


def test_simulate_json_is_strict_at_a_huge_rho(data_dir, tmp_path, monkeypatch, capsys):
    from kvdro.__main__ import main

    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    t = pd.read_csv(DATA / "synthetic_trace.csv").head(200)
    ts = pd.Timestamp("2023-11-16T18:00:00Z") + pd.to_timedelta(t["arrival_s"], unit="s")
    csv = tmp_path / "mine.csv"
    pd.DataFrame({"TIMESTAMP": ts.dt.strftime("%Y-%m-%dT%H:%M:%S.%f"), "ContextTokens": t["input_tokens"],
                  "GeneratedTokens": t["output_tokens"]}).to_csv(csv, index=False)
    assert main(["simulate", "--trace", str(csv), "--policy", "vllm", "--rho", "1e308", "--config", "TP2-PP1",
                 "--groups", "1", "--scale", "20", "--json", "--quiet"]) == 0  # vLLM preempts: c_p x tokens overflows
    cap = capsys.readouterr()
    out = _strict(cap.out)  # was "cost_total": Infinity
    assert out["cost_total"] is None and "cost_total is +Infinity" in cap.err


def test_finite_or_null_names_every_replacement():
    from kvdro._strict_json import finite_or_null

    clean, why = finite_or_null({"a": 1.0, "b": [np.float64("nan"), 2], "c": {"d": -np.inf}})
    assert clean == {"a": 1.0, "b": [None, 2], "c": {"d": None}}
    assert set(why) == {"b[0]", "c.d"} and why["c.d"].startswith("-Infinity")
