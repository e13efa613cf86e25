"""The engines people run, as named presets of the simulator: each rule a small function citing its source.

==================  ===========================================  =====================================
preset              module (rules, knobs, source + version)      in brief
==================  ===========================================  =====================================
``vllm-v0``         :mod:`~kvdro.sim.engines.vllm_v0`            today's engine (the default)
``vllm-v1``         :mod:`~kvdro.sim.engines.vllm_v1`            token budget, running first, chunks
``sglang``          :mod:`~kvdro.sim.engines.sglang`             PrefillAdder + new-token ratio, retract
``trtllm-gne``      :mod:`~kvdro.sim.engines.trtllm`             GUARANTEED_NO_EVICT: reserve max_new
``trtllm-maxutil``  :mod:`~kvdro.sim.engines.trtllm`             MAX_UTILIZATION: next step, pause
``lightllm``        :mod:`~kvdro.sim.engines.lightllm`           future-peak admission
==================  ===========================================  =====================================

:func:`make_config` builds a preset's knobs (its module's ``Config``) with overrides, each checked
(a ValueError names the argument); :mod:`kvdro.sim.engine_presets` runs the presets step by step;
:func:`kvdro.sim.simulate` takes ``engine=`` and ``max_new=``. :func:`step_trace` replays a small
request table through a preset with steps in place of time, for the comparison with vLLM's own
scheduler (``kvdro.bench conformance``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

import numpy as np
import pandas as pd

from kvdro.sim.engines import lightllm, sglang, trtllm, vllm_v0, vllm_v1

__all__ = ["ENGINES", "DEFAULT_ENGINE", "ADMISSION", "READS_MAX_NEW", "PRESETS", "make_config", "rules", "step_trace"]

#: The preset names ``simulate(engine=...)`` and ``--engine`` accept.
ENGINES: tuple[str, ...] = ("vllm-v0", "vllm-v1", "sglang", "trtllm-gne", "trtllm-maxutil", "lightllm")
#: Today's engine, so that results and caches made before the presets hold.
DEFAULT_ENGINE = "vllm-v0"
#: What each preset sets aside at admission (chapter 7's table): ``reactive`` -- blocks as a sequence
#: grows, admission on the prompt alone (vLLM v0's ``can_allocate``, v1's ``allocate_slots``,
#: TensorRT-LLM MAX_UTILIZATION); ``ratio`` -- SGLang's ``new_token_ratio`` x max_new
#: (``PrefillAdder``); ``reserves max_new`` -- all of it (TensorRT-LLM GUARANTEED_NO_EVICT, LightLLM's
#: peak rule).
ADMISSION: dict[str, str] = {"vllm-v0": "reactive", "vllm-v1": "reactive", "trtllm-maxutil": "reactive",
                             "sglang": "ratio", "trtllm-gne": "reserves max_new", "lightllm": "reserves max_new"}
#: The presets whose admission reads ``max_new`` (:data:`ADMISSION` not reactive).
READS_MAX_NEW: tuple[str, ...] = tuple(e for e in ENGINES if ADMISSION[e] != "reactive")
#: preset -> (its rules' module, the knobs the name fixes).
PRESETS: dict[str, tuple[object, dict]] = {
    "vllm-v0": (vllm_v0, {}),
    "vllm-v1": (vllm_v1, {}),
    "sglang": (sglang, {}),
    "trtllm-gne": (trtllm, {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}),
    "trtllm-maxutil": (trtllm, {"capacity_scheduler_policy": "MAX_UTILIZATION"}),
    "lightllm": (lightllm, {}),
}


def check_engine_name(engine: str) -> str:
    """``engine`` if it names a preset; ValueError naming ``engine`` otherwise."""
    if engine not in ENGINES:
        raise ValueError(f"engine: must be one of {ENGINES}, got {engine!r}")
    return engine


def rules(engine: str):
    """The module whose functions are ``engine``'s rules."""
    return PRESETS[check_engine_name(engine)][0]


def make_config(engine: str, options: Mapping | None = None):
    """The knobs of ``engine`` (its module's ``Config``) with ``options`` overriding the defaults.

    Raises ValueError naming ``engine`` (unknown preset), an unknown option, an option the preset's
    name fixes (TensorRT-LLM's policy), or a value out of range (the option's name)."""
    module, fixed = PRESETS[check_engine_name(engine)]
    options = dict(options or {})
    known = {f.name for f in fields(module.Config)}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"engine_options: {engine} has no option {key!r} (it has {sorted(known) or 'none'})")
        if key in fixed and value != fixed[key]:
            raise ValueError(f"{key}: the preset {engine} fixes it to {fixed[key]!r}, got {value!r}")
    return module.Config(**{**fixed, **options})


