"""The oracles (``oracle``: vLLM's admission plus a look-ahead on the true lengths; ``exact``: reserve
L_in + xi) and length-aware scheduling (``schedule="sof"``): the admission rule on constructed
states, the engines' agreement, and what the policies promise (no preemption, no outgrowing)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdro.hardware import A100_80GB, LLAMA2_70B, ParallelConfig
from kvdro.sim import ALL_POLICIES, POLICIES, Deployment, default_deployment, policy_buffers, simulate
from kvdro.sim.engine_compiled import run_compiled
from kvdro.sim.engine_reference import run_reference
from kvdro.sim.policies import DISPLAY_NAMES, ORACLE_POLICIES
from kvdro.sim.scheduler import EngineInput, EngineSpec, ceil_blocks, lookahead_fits
from kvdro.sim.timing import StepClock

CLOCK = StepClock(LLAMA2_70B, A100_80GB, ParallelConfig(4, 1))
FIELDS = ("admit_ps", "first_token_ps", "finish_ps", "preemptions", "recomputed_tokens", "final_cap_tokens", "generated")


def toy_trace(rng, n=300, rate=4.0, out=(1, 600), classes=("a", "b")) -> pd.DataFrame:
    return pd.DataFrame({
        "arrival_s": np.cumsum(rng.exponential(1.0 / rate, n)),
        "input_tokens": rng.integers(50, 2000, n),
        "output_tokens": rng.integers(out[0], out[1], n),
        "request_class": rng.choice(list(classes), n),
    })


def test_oracle_names():
    assert ORACLE_POLICIES == ("oracle", "exact")
    assert ALL_POLICIES == POLICIES + ORACLE_POLICIES
    assert not set(ORACLE_POLICIES) & set(POLICIES)  # the sweeps over POLICIES are unchanged
    assert DISPLAY_NAMES["oracle"] == "Look-ahead" and DISPLAY_NAMES["exact"] == "Exact"
    tr = toy_trace(np.random.default_rng(0), n=50)
    assert policy_buffers("oracle", tr, rho=10) == {} and policy_buffers("exact", tr, rho=10) == {}


# ---------------------------------------------------------------------------------------------
# the admission rule on constructed states


def _usage(running, new, prefix_blocks, d):
    """Blocks in use at future decode step d, summed directly (no shortcut)."""
    used, keys = 0, set()
    for kv, left, sh, key in list(running) + [new]:
        if d < left:
            used += ceil_blocks(kv + d + 1) - sh
            if key >= 0:
                keys.add(key)
    return used + sum(prefix_blocks[k] for k in keys)


@st.composite
def state(draw):
    prefix_blocks = tuple(draw(st.lists(st.integers(0, 3), min_size=2, max_size=2)))
    seq = st.tuples(st.integers(1, 120), st.integers(1, 80), st.integers(0, 2), st.integers(-1, 1))
    running = [(kv, left, sh if key >= 0 else 0, key) for kv, left, sh, key in draw(st.lists(seq, max_size=8))]
    kv, left, sh, key = draw(seq)
    new = (kv, left, sh if key >= 0 else 0, key)
    return running, new, prefix_blocks, draw(st.integers(5, 70))


@settings(max_examples=300, deadline=None)
@given(state())
def test_lookahead_evaluates_exactly_every_future_step(case):
    """Checking only the completion points is the same as checking every step of the new request's life."""
    running, new, pb, limit = case
    brute = all(_usage(running, new, pb, d) <= limit for d in range(new[1]))
    assert lookahead_fits(running, new, pb, limit) == brute


def test_oracle_admits_no_earlier_than_vllm():
    """In the same state the look-ahead implies vLLM's own check (free - need >= watermark), and it
    is strictly stricter in some states: the oracle never admits a request vLLM would hold back."""
    rng = np.random.default_rng(1)
    stricter = 0
    for _ in range(3000):
        pb = (int(rng.integers(0, 4)),)
        running = []
        for _ in range(int(rng.integers(0, 8))):
            key = int(rng.integers(-1, 1))
            running.append((int(rng.integers(1, 200)), int(rng.integers(1, 150)), int(rng.integers(0, 2)) if key >= 0 else 0, key))
        key = int(rng.integers(-1, 1))
        P, sh = int(rng.integers(1, 200)), (int(rng.integers(0, 2)) if key >= 0 else 0)
        new = (P, int(rng.integers(1, 150)), sh, key)
        blocks, wm = int(rng.integers(10, 80)), int(rng.integers(1, 3))
        used = sum(ceil_blocks(kv) - s for kv, _, s, _ in running) + (pb[0] if any(k >= 0 for *_, k in running) else 0)
        if used > blocks:
            continue
        resident = any(k == key >= 0 for *_, k in running)
        need = ceil_blocks(P) - sh + (pb[0] if key >= 0 and not resident else 0)
        vllm = blocks - used - need >= wm
        oracle = vllm and lookahead_fits(running, new, pb, blocks - wm)
        assert lookahead_fits(running, new, pb, blocks - wm) <= vllm  # the look-ahead alone implies vLLM's check
        stricter += vllm and not oracle
    assert stricter > 100


