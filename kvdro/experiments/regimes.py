"""The two operating points at which chapter 10 re-tests the paper (issues 15 and 26).

* ``"memory"`` -- the primary test: memory-bound and stable. By the rules of
  :mod:`kvdro.sim.regimes` (stable by the queue; mean KV use >= 60 % with vLLM preempting; the
  lowest SLO violation among such cells): 4 x TP2-PP1 (the paper's own first configuration, 37,744
  KV tokens per group) at 0.7 of the conversation trace's arrival rate.
* ``"light"`` -- the contrast: 2 x TP4-PP1 at the highest load where nothing binds (0.6 of the
  rate: no preemption, the KV cache about 5 % full, latency within 10 points of the lowest load's).

The simulator's regime map (``kvdro.sim.regimes.OPERATING_POINTS``, read from
``data/sim_regimes.csv``) names the points; :func:`operating_point` reads the configuration, the
number of groups and the load from it, and falls back to the values above only if that map is
missing. ``load`` is a multiple of each trace's own arrival rate.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REGIMES", "OperatingPoint", "operating_point"]

#: The regimes, primary first.
REGIMES = ("memory", "light")


@dataclass(frozen=True)
class OperatingPoint:
    """A deployment of ``groups`` x ``config`` on 8 A100-80GB served at ``load`` x the trace's rate."""

    regime: str
    config: str
    groups: int
    load: float
    source: str

    def describe(self) -> str:
        return f"{self.groups} x {self.config} at {self.load:g} x the trace's rate"


_FALLBACK = {
    "memory": ("TP2-PP1", 4, 0.7),
    "light": ("TP4-PP1", 2, 0.6),
}


def _field(point, *names):
    for n in names:
        if isinstance(point, dict) and n in point:
            return point[n]
        if hasattr(point, n):
            return getattr(point, n)
    return None


def _from_simulator(regime: str) -> OperatingPoint | None:
    """The simulator's named point, if ``kvdro.sim.regimes`` exists and names one we can read."""
    try:
        from kvdro.sim import regimes as sim_regimes  # type: ignore[attr-defined]
    except ImportError:
        return None
    points = getattr(sim_regimes, "OPERATING_POINTS", None)
    if not points or regime not in points:
        return None
    p = points[regime]
    groups = _field(p, "groups", "n_groups")
    load = _field(p, "load", "scale", "rate_scale")
    config = _field(p, "config", "configuration")
    if isinstance(groups, (tuple, list)):  # the simulator's form: one configuration name per group
        names = {getattr(g, "name", g) for g in groups}
        if len(names) != 1:
            return None  # a mixed deployment is not one of our (config, groups) points
        config, groups = names.pop(), len(groups)
    if config is None or groups is None or load is None:
        return None
    config = getattr(config, "name", config)
    return OperatingPoint(regime, str(config), int(groups), float(load), "kvdro.sim.regimes.OPERATING_POINTS")


def operating_point(regime: str) -> OperatingPoint:
    """The deployment and load of ``regime`` (:data:`REGIMES`); ValueError names a bad regime."""
    if regime not in REGIMES:
        raise ValueError(f"regime: must be one of {REGIMES}, got {regime!r}")
    found = _from_simulator(regime)
    if found is not None:
        return found
    config, groups, load = _FALLBACK[regime]
    return OperatingPoint(regime, config, groups, load, "kvdro.experiments.regimes (fallback, issue 26)")
