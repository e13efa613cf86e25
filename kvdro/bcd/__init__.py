"""BCD-DRO: the paper's block coordinate descent (Algorithm 1) for the joint problem (6)/(8).

- :mod:`kvdro.bcd.blocks`    -- LP1 (routing), LP2 (reservations), Block 2 (prefix caching) and the
  Block 3 integer program (configurations), each a CVXPY model built once with parameters
- :mod:`kvdro.bcd.algorithm` -- :func:`solve_bcd` / :func:`run_bcd`: the iteration, its trace
- :mod:`kvdro.bcd.scaling`   -- instances of any size (Table III and past it), small tight random ones
- :mod:`kvdro.bcd.rolling`   -- rolling-horizon re-optimisation on windows whose outputs drift
"""

from kvdro.bcd.algorithm import BLOCKS, DELTA_RULES, BcdRun, BlockRecord, run_bcd, solve_bcd

__all__ = ["BLOCKS", "DELTA_RULES", "BcdRun", "BlockRecord", "run_bcd", "solve_bcd"]