def _earliest(running, new, pb, limit, G) -> int:
    """The compiled engine's look-ahead (kvdro.sim._engine_kernels._la_add, _la_earliest) on one state:
    the running sequences joined at decode step G, then the first step >= G at which ``new`` fits."""
    from kvdro.sim import _engine_kernels as kern

    rows = list(running) + [new]
    n = len(rows)
    L = np.array([kv for kv, *_ in rows], np.int64)  # prompt = cached tokens (nothing generated yet)
    X = np.array([left + 1 for _, left, _, _ in rows], np.int64)  # one token at the prefill, then `left` steps
    S = np.array([sh for _, _, sh, _ in rows], np.int64)
    K = np.array([key for *_, key in rows], np.int64)
    pblocks = np.array(pb, np.int64)
    lk, mem, mpos = np.zeros(11, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    lo_o, lo_c = np.zeros(n, np.int64), np.zeros(n, np.int64)
    pcs, pos, pss, pV, tmp = (np.zeros(n + 1, np.int64) for _ in range(5))
    pckey = np.full(max(pblocks.size, 1), -1, np.int64)
    for j, (kv, left, _, _) in enumerate(running):  # absolute decode steps: o = kv + 1 - G, c = G + left - 1
        kern._la_add(j, kv + 1 - G, G + left - 1, lk, mem, mpos, lo_o, lo_c, S)
    return int(kern._la_earliest(n - 1, 0, G, lk, mem, lo_o, lo_c, L, X, S, K, pblocks, int(pblocks.sum()), limit,
                                 pcs, pos, pss, pV, pckey, tmp))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state(), st.integers(0, 50))
def test_fast_engine_finds_the_first_step_the_head_fits(case, G):
    """The compiled engine's skip scan returns the first decode step >= G at which a request admitted
    then fits, the trajectories being fixed (checked against every step, by the plain rule)."""
    from kvdro.sim._engine_kernels import _NONE

    running, new, pb, limit = case
    P, m, sh, key = new

    def fits_at(a):  # admitted at a: the running sequences have advanced a - G steps
        shifted = [(kv + a - G, left - (a - G), s, k) for kv, left, s, k in running if left - (a - G) >= 1]
        return lookahead_fits(shifted, (P, m, sh, key), pb, limit)

    horizon = G + max([left for _, left, _, _ in running], default=0) + 2
    first = next((a for a in range(G, horizon + 1) if fits_at(a)), None)
    got = _earliest(running, new, pb, limit, G)
    assert got == (first if first is not None else _NONE)


# ---------------------------------------------------------------------------------------------
# the engines


@st.composite
def heavy_case(draw):
    """Small pools and long outputs: vLLM preempts often here."""
    n = draw(st.integers(5, 30))
    prompt = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), dtype=np.int64)
    output = np.array(draw(st.lists(st.integers(20, 200), min_size=n, max_size=n)), dtype=np.int64)
    arrival = np.cumsum(np.array(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)), dtype=np.int64)) * 10**9
    window = int(max(ceil_blocks(int(p + o)) for p, o in zip(prompt, output)))
    spec = EngineSpec(blocks=draw(st.integers(window + 2, window + 15)), watermark_blocks=draw(st.integers(1, 2)),
                      max_num_seqs=draw(st.integers(2, 12)), token_budget=400, free_block_rule=True, window_blocks=window)
    zeros = np.zeros(n, dtype=np.int64)
    inp = EngineInput(arrival, prompt, output, zeros, np.full(n, -1, dtype=np.int64), zeros,
                      queue_key=arrival + 10**10 * output if draw(st.booleans()) else None)
    return spec, inp


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heavy_case())
def test_oracle_never_preempts_and_the_engines_agree(case):
    spec, inp = case
    oracle = EngineSpec(**{**spec.__dict__, "lookahead": True})
    a, b = run_reference(oracle, inp, CLOCK), run_compiled(oracle, inp, CLOCK)
    assert a.preemptions.sum() == 0 and b.preemptions.sum() == 0
    assert a.totals() == b.totals()
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_heavy_cases_do_preempt_under_vllm():
    """The regime above is the one that matters: vLLM preempts there, the oracle does not."""
    rng = np.random.default_rng(2)
    n = 30
    prompt, output = rng.integers(1, 60, n), rng.integers(100, 200, n)
    arrival = np.cumsum(rng.integers(0, 50, n)) * 10**9
    zeros = np.zeros(n, dtype=np.int64)
    spec = EngineSpec(blocks=30, watermark_blocks=1, max_num_seqs=12, token_budget=400, free_block_rule=True)
    inp = EngineInput(arrival, prompt, output, zeros, np.full(n, -1, dtype=np.int64), zeros)
    vllm = run_compiled(spec, inp, CLOCK)
    oracle = run_compiled(EngineSpec(**{**spec.__dict__, "lookahead": True}), inp, CLOCK)
    assert vllm.preemptions.sum() >= 10 and oracle.preemptions.sum() == 0
    assert (oracle.admit_ps >= 0).all() and (oracle.generated == output).all()


