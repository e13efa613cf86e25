"""Which engine runs a simulation, how, and the ``max_new_tokens`` each request carries into it.

**Engine and implementation.** ``simulate(..., engine=)`` names the engine's rules, a preset of
:mod:`kvdro.sim.engines` (``"vllm-v0"``, the default, ``"vllm-v1"``, ``"sglang"``, ``"trtllm-gne"``,
``"trtllm-maxutil"``, ``"lightllm"``); ``implementation=`` says which code executes them:
``"fast"``, the compiled implementation (event jumps for ``vllm-v0``, :mod:`kvdro.sim.engine_compiled`;
:mod:`kvdro.sim.presets_compiled` for the other presets; the default once a preset has one), or
``"reference"``, the step-by-step specification (:mod:`kvdro.sim.engine_reference`,
:mod:`kvdro.sim.engine_presets`), with identical results. ``"fast-python"``, vLLM v0's pure-Python
event engine, was retired (issue 32) and is refused with a ValueError saying what replaces it
(:data:`RETIRED`): ``"fast"`` under ``NUMBA_DISABLE_JIT=1`` runs the compiled source as plain Python.
With the trace's prefix keys (``prefix_keys=``, :mod:`kvdro.sim.prefix_keys`) ``vllm-v1`` and
``sglang`` run on their reference engine: the compiled presets do not share prefixes across requests.
Before the presets, ``engine=`` took the implementation; ``engine="fast"`` (or ``"reference"``)
still works and means ``engine="vllm-v0"`` with that implementation.

**max_new_tokens** (:func:`request_max_new`), as clients set it:

* ``"unset"`` -- the engines' default, the window minus the prompt (``max_model_len - L_in``);
* a number N >= 1 -- a client's cap, the same for every request;
* ``"policy"`` -- the reservation policy's per-class estimate eta_i (rounded up, at least 1): the
  paper's reservation as the ``max_new`` an engine reserves against;
* ``"true"`` -- each request's true output length (the in-engine oracle);
* ``"policy-soft"`` -- the policy's estimate as what the engine *reserves against*, while the
  request still generates its true length (no cap): the soft reading of a reservation inside an
  engine, an arm of its own, for the engines whose admission reads ``max_new`` and that can recover
  when a request outgrows it: ``sglang`` (retraction; a request past its estimate counts no
  remaining tokens) and ``lightllm`` (its decode-time pause). Not a setting the engines have: a
  client's ``max_new_tokens`` is always a cap there.

Each is clipped to the window (``max_model_len - L_in``: no engine generates past it). In every
engine ``max_new`` is also the generation cap: a request whose true output is longer **ends at
max_new and is counted as capped** -- an outcome of its own, not served (it counts neither as
completed nor toward goodput). That differs from today's window truncation, where the *model's*
window ends a request (outcome ``truncated``, served with the tokens the window allows), which is
what ``"unset"`` gives: with max_new = window - prompt the window and the cap coincide and such a
request is ``truncated``, as before. With ``vllm-v0`` and ``"unset"`` nothing changes (v0's window
cap stays ``max_model_len - L_in + 1``, its results bit-identical).
"""

from __future__ import annotations

import math

import numpy as np

from kvdro.sim.engines import DEFAULT_ENGINE, check_engine_name

__all__ = ["IMPLEMENTATIONS", "RETIRED", "MAX_NEW_MODES", "resolve_engine", "check_max_new", "check_preset_arguments",
           "generation_limits", "request_max_new"]

#: The implementations of every engine (the values ``engine=`` took before the presets).
IMPLEMENTATIONS: tuple[str, ...] = ("fast", "reference")
#: Implementations that were retired, and what to use instead (the ValueError's advice).
RETIRED: dict[str, str] = {
    "fast-python": "vLLM v0's pure-Python event engine was retired: use implementation='fast' (the "
                   "compiled engine; with NUMBA_DISABLE_JIT=1 its source runs as plain Python, for debugging) "
                   "or implementation='reference' (step by step)",
}
#: The named ``max_new`` settings (besides a number).
MAX_NEW_MODES: tuple[str, ...] = ("unset", "true", "policy", "policy-soft")
#: The presets that take ``max_new="policy-soft"`` (module docstring).
SOFT_ENGINES: tuple[str, ...] = ("sglang", "lightllm")


