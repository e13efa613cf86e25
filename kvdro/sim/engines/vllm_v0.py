"""vLLM v0.6: the package's original engine, kept as the default preset ``vllm-v0``.

Its rules live in :mod:`kvdro.sim.scheduler` (source: vLLM v0.6 ``vllm/core/scheduler.py``
``Scheduler._schedule_default``, ``vllm/core/block_manager.py`` ``SelfAttnBlockSpaceManager``), and
its two implementations in :mod:`kvdro.sim.engine_reference` and :mod:`kvdro.sim.engine_compiled`;
this preset only names them, so that ``simulate(..., engine="vllm-v0")`` gives today's results bit
for bit. In brief: prompt-only admission above a 1 % watermark, prefill-only steps (no chunking;
the token budget is ``max(max_model_len, 2048)``), a decode step needs one free block, the newest
running sequence is preempted by recompute to the front of the waiting queue, and nothing is
admitted in a step that preempted. Its knobs are the :class:`kvdro.sim.Deployment`'s
(``max_num_seqs``, ``max_num_batched_tokens``, ``watermark``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Config"]

NAME = "vllm-v0"
SOURCE = "vLLM v0.6 vllm/core/scheduler.py (Scheduler._schedule_default), vllm/core/block_manager.py (can_allocate, can_append_slots)"


@dataclass(frozen=True)
class Config:
    """No knobs of its own: ``max_num_seqs``, the token budget and the watermark are the
    :class:`~kvdro.sim.Deployment`'s, as before the presets existed."""
