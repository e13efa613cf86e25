"""Invariants checked at the end of every run (both engines): a violation raises :class:`InvariantError`.

* **Blocks are conserved**: never more blocks in use than the pool (peak <= blocks), and every block
  is free again at the end (free == blocks).
* **Tokens are conserved**: every request an engine received finished, with exactly its (capped)
  output length generated.
* **No request is lost**: completed + rejected + ignored = requests in the trace.
* **Hard reservations terminate**: a hard-capped request is readmitted with a strictly larger
  reservation up to the context window, where it cannot overflow; an overflow at the window raises
  :class:`InvariantError` inside the engine (both engines).
* **Time is monotone**: arrival <= first admission < first token <= finish <= the engine's last step
  end, and every step has a positive duration (busy time <= end time).
"""

from __future__ import annotations

import numpy as np

from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec

__all__ = ["InvariantError", "check_engine", "check_accounting"]


class InvariantError(AssertionError):
    """A simulator invariant does not hold (a bug, never bad input)."""


def check_engine(spec: EngineSpec, inp: EngineInput, out: EngineOutput) -> None:
    """The per-engine invariants of the module docstring."""
    if out.peak_blocks > spec.blocks:
        raise InvariantError(f"blocks: peak {out.peak_blocks} in use exceeds the pool of {spec.blocks}")
    if out.free_blocks_end != spec.blocks:
        raise InvariantError(f"blocks: {spec.blocks - out.free_blocks_end} block(s) still in use at the end")
    if len(inp) == 0:
        return
    if np.any(out.finish_ps < 0):
        raise InvariantError(f"requests: {int((out.finish_ps < 0).sum())} request(s) never finished")
    if not np.array_equal(out.generated, inp.output):
        bad = int(np.flatnonzero(out.generated != inp.output)[0])
        raise InvariantError(f"tokens: request {bad} generated {out.generated[bad]} tokens, expected {inp.output[bad]}")
    if not (np.all(inp.arrival_ps <= out.admit_ps) and np.all(out.admit_ps < out.first_token_ps)
            and np.all(out.first_token_ps <= out.finish_ps) and np.all(out.finish_ps <= out.end_ps)):
        raise InvariantError("time: arrival <= admission < first token <= finish <= end does not hold")
    if out.busy_ps > out.end_ps or out.prefill_steps > out.steps:
        raise InvariantError("time: busy time exceeds the engine's end time")


def check_accounting(n_requests: int, completed: int, rejected: int, ignored: int) -> None:
    """completed + rejected + ignored = requests (nothing silently dropped)."""
    if completed + rejected + ignored != n_requests:
        raise InvariantError(
            f"requests: completed {completed} + rejected {rejected} + ignored {ignored} != {n_requests} in the trace"
        )
