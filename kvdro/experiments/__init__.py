"""The paper's evaluation, reproduced (chapter 10): sweeps behind every table and figure.

- :mod:`kvdro.experiments.runner`   -- :func:`run_sweep`: joblib processes, tqdm bar, on-disk cache
  (any joblib backend, e.g. Dask: see the module docstring)
- :mod:`kvdro.experiments.cache`    -- cache folder (``$KVDRO_CACHE_DIR`` or ``_build/kvdro-cache``), code fingerprint
- :mod:`kvdro.experiments.traces`   -- real traces and synthetic twins; train/test split; load, shift, drift
- :mod:`kvdro.experiments.analytic` -- the parts that need no simulator (Table II per request, Fig. 2(b), eps premium)
- :mod:`kvdro.experiments.sweeps`   -- Tables II, IV, V and Figures 3(a), 5(a), 5(b), 6 on :mod:`kvdro.sim` / :mod:`kvdro.bcd`
- :mod:`kvdro.experiments.regimes`  -- the two operating points (memory-bound, light)
- :mod:`kvdro.experiments.uncertainty` -- per-block sums and the seeded moving-block bootstrap
- :mod:`kvdro.experiments.verdicts` -- verdicts from rules fixed before the sweeps, with intervals
- :mod:`kvdro.experiments.paper`    -- the paper's printed numbers

Command line: ``python -m kvdro.experiments {table2,table4,table5,fig3,fig5,fig6,verdicts} [--regime memory|light]
[--quick] [--n-jobs N] [--json]``.
"""

from kvdro.experiments.cache import cache_dir, code_fingerprint
from kvdro.experiments.runner import run_sweep
from kvdro.experiments.sweeps import fig3, fig5a, fig5b, fig6, table2, table4, table5

__all__ = [
    "cache_dir",
    "code_fingerprint",
    "fig3",
    "fig5a",
    "fig5b",
    "fig6",
    "run_sweep",
    "table2",
    "table4",
    "table5",
]
