"""The joint problem (6)/(8): configurations z, reservations r, routing pi, prefix caching delta.

- :mod:`kvdro.joint.instance`     -- :class:`Instance`, :class:`Solution`, block-granular candidates
- :mod:`kvdro.joint.paper`        -- :func:`paper_instance`: the paper's "small" and "large" families
- :mod:`kvdro.joint.serving`      -- work, residence and waiting time (7) per group
- :mod:`kvdro.joint.objective`    -- :func:`evaluate`: (8a) term by term and constraint violations
- :mod:`kvdro.joint.formulations` -- the MILP in a ladder of formulations, McCormick to ``counts`` (the default)
- :mod:`kvdro.joint.exact`        -- :func:`solve_exact`: the MILP solved by HiGHS, proven optimal
"""

from kvdro.joint.exact import MilpResult, solve_exact, solve_milp, solve_relaxation
from kvdro.joint.formulations import DEFAULT_FORMULATION, FORMULATIONS, LADDER, SPECS, Spec, build_milp
from kvdro.joint.instance import DEFAULT_C_GPU, PAPER_COSTS, Instance, Solution, candidate_buffers
from kvdro.joint.objective import TERMS, Evaluation, evaluate
from kvdro.joint.paper import paper_instance

__all__ = [
    "DEFAULT_C_GPU",
    "DEFAULT_FORMULATION",
    "FORMULATIONS",
    "LADDER",
    "SPECS",
    "Spec",
    "PAPER_COSTS",
    "TERMS",
    "Evaluation",
    "Instance",
    "MilpResult",
    "Solution",
    "build_milp",
    "candidate_buffers",
    "evaluate",
    "paper_instance",
    "solve_exact",
    "solve_milp",
    "solve_relaxation",
]