def _same(a, b):
    keep = [k for k in a.metrics if k != "wall_s"]
    assert {k: a.metrics[k] for k in keep} == {k: b.metrics[k] for k in keep}
    pd.testing.assert_frame_equal(a.requests, b.requests)


@pytest.mark.parametrize("policy,schedule", [("oracle", "fcfs"), ("exact", "fcfs"), ("vllm", "sof"), ("oracle", "sof")])
def test_engines_agree_through_simulate(policy, schedule):
    """Long outputs at a high rate on one TP2 group, with shared prefixes: heavy preemption for vLLM."""
    rng = np.random.default_rng(4)
    tr = toy_trace(rng, n=160, rate=6.0, out=(200, 1500))
    dep = Deployment(groups=("TP2-PP1",), prefix_tokens={"a": 300}, prefix_caching={"a": [True]})
    runs = [simulate(tr, policy=policy, schedule=schedule, deployment=dep, rng=np.random.default_rng(0), engine=e)
            for e in ("fast", "reference")]
    _same(*runs)
    if policy == "oracle":
        assert runs[0].metrics["preemptions"] == 0
    if policy == "vllm":
        assert runs[0].metrics["preemptions"] > 10  # the heavy-preemption regime


def test_simulate_oracle_never_preempts_where_vllm_does():
    rng = np.random.default_rng(5)
    tr = toy_trace(rng, n=400, rate=8.0, out=(200, 2000))
    dep = default_deployment(config="TP2-PP1", groups=1)
    vllm = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    oracle = simulate(tr, policy="oracle", deployment=dep, rng=np.random.default_rng(0))
    exact = simulate(tr, policy="exact", deployment=dep, rng=np.random.default_rng(0))
    assert vllm.metrics["preemptions"] > 20
    assert oracle.metrics["preemptions"] == 0 and oracle.metrics["recomputed_tokens"] == 0
    assert oracle.metrics["completed"] == vllm.metrics["completed"] == len(tr)
    # exact never outgrows its reservation: no overflow, every cache within its reserved blocks
    rq = exact.requests
    assert exact.metrics["preemptions"] == 0 and (rq["overflow_tokens"] == 0).all()
    assert (16 * rq["reserved_blocks"] >= rq["input_tokens"] + rq["generated_tokens"] - 1).all()
    np.testing.assert_array_equal(rq["buffer_tokens"], rq["generated_tokens"])  # eta = xi (no truncation here)
    assert (rq["waste_tokens"] < 16).all()  # only the last block's slack


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.floats(0.5, 30.0), st.integers(300, 3000))
def test_oracle_never_preempts_at_any_load(seed, rate, longest):
    """Any seed, any rate (light to far past saturation), outputs up to ``longest`` tokens."""
    rng = np.random.default_rng(seed)
    tr = toy_trace(rng, n=150, rate=rate, out=(1, longest))
    r = simulate(tr, policy="oracle", deployment=default_deployment(config="TP2-PP1", groups=1), rng=rng)
    assert r.metrics["preemptions"] == 0 and r.metrics["completed"] == len(tr)


def test_oracle_equals_vllm_where_memory_is_ample():
    """2 x TP4 at a low rate: vLLM never preempts and the look-ahead never binds -- the same run."""
    tr = toy_trace(np.random.default_rng(6), n=400, rate=2.0)
    dep = default_deployment(config="TP4-PP1", groups=2)
    vllm = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    oracle = simulate(tr, policy="oracle", deployment=dep, rng=np.random.default_rng(0))
    assert vllm.metrics["preemptions"] == 0
    _same(vllm, oracle)