def step_trace(requests: pd.DataFrame, *, engine: str = "vllm-v1", num_blocks: int, block_size: int = 16,
               max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
               long_prefill_token_threshold: int = 0, enable_prefix_caching: bool = False) -> list[dict]:
    """Replay ``requests`` through a preset with steps in place of time: one dict per ``schedule()`` call.

    ``requests``: columns ``request_id`` (str), ``arrival_step`` (int >= 0: the request is added
    before that ``schedule()`` call), ``input_tokens`` (>= 1), ``output_tokens`` (>= 1; the request's
    ``max_tokens`` and its true length: it stops after that many tokens, or when prompt + output
    reaches ``max_model_len``). ``num_blocks`` is vLLM's ``num_gpu_blocks``: block 0 is vLLM's null
    block, so ``num_blocks - 1`` hold tokens. ``enable_prefix_caching``: off by default (run vLLM
    with the same setting to compare); on, a preempted request hits its own freed blocks while they
    are still cached (:mod:`kvdro.sim.engines.free_queue`; no prompt shares blocks with another:
    token ids are not modelled). Returns, for step 0, 1, ... until every request
    finished: ``{"step": k, "scheduled": {request_id: num_scheduled_tokens}, "preempted": [ids],
    "finished": [ids]}``; a token is sampled for a request exactly when its prefill completes in that
    step or it decodes; ``finished`` lists the requests whose last token was sampled in step k.
    Steps in which nothing runs (before an arrival) appear with empty fields. Only ``vllm-v1`` so far.
    """
    from kvdro.sim.engine_presets import replay_steps

    if engine != "vllm-v1":
        raise ValueError(f"engine: step_trace replays 'vllm-v1' only, got {engine!r}")
    if not isinstance(requests, pd.DataFrame):
        raise ValueError("requests: must be a pandas DataFrame")
    need = ("request_id", "arrival_step", "input_tokens", "output_tokens")
    missing = [c for c in need if c not in requests.columns]
    if missing:
        raise ValueError(f"requests: missing column(s) {missing}")
    for col, low in (("arrival_step", 0), ("input_tokens", 1), ("output_tokens", 1)):
        v = pd.to_numeric(requests[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(v) | (v != np.round(v)) | (v < low)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"requests: column {col!r} must hold integers >= {low}; row {i} has {requests[col].iloc[i]!r}")
    if requests["request_id"].astype(str).duplicated().any():
        raise ValueError("requests: column 'request_id' must be unique")
    cfg = make_config("vllm-v1", {"block_size": block_size, "max_num_seqs": max_num_seqs,
                                  "max_num_batched_tokens": max_num_batched_tokens,
                                  "long_prefill_token_threshold": long_prefill_token_threshold,
                                  "enable_prefix_caching": enable_prefix_caching})
    from kvdro.sim.engines.knobs import positive_int

    positive_int("num_blocks", num_blocks, at_least=2, why="block 0 is the null block")
    window = positive_int("max_model_len", max_model_len, at_least=2)
    order = np.argsort(requests["arrival_step"].to_numpy(dtype=np.int64), kind="stable")
    df = requests.iloc[order]
    prompt = df["input_tokens"].to_numpy(dtype=np.int64)
    if np.any(prompt >= window):
        i = int(order[np.flatnonzero(prompt >= window)[0]])
        raise ValueError(f"requests: row {i} has a prompt of {int(requests['input_tokens'].iloc[i])} tokens, "
                         f"not below max_model_len ({window})")
    limit = np.minimum(df["output_tokens"].to_numpy(dtype=np.int64), window - prompt)
    ids = df["request_id"].astype(str).tolist()
    rows = replay_steps("vllm-v1", cfg, arrival=df["arrival_step"].to_numpy(dtype=np.int64), prompt=prompt,
                        limit=limit, max_new=limit, pages=num_blocks - 1, window=window)
    return [{"step": k, "scheduled": {ids[j]: n for j, n in sched.items()}, "preempted": [ids[j] for j in pre],
             "finished": [ids[j] for j in fin]} for k, sched, pre, fin in rows]
