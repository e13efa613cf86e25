"""The verdict on each claim of the paper, from rules fixed before the sweeps they judge (issue 15).

Every rule is a function below, written before the sweep it judges. Each claim is read **one way,
fixed up front** -- the paper's own reading (its cost, its radius unit); other readings are shown in
chapter 8 as sensitivity and never change a verdict. A rule

1. cuts the sweep into *groups* (a trace and rho, a trace and load, ...), compares the arms of each
   group *paired* (same arrivals) and attaches a 95 % bootstrap interval to the effect
   (:mod:`kvdro.experiments.uncertainty`: time blocks of a real test half, seeds of a synthetic twin);
2. marks a group **cannot be checked** when the mechanism the claim is about is inert there
   (:func:`inert`): for a claim about *reservations* -- no compared policy preempts (at least
   :data:`PREEMPT_MIN` preemption per run on average), or the KV cache
   is on average less than :data:`KV_MIN` full, or the compared plans are identical; for a claim about
   routing or prefix caching -- the compared plans are identical;
3. passes or fails each checkable group on the *interval*, not the point (the noise margin), and
4. gives ``"holds"`` if every checkable group passes (plus the claim's size condition where it states a
   size), ``"holds partly"`` if a strict majority passes, ``"does not hold"`` otherwise, and ``"cannot
   be checked"`` if no group is checkable.

Costs are per served request. ``nv`` is the newsvendor term (2)+(3) alone; ``total`` is the paper's
accounting (4): the newsvendor term plus the SLO, rejection and GPU terms (the GPU price is the
book's, chapter 5). Which one a claim uses is fixed in its rule.

:func:`verdicts` returns every verdict of a regime from the cached sweeps (``data/experiments_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvdro.experiments import uncertainty as unc

__all__ = [
    "CLAIMS",
    "COST",
    "KV_MIN",
    "VERDICTS",
    "Group",
    "Verdict",
    "arm_units",
    "decide",
    "fig2b_verdict",
    "fig3_verdict",
    "fig5a_verdict",
    "fig5b_verdict",
    "fig6_verdict",
    "inert",
    "p99_change",
    "premium_verdict",
    "regret",
    "table2_gains",
    "table2_verdict",
    "table4_summary",
    "table4_verdict",
    "table5_summary",
    "table5_verdicts",
    "verdicts",
]

VERDICTS = ("holds", "holds partly", "does not hold", "cannot be checked")
COST = "cost_paper_per_req"
#: Below this mean KV-cache use a reservation cannot matter: "cannot be checked".
KV_MIN = 0.5
#: A compared arm "preempts" if it preempts at least this often per run on average (one stray
#: preemption in a few of thirty runs is not a mechanism at work).
PREEMPT_MIN = 1.0
SYNTHETIC_TRACES = ("synthetic-conv", "synthetic-code")

#: The claims, in the order of the chapter's closing table (short labels).
CLAIMS = (
    "Table II: DRO beats P90/P95, up to 56%",
    "Table IV: only DRO stays bounded across rho",
    "Figure 2(b): DRO's quantile tracks q*",
    "Figure 3(a): DRO's advantage persists with load",
    "Premium < 1.3% at eps = 0.5",
    "Table V: without routing, cost x7",
    "Table V: SAA instead of DRO, cost +85%",
    "Table V: without prefix caching, P99 +22%",
    "Figure 5(a): rolling beats static under drift",
    "Figure 5(b): DRO's advantage grows with shift",
    "Figure 6: SAA's P99 grows twice DRO's",
)


@dataclass(frozen=True)
class Group:
    """One group of a rule: its label, whether it is checkable (else why not), the effect with its
    interval, whether it passes, and the mechanism's activity (preemptions per run, mean KV use)."""

    label: str
    effect: unc.Interval | None
    passed: bool
    inert: str | None
    preemptions: float | None
    kv: float | None

    def as_row(self) -> dict:
        e = self.effect
        return {"group": self.label, "effect": None if e is None else e.point, "lo": None if e is None else e.lo,
                "hi": None if e is None else e.hi, "checkable": self.inert is None,
                "passes": self.passed if self.inert is None else None, "why not checkable": self.inert or "",
                "preemptions": self.preemptions, "kv_utilisation_mean": self.kv}


