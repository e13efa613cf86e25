"""The fast engine of vLLM v0: the reference engine's semantics, jumping between events, compiled with numba.

Between two events every decode step is the same: the same sequences each append one token, and
the only things that change are counters. So the engine keeps running sequences **lazily**:

* a global decode-step counter ``G``; a running sequence stores offsets, so its cached tokens are
  ``kv_off + G`` and its generated tokens ``g_off + G`` -- nothing is touched per step;
* a sequence whose blocks are exactly full ("tight": vLLM's reactive growth, or a reservation
  policy's request that has outgrown its reservation) takes a new block in every step with
  ``G % 16 == (-kv_off) % 16``; such sequences sit in one of 16 residue lists, so the blocks taken by
  the next ``k`` steps are a periodic sum over 16 counts;
* heaps hold each sequence's completion step and, for a reservation policy, the step at which it
  outgrows its reservation (it then joins a residue list).

The events that end a jump: a completion, a reservation overflow, the step at which free blocks
would run out (preemption), and an arrival when the waiting queue is empty (with a non-empty FCFS
queue whose head does not fit, arrivals cannot be admitted before a completion: head-of-line
blocking; with a queue ordered by another key, a newcomer can overtake the head, so every arrival
ends a jump unless preempted requests are at the front). With the oracle's look-ahead a head that
fits vLLM's rules but not the look-ahead ends the jump at the first step at which it fits, computed
from the running sequences' fixed profile (:func:`kvdro.sim._engine_kernels._la_earliest`; the rule
is :func:`kvdro.sim.scheduler.lookahead_fits`, which the reference engine evaluates at every step).
The jump advances time by the closed-form sum of the ``k`` step durations (affine in the growing
context, :class:`kvdro.sim.timing.StepClock`) and the KV-use integral by a sum over the 16 residues;
then one ordinary step runs with the event. Time and integrals are integers, so every metric is
bit-identical to the step-by-step :mod:`kvdro.sim.engine_reference` (``tests/test_sim_engines.py``,
``tests/test_sim_compiled.py``).

The data structures are arrays, so that the loop compiles to machine code:

* the FCFS waiting queue is a ring buffer of request indices (``extendleft`` = write before the head);
* the running sequences, oldest admission first, are a doubly linked list over request indices
  (admission numbers only grow, so appending keeps it sorted; "the next running sequence after
  ``a``" is the list successor); each residue list is such a list too, kept sorted by admission number;
* the two heaps are arrays of (step, admission number, request) with lazy deletion (an entry whose
  admission number is no longer its request's is stale); when one is full its stale entries are
  dropped (at most ``max_num_seqs`` entries are live), so its size is fixed;
* the integrals that outgrow int64 (``kv_integral`` = blocks x ps reaches 3.5e19 on the
  conversation trace itself, above 2**63 = 9.2e18; ``resident_integral`` and
  ``decode_batch_integral`` pass it on a 32x trace) are accumulated exactly in three 30-bit limbs
  (:func:`_addmul`, every product checked for its operands' range) and returned as Python ints;
* a jump covers at most ``kmax`` (2**16) decode steps, so every intermediate product (the jump's
  duration, the moments of the residue sums) stays far inside int64. A shorter jump followed by an
  ordinary step is the same simulation (the ordinary step is the general one), which the tests
  check by running with ``kmax`` = 1, 2, 3, ...;
* step durations come from tables: ``base(n)`` for n <= ``max_num_seqs`` (and <= the engine's
  requests) and the prefill floor
  ``S0(tokens)`` for every token count one prefill step of the run can hold -- the token budget,
  or fewer when the trace is short: the sum of the ``max_num_seqs`` longest prompts plus their
  recompute (:func:`kvdro.sim.envelope.prefill_tokens_bound`), so a budget of 10**8 tokens does not
  tabulate 10**8 times for a 50-request trace -- both from the same
  :class:`~kvdro.sim.timing.StepClock` and combined with the same float operations and the same
  round-half-to-even as :meth:`StepClock.prefill_ps`. The tables are built once per clock and
  process and grow when a run needs more (``S0`` costs ~10 us per token count: ~0.17 s for a
  16,384-token budget);
* the engines' envelope (:mod:`kvdro.sim.envelope`) is checked before the loop, as in the reference
  engine, and the loop stops with the same :class:`~kvdro.sim.timing.ClockLimitError` when its
  clock passes the drain limit :data:`~kvdro.sim.timing.MAX_CLOCK_PS`.

**Why numba, and one fast implementation.** The same event-jumping algorithm first ran as pure
Python (``engine_fast.py``, issue 9), one Python iteration per *event* (a completion, an overflow,
an arrival, a preemption), not per step: 96 % of its time was that loop, so fewer Python-level
events could not make it much faster without changing what is simulated. A compiled loop did
(issue 29; when the Python engine was retired, 11x less engine time on the conversation trace's
four cases of ``python -m kvdro.bench sim``, part 2). numba compiles the loop from this Python
source at first use (``cache=True``: once per machine, then loaded from ``__pycache__``), ships as
wheels for every platform the book supports, and needs no compiler at install -- Cython or a C
extension would need a build step in ``pip install`` and in Binder; a rewrite in numpy vector
operations does not fit an event loop whose every iteration depends on the last. numba is a required dependency
(``pyproject.toml``). With ``NUMBA_DISABLE_JIT=1`` the same source runs as plain Python (slowly,
with the same results: ``tests/test_sim_compiled.py``), which is how to step through it in a
debugger. The Python engine, a third copy of one algorithm, was retired in issue 32; what that
costs is the fixed start-up of a process's first compiled run (numba's import and the cached
machine code: a one-off ``python -m kvdro simulate`` of the conversation trace went from 1.17 to
1.71 CPU s and from 99 to 210 MiB; ``python -m kvdro.bench startup`` times it).

The kernels live in :mod:`kvdro.sim._engine_kernels`, imported on first use, so that ``import
kvdro.sim`` and ``python -m kvdro simulate --help`` do not load numba.
"""

