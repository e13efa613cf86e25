"""``python -m kvdro simulate``: run the simulator on a named trace or on your own Azure-schema CSV.

::

    python -m kvdro simulate --trace azure-2023-conv --policy dro --rho 10 --seed 0 --json
    python -m kvdro simulate --trace my_trace.csv --policy vllm --config TP2-PP1 --groups 4 --scale 2

``--trace`` is a dataset name of :data:`kvdro.datasets.REGISTRY` (``azure-2023-conv``,
``azure-2023-code``, ...) or the path of a CSV with the Azure columns ``TIMESTAMP``,
``ContextTokens``, ``GeneratedTokens`` (a bad file gets an error naming the file, the row and the
column). ``--scale X`` multiplies the arrival rate by X. Without ``--config`` the deployment is the
documented default (:func:`kvdro.sim.default_deployment`: the paper's J = 8 A100s as 2 x TP4-PP1).
``--reservation soft|hard`` picks the reading of a reservation (:mod:`kvdro.sim.scheduler`).
``--policy oracle|exact`` runs an oracle that knows every true output length (the look-ahead
admission that never preempts, or a reservation of exactly L_in + xi); ``--schedule sof`` orders the
waiting queue shortest-output-first with aging, by the true lengths (:func:`kvdro.sim.simulate`).
Buffers of a reservation policy are fitted on the trace itself (in sample). ``--json`` prints
exactly the metric keys (:data:`kvdro.sim.METRIC_KEYS`) as strict JSON (a non-finite number, e.g.
``cost_total`` at ``--rho 1e308``, is null and named on stderr); ``--breakdown`` adds ``cost_breakdown``.

``--engine`` names the engine whose rules run (a preset of :mod:`kvdro.sim.engines`; default
``vllm-v0``, today's), ``--implementation`` the code that runs it (``fast``, compiled, or ``reference``,
step by step; the retired ``fast-python`` is refused, exit 2, saying what replaces it), and ``--max-new
unset|true|policy|N`` what each request carries as ``max_new_tokens`` (:mod:`kvdro.sim.engine_choice`):
a request longer than it ends there and is counted as capped. With another preset or a ``--max-new``,
``--json`` adds ``capped``, ``engine``, ``implementation`` and ``max_new`` to the metric keys.

``--plan plan.json`` (:mod:`kvdro.sim.plan`) serves a plan of ``python -m kvdro solve --json`` on its
instance's test half, or on ``--trace`` (a registry trace of the instance's families is split into
its sub-classes by prompt length). It honours ``--trace``, ``--scale``, ``--engine``,
``--implementation``, ``--max-new`` (``policy``: each class's planned eta_i), ``--reservation``, ``--schedule``, ``--max-model-len``, ``--seed``, ``--json``, ``--breakdown`` and
``--quiet``, and refuses (exit 2, naming the flag) ``--policy``, ``--rho``, ``--config`` and
``--groups``, which the plan fixes. A progress bar goes to stderr. Exit status 0 on success, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvdro._strict_json import dumps as strict_json

__all__ = ["add_parser", "run", "load_trace_arg"]


def add_parser(sub) -> argparse.ArgumentParser:
    """Register the ``simulate`` subcommand on an argparse sub-parser set."""
    from kvdro.sim.engine_choice import IMPLEMENTATIONS
    from kvdro.sim.engines import ENGINES
    from kvdro.sim.policies import ALL_POLICIES

    s = sub.add_parser("simulate", help="simulate a trace on vLLM-semantics engines (kvdro.sim, chapter 7)")
    s.add_argument("--trace", default=None, help="dataset name (e.g. azure-2023-conv) or path of an Azure-schema CSV "
                   "(required unless --plan; with --plan it replaces the instance's test half)")
    s.add_argument("--policy", default=None, choices=ALL_POLICIES,
                   help="admission policy (required unless --plan); oracle and exact know the true output lengths")
    s.add_argument("--plan", default=None, help="a plan document of `python -m kvdro solve --json` (kvdro.sim.plan): "
                   "simulate its deployment, routing, caching and buffers")
    s.add_argument("--rho", type=float, default=None, help="cost ratio c_p / c_w (default 10; a plan fixes its own)")
    s.add_argument("--config", default=None, help="serving configuration, e.g. TP4-PP1 (default: 2 x TP4-PP1)")
    s.add_argument("--groups", type=int, default=None, help="number of groups of --config (default: as many as 8 GPUs hold)")
    s.add_argument("--seed", type=int, default=0, help="seed of the routing draw (default 0)")
    s.add_argument("--scale", type=float, default=1.0, help="multiplier of the arrival rate (default 1)")
    s.add_argument("--max-model-len", type=int, default=None, help="context window in tokens (default 16384; Llama-2: 4096)")
    s.add_argument("--engine", choices=ENGINES + IMPLEMENTATIONS, default="vllm-v0", type=_not_retired,
                   help="the engine's rules, a preset: vllm-v0 (default), vllm-v1, sglang, trtllm-gne, trtllm-maxutil, "
                        "lightllm (kvdro.sim.engines); the old values fast, reference mean vllm-v0 with "
                        "that --implementation")
    s.add_argument("--implementation", choices=IMPLEMENTATIONS, default=None, type=_not_retired,
                   help="the code that runs the engine: fast (compiled, default; vllm-v0 jumps between events) or "
                        "reference (step by step, the specification)")
    s.add_argument("--max-new", default="unset", type=_max_new_arg, metavar="unset|true|policy|policy-soft|N",
                   help="each request's max_new_tokens: unset (window - prompt, default), true (its true length), "
                        "policy (--policy's estimate eta_i), or a client cap N >= 1; a longer request ends there, "
                        "counted as capped (not served); policy-soft: the estimate reserved against, no cap "
                        "(sglang, lightllm)")
    s.add_argument("--reservation", choices=("soft", "hard"), default="soft",
                   help="reading of a reservation: soft = admission control (default), hard = a cap (preempt at the "
                        "reservation, re-admit with a doubled buffer); ignored for vllm")
    s.add_argument("--schedule", choices=("fcfs", "sof"), default="fcfs",
                   help="waiting-queue order: fcfs (vLLM's, default) or sof = shortest-output-first with aging "
                        "(0.1 s per token), by the true output lengths")
    s.add_argument("--json", action="store_true", help="print the metrics as JSON")
    s.add_argument("--breakdown", action="store_true", help="with --json, add the cost breakdown")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    return s


def _not_retired(text: str) -> str:
    """``--engine`` / ``--implementation``: argparse names the flag and says what replaces a retired
    implementation (:data:`kvdro.sim.engine_choice.RETIRED`); the choices are checked after."""
    from kvdro.sim.engine_choice import RETIRED

    if text in RETIRED:
        raise argparse.ArgumentTypeError(f"{text!r} is retired; {RETIRED[text]}")
    return text


def _max_new_arg(text: str):
    """``--max-new``: unset, true, policy, or an integer >= 1 (argparse names the flag otherwise)."""
    if text in ("unset", "true", "policy", "policy-soft"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be unset, true, policy, policy-soft or an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 [tokens], got {value}")
    return value


def load_trace_arg(trace: str):
    """A registry name -> :func:`kvdro.datasets.load_trace`; otherwise a CSV path read with
    :func:`kvdro.datasets.read_azure_csv` (class = the file's stem)."""
    from kvdro import datasets

    if trace in datasets.REGISTRY:
        return datasets.load_trace(trace)
    path = Path(trace)
    if not path.is_file():
        raise ValueError(f"--trace: {trace!r} is neither a known dataset ({', '.join(sorted(datasets.REGISTRY))}) nor a CSV file")
    from kvdro.sim.timing import MAX_HORIZON_S

    return datasets.read_azure_csv(path, path.stem, max_span_s=MAX_HORIZON_S)


def _scaled(trace, scale: float):
    """``trace`` with its arrival rate multiplied by ``scale``; ValueError names ``--scale`` when the
    stretched arrivals no longer fit the simulator's clock (:data:`kvdro.sim.timing.MAX_HORIZON_S`)."""
    from kvdro.sim.timing import MAX_HORIZON_S

    t = trace["arrival_s"].to_numpy(dtype=float)
    span = float(t.max() - t.min()) if t.size else 0.0
    if span / scale > MAX_HORIZON_S:
        raise ValueError(f"--scale: {scale:g} stretches the trace's {span:.3g} s of arrivals to {span / scale:.3g} s, "
                         f"more than the {MAX_HORIZON_S:.3g} s ({MAX_HORIZON_S / 86400:.1f} days) the simulator's "
                         f"clock holds; use --scale >= {span / MAX_HORIZON_S:.3g}")
    return trace.assign(arrival_s=t / scale)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from kvdro.sim import default_deployment, simulate

    if args.seed < 0:  # numpy's own refusal ("expected non-negative integer") does not name --seed
        print(f"kvdro simulate: --seed: must be a non-negative integer, got {args.seed}", file=sys.stderr)
        return 2
    if args.plan is not None:
        return _run_plan(args)
    if args.rho is None:
        args.rho = 10.0
    if args.trace is None or args.policy is None:
        print("kvdro simulate: --trace and --policy are required unless --plan is given", file=sys.stderr)
        return 2
    try:
        if not (np.isfinite(args.scale) and args.scale > 0):
            raise ValueError(f"--scale: must be a positive number, got {args.scale!r}")
        trace = load_trace_arg(args.trace)
        if args.scale != 1.0:
            trace = _scaled(trace, args.scale)
        settings = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
        dep = default_deployment(trace, config=args.config or "TP4-PP1", groups=args.groups, **settings)
        result = simulate(trace, policy=args.policy, deployment=dep, rho=args.rho, rng=np.random.default_rng(args.seed),
                          engine=args.engine, implementation=args.implementation, max_new=args.max_new,
                          progress=not args.quiet, reservation=args.reservation, schedule=args.schedule)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvdro simulate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = dict(result.metrics)
        if result.engine != "vllm-v0" or result.max_new != "unset":  # which engine ran, what max_new carried
            out.update(engine=result.engine, implementation=result.implementation, max_new=result.max_new)
        if args.breakdown:
            out["cost_breakdown"] = result.cost
        print(strict_json(out, prog="kvdro simulate", indent=2))
        return 0
    m = result.metrics
    print(f"{args.trace}: {len(trace):,} requests, policy {args.policy} ({args.reservation}, {args.schedule}), rho {args.rho:g}, "
          f"{dep.describe()}, engine {result.engine} ({result.implementation}), max_new {result.max_new}")
    print(f"  completed {m['completed']:,} (truncated {m['truncated']:,}), rejected {m['rejected']:,}, ignored {m['ignored']:,}"
          + (f", capped at max_new {m['capped']:,}" if "capped" in m else ""))
    print(f"  preemptions {m['preemptions']:,}, recomputed tokens {m['recomputed_tokens']:,}")
    print(f"  TTFT p50/p99 {m['ttft_p50_s']:.3f}/{m['ttft_p99_s']:.3f} s, TPOT p50 {m['tpot_p50_s'] * 1e3:.1f} ms, "
          f"e2e p50/p99 {m['e2e_p50_s']:.2f}/{m['e2e_p99_s']:.2f} s, SLO violations {m['slo_violation_rate']:.1%}")
    print(f"  goodput {m['goodput_rps']:.3f} req/s, throughput {m['throughput_tok_s']:.0f} tok/s, "
          f"mean batch {m['mean_batch']:.1f}, KV use {m['kv_utilisation_mean']:.1%}")
    c = result.cost
    print("  cost " + ", ".join(f"{k} {c[k]:,.0f}" for k in ("preemption", "waste", "slo", "rejection", "gpu"))
          + f"; total {c['total']:,.0f} ({c['per_second']:.2f} per s over {c['horizon_s']:.0f} s)")
    print(f"  simulated in {m['wall_s']:.2f} s")
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    """``simulate --plan plan.json``: the plan on its instance's test half (or ``--trace``), JSON with
    the metric keys plus ``e2e_mean_s``, ``observed`` and the plan's ``predicted``. The flags a plan
    fixes (:data:`kvdro.sim.plan.FIXED_BY_PLAN`) are refused with exit 2; ``--scale``, ``--engine``,
    ``--implementation``, ``--max-new`` (``policy``: the plan's eta_i), ``--reservation``, ``--schedule``,
    ``--max-model-len`` and ``--seed`` are honoured."""
    import numpy as np

    from kvdro.sim.plan import FIXED_BY_PLAN, simulate_plan

    given = {"--policy": args.policy, "--rho": args.rho, "--config": args.config, "--groups": args.groups}
    for flag, value in given.items():
        if value is not None:
            print(f"kvdro simulate: {flag} cannot be combined with --plan: {FIXED_BY_PLAN[flag]} "
                  "(drop the flag, or solve another plan)", file=sys.stderr)
            return 2
    try:
        if not (np.isfinite(args.scale) and args.scale > 0):
            raise ValueError(f"--scale: must be a positive number, got {args.scale!r}")
        path = Path(args.plan)
        if not path.is_file():
            raise ValueError(f"--plan: {args.plan!r} is not a file")
        try:
            plan = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"--plan: {args.plan} is not JSON ({exc})") from None
        trace = None if args.trace is None else load_trace_arg(args.trace)
        settings = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
        result, summary = simulate_plan(plan, trace, seed=args.seed, scale=args.scale, engine=args.engine,
                                        implementation=args.implementation, max_new=args.max_new,
                                        reservation=args.reservation, schedule=args.schedule,
                                        progress=not args.quiet, **settings)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvdro simulate: {exc}", file=sys.stderr)
        return 2
    out = dict(result.metrics)
    out["e2e_mean_s"] = summary["observed"]["e2e_mean_s"]
    out.update(summary)
    if args.breakdown:
        out["cost_breakdown"] = result.cost
    if args.json:
        print(strict_json(out, prog="kvdro simulate", indent=2))
        return 0
    o, p = summary["observed"], summary["predicted"] or {}
    print(f"plan {args.plan}: {summary['deployment']} ({args.reservation}, {args.schedule}, engine {summary['engine']}, "
          f"max_new {summary['max_new']}"
          + (f", arrival rate x {args.scale:g}" if args.scale != 1.0 else "") + ")")
    for key in ("e2e_mean_s", "goodput_rps", "kv_utilisation_mean"):
        pv = p.get(key)
        print(f"  {key:<20} simulated {o[key]:10.3f}   predicted {'–' if pv is None else format(pv, '10.3f')}")
    print(f"  cost per s: realised {o['cost_realised_per_s']:,.1f}, paper accounting {o['cost_paper_per_s']:,.1f}")
    return 0
