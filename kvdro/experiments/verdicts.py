"""Summaries of the sweeps beside the paper's numbers, and a verdict per claim from fixed rules.

Each ``*_summary`` turns a sweep's rows into the table the chapter shows (means over seeds per trace);
each ``*_verdict`` returns a :class:`Verdict` -- ``"holds"``, ``"holds partly"``, ``"does not hold"``
or ``"cannot be checked"`` -- with the reason in numbers. The rules are stated in each docstring;
they judge the direction of an effect on our numbers alone, and compare its size with the paper's
printed effect only where the claim is a size (Table V).

The cost compared is ``cost_paper_per_req`` (the paper's accounting (4): newsvendor loss of each
reservation plus SLO, rejection and GPU terms, per served request) unless a function says otherwise;
``cost_realised_per_req`` (what the engine actually paid) is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "Verdict",
    "fig3_verdict",
    "fig5a_verdict",
    "fig5b_verdict",
    "fig6_verdict",
    "regret",
    "table2_summary",
    "table2_verdict",
    "table4_summary",
    "table4_verdict",
    "table5_summary",
    "table5_verdict",
]

VERDICTS = ("holds", "holds partly", "does not hold", "cannot be checked")
COST = "cost_paper_per_req"


@dataclass(frozen=True)
class Verdict:
    """A claim, our verdict (one of :data:`VERDICTS`) and the reason in numbers."""

    claim: str
    verdict: str
    reason: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict: must be one of {VERDICTS}, got {self.verdict!r}")

    def as_row(self) -> dict[str, str]:
        return {"claim": self.claim, "verdict": self.verdict, "reason": self.reason}


def _mean(df: pd.DataFrame, keys: list[str], cols: list[str]) -> pd.DataFrame:
    return df.groupby(keys, sort=False, observed=True)[cols].mean().reset_index()


# ------------------------------------------------------------------------------------------------ Table II
def table2_summary(df: pd.DataFrame, cost: str = COST) -> pd.DataFrame:
    """One row per (trace, rho): DRO, P90, P95, SAA cost (mean over seeds) and DRO's gains."""
    m = _mean(df, ["trace", "rho", "policy"], [cost]).pivot_table(index=["trace", "rho"], columns="policy", values=cost)
    m = m.rename(columns=str.upper)[["DRO", "P90", "P95", "SAA"]]
    m["gain_vs_p90"] = 1 - m.DRO / m.P90
    m["gain_vs_p95"] = 1 - m.DRO / m.P95
    return m.reset_index()


def table2_verdict(summary: pd.DataFrame) -> Verdict:
    """Claim: DRO is never costlier than P90 and P95 and gains up to ~56%, more as rho grows.

    Rule: "holds" if DRO <= min(P90, P95) in every (trace, rho) and the largest gain is >= 40%;
    "holds partly" if DRO <= min(P90, P95) in at least half of them; else "does not hold".
    """
    tol = 1e-9
    best = summary[["gain_vs_p90", "gain_vs_p95"]].min(axis=1) >= -tol
    top = float(summary[["gain_vs_p90", "gain_vs_p95"]].max(axis=1).max())
    worst = summary.loc[summary[["gain_vs_p90", "gain_vs_p95"]].min(axis=1).idxmin()]
    n, k = len(summary), int(best.sum())
    verdict = "holds" if k == n and top >= 0.4 else "holds partly" if k >= n / 2 else "does not hold"
    reason = (
        f"DRO <= both P90 and P95 in {k} of {n} (trace, rho) cells; largest gain {top:.0%}; "
        f"worst: {worst.trace} at rho = {worst.rho:g}, DRO {-min(worst.gain_vs_p90, worst.gain_vs_p95):.0%} costlier"
    )
    return Verdict("Table II: DRO beats P90/P95, gains up to 56%", verdict, reason)


# ------------------------------------------------------------------------------------------------ Table IV
def table4_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (trace, policy, rho): both costs, P99 latency, SLO violation, preemptions (means)."""
    cols = [COST, "cost_realised_per_req", "e2e_p99_s", "slo_violation_rate", "preemptions", "lost"]
    return _mean(df, ["trace", "policy", "rho"], cols)


def regret(summary: pd.DataFrame, policies: list[str] | None = None, cost: str = COST) -> pd.DataFrame:
    """Cost over the best policy's at the same (trace, rho): 1 = best. Columns: trace, policy, rho, regret."""
    s = summary if policies is None else summary[summary.policy.isin(policies)]
    best = s.groupby(["trace", "rho"])[cost].transform("min")
    return s.assign(regret=s[cost] / best)[["trace", "policy", "rho", "regret"]]


