"""The busy-time decomposition of two runs of the same requests (chapter 8, issue 34 item 3).

For a run, busy is the engines' summed step time [s] and K the tokens it feeds the model
(K = W + R: the work W every policy feeds plus the recomputed tokens R,
:func:`kvdro.experiments.headroom.run_stats`); c = busy / K is its mean step time per token fed
[s/token]. For two runs d and t of the same requests, exactly

    busy_d / busy_t = (c_d / c_t) x (K_d / K_t),

"the per-token cost factor times the tokens-fed factor". :func:`ratios` is the one place the three
ratios are computed: chapter 8's engine-by-engine table at the presets' point
(:func:`kvdro.bench.presets_table.decomposition`) and the atlas's per-cell reader
(:func:`kvdro.experiments.atlas.decomposition`) both call it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ratios"]


def _positive(name: str, v):
    a = np.asarray(v, dtype=float)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name}: must be finite and > 0, got {v!r}")
    return v


def ratios(busy_d_s, tokens_d, busy_t_s, tokens_t) -> dict:
    """``busy_ratio`` = busy_d / busy_t, ``tokens_ratio`` = K_d / K_t and ``cost_ratio`` = c_d / c_t with
    c = busy / K [s per token fed], so that busy_ratio = cost_ratio x tokens_ratio (to rounding).

    Args: busy times [s] and tokens fed [tokens] of run d (the numerator) and run t, scalars or
    equal-length arrays. ValueError naming the argument if one is not finite and positive."""
    for name, v in (("busy_d_s", busy_d_s), ("tokens_d", tokens_d), ("busy_t_s", busy_t_s), ("tokens_t", tokens_t)):
        _positive(name, v)
    return {"busy_ratio": busy_d_s / busy_t_s, "tokens_ratio": tokens_d / tokens_t,
            "cost_ratio": (busy_d_s / tokens_d) / (busy_t_s / tokens_t)}