@dataclass(frozen=True)
class Verdict:
    """A claim, our verdict (one of :data:`VERDICTS`), the reason in numbers, the regime, and the
    mechanism's activity over the runs compared (mean preemptions per run, mean KV use; ``None``
    where no simulator is involved). ``groups`` holds the per-group detail."""

    claim: str
    verdict: str
    reason: str
    regime: str = ""
    preemptions: float | None = None
    kv_utilisation_mean: float | None = None
    groups: tuple[Group, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict: must be one of {VERDICTS}, got {self.verdict!r}")

    def as_row(self) -> dict:
        return {"claim": self.claim, "regime": self.regime, "verdict": self.verdict, "reason": self.reason,
                "preemptions": self.preemptions, "kv_utilisation_mean": self.kv_utilisation_mean}

    def detail(self) -> pd.DataFrame:
        return pd.DataFrame([g.as_row() for g in self.groups])


# ------------------------------------------------------------------------------------------------ helpers
def decide(groups: Sequence[Group], size_ok: bool = True) -> tuple[str, int, int]:
    """(verdict, passed, checkable): all checkable groups pass (and ``size_ok``) -> holds; a strict
    majority -> holds partly; none checkable -> cannot be checked."""
    chk = [g for g in groups if g.inert is None]
    k = sum(g.passed for g in chk)
    if not chk:
        return "cannot be checked", 0, 0
    if k == len(chk) and size_ok:
        return "holds", k, len(chk)
    if k > len(chk) / 2:
        return "holds partly", k, len(chk)
    return "does not hold", k, len(chk)


def inert(rows: pd.DataFrame, *, memory: bool = True, identical: bool = False) -> str | None:
    """Why the compared runs ``rows`` cannot test the claim, or None. ``memory``: a reservation claim
    (needs preemptions and KV use >= :data:`KV_MIN`); ``identical``: the compared arms are the same plan."""
    if identical:
        return "compared plans identical"
    if memory:
        arms = [c for c in ("policy", "variant", "mode", "shift", "rho") if c in rows.columns and rows[c].nunique() > 1]
        per_arm = rows.groupby(arms)["preemptions"].mean() if arms else rows["preemptions"].agg(["mean"])
        if float(per_arm.max()) < PREEMPT_MIN:
            return "no compared policy preempts"
        kv = float(rows["kv_utilisation_mean"].mean())
        if kv < KV_MIN:
            return f"KV use < {KV_MIN:.0%}"
    return None


def _activity(rows: pd.DataFrame) -> tuple[float | None, float | None]:
    if rows is None or len(rows) == 0 or "preemptions" not in rows:
        return None, None
    return float(rows["preemptions"].mean()), float(rows["kv_utilisation_mean"].mean())


def _is_twin(rows: pd.DataFrame) -> bool:
    if "source" in rows.columns:
        return bool((rows["source"] == "synthetic").all())
    return bool(rows["trace"].isin(SYNTHETIC_TRACES).all())


def arm_units(rows: pd.DataFrame, arm_cols: Sequence[str], arms: Sequence[tuple], columns: Sequence[str],
              *, blocks: slice | None = None) -> tuple[np.ndarray, int]:
    """Paired units for the bootstrap: shape ``(n_units, len(arms), len(columns))`` and the run length.

    ``rows`` are the runs of one group; an arm is a tuple of values of ``arm_cols``. ``columns`` name
    per-block strings (``blk_nv``, ``blk_total``, ``blk_served``, ``blk_e2e_hist``); a histogram
    contributes all its bins (then it must be the only column). A real trace (one run per arm) gives
    its time blocks as units (run :data:`~kvdro.experiments.uncertainty.BLOCK_RUN`); synthetic twins
    give one unit per seed (run 1). ``blocks`` keeps only some time blocks (late windows)."""
    twin = _is_twin(rows)
    per_arm = []
    seeds = None
    for arm in arms:
        m = np.ones(len(rows), dtype=bool)
        for c, v in zip(arm_cols, arm):
            m &= (rows[c] == v).to_numpy()
        r = rows[m].sort_values("seed")
        if len(r) == 0:
            raise ValueError(f"rows: no run for arm {dict(zip(arm_cols, arm))}")
        if seeds is None:
            seeds = tuple(r["seed"])
        elif tuple(r["seed"]) != seeds:
            raise ValueError(f"rows: arm {arm} has seeds {tuple(r['seed'])}, others {seeds} (not paired)")
        cols = []
        for c in columns:
            x = np.stack([unc.decode(t) for t in r[c]])  # (seeds, blocks) or (seeds, blocks * bins)
            x = x.reshape(len(r), unc.N_BLOCKS, -1)
            if blocks is not None:
                x = x[:, blocks]
            cols.append(x)
        per_arm.append(np.concatenate(cols, axis=2))  # (seeds, blocks, k)
    a = np.stack(per_arm, axis=2)  # (seeds, blocks, arms, k)
    if twin and a.shape[0] >= 2:
        return a.sum(axis=1), 1
    if a.shape[0] != 1:
        raise ValueError("rows: a real trace must have one run per arm")
    return a[0], unc.BLOCK_RUN


def _per_req(s: np.ndarray) -> np.ndarray:
    """Cost per served request of each arm from summed units (..., arms, [cost, served])."""
    return s[..., 0] / np.maximum(s[..., 1], 1.0)


def _gain(rows: pd.DataFrame, arm_col: str, a, b, term: str) -> unc.Interval:
    """1 - cost(a)/cost(b) per served request, paired, with its interval."""
    u, run = arm_units(rows, [arm_col], [(a,), (b,)], [f"blk_{term}", "blk_served"])
    return unc.bootstrap(lambda s: 1 - _per_req(s)[:, 0] / _per_req(s)[:, 1], u, run=run)


def _identical(rows: pd.DataFrame, arm_col: str, arms: Sequence) -> bool:
    r = rows[rows[arm_col].isin(arms)]
    key = "plan_key" if "plan_key" in r.columns else "blk_total"
    return all(r[r[arm_col] == a].sort_values("seed")[key].tolist() == r[r[arm_col] == arms[0]].sort_values("seed")[key].tolist()
               for a in arms[1:])


def _groups(df: pd.DataFrame, keys: Sequence[str]):
    return df.groupby(list(keys), sort=True, observed=True)


def _verdict(claim: str, regime: str, groups: list[Group], reason: str, size_ok: bool = True) -> Verdict:
    v, k, n = decide(groups, size_ok)
    pre = [g.preemptions for g in groups if g.preemptions is not None]
    kv = [g.kv for g in groups if g.kv is not None]
    if n:
        head = f"passes in {k} of {n} checkable groups ({len(groups) - n} inert); "
    else:
        why = sorted({g.inert for g in groups})
        head = f"all {len(groups)} groups inert ({'; '.join(why)}); "
    return Verdict(claim, v, head + reason, regime, float(np.mean(pre)) if pre else None,
                   float(np.mean(kv)) if kv else None, tuple(groups))


def _extreme(groups: list[Group], best: bool = True) -> Group | None:
    gs = [g for g in groups if g.effect is not None]
    if not gs:
        return None
    return (max if best else min)(gs, key=lambda g: g.effect.point)


# ------------------------------------------------------------------------------------------------ Table II
PAPER_TABLE2_TOP = 0.56


def table2_gains(df: pd.DataFrame, term: str = "nv") -> pd.DataFrame:
    """Per (trace, rho): DRO's paired gains over P90 and P95 on ``term`` ("nv" or "total"), with
    intervals, and the costs per served request (means over seeds), preemptions and KV use."""
    rows = []
    for (trace, rho), g in _groups(df, ["trace", "rho"]):
        gp90 = _gain(g, "policy", "dro", "p90", term)
        gp95 = _gain(g, "policy", "dro", "p95", term)
        cost = g.groupby("policy")["newsvendor_per_req" if term == "nv" else COST].mean()
        cmp_ = g[g.policy.isin(["dro", "p90", "p95"])]
        rows.append({"trace": trace, "rho": rho, "DRO": cost["dro"], "P90": cost["p90"], "P95": cost["p95"],
                     "gain_vs_p90": gp90.point, "p90_lo": gp90.lo, "p90_hi": gp90.hi,
                     "gain_vs_p95": gp95.point, "p95_lo": gp95.lo, "p95_hi": gp95.hi,
                     "preemptions": float(cmp_.preemptions.mean()), "kv_utilisation_mean": float(cmp_.kv_utilisation_mean.mean()),
                     "identical": _identical(g, "policy", ["dro", "p90", "p95"])})
    return pd.DataFrame(rows)


def table2_verdict(df: pd.DataFrame, regime: str = "", term: str = "nv") -> Verdict:
    """Claim: DRO is never costlier than P90 and P95, and gains up to 56 % (more as rho grows).

    Reading (the paper's Table II, a per-request reservation cost): the newsvendor term ``nv``.
    Groups: (trace, rho). A group passes if neither gain's interval lies wholly below 0 (DRO not
    costlier than P90 or P95 beyond noise). Size condition for "holds": the largest gain's lower
    bound is at least half the paper's 56 %."""
    groups = []
    gains = table2_gains(df, term)
    for r in gains.itertuples():
        rows = df[(df.trace == r.trace) & (df.rho == r.rho) & df.policy.isin(["dro", "p90", "p95"])]
        why = inert(rows, identical=bool(r.identical))
        worst = min((unc.Interval(r.gain_vs_p90, r.p90_lo, r.p90_hi), unc.Interval(r.gain_vs_p95, r.p95_lo, r.p95_hi)),
                    key=lambda i: i.point)
        groups.append(Group(f"{r.trace}, rho = {r.rho:g}", worst, worst.hi >= 0, why, r.preemptions, r.kv_utilisation_mean))
    tops = [max(unc.Interval(r.gain_vs_p90, r.p90_lo, r.p90_hi), unc.Interval(r.gain_vs_p95, r.p95_lo, r.p95_hi),
                key=lambda i: i.point) for r in gains.itertuples()]
    checkable_tops = [t for t, g in zip(tops, groups) if g.inert is None]
    size_ok = bool(checkable_tops) and max(checkable_tops, key=lambda i: i.point).lo >= PAPER_TABLE2_TOP / 2
    k_top = int(np.argmax([t.point for t in tops]))
    low = _extreme(groups, best=False)
    reason = f"largest gain {groups[k_top].label}: {tops[k_top].pct()}; worst {low.label}: {low.effect.pct()}"
    return _verdict(CLAIMS[0], regime, groups, reason, size_ok)


# ------------------------------------------------------------------------------------------------ Table IV
PAPER_TABLE4 = ("dro", "p90", "p95", "p99", "mean", "max", "lp1", "lp2")


def table4_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (trace, policy, rho): both costs, newsvendor term, P99, SLO violation, preemptions,
    KV use (means over seeds)."""
    cols = [COST, "newsvendor_per_req", "cost_realised_per_req", "e2e_p99_s", "slo_violation_rate", "preemptions",
            "kv_utilisation_mean", "lost"]
    return df.groupby(["trace", "policy", "rho"], sort=False)[cols].mean().reset_index()


def regret(summary: pd.DataFrame, policies: Sequence[str] | None = None, cost: str = COST) -> pd.DataFrame:
    """Cost over the best policy's at the same (trace, rho): 1 = best. Columns: trace, policy, rho, regret."""
    s = summary if policies is None else summary[summary.policy.isin(policies)]
    best = s.groupby(["trace", "rho"])[cost].transform("min")
    return s.assign(regret=s[cost] / best)[["trace", "policy", "rho", "regret"]]


def table4_verdict(df: pd.DataFrame, regime: str = "", term: str = "total") -> Verdict:
    """Claim: DRO is the only method whose cost stays bounded across rho in {2, 10, 100}.

    Reading (the paper's Table IV, total cost): among the paper's eight methods, DRO's worst regret
    over rho (cost over the best method's at that rho) is the smallest. Groups: traces. Statistic:
    DRO's worst regret minus the smallest worst regret of the other seven, bootstrapped jointly over
    all 24 (policy, rho) runs; a trace passes if the interval's lower bound is <= 0 (DRO not beaten
    beyond noise)."""
    groups = []
    rhos = sorted(df.rho.unique())
    arms = [(p, r) for p in PAPER_TABLE4 for r in rhos]
    for trace, g in _groups(df[df.policy.isin(PAPER_TABLE4)], ["trace"]):
        trace = trace[0] if isinstance(trace, tuple) else trace
        u, run = arm_units(g, ["policy", "rho"], arms, [f"blk_{term}", "blk_served"])

        def stat(s):
            c = _per_req(s).reshape(s.shape[0], len(PAPER_TABLE4), len(rhos))
            worst = (c / c.min(axis=1, keepdims=True)).max(axis=2)
            return worst[:, 0] - worst[:, 1:].min(axis=1)

        d = unc.bootstrap(stat, u, run=run)
        why = inert(g, identical=False)
        pre, kv = _activity(g)
        groups.append(Group(trace, d, d.lo <= 0, why, pre, kv))
    reason = "DRO's worst regret minus the best other's: " + "; ".join(f"{g.label} {g.effect.num()}" for g in groups)
    return _verdict(CLAIMS[1], regime, groups, reason)


# ------------------------------------------------------------------------------------------------ Figure 2(b)
def fig2b_verdict(f2: pd.DataFrame, regime: str = "") -> Verdict:
    """Claim: DRO's empirical quantile tracks q* = rho/(rho+1) exactly.

    Reading (the paper's Figure 2(b), in-sample): the DRO buffer is a q*-quantile of the training
    outputs, i.e. F(eta-) <= q* <= F(eta) (``level_below`` <= q* <= ``level_train``, with 1e-9 for
    rounding). No sampling noise enters an in-sample quantile, so the margin is the atom at eta and
    nothing more. Groups: (trace, rho) of the figure's grid. No simulator: preemptions and KV use
    are not involved."""
    groups = []
    for r in f2.itertuples():
        ok = (r.level_below <= r.q_star + 1e-9) and (r.q_star <= r.level_train + 1e-9)
        groups.append(Group(f"{r.trace}, rho = {r.rho:g}", unc.Interval(r.level_train - r.q_star, r.level_below - r.q_star,
                                                                          r.level_train - r.q_star), ok, None, None, None))
    far = f2[~((f2.level_below <= f2.q_star + 1e-9) & (f2.q_star <= f2.level_train + 1e-9))]
    reason = (f"the DRO buffer is a q*-quantile wherever it equals SAA's; it is not in {len(far)} groups "
              + (f"(from rho = {far.rho.min():g}, level {far.level_train.min():.3f} or more)" if len(far) else ""))
    return _verdict(CLAIMS[2], regime, groups, reason)


# ------------------------------------------------------------------------------------------------ Figure 3(a)
FIG3_RULES = ("mean", "p90", "p95", "p99", "max", "saa", "dro")
FIG3_MARGIN = 0.01


def fig3_verdict(df: pd.DataFrame, regime: str = "", term: str = "total") -> Verdict:
    """Claim: DRO's cost advantage persists as the load grows.

    Reading: DRO's total cost is the lowest of the reservation rules (vLLM excluded) at every load.
    Groups: (trace, load). Statistic: DRO's cost over the cheapest other rule's, minus 1 (paired,
    bootstrapped jointly); a group passes if the interval's lower bound is at most
    :data:`FIG3_MARGIN` (DRO within 1 % of the cheapest rule beyond noise: the first edition's
    margin of practical equivalence)."""
    groups = []
    others = [p for p in FIG3_RULES if p != "dro"]
    arms = [(p,) for p in ["dro", *others]]
    for (trace, load), g in _groups(df[df.policy.isin(FIG3_RULES)], ["trace", "load"]):
        u, run = arm_units(g, ["policy"], arms, [f"blk_{term}", "blk_served"])
        d = unc.bootstrap(lambda s: _per_req(s)[:, 0] / _per_req(s)[:, 1:].min(axis=1) - 1, u, run=run)
        pre, kv = _activity(g)
        groups.append(Group(f"{trace}, load {load:g}", d, d.lo <= FIG3_MARGIN, inert(g), pre, kv))
    worst = _extreme(groups, best=True)
    reason = f"DRO's largest excess over the cheapest rule: {worst.label}, {worst.effect.pct(1)}" if worst else ""
    return _verdict(CLAIMS[3], regime, groups, reason)


# ------------------------------------------------------------------------------------------------ premium
def premium_verdict(ej: pd.DataFrame, regime: str = "") -> Verdict:
    """Claim: the robustness premium is < 1.3 % even at eps = 0.5 and < 0.5 % for eps in [0.1, 0.2].

    Reading (fixed: the paper's radius unit, eps as a multiple of E[xi], as its default 0.15 E[xi];
    the premium of the robust plan's objective (8a) over the SAA plan's): ``eps_units == "mean"``,
    ``obj_robust / obj_saa - 1``, the maximum over rho in {2, 10, 100}. Exact plans, so no noise;
    one group. "holds partly" if only one of the two bounds holds. Other readings are sensitivity."""
    g = ej[ej.eps_units == "mean"]
    prem = g.obj_robust / g.obj_saa - 1
    at05 = float(prem[np.isclose(g.eps_fraction, 0.5)].max())
    low = float(prem[g.eps_fraction.between(0.1 - 1e-9, 0.2 + 1e-9)].max())
    a, b = at05 < 0.013, low < 0.005
    v = "holds" if a and b else "holds partly" if a or b else "does not hold"
    reason = f"eps in E[xi], objective (8a): premium up to {at05:.1%} at eps = 0.5 and {low:.1%} on [0.1, 0.2]"
    return Verdict(CLAIMS[4], v, reason, regime, None, None, (Group("small instance", None, a and b, None, None, None),))


# ------------------------------------------------------------------------------------------------ Table V
PAPER_TABLE5 = {  # variant: (claim, column, the paper's printed effect)
    "no-routing": (CLAIMS[5], "total", 93878 / 13476 - 1),
    "no-dro": (CLAIMS[6], "total", 24864 / 13476 - 1),
    "no-prefix": (CLAIMS[7], "p99", 9.95 / 8.12 - 1),
}


def p99_change(g: pd.DataFrame, arm_col: str, a, b) -> unc.Interval:
    """P99 latency of arm ``a`` over arm ``b``'s, minus 1, paired, from the runs' latency histograms."""
    u, run = arm_units(g, [arm_col], [(a,), (b,)], ["blk_e2e_hist"])
    return unc.bootstrap(lambda s: unc.quantile_from_hist(s[:, 0], 0.99) / unc.quantile_from_hist(s[:, 1], 0.99) - 1, u, run=run)


def _cost_change(g: pd.DataFrame, arm_col: str, a, b, term: str = "total") -> unc.Interval:
    u, run = arm_units(g, [arm_col], [(a,), (b,)], [f"blk_{term}", "blk_served"])
    return unc.bootstrap(lambda s: _per_req(s)[:, 0] / _per_req(s)[:, 1] - 1, u, run=run)


def table5_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (source, variant): means over seeds of cost, P99, goodput, SLO, preemptions, KV use."""
    cols = [COST, "newsvendor_per_req", "cost_realised_per_req", "e2e_p99_s", "goodput_rps", "slo_violation_rate",
            "preemptions", "kv_utilisation_mean", "rejected"]
    out = df.groupby(["source", "variant"], sort=False)[cols].mean()
    configs = df["plan"].astype(str).str.count(r" x TP")
    out["configs_deployed"] = configs.groupby([df["source"], df["variant"]], sort=False).max()
    return out.reset_index()


def table5_verdicts(df: pd.DataFrame, regime: str = "") -> list[Verdict]:
    """Claims of Table V: removing routing raises cost x7 (+597 %), removing DRO raises it +85 %,
    removing prefix caching raises P99 +22 %. Groups: the real heterogeneous trace and its synthetic
    twins. Statistic: the ablation's total cost (P99 for prefix caching) over the full plan's, minus 1,
    paired. A group passes if the interval's lower bound is > 0; "holds" needs every lower bound at
    least half the paper's effect. Routing and prefix caching are not reservation mechanisms: they are
    inert only where the ablated plan is the full plan (one configuration deployed; nothing cached);
    DRO vs SAA is a reservation claim (the memory rule of :func:`inert` applies)."""
    out = []
    for variant, (claim, col, effect) in PAPER_TABLE5.items():
        groups = []
        for source, g in _groups(df[df.variant.isin(["bcd-dro", variant])], ["source"]):
            source = source[0] if isinstance(source, tuple) else source
            same = _identical(g, "variant", ["bcd-dro", variant])
            d = p99_change(g, "variant", variant, "bcd-dro") if col == "p99" else _cost_change(g, "variant", variant, "bcd-dro")
            pre, kv = _activity(g)
            why = inert(g, memory=variant == "no-dro", identical=same)
            groups.append(Group(source, d, d.lo > 0, why, pre, kv))
        chk = [g for g in groups if g.inert is None]
        size_ok = all(g.effect.lo >= effect / 2 for g in chk)
        what = "P99" if col == "p99" else "cost"
        reason = "; ".join(f"{g.label}: {what} {g.effect.pct()}" for g in groups) + f" (paper {effect:+.0%})"
        out.append(_verdict(claim, regime, groups, reason, size_ok))
    return out


# ------------------------------------------------------------------------------------------------ Figure 5
def fig5a_verdict(df: pd.DataFrame, regime: str = "") -> Verdict:
    """Claim: under drift the rolling horizon stays robust where static buffers degrade.

    Reading: the newsvendor term per served request over the second half of the test part (the
    drifted windows), rolling vs static. Groups: (trace, policy). A group passes if the saving
    1 - rolling/static has its interval's lower bound > 0."""
    groups = []
    late = slice(unc.N_BLOCKS // 2, None)
    for (trace, policy), g in _groups(df, ["trace", "policy"]):
        u, run = arm_units(g, ["mode"], [("rolling",), ("static",)], ["blk_nv", "blk_served"], blocks=late)
        d = unc.bootstrap(lambda s: 1 - _per_req(s)[:, 0] / _per_req(s)[:, 1], u, run=run)
        pre, kv = _activity(g)
        groups.append(Group(f"{trace}, {policy}", d, d.lo > 0, inert(g, identical=_identical(g, "mode", ["rolling", "static"])), pre, kv))
    lo, hi = _extreme(groups, best=False), _extreme(groups, best=True)
    reason = f"saving from {lo.label}: {lo.effect.pct()} to {hi.label}: {hi.effect.pct()}" if lo else ""
    return _verdict(CLAIMS[8], regime, groups, reason)


def fig5b_verdict(df: pd.DataFrame, regime: str = "", term: str = "total") -> Verdict:
    """Claim: DRO's advantage over SAA grows with the shift s.

    Reading: advantage(s) = 1 - cost(DRO)/cost(SAA), total cost; "grows" = advantage at the largest
    s minus advantage at s = 1, bootstrapped jointly over the four runs. Groups: (trace, rho). A group
    passes if the interval's lower bound is > 0. Where DRO's buffers are SAA's the plans are identical."""
    groups = []
    for (trace, rho), g in _groups(df, ["trace", "rho"]):
        s0, s1 = g["shift"].min(), g["shift"].max()
        arms = [("dro", s0), ("saa", s0), ("dro", s1), ("saa", s1)]
        u, run = arm_units(g, ["policy", "shift"], arms, [f"blk_{term}", "blk_served"])

        def stat(s):
            c = _per_req(s)
            return (1 - c[:, 2] / c[:, 3]) - (1 - c[:, 0] / c[:, 1])

        d = unc.bootstrap(stat, u, run=run)
        pre, kv = _activity(g)
        groups.append(Group(f"{trace}, rho = {rho:g}", d, d.lo > 0, inert(g, identical=_identical(g, "policy", ["dro", "saa"])), pre, kv))
    best = _extreme(groups)
    reason = f"largest growth of the advantage (points): {best.label}, {best.effect.pct()}" if best else ""
    return _verdict(CLAIMS[9], regime, groups, reason)


PAPER_FIG6 = 18.0 / 9.0 - 1  # SAA's P99 over DRO's at s = 3 in the paper's Figure 6


def fig6_verdict(df: pd.DataFrame, regime: str = "") -> Verdict:
    """Claim: under shift the SAA plan's P99 grows far more than the DRO plan's (~18 s vs ~9 s at s = 3).

    Reading: at the largest s, the SAA plan's P99 over the DRO plan's, minus 1 (paired). Groups: real
    and synthetic. A group passes if the interval's lower bound is > 0; "holds" needs every lower
    bound at least half the paper's +100 %. A reservation claim (the memory rule applies)."""
    groups = []
    top = df["shift"].max()
    d_top = df[df["shift"] == top]
    for source, g in _groups(d_top, ["source"]):
        source = source[0] if isinstance(source, tuple) else source
        d = p99_change(g, "variant", "no-dro", "bcd-dro")
        pre, kv = _activity(g)
        groups.append(Group(source, d, d.lo > 0, inert(g, identical=_identical(g, "variant", ["bcd-dro", "no-dro"])), pre, kv))
    chk = [g for g in groups if g.inert is None]
    size_ok = all(g.effect.lo >= PAPER_FIG6 / 2 for g in chk)
    reason = f"s = {top:g}, SAA plan's P99 over DRO plan's: " + "; ".join(f"{g.label} {g.effect.pct()}" for g in groups)
    return _verdict(CLAIMS[10], regime, groups, reason, size_ok)


# ------------------------------------------------------------------------------------------------ all
def verdicts(regime: str, frames: dict[str, pd.DataFrame] | None = None) -> list[Verdict]:
    """Every claim's verdict in ``regime`` (:data:`kvdro.experiments.regimes.REGIMES`), in the order of
    :data:`CLAIMS`, from ``frames`` (sweep name -> rows; ``"fig2b"``: :func:`kvdro.experiments.analytic.fig2b`)
    or else the cached sweeps in ``data/`` (and Figure 2(b) computed)."""
    from kvdro.experiments import analytic, results
    from kvdro.experiments.regimes import REGIMES

    if regime not in REGIMES:
        raise ValueError(f"regime: must be one of {REGIMES}, got {regime!r}")
    frames = dict(frames or {})

    def get(name: str) -> pd.DataFrame:
        if name not in frames:
            frames[name] = results.read(name) if name == "eps_joint" else results.read(name, regime)
        return frames[name]

    out: list[Verdict] = [
        table2_verdict(get("table2"), regime),
        table4_verdict(get("table4"), regime),
        fig2b_verdict(frames["fig2b"] if "fig2b" in frames else analytic.fig2b(), regime),
        fig3_verdict(get("fig3"), regime),
        premium_verdict(get("eps_joint"), regime),
        *table5_verdicts(get("table5"), regime),
        fig5a_verdict(get("fig5a"), regime),
        fig5b_verdict(get("fig5b"), regime),
        fig6_verdict(get("fig6"), regime),
    ]
    return out


RULES: dict[str, Callable] = {
    "table2": table2_verdict, "table4": table4_verdict, "fig3": fig3_verdict, "fig5a": fig5a_verdict,
    "fig5b": fig5b_verdict, "fig6": fig6_verdict,
}