PAPER_TABLE4 = ["dro", "p90", "p95", "p99", "mean", "max", "lp1", "lp2"]


def table4_verdict(summary: pd.DataFrame) -> Verdict:
    """Claim: DRO is the only method whose cost stays bounded across rho in {2, 10, 100}.

    Read as: among the paper's eight methods, DRO's worst regret over rho (cost over the best
    method's at that rho) is the smallest, per trace. Rule: "holds" on every trace, "holds
    partly" on some, else "does not hold". The reason also names SAA's and vLLM's worst regret,
    which the paper's table omits.
    """
    r = regret(summary, PAPER_TABLE4)
    worst = r.groupby(["trace", "policy"]).regret.max().unstack()
    wins = [t for t in worst.index if worst.loc[t].idxmin() == "dro" or worst.loc[t, "dro"] <= worst.loc[t].min() * (1 + 1e-9)]
    n = len(worst.index)
    verdict = "holds" if len(wins) == n else "holds partly" if wins else "does not hold"
    full = regret(summary).groupby(["trace", "policy"]).regret.max().unstack()
    parts = []
    for t in worst.index:
        best = worst.loc[t].idxmin()
        parts.append(
            f"{t}: DRO worst regret {worst.loc[t, 'dro']:.2f}, best {best} {worst.loc[t, best]:.2f}"
            + (f", SAA {full.loc[t, 'saa']:.2f}" if "saa" in full.columns else "")
            + (f", vLLM {full.loc[t, 'vllm']:.2f}" if "vllm" in full.columns else "")
        )
    return Verdict("Table IV: only DRO keeps its cost bounded across rho", verdict, "; ".join(parts))


