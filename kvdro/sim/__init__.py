"""PagedAttention simulation on the A100 model: a vLLM-semantics engine driven by traces (chapter 7).

Public API::

    from kvdro.sim import POLICIES, Deployment, SimResult, simulate, policy_buffers, \\
        deployment_from_solution, default_deployment

- :mod:`kvdro.sim.scheduler`        -- the vLLM v0.6 scheduling rules both engines implement, and the
                                      soft and hard readings of a reservation
- :mod:`kvdro.sim.engine_reference` -- step-by-step engine;  :mod:`kvdro.sim.engine_compiled` -- event jumping, compiled
- :mod:`kvdro.sim.engines`          -- the engines people run as named presets (``simulate(engine=...)``):
                                      vllm-v0 (the rules above), vllm-v1, sglang, trtllm-gne/-maxutil,
                                      lightllm, each rule citing its source; :mod:`kvdro.sim.engine_presets`
                                      runs them step by step; :mod:`kvdro.sim.engine_choice` -- the
                                      engine/implementation keywords and each request's ``max_new``
- :mod:`kvdro.sim.policies`         -- ``vllm``, the reservation buffers eta_i (max ... dro, lp1/lp2) and
                                      the oracles ``oracle`` / ``exact`` (true output lengths)
- :mod:`kvdro.sim.deployment`       -- groups z, routing pi (seeded), rejection, prefix caching delta
- :mod:`kvdro.sim.timing`           -- step durations from :func:`kvdro.hardware.step_time`
- :mod:`kvdro.sim.metrics`          -- metrics and realised cost;  :mod:`kvdro.sim.invariants`
- :mod:`kvdro.sim.regimes`          -- the regime map and the operating points (``OPERATING_POINTS``)
- :mod:`kvdro.sim.studies`          -- chapter 7's sweeps;  :mod:`kvdro.sim.figures` -- its charts
"""

from kvdro.sim.deployment import (
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    Deployment,
    buffers_from_solution,
    default_deployment,
    deployment_from_solution,
    parse_config,
)
from kvdro.sim.invariants import InvariantError
from kvdro.sim.metrics import COST_TERMS, METRIC_KEYS, default_costs
from kvdro.sim.policies import ALL_POLICIES, ORACLE_POLICIES, POLICIES, RESERVATION_POLICIES, Buffers, policy_buffers
from kvdro.sim.simulate import ENGINES, IMPLEMENTATIONS, READINGS, SCHEDULES, SimResult, check_trace, simulate

__all__ = [
    "ALL_POLICIES",
    "COST_TERMS",
    "ENGINES",
    "IMPLEMENTATIONS",
    "MAX_MODEL_LEN",
    "MAX_NUM_SEQS",
    "METRIC_KEYS",
    "ORACLE_POLICIES",
    "POLICIES",
    "READINGS",
    "RESERVATION_POLICIES",
    "SCHEDULES",
    "Buffers",
    "Deployment",
    "InvariantError",
    "SimResult",
    "buffers_from_solution",
    "check_trace",
    "default_costs",
    "default_deployment",
    "deployment_from_solution",
    "parse_config",
    "policy_buffers",
    "simulate",
]