def resolve_engine(engine: str, implementation: str | None, *, prefix_keys: bool = False) -> tuple[str, str]:
    """(preset, implementation) from ``simulate``'s two keywords (module docstring); ValueError names
    ``engine`` or ``implementation``. ``prefix_keys``: the run has the trace's prefix keys
    (:mod:`kvdro.sim.prefix_keys`): only ``vllm-v1`` and ``sglang`` model them (ValueError naming
    ``prefix_keys`` otherwise), on their reference engine (the default then; ``"fast"`` is refused:
    the compiled presets do not share prefixes across requests)."""
    if isinstance(engine, str) and engine in RETIRED:
        raise ValueError(f"engine: {engine!r} is retired; {RETIRED[engine]}")
    if isinstance(implementation, str) and implementation in RETIRED:
        raise ValueError(f"implementation: {implementation!r} is retired; {RETIRED[implementation]}")
    if isinstance(engine, str) and engine in IMPLEMENTATIONS:  # the old meaning of engine=
        if implementation is not None and implementation != engine:
            raise ValueError(f"engine: {engine!r} is an implementation (the old engine= values); "
                             f"it conflicts with implementation={implementation!r}")
        engine, implementation = DEFAULT_ENGINE, engine
    check_engine_name(engine)
    from kvdro.sim.presets_compiled import COMPILED

    if prefix_keys:
        from kvdro.sim.engine_presets import PREFIX_ENGINES

        if engine not in PREFIX_ENGINES:
            raise ValueError(f"prefix_keys: prefix sharing is modelled for {PREFIX_ENGINES}, not {engine!r}"
                             + (" (vLLM v0's prefix cache is the deployment's per-class prefix_tokens)"
                                if engine == DEFAULT_ENGINE else ""))
        if implementation is None:
            implementation = "reference"
        elif implementation != "reference":
            raise ValueError(f"implementation: a run with prefix_keys needs implementation='reference' (the compiled "
                             f"presets do not share prefixes across requests), got {implementation!r}")
    if implementation is None:
        implementation = "fast" if engine == DEFAULT_ENGINE or engine in COMPILED else "reference"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if engine != DEFAULT_ENGINE and implementation == "fast" and engine not in COMPILED:
        raise ValueError(f"implementation: the preset {engine!r} has no compiled implementation yet "
                         f"(implementation='reference'), got {implementation!r}")
    return engine, implementation


def check_max_new(max_new) -> str | int:
    """``max_new`` if valid: one of :data:`MAX_NEW_MODES` or an integer >= 1; ValueError naming it."""
    if isinstance(max_new, str):
        if max_new not in MAX_NEW_MODES:
            raise ValueError(f"max_new: must be one of {MAX_NEW_MODES} or an integer >= 1, got {max_new!r}")
        return max_new
    if isinstance(max_new, (bool, np.bool_)) or not isinstance(max_new, (int, float, np.integer, np.floating)) \
            or not math.isfinite(max_new) or max_new != int(max_new) or max_new < 1:
        raise ValueError(f"max_new: must be one of {MAX_NEW_MODES} or an integer >= 1 [tokens], got {max_new!r}")
    return int(max_new)


def request_max_new(max_new: str | int, *, room: np.ndarray, true_output: np.ndarray,
                    eta: np.ndarray | None) -> np.ndarray:
    """Per request ``max_new_tokens`` [tokens, int64 >= 1] (module docstring), clipped to ``room``
    (the tokens the window leaves after the prompt, >= 1). ``true_output``: each request's output
    length (0 counts as 1: a prefill always samples a token); ``eta``: the policy's buffers (``"policy"``)."""
    room = np.asarray(room, dtype=np.int64)
    if max_new == "unset":
        m = room
    elif max_new == "true":
        m = np.maximum(np.asarray(true_output, dtype=np.int64), 1)
    elif max_new in ("policy", "policy-soft"):
        if eta is None or not np.all(np.isfinite(eta)):
            raise ValueError("max_new: 'policy' needs a reservation policy's estimate (policy max, mean, ..., dro, lp1, lp2 or exact)")
        m = np.maximum(np.ceil(np.minimum(np.asarray(eta, dtype=float), room)).astype(np.int64), 1)
    else:
        m = np.full(room.shape, int(max_new), dtype=np.int64)
    return np.minimum(m, room)


