"""The cost constants of the joint problem (8a), in a module that imports nothing heavy.

:mod:`kvdro.joint.instance` (the optimisation model) and :mod:`kvdro.sim.metrics` (the simulator's
realised cost) both read them from here, so that ``kvdro.sim.simulate`` prices a run without
importing the joint package, and with it CVXPY and SciPy's statistics (``tests/test_startup.py``).
"""

from __future__ import annotations

__all__ = ["DEFAULT_C_GPU", "PAPER_COSTS"]

#: The paper's cost ratios with c_w = 1 (cost units per token wasted per request):
#: c_p/c_w = 10, c_slo/c_w = 5, c_rej/c_w = 5000, kappa = 0.2 (Sec. VI).
PAPER_COSTS = {"c_p": 10.0, "c_w": 1.0, "c_slo": 5.0, "c_rej": 5000.0, "kappa": 0.2}

#: GPU cost [cost units per GPU per second] -- our choice, not the paper's. One GPU-second is priced
#: like the waste of 100 reserved-but-unused tokens per request at one request per second
#: (c_w = 1): an idle A100 then costs as much as serving a few requests per second wastefully, so the
#: GPU term matters (the solver will not deploy groups it does not need) but never outweighs
#: rejecting traffic (c_rej = 5000 per request).
DEFAULT_C_GPU = 100.0