# ---------------------------------------------------------------------------------------------
# shortest-output-first


def test_sof_with_equal_hints_or_no_aging_is_fcfs():
    tr = toy_trace(np.random.default_rng(7), n=300, rate=6.0)
    dep = default_deployment(config="TP2-PP1", groups=1)
    fcfs = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    assert fcfs.metrics["preemptions"] > 0 and fcfs.requests["wait_s"].max() > 1.0  # a queue to reorder
    _same(fcfs, simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof",
                         length_hint=np.full(len(tr), 250.0)))
    _same(fcfs, simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof", aging_s_per_token=0.0))
    sof = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof")
    assert sof.schedule == "sof" and not sof.requests["admit_s"].equals(fcfs.requests["admit_s"])


def test_sof_lowers_the_mean_latency_of_a_burst():
    """A burst (all at once, the long request first in arrival order) on an engine that runs one
    sequence at a time: FCFS makes the short ones wait behind it, shortest-output-first serves them first."""
    n = 12
    tr = pd.DataFrame({"arrival_s": np.zeros(n), "input_tokens": np.full(n, 100),
                       "output_tokens": [3000] + [20] * (n - 1), "request_class": ["a"] * n})
    dep = Deployment(groups=("TP4-PP1",), max_num_seqs=1)
    fcfs = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    sof = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof")
    assert sof.metrics["e2e_mean_s"] < 0.5 * fcfs.metrics["e2e_mean_s"]
    assert sof.requests["finish_s"].iloc[0] == sof.requests["finish_s"].max()  # the long one goes last
    # a prediction that ranks the long request first is FCFS again
    _same(fcfs, simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof",
                         length_hint=np.r_[0.0, np.full(n - 1, 1e3)]))


def test_sof_lowers_the_mean_latency_under_load():
    tr = toy_trace(np.random.default_rng(8), n=400, rate=3.0, out=(1, 1500))
    dep = default_deployment(config="TP2-PP1", groups=1)
    fcfs = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
    sof = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), schedule="sof")
    assert sof.metrics["e2e_mean_s"] < fcfs.metrics["e2e_mean_s"]


def test_bad_schedule_input_names_the_argument():
    tr = toy_trace(np.random.default_rng(9), n=20)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="schedule"):
        simulate(tr, policy="vllm", rng=rng, schedule="sjf")
    for aging in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="aging_s_per_token"):
            simulate(tr, policy="vllm", rng=rng, schedule="sof", aging_s_per_token=aging)
    with pytest.raises(ValueError, match="length_hint.*20"):
        simulate(tr, policy="vllm", rng=rng, schedule="sof", length_hint=np.ones(19))
    for bad in (np.nan, -1.0):
        hint = np.ones(20)
        hint[4] = bad
        with pytest.raises(ValueError, match="length_hint.*row 4"):
            simulate(tr, policy="vllm", rng=rng, schedule="sof", length_hint=hint)
    with pytest.raises(ValueError, match="policy"):
        simulate(tr, policy="prophet", rng=rng)


# ---------------------------------------------------------------------------------------------
# the CLI


def test_cli_oracle_exact_and_sof(tmp_path, capsys):
    from kvdro.__main__ import main

    csv = tmp_path / "mine.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{10 + i:02d}.000,{100 + 7 * i},{20 + 13 * i}\n" for i in range(30)))
    outs = {}
    for extra in (["--policy", "oracle"], ["--policy", "exact"], ["--policy", "vllm", "--schedule", "sof"]):
        assert main(["simulate", "--trace", str(csv), *extra, "--json", "--quiet"]) == 0
        outs[" ".join(extra)] = json.loads(capsys.readouterr().out)
    assert all(o["completed"] == 30 and o["preemptions"] == 0 for o in outs.values())
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", str(csv), "--policy", "vllm", "--schedule", "lifo", "--quiet"])
    assert exc.value.code == 2 and "--schedule" in capsys.readouterr().err


def test_cli_oracle_on_the_conversation_trace(data_dir, capsys):
    """Must show: 4 x TP2 at 0.65 of the rate, the oracle never preempts."""
    from kvdro.__main__ import main

    assert main(["simulate", "--trace", "azure-2023-conv", "--config", "TP2-PP1", "--groups", "4", "--scale", "0.65",
                 "--policy", "oracle", "--rho", "10", "--seed", "0", "--json", "--quiet"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["preemptions"] == 0 and m["completed"] == 19_366