from __future__ import annotations

import weakref

import numpy as np

from kvdro.sim.envelope import check_envelope, prefill_tokens_bound
from kvdro.sim.invariants import InvariantError
from kvdro.sim.scheduler import EngineInput, EngineOutput, EngineSpec, queue_order
from kvdro.sim.timing import ClockLimitError, StepClock

__all__ = ["KMAX", "run_compiled", "warm_up"]

#: The longest jump [decode steps]; keeps every product of a jump inside int64 (module docstring).
KMAX = 1 << 16
_LIMB = 30  # the wide integrals' limbs (kvdro.sim._engine_kernels._addmul)

# ---------------------------------------------------------------------------------------------
# step-duration tables, one per clock and process

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tables(clock: StepClock, max_seqs: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """(base(n) for n = 0..max_seqs [ps], S0(tokens) for tokens = 0..budget [s]) of ``clock``, at least;
    ``budget`` = the most tokens a prefill step of the run holds (:func:`prefill_tokens_bound`)."""
    from kvdro.hardware import step_time

    base, s0 = _TABLES.get(clock, (np.zeros(0, np.int64), np.zeros(0)))
    if base.size <= max_seqs:
        old = base.size
        base = np.concatenate([base, np.zeros(max_seqs + 1 - old, np.int64)])
        for n in range(max(old, 1), max_seqs + 1):
            base[n] = clock.decode_base_ps(n)
    if s0.size <= budget:
        old = s0.size
        s0 = np.concatenate([s0, np.zeros(budget + 1 - old)])
        memo = clock._s0  # the clock's own memo of S0 (timing.StepClock.prefill_ps)
        for tok in range(max(old, 1), budget + 1):
            v = memo.get(tok)
            if v is None:
                v = step_time(clock.model, clock.gpu, clock.config, tok, 0, 0, prefill_attention_tokens2=0)
            s0[tok] = v
    _TABLES[clock] = (base, s0)
    return base, s0


def _wide(limbs: np.ndarray) -> int:
    return (int(limbs[2]) << (2 * _LIMB)) + (int(limbs[1]) << _LIMB) + int(limbs[0])


def _as_int64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _kernels():
    """:mod:`kvdro.sim._engine_kernels`, imported on first use (module docstring); an ImportError that
    says what to install when numba is missing."""
    try:
        from kvdro.sim import _engine_kernels
    except ModuleNotFoundError as e:
        if e.name != "numba":
            raise
        raise ImportError("the fast engine needs numba, a dependency of kvdro (pip install 'numba>=0.60,<1'); "
                          "implementation='reference' runs without it") from e
    return _engine_kernels


def run_compiled(spec: EngineSpec, inp: EngineInput, clock: StepClock, *, progress=None, kmax: int = KMAX) -> EngineOutput:
    """Simulate one engine with the compiled event loop; the same :class:`EngineOutput`, bit for bit,
    as the step-by-step :func:`kvdro.sim.engine_reference.run_reference`.

    ``kmax`` [decode steps] bounds one jump (module docstring; any value >= 1 gives the same
    result). ``progress`` (a tqdm bar) is advanced once, by the finished requests, at the end.
    Raises ValueError / :class:`~kvdro.sim.timing.ClockLimitError` outside the engines' envelope
    (:mod:`kvdro.sim.envelope`), as the reference engine does; ImportError without numba.
    """
    if isinstance(kmax, bool) or not isinstance(kmax, (int, np.integer)) or not 1 <= kmax <= KMAX:
        raise ValueError(f"kmax: must be an integer in [1, {KMAX}] decode steps, got {kmax!r}")
    check_envelope(spec, inp, clock)
    n = len(inp)
    out = EngineOutput.empty(n)
    # tables sized by the trace: at most min(max_num_seqs, requests) run at once
    base, s0 = _tables(clock, min(int(spec.max_num_seqs), max(n, 1)), prefill_tokens_bound(spec, inp))
    totals = np.zeros(8, np.int64)
    wide = np.zeros(9, np.int64)
    R = np.array(inp.reserve_blocks, dtype=np.int64, copy=True)  # grows when hard-capped
    if spec.lookahead and np.any(np.asarray(inp.reserve_blocks) != 0):
        raise ValueError("reserve_blocks: the oracle's look-ahead admits reactively (reserve nothing)")
    kern = _kernels()
    rank, by_rank, fifo = queue_order(inp)  # int64 arrays: no per-request Python objects
    code = kern._kernel(
        _as_int64(inp.arrival_ps), _as_int64(rank), _as_int64(by_rank), bool(fifo), bool(spec.lookahead), _as_int64(inp.prompt), _as_int64(inp.output), R, _as_int64(inp.prefix_key),
        _as_int64(inp.shared_blocks), np.array(spec.prefix_blocks, dtype=np.int64).reshape(-1),
        int(spec.blocks), int(spec.watermark_blocks), int(spec.max_num_seqs), int(spec.token_budget),
        bool(spec.free_block_rule), bool(spec.hard), int(spec.window_blocks),
        int(clock.slope_ps), base, s0, float(clock._pair_s), float(clock._token_s), int(kmax),
        out.admit_ps, out.first_token_ps, out.finish_ps, out.preemptions, out.recomputed_tokens,
        out.final_cap_tokens, out.generated, totals, wide,
    )
    if code == kern._STUCK:
        raise InvariantError("compiled engine: waiting requests but nothing running and nothing admissible")
    if code == kern._JUMP_OVERDRAW:
        raise InvariantError("compiled engine: a jump took more blocks than are free")
    if code == kern._WINDOW:
        raise InvariantError(f"compiled engine: request {int(totals[7])} outgrew a reservation at the context window")
    if code == kern._CLOCK:
        raise ClockLimitError(clock.config.name, n, "the clock passed it before the queue drained")
    if code == kern._RANGE:
        raise ValueError("spec/clock: step durations or integrals outside the compiled engine's exact integer "
                         "range (implementation='reference' computes with Python's unbounded integers)")
    if code == kern._ORACLE_PREEMPTED:
        raise InvariantError("compiled engine: the oracle's look-ahead admitted a request that was then preempted")
    if code == kern._HEAP:
        raise InvariantError("compiled engine: more live heap entries than running sequences")
    steps, prefill_steps, busy, dps, end, peak, free_end = (int(v) for v in totals[:7])
    out.steps, out.prefill_steps, out.busy_ps, out.decode_ps = steps, prefill_steps, busy, dps
    out.resident_integral, out.decode_batch_integral, out.kv_integral = _wide(wide[0:3]), _wide(wide[3:6]), _wide(wide[6:9])
    out.end_ps, out.peak_blocks, out.free_blocks_end = end, peak, free_end
    if progress is not None:
        progress.update(int((out.finish_ps >= 0).sum()))
    return out


def warm_up() -> None:
    """Compile the kernels into numba's on-disk cache now (``make install`` calls it once), so that no
    later process -- two pytest-xdist workers, a chapter's kernel -- pays the ~15 CPU s compilation
    or compiles the same kernels at the same time. Runs 20 tiny requests through this engine and
    each compiled preset (:func:`kvdro.sim.presets_compiled.warm_up`)."""
    from kvdro.sim.presets_compiled import warm_up_case

    clock, spec, inp = warm_up_case(watermark_blocks=1)
    run_compiled(spec, inp, clock)
    from kvdro.sim.presets_compiled import warm_up as warm_up_presets

    warm_up_presets()
