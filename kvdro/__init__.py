"""kvdro: robust KV-cache reservation for LLM serving under output-length uncertainty.

A teaching package for the book of the same name. Each module does one job (see DESIGN.md):

- :mod:`kvdro.newsvendor`  -- loss (2)-(3), SAA, critical fractile (9)-(10)
- :mod:`kvdro.wasserstein` -- 1-Wasserstein worst case (5), (8c)-(8g)
- :mod:`kvdro.hardware`    -- A100-80GB and Llama-2-70B data, KV capacity per (TP, PP)
- :mod:`kvdro.queueing`    -- service time (1), Little's law, waiting time (7)
- :mod:`kvdro.joint`       -- the joint problem (6)/(8) and its exact solver
- :mod:`kvdro.workload`    -- request classes and synthetic generators
- :mod:`kvdro.datasets`    -- registry of real traces (pooch)
- :mod:`kvdro.plotting`    -- one Altair theme and an offline renderer
"""

__version__ = "0.1.0"
