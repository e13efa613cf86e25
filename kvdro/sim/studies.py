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
* :func:`policy_sweep` -- every policy on both Azure 2023 traces at rho in {2, 10, 100}, both
  readings of a reservation, at each trace's operating points (:mod:`kvdro.sim.regimes`): buffers
  fitted on the first half of a trace (by arrival), simulated on the second half.
* :func:`safety_table` -- every policy with and without vLLM's watermark and free-block rule.
* :func:`resemblance` -- how closely simulated costs follow the paper's Table IV.
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
    "SAFETY_CASES",
    "safety_table",
    "resemblance",
    "blocks_timeline",
    "timeline_layers",
    "preemption_times",
    "PARTS",
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
                 rhos=(2.0, 10.0, 100.0), policies=POLICIES, *, readings=("soft",), safety=(True,), seed: int = 0,
                 progress: bool = False) -> pd.DataFrame:
    """Every policy x rho x reading x safety rules x trace x deployment; buffers fitted on the first
    half of a trace, run on the second (re-zeroed, its rate multiplied by the deployment's scale).

    ``deployments`` maps a label to (deployment, rate multiplier), or, per trace, ``traces`` label ->
    such a dict (each trace at its own operating points). ``readings`` are ``simulate``'s
    ``reservation`` values, ``safety`` its ``safety_rules`` values; ``vllm``, which reserves nothing,
    runs once per (trace, deployment, rho), with ``reading`` "soft" and ``safety_rules`` True.
    """
    rows = []
    per_trace = {tn: deployments[tn] if tn in deployments else deployments for tn in traces}
    jobs = [(tn, dn, rho, p, rd, sf) for tn in traces for dn in per_trace[tn] for rho in rhos for p in policies
            for rd in readings for sf in safety
            if p != "vllm" or (rd == readings[0] and sf == safety[0])]
    iterator = jobs
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(jobs, desc="policies", leave=False)
    halves = {tn: split_half(tr) for tn, tr in traces.items()}
    for tn, dn, rho, policy, reading, safe in iterator:
        train, test = halves[tn]
        dep, scale = per_trace[tn][dn]
        test = test.assign(arrival_s=(test["arrival_s"] - test["arrival_s"].min()) / scale)
        buffers = None if policy == "vllm" else policy_buffers(policy, train, rho=rho)
        r = simulate(test, policy=policy, buffers=buffers, deployment=dep, rho=rho, rng=np.random.default_rng(seed),
                     reservation=reading, safety_rules=safe)
        m = dict(r.metrics)
        m.pop("wall_s")
        rows.append({"trace": tn, "deployment": dn, "scale": scale, "rho": rho, "policy": policy,
                     "reading": "soft" if policy == "vllm" else reading, "safety_rules": True if policy == "vllm" else safe,
                     "buffer": float(np.mean(list(r.buffers.values()))) if r.buffers else np.nan, **m,
                     "preempted_share": float((r.requests["preemptions"] > 0).mean()),
                     **{f"cost_{k}": r.cost[k] for k in ("preemption", "waste", "slo", "rejection", "gpu")},
                     "overflow_tokens": r.cost["overflow_tokens"], "newsvendor": r.cost["newsvendor"]})
    return pd.DataFrame(rows)


#: Deployments of chapter 7's before/after table of the safety rules: label -> (deployment, load).
SAFETY_CASES = {
    "4 x TP2-PP1 at 0.6": (default_deployment(config="TP2-PP1"), 0.6),
    "2 x TP4-PP1 at 1.0": (default_deployment(), 1.0),
    "2 x TP4-PP1, max_num_seqs 1,024, at 1.5": (default_deployment(max_num_seqs=1024), 1.5),
}


def safety_table(trace: pd.DataFrame, *, rho: float = 10.0, progress: bool = False) -> pd.DataFrame:
    """Every policy with vLLM's watermark and free-block rule (``safety_rules=True``, the simulator's
    only behaviour) and without them (the package before issue 15), on :data:`SAFETY_CASES`."""
    return policy_sweep({"conversation": trace}, SAFETY_CASES, rhos=(rho,), safety=(True, False), progress=progress)


def resemblance(costs: pd.DataFrame, paper: dict[str, tuple]) -> dict[str, float]:
    """How closely simulated costs follow the paper's Table IV: ``costs`` has columns policy, rho,
    cost (one reading, one regime); ``paper`` maps a policy to (cost at rho 2, 10, 100, ...).

    Returns the Spearman rank correlation of the 24 (policy, rho) costs with the paper's, and the
    median absolute log10 error after the best single scale factor (the units differ), and the same
    for the growth cost(rho = 100) / cost(rho = 2) of each policy (the paper's signature: Mean x34,
    Max x1.0). A rank correlation with a constant side (e.g. no cost grows) is reported as 0: no
    resemblance, rather than NaN.
    """
    from scipy.stats import spearmanr

    def rank_corr(a: np.ndarray, b: np.ndarray) -> float:
        return float(spearmanr(a, b)[0]) if np.ptp(a) > 0 and np.ptp(b) > 0 else 0.0

    rhos = (2.0, 10.0, 100.0)
    sim = costs.set_index(["policy", "rho"])["cost"]
    pol = [p for p in paper if all((p, r) in sim.index for r in rhos)]
    if len(pol) < 3:
        raise ValueError("costs: need the paper's policies at rho 2, 10 and 100")
    x = np.log10([max(sim[(p, r)], 1e-9) for p in pol for r in rhos])
    y = np.log10([paper[p][i] for p in pol for i in range(3)])
    shift = np.median(y - x)
    gx = np.array([np.log10(max(sim[(p, 100.0)], 1e-9) / max(sim[(p, 2.0)], 1e-9)) for p in pol])
    gy = np.array([np.log10(paper[p][2] / paper[p][0]) for p in pol])
    return {"spearman": rank_corr(x, y), "log10_error": float(np.median(np.abs(y - x - shift))),
            "growth_spearman": rank_corr(gx, gy), "growth_log10_error": float(np.median(np.abs(gy - gx)))}


