"""The simulator's studies behind chapter 7: the referee of chapter 4, saturation, the policies.

Each function returns a tidy ``pandas.DataFrame``; :func:`write_all` caches them under ``data/``
(``python -m kvdro.bench sim --sweeps`` regenerates them; the chapter reads the CSVs).

* :func:`referee` -- one serving group, a real trace replayed at several rates (its arrival times
  compressed or stretched, so its burstiness is kept): simulated vs analytic decode batch, requests
  holding KV, KV tokens in use, prefill share of time, waiting and end-to-end latency. Two analytic
  models: the first edition's (decode batch fixed at 64, ``config_performance(..., decode_batch=64)``)
  and the fixed point of :func:`kvdro.hardware.decode_operating_point` at the same rate.
* :func:`saturation` -- closed loop: N requests always in the engine (all queued at t = 0,
  ``max_num_seqs = N``), as lmdeploy's request-throughput benchmark runs N concurrent clients.
* :func:`policy_sweep` -- every policy on both Azure 2023 traces at rho in {2, 10, 100}: buffers
  fitted on the first half of a trace (by arrival), simulated on the second half.
* :func:`blocks_timeline` -- the per-step blocks of a handful of requests (the chapter's figure).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvdro import hardware as hw
from kvdro import queueing as q
from kvdro.sim.deployment import Deployment, default_deployment
from kvdro.sim.policies import POLICIES, policy_buffers
from kvdro.sim.simulate import simulate

__all__ = [
    "DATA_DIR",
    "REFEREE_LOADS",
    "referee",
    "saturation",
    "policy_sweep",
    "split_half",
    "blocks_timeline",
    "write_all",
]

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
#: Arrival rates of the referee, as shares of the endogenous model's saturation rate.
REFEREE_LOADS = (0.2, 0.4, 0.6, 0.75, 0.9, 1.1)


def _at_rate(trace: pd.DataFrame, rate: float) -> pd.DataFrame:
    """The trace replayed at ``rate`` requests/s (arrival times scaled; order and burstiness kept)."""
    span = float(trace["arrival_s"].max() - trace["arrival_s"].min())
    own = (len(trace) - 1) / span
    return trace.assign(arrival_s=(trace["arrival_s"] - trace["arrival_s"].min()) * own / rate)


def referee(trace: pd.DataFrame, config: hw.ParallelConfig, loads=REFEREE_LOADS, *, name: str = "",
            seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """Simulated vs analytic quantities for one group of ``config`` serving ``trace`` at each load."""
    model, gpu = hw.LLAMA2_70B, hw.A100_80GB
    L_in, xi = float(trace["input_tokens"].mean()), float(trace["output_tokens"].mean())
    ctx = L_in + xi / 2
    old = hw.config_performance(model, gpu, config, decode_batch=hw.DEFAULT_DECODE_BATCH)
    T_old = q.service_time(model, old, L_in, xi)
    H_old = q.residence_time(model, old, L_in, xi)
    new = hw.config_performance(model, gpu, config)
    T_new = q.service_time(model, new, L_in, xi)
    sat = hw.decode_operating_point(model, gpu, config, L_in, xi).saturation_rate
    from kvdro.workload import interarrival_cv

    ca2 = interarrival_cv(trace["arrival_s"].to_numpy()) ** 2
    xs = trace["output_tokens"].to_numpy(dtype=float)
    slope_old = q.service_time(model, old, L_in, xi + 1) - T_old
    slope_new = q.service_time(model, new, L_in, xi + 1) - T_new
    cs2_old, cs2_new = (slope_old * xs.std() / T_old) ** 2, (slope_new * xs.std() / T_new) ** 2
    dep = Deployment(groups=(config,))
    rows = []
    iterator = loads
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(loads, desc=f"referee {name} {config.name}", leave=False)
    for load in iterator:
        lam = load * sat
        r = simulate(_at_rate(trace, lam), policy="vllm", deployment=dep, rng=np.random.default_rng(seed))
        e, rq = r.engines, r.requests
        outs = r.outputs
        horizon = max(o.end_ps for o in outs)
        op = hw.decode_operating_point(model, gpu, config, L_in, xi, arrival_rate=lam)
        u_old, u_new = lam * T_old, lam * T_new
        w_old = q.waiting_time(u_old, T_old, cs2_old, ca2) if u_old < 1 else np.inf
        w_new = q.waiting_time(u_new, T_new, cs2_new, ca2) if u_new < 1 else np.inf
        rows.append({
            "trace": name, "config": config.name, "load": load, "rate": lam, "saturation_model": sat,
            "throughput_sim": r.metrics["completed"] / (horizon / 1e12),
            "batch_sim": float(sum(o.decode_batch_integral for o in outs) / max(sum(o.decode_ps for o in outs), 1)),
            "batch_fixed_point": op.batch, "batch_old": float(hw.DEFAULT_DECODE_BATCH),
            "running_sim": float(e["mean_running"].mean()) * config.pp,
            "running_old": lam * H_old, "running_fixed_point": lam * op.residence_s,
            "kv_tokens_sim": float((e["kv_use_mean"] * e["blocks"]).sum() * 16),
            "kv_tokens_old": lam * H_old * ctx, "kv_tokens_fixed_point": lam * op.residence_s * ctx,
            "prefill_share_sim": float(sum(o.busy_ps - o.decode_ps for o in outs) / sum(o.end_ps for o in outs)),
            "prefill_share_fixed_point": op.prefill_share,
            "utilisation_old": u_old, "utilisation_new": u_new,
            "busy_share_sim": float(sum(o.busy_ps for o in outs) / sum(o.end_ps for o in outs)),
            "wait_sim": float(rq["wait_s"].mean()), "wait_old": w_old, "wait_new": w_new, "arrival_scv": ca2,
            "e2e_sim": float(rq["e2e_s"].mean()), "e2e_p99_sim": float(rq["e2e_s"].quantile(0.99)),
            "e2e_old": w_old + H_old, "e2e_fixed_point": op.residence_s if not op.saturated else np.inf,
            "e2e_new": w_new + op.residence_s if not op.saturated else np.inf,
            "preemptions": r.metrics["preemptions"],
        })
    return pd.DataFrame(rows)


def sharegpt_like(trace: pd.DataFrame, n: int = 3000) -> pd.DataFrame:
    """The first ``n`` requests of ``trace`` with lengths rescaled to lmdeploy's ShareGPT means
    (:data:`kvdro.hardware.LMDEPLOY_SHAREGPT_TOKENS`), every request queued at t = 0."""
    part = trace.sort_values("arrival_s", kind="stable").iloc[:n]
    p_mean, o_mean = hw.LMDEPLOY_SHAREGPT_TOKENS
    inp = np.maximum(1, np.round(part["input_tokens"] * p_mean / part["input_tokens"].mean())).astype(int)
    out = np.maximum(1, np.round(part["output_tokens"] * o_mean / part["output_tokens"].mean())).astype(int)
    return pd.DataFrame({"arrival_s": 0.0, "input_tokens": inp.to_numpy(), "output_tokens": out.to_numpy(),
                         "request_class": "sharegpt-like"})


def saturation(trace: pd.DataFrame, *, n: int = 3000, concurrency=(64, 128, 256)) -> pd.DataFrame:
    """Closed-loop throughput of one TP4-PP1 group at each concurrency: simulated, the first edition's
    analytic 1/T (batch 64) and the endogenous model's 1/T at batch = concurrency, next to lmdeploy."""
    model, gpu, cfg = hw.LLAMA2_70B, hw.A100_80GB, hw.ParallelConfig(4, 1)
    measured = dict(hw.LMDEPLOY_TP4_THROUGHPUT)
    rows = []
    for workload, tr in (("ShareGPT-like", sharegpt_like(trace, n)), ("Azure conversation", _closed(trace, n))):
        L_in, xi = float(tr["input_tokens"].mean()), float(tr["output_tokens"].mean())
        old = hw.config_performance(model, gpu, cfg, decode_batch=hw.DEFAULT_DECODE_BATCH)
        old_at_peak = hw.config_performance(model, gpu.at_peak(), cfg, decode_batch=hw.DEFAULT_DECODE_BATCH)
        for c in concurrency:
            dep = Deployment(groups=(cfg,), max_num_seqs=c)
            r = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0))
            horizon = max(o.end_ps for o in r.outputs) / 1e12
            op = hw.decode_operating_point(model, gpu, cfg, L_in, xi, max_num_seqs=c)
            rows.append({
                "workload": workload, "concurrency": c, "mean_input": L_in, "mean_output": xi,
                "simulated_rps": r.metrics["completed"] / horizon,
                "model_batch64_rps": 1.0 / q.service_time(model, old, L_in, xi),
                "model_batch64_peak_rps": 1.0 / q.service_time(model, old_at_peak, L_in, xi),
                "model_endogenous_rps": op.saturation_rate,
                "lmdeploy_rps": measured.get(c, np.nan) if workload == "ShareGPT-like" else np.nan,
                "mean_batch_sim": float(r.engines["mean_decode_batch"].iloc[0]),
            })
    return pd.DataFrame(rows)