def check_preset_arguments(engine: str, *, policy: str, max_new, reservation: str, safety_rules: bool,
                           schedule: str, prefix: bool) -> None:
    """What a preset other than ``vllm-v0`` does not take (ValueError naming the argument): vLLM v0's
    reservation readings and safety switch, its oracle look-ahead, the ``sof`` order, prefix caching;
    a reservation policy enters a preset only as its ``max_new`` estimate (``max_new="policy"``)."""
    if engine == DEFAULT_ENGINE:
        if max_new == "policy-soft":
            raise ValueError("max_new: 'policy-soft' is vllm-v0's own soft reservation: pass the policy with max_new='unset'")
        if max_new == "policy" and policy in ("vllm", "oracle"):
            raise ValueError(f"max_new: 'policy' needs a policy with an estimate, not {policy!r}")
        return
    if policy == "oracle":
        raise ValueError(f"policy: 'oracle' is vLLM v0's look-ahead; with engine={engine!r} use max_new='true'")
    if max_new == "policy-soft" and engine not in SOFT_ENGINES:
        raise ValueError(f"max_new: 'policy-soft' is for {SOFT_ENGINES} (an engine that reads max_new and recovers "
                         f"from an overrun), not {engine!r}")
    if policy != "vllm" and max_new not in ("policy", "policy-soft"):
        raise ValueError(f"max_new: engine {engine!r} reserves through max_new; pass max_new='policy' to use "
                         f"policy {policy!r}'s estimate (or policy='vllm')")
    if policy == "vllm" and max_new in ("policy", "policy-soft"):
        raise ValueError("max_new: 'policy' needs a policy with an estimate (max, mean, ..., dro, lp1, lp2, exact), not 'vllm'")
    if reservation != "soft":
        raise ValueError(f"reservation: {reservation!r} is a reading of vLLM v0's reservation; engine {engine!r} caps at max_new")
    if safety_rules is not True:
        raise ValueError(f"safety_rules: a switch of vLLM v0's rules; engine {engine!r} follows its own source")
    if schedule != "fcfs":
        raise ValueError(f"schedule: {schedule!r} is not available for engine {engine!r} (FCFS, as the engines run)")
    if prefix:
        raise ValueError(f"deployment: the per-class cached prefix (prefix_tokens) is vLLM v0's model; engine "
                         f"{engine!r} shares prefixes through the trace's keys (simulate(..., prefix_keys=))")


def generation_limits(engine: str, cfg, max_new, *, L: np.ndarray, xi: np.ndarray, window: int,
                      v0_limit: np.ndarray, v0_ignored: np.ndarray, eta: np.ndarray | None):
    """(limit, max_new_tokens, ignored, truncated, capped) per request, arrays in arrival order.

    ``limit``: tokens a request generates before it stops (the engine's input ``output``);
    ``max_new_tokens``: what it carries (:func:`request_max_new`); ``ignored``: prompts the engine
    refuses (vLLM v0: beyond its prompt limit; a preset: its ``prompt_limit``, by default
    ``max_model_len - 1``, so that at least one token fits); ``truncated``: ended by the window
    (served); ``capped``: ended by ``max_new`` below its true length (not served). ``v0_limit`` and
    ``v0_ignored`` are vLLM v0's window cap (``max_model_len - L_in + 1``) and refusals."""
    from kvdro.sim.engines import rules

    if engine == DEFAULT_ENGINE:
        ignored = v0_ignored
        window_cap = v0_limit
        room = np.maximum(window - L + 1, 1)
    else:
        prompt_limit = getattr(rules(engine), "prompt_limit", None)
        ignored = L > (window - 1 if prompt_limit is None else prompt_limit(cfg, window))
        room = np.maximum(window - L, 1)
        window_cap = np.maximum(1, np.minimum(xi, room))
    if max_new == "unset" and engine == DEFAULT_ENGINE:
        m = room
    else:
        m = request_max_new(max_new, room=room, true_output=window_cap, eta=eta)
    limit = window_cap if max_new == "policy-soft" else np.minimum(window_cap, m)
    capped = ~ignored & (limit < window_cap)
    truncated = ~ignored & ~capped & (xi > window_cap)
    return limit.astype(np.int64), m.astype(np.int64), ignored, truncated, capped