def blocks_timeline(requests: pd.DataFrame, *, blocks: int, reserve_tokens: dict | None = None,
                    max_num_seqs: int = 8, hard: bool = False, watermark_blocks: int = 1) -> pd.DataFrame:
    """Per step and request: blocks reserved (held), tokens used, and free blocks, on a tiny engine of
    ``blocks`` blocks (reference engine, step by step). ``requests`` has arrival_s, input_tokens,
    output_tokens; ``reserve_tokens`` (request position -> L_in + eta) makes it a reservation policy,
    ``hard=True`` a hard one (a cap; the context window is ``blocks - 1 - watermark_blocks`` blocks).
    The free-block rule applies; the watermark is ``watermark_blocks`` (vLLM's 1% of a real pool is
    dozens of blocks; of a toy pool it would round to 0).
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
    spec = EngineSpec(blocks=blocks, watermark_blocks=watermark_blocks, max_num_seqs=max_num_seqs, token_budget=4096,
                      free_block_rule=True, hard=hard and not reactive, window_blocks=blocks - 1 - watermark_blocks)
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


def timeline_layers(frame: pd.DataFrame) -> pd.DataFrame:
    """A :func:`blocks_timeline` frame as stacked layers per step: blocks holding cached tokens,
    reserved but unused, and free (columns step, t_s, dur_s, ``blocks are``, n, layer)."""
    held = frame[frame["request"] >= 0].assign(used=lambda d: -(-d["used_tokens"] // 16))
    per = held.groupby(["step", "t_s", "dur_s"], as_index=False)[["blocks", "used"]].sum()
    free = frame[frame["request"] < 0].set_index("step")["blocks"]
    per["free"] = per["step"].map(free)
    per["reserved, unused"] = per["blocks"] - per["used"]
    out = per.rename(columns={"used": "holding cached tokens"}).melt(
        id_vars=["step", "t_s", "dur_s"], value_vars=["holding cached tokens", "reserved, unused", "free"],
        var_name="blocks are", value_name="n")
    return out.assign(layer=out["blocks are"].map({"holding cached tokens": 0, "reserved, unused": 1, "free": 2}))


def preemption_times(frame: pd.DataFrame) -> pd.DataFrame:
    """Times at which a request of a :func:`blocks_timeline` frame leaves the running set and comes back."""
    seen = frame[frame["request"] >= 0].groupby("request")["step"].apply(sorted)
    t_of = frame.drop_duplicates("step").set_index("step")["t_s"]
    rows = [{"t_s": t_of[b], "request": j} for j, steps in seen.items() for a, b in zip(steps, steps[1:]) if b > a + 1]
    return pd.DataFrame(rows, columns=["t_s", "request"])


PARTS = ("referee", "saturation", "regimes", "policies", "safety")


def write_all(data_dir: Path | None = None, *, progress: bool = True, parts=PARTS) -> list[Path]:
    """Run the studies on the real traces and write the CSVs chapter 7 reads; returns their paths.

    ``parts`` (default all, in this order): ``referee`` -> ``sim_referee.csv``, ``saturation`` ->
    ``sim_saturation.csv``, ``regimes`` -> ``sim_regimes.csv`` (:mod:`kvdro.sim.regimes`),
    ``policies`` -> ``sim_policies.csv`` (every policy, both readings, at each trace's operating
    points chosen from ``sim_regimes.csv``), ``safety`` -> ``sim_safety.csv``.
    """
    from kvdro.datasets import load_trace
    from kvdro.sim import regimes

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts: unknown {sorted(unknown)} (use {PARTS})")
    from kvdro.cachefile import write_csv_atomic

    d = DATA_DIR if data_dir is None else Path(data_dir)
    conv, code = load_trace("azure-2023-conv"), load_trace("azure-2023-code")
    paths = []

    def write(frame: pd.DataFrame, name: str) -> None:
        p = d / name
        write_csv_atomic(frame, p, float_format="%.6g")
        paths.append(p)

    if "referee" in parts:
        write(pd.concat([
            referee(conv, hw.ParallelConfig(4, 1), name="conversation", progress=progress),
            referee(conv, hw.ParallelConfig(2, 1), name="conversation", progress=progress),
            referee(code, hw.ParallelConfig(4, 1), name="code", progress=progress),
        ], ignore_index=True), "sim_referee.csv")
    if "saturation" in parts:
        write(saturation(conv), "sim_saturation.csv")
    traces = {"conversation": conv, "code": code}
    if "regimes" in parts:
        write(regimes.regime_map(traces, progress=progress), "sim_regimes.csv")
    if "policies" in parts:
        rmap = regimes.load_regime_map(d / "sim_regimes.csv")
        points = {}
        for tn in traces:
            chosen = regimes.choose_operating_points(rmap, tn)
            points[tn] = {f"{name}: {pt.deployment_label} at {pt.scale:g}": (pt.deployment(), pt.scale) for name, pt in chosen.items()}
        frame = policy_sweep(traces, points, readings=("soft", "hard"), progress=progress)
        frame.insert(1, "regime", frame["deployment"].str.split(":").str[0])
        frame["deployment"] = frame["deployment"].str.split(": ").str[1]
        write(frame, "sim_policies.csv")
    if "safety" in parts:
        write(safety_table(conv, progress=progress), "sim_safety.csv")
    return paths