def _closed(trace: pd.DataFrame, n: int) -> pd.DataFrame:
    part = trace.sort_values("arrival_s", kind="stable").iloc[:n]
    return part.assign(arrival_s=0.0).reset_index(drop=True)


def split_half(trace: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test): the first and second halves of a trace by arrival time."""
    t = trace.sort_values("arrival_s", kind="stable")
    mid = len(t) // 2
    return t.iloc[:mid], t.iloc[mid:]


def policy_sweep(traces: dict[str, pd.DataFrame], deployments: dict[str, tuple[Deployment, float]],
                 rhos=(2.0, 10.0, 100.0), policies=POLICIES, *, seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """Every policy x rho x trace x deployment; buffers fitted on the first half, run on the second.

    ``deployments`` maps a label to (deployment, rate multiplier).
    """
    rows = []
    jobs = [(tn, dn, rho, p) for tn in traces for dn in deployments for rho in rhos for p in policies]
    iterator = jobs
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(jobs, desc="policies", leave=False)
    for tn, dn, rho, policy in iterator:
        train, test = split_half(traces[tn])
        dep, scale = deployments[dn]
        test = test.assign(arrival_s=(test["arrival_s"] - test["arrival_s"].min()) / scale)
        buffers = None if policy == "vllm" else policy_buffers(policy, train, rho=rho)
        r = simulate(test, policy=policy, buffers=buffers, deployment=dep, rho=rho, rng=np.random.default_rng(seed))
        m = dict(r.metrics)
        m.pop("wall_s")
        rows.append({"trace": tn, "deployment": dn, "scale": scale, "rho": rho, "policy": policy,
                     "buffer": float(np.mean(list(r.buffers.values()))) if r.buffers else np.nan, **m,
                     **{f"cost_{k}": r.cost[k] for k in ("preemption", "waste", "slo", "rejection", "gpu")},
                     "overflow_tokens": r.cost["overflow_tokens"], "newsvendor": r.cost["newsvendor"]})
    return pd.DataFrame(rows)


def blocks_timeline(requests: pd.DataFrame, *, blocks: int, reserve_tokens: dict | None = None,
                    max_num_seqs: int = 8, hard: bool = False) -> pd.DataFrame:
    """Per step and request: blocks reserved (held), tokens used, and free blocks, on a tiny engine of
    ``blocks`` blocks (reference engine, step by step). ``requests`` has arrival_s, input_tokens,
    output_tokens; ``reserve_tokens`` (request position -> L_in + eta) makes it a reservation policy,
    ``hard=True`` a hard one (a cap; the context window is ``blocks - 1`` blocks). vLLM's watermark is
    int(1% of ``blocks``) = 0 on so small a pool; the free-block rule applies.
    Rows: step, t_s, dur_s, kind, request (or -1 for free), blocks, used_tokens."""
    from kvdro.sim.engine_reference import run_reference
    from kvdro.sim.scheduler import EngineInput, EngineSpec, ceil_blocks
    from kvdro.sim.timing import PS_PER_S, StepClock

    n = len(requests)
    reactive = reserve_tokens is None
    reserve = np.zeros(n, dtype=np.int64) if reactive else np.array([ceil_blocks(reserve_tokens[i]) for i in range(n)], dtype=np.int64)
    inp = EngineInput(
        arrival_ps=np.round(requests["arrival_s"].to_numpy() * PS_PER_S).astype(np.int64),
        prompt=requests["input_tokens"].to_numpy().astype(np.int64),
        output=requests["output_tokens"].to_numpy().astype(np.int64),
        reserve_blocks=reserve, prefix_key=np.full(n, -1, dtype=np.int64), shared_blocks=np.zeros(n, dtype=np.int64),
    )
    spec = EngineSpec(blocks=blocks, watermark_blocks=0, max_num_seqs=max_num_seqs, token_budget=4096, free_block_rule=True,
                      hard=hard and not reactive, window_blocks=blocks - 1)
    out = run_reference(spec, inp, StepClock(hw.LLAMA2_70B, hw.A100_80GB, hw.ParallelConfig(4, 1)), record=True)
    rows = []
    for step, (t, dur, kind, free, seqs) in enumerate(out.trace):
        for j, used, cap in seqs:
            rows.append({"step": step, "t_s": t / PS_PER_S, "dur_s": dur / PS_PER_S, "kind": kind, "request": int(j),
                         "blocks": cap // 16, "used_tokens": used})
        rows.append({"step": step, "t_s": t / PS_PER_S, "dur_s": dur / PS_PER_S, "kind": kind, "request": -1,
                     "blocks": free, "used_tokens": 0})
    frame = pd.DataFrame(rows)
    frame.attrs["preemptions"] = out.preemptions.tolist()
    return frame


def write_all(data_dir: Path | None = None, *, progress: bool = True) -> list[Path]:
    """Run every study on the real traces and write the CSVs chapter 7 reads; returns their paths."""
    from kvdro.datasets import load_trace

    d = DATA_DIR if data_dir is None else Path(data_dir)
    conv, code = load_trace("azure-2023-conv"), load_trace("azure-2023-code")
    paths = []
    frames = [
        referee(conv, hw.ParallelConfig(4, 1), name="conversation", progress=progress),
        referee(conv, hw.ParallelConfig(2, 1), name="conversation", progress=progress),
        referee(code, hw.ParallelConfig(4, 1), name="code", progress=progress),
    ]
    p = d / "sim_referee.csv"
    pd.concat(frames, ignore_index=True).to_csv(p, index=False, float_format="%.6g")
    paths.append(p)
    p = d / "sim_saturation.csv"
    saturation(conv).to_csv(p, index=False, float_format="%.6g")
    paths.append(p)
    deployments = {
        "2 x TP4-PP1": (default_deployment(), 1.0),
        "4 x TP2-PP1": (default_deployment(config="TP2-PP1"), 0.6),
    }
    p = d / "sim_policies.csv"
    policy_sweep({"conversation": conv, "code": code}, deployments, progress=progress).to_csv(p, index=False, float_format="%.6g")
    paths.append(p)
    return paths