# ------------------------------------------------------------------------------------------------ Table V
def table5_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (source, variant): mean and standard deviation over seeds of cost, P99, goodput, SLO."""
    cols = [COST, "cost_realised_per_req", "e2e_p99_s", "goodput_rps", "slo_violation_rate", "preemptions", "rejected"]
    g = df.groupby(["source", "variant"], sort=False)[cols]
    out = g.mean()
    sd = g.std(ddof=0).add_suffix("_sd")
    summary = pd.concat([out, sd], axis=1)
    if "plan" in df.columns:  # configurations the plan deploys, e.g. "... : 1 x TP2-PP1 + 1 x TP4-PP1 (6 GPUs)"
        configs = df["plan"].astype(str).str.count(r" x TP")
        summary["configs_deployed"] = configs.groupby([df["source"], df["variant"]], sort=False).max()
    return summary.reset_index()


def table5_verdict(summary: pd.DataFrame, source: str) -> list[Verdict]:
    """Claims of Table V on ``source``: removing each component raises cost (routing: x7, i.e.
    +597%; DRO: +85%) or P99 latency (prefix caching: +22%). Rule per component: "holds" if our
    ablation is worse than the full plan by at least half the paper's printed effect, "holds partly"
    if worse but by less (more than 1%), else "does not hold". Routing is "cannot be checked" where the
    full plan deploys a single configuration (then uniform routing is the same plan)."""
    s = summary[summary.source == source].set_index("variant")
    full = s.loc["bcd-dro"]
    out = []
    for variant, col, claim, effect in (
        ("no-routing", COST, "Table V: without routing, cost x7", 93878 / 13476 - 1),
        ("no-dro", COST, "Table V: SAA instead of DRO, cost +85%", 24864 / 13476 - 1),
        ("no-prefix", "e2e_p99_s", "Table V: without prefix caching, P99 +22%", 9.95 / 8.12 - 1),
    ):
        change = float(s.loc[variant, col] / full[col] - 1)
        what = "cost" if col == COST else "P99 latency"
        reason = f"{source} trace: {what} {change:+.0%} against the full plan (paper {effect:+.0%})"
        if variant == "no-routing" and full.get("configs_deployed", 2) == 1:
            out.append(Verdict(claim, "cannot be checked", reason + "; the plan deploys one configuration, so uniform routing is the same plan"))
            continue
        verdict = "holds" if change >= effect / 2 else "holds partly" if change > 0.01 else "does not hold"
        out.append(Verdict(claim, verdict, reason))
    return out


# ------------------------------------------------------------------------------------------------ Figures
def fig3_verdict(df: pd.DataFrame) -> Verdict:
    """Figure 3(a), read as: DRO's cost stays the lowest of the reservation rules as the load grows.

    Rule: "holds" if DRO's cost is within 1% of the lowest reservation rule (vLLM excluded) at every
    (trace, load); "holds partly" at half of them; else "does not hold"."""
    s = _mean(df[df.policy != "vllm"], ["trace", "load", "policy"], [COST])
    best = s.groupby(["trace", "load"])[COST].transform("min")
    d = s[s.policy == "dro"]
    ok = d[COST] <= best[d.index] * 1.01
    n, k = len(d), int(ok.sum())
    verdict = "holds" if k == n else "holds partly" if k >= n / 2 else "does not hold"
    return Verdict("Figure 3(a): DRO's cost advantage persists as load scales", verdict,
                   f"DRO within 1% of the cheapest reservation rule at {k} of {n} (trace, load) points")


def fig5b_verdict(df: pd.DataFrame) -> Verdict:
    """Claim: DRO's advantage over SAA grows monotonically with the shift s.

    Advantage = 1 - cost(DRO)/cost(SAA). Rule: "holds" if it is non-decreasing in s and positive at
    the largest s for every (trace, rho); "holds partly" if positive at the largest s for some;
    else "does not hold"."""
    s = _mean(df, ["trace", "rho", "shift", "policy"], [COST]).pivot_table(index=["trace", "rho", "shift"], columns="policy", values=COST)
    s["advantage"] = 1 - s["dro"] / s["saa"]
    mono, pos = 0, 0
    groups = list(s.groupby(level=[0, 1]))
    for _, g in groups:
        a = g["advantage"].to_numpy()
        mono += bool(np.all(np.diff(a) >= -1e-9) and a[-1] > 0)
        pos += bool(a[-1] > 0)
    n = len(groups)
    verdict = "holds" if mono == n else "holds partly" if pos else "does not hold"
    top = s["advantage"].max()
    return Verdict("Figure 5(b): DRO's advantage grows with the shift", verdict,
                   f"monotone and positive in {mono} of {n} (trace, rho); positive at the largest s in {pos}; "
                   f"largest advantage {top:.0%}")


def fig6_verdict(df: pd.DataFrame, source: str = "real") -> Verdict:
    """Claim: under shift SAA's P99 grows far more than DRO's (3.0 s -> ~18 s vs ~9 s at s = 3).

    Rule: at the largest s, "holds" if the SAA plan's P99 exceeds the DRO plan's by more than 25%,
    "holds partly" if by 0-25%, else "does not hold"."""
    s = _mean(df[df.source == source], ["variant", "shift"], ["e2e_p99_s"]).pivot_table(index="shift", columns="variant", values="e2e_p99_s")
    top = s.index.max()
    ratio = float(s.loc[top, "no-dro"] / s.loc[top, "bcd-dro"])
    verdict = "holds" if ratio > 1.25 else "holds partly" if ratio > 1 else "does not hold"
    return Verdict(
        "Figure 6: under shift SAA's P99 grows twice as much as DRO's", verdict,
        f"{source} trace, s = {top:g}: P99 SAA plan {s.loc[top, 'no-dro']:.1f} s, DRO plan {s.loc[top, 'bcd-dro']:.1f} s "
        f"(at s = {s.index.min():g}: {s.loc[s.index.min(), 'no-dro']:.1f} s and {s.loc[s.index.min(), 'bcd-dro']:.1f} s)",
    )


def fig5a_verdict(df: pd.DataFrame) -> Verdict:
    """Claim: under drift the rolling horizon stays robust where static buffers degrade.

    Per (trace, policy): the mean newsvendor cost per request over the second half of the windows,
    static vs rolling. Rule: "holds" if rolling is cheaper for every (trace, policy), "holds
    partly" for some, else "does not hold"."""
    wcols = sorted(c for c in df.columns if c.startswith("w") and c.endswith("_cost_per_req"))
    late = wcols[len(wcols) // 2:]
    d = df.assign(late_cost=df[late].mean(axis=1))
    p = _mean(d, ["trace", "policy", "mode"], ["late_cost"]).pivot_table(index=["trace", "policy"], columns="mode", values="late_cost")
    better = p["rolling"] < p["static"]
    n, k = len(p), int(better.sum())
    verdict = "holds" if k == n else "holds partly" if k else "does not hold"
    gain = float((1 - p["rolling"] / p["static"]).median())
    return Verdict("Figure 5(a): rolling horizon beats static buffers under drift", verdict,
                   f"rolling cheaper late in the drift in {k} of {n} (trace, policy); median saving {gain:.0%}")
