"""Benchmark: prefix sharing in the ``vllm-v1`` preset against vLLM's own v1 scheduler, step by step.

``python -m kvdro.bench conformance-prefix``. Requests built from 16-token prefix keys (:func:`workload`:
a few shared "system prompts" of 2-29 blocks, each request's own blocks after them, a tail under 16
tokens) are replayed with steps in place of time through

* vLLM 0.11.0's ``Scheduler`` with automatic prefix caching on (:mod:`kvdro.bench._vllm_prefix_replay`,
  run by ``.venv-vllm`` as :mod:`kvdro.bench.conformance` runs it; prompts' token ids are a function of
  the keys, so vLLM's block hashes are equal exactly where the keys are), and
* ours: :func:`kvdro.sim.engine_presets.replay_steps` of ``vllm-v1`` with the same keys
  (:class:`kvdro.sim.engines.free_queue.HashedBlockPool`),

and compared step by step (:func:`kvdro.bench.conformance.compare_steps`) over pools from roomy to tight
(evictions of cached blocks, preemptions). A negative control replays ours *without* the keys (no
sharing across requests): it must differ from vLLM. Exit 0 when every keyed pair is identical and the
control differs, 1 otherwise, 2 without ``.venv-vllm`` (``make conformance-install``). Not part of
``make test`` (vLLM's import alone takes 10-20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from kvdro.bench.conformance import VLLM_PYTHON, compare_steps, skip_reason

__all__ = ["workload", "run_vllm", "run_ours", "CASES", "main", "skip_reason"]

DRIVER = Path(__file__).with_name("_vllm_prefix_replay.py")
#: (seed, num_gpu_blocks) of the compared replays: roomy, then tighter pools (block 0 is vLLM's null block).
CASES: tuple[tuple[int, int], ...] = ((0, 2000), (0, 600), (1, 400), (2, 300))
#: The engine knobs both sides get (vLLM's names; a 4,096-token window).
ENGINE = {"block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096,
          "enable_prefix_caching": True, "long_prefill_token_threshold": 0}


def workload(seed: int, n: int = 300) -> list[dict]:
    """``n`` requests (seeded): 6 shared prefixes of 2-29 blocks (keys 100 c + b), 0-39 blocks of its own
    (keys from 5,000 up, never shared), a tail of 1-15 tokens; arrivals 0-5 steps apart; outputs 1-299."""
    rng = np.random.default_rng(seed)
    systems = [list(range(100 * c, 100 * c + int(rng.integers(2, 30)))) for c in range(6)]
    nxt, t, out = 5000, 0, []
    for i in range(n):
        t += int(rng.integers(0, 6))
        own = int(rng.integers(0, 40))
        keys = systems[int(rng.integers(0, 6))] + list(range(nxt, nxt + own))
        nxt += own
        out.append({"request_id": str(i), "arrival_step": t, "input_tokens": 16 * len(keys) + int(rng.integers(1, 16)),
                    "output_tokens": int(rng.integers(1, 300)), "keys": keys})
    return out


def run_vllm(runs: list[tuple[list[dict], int]]) -> list[list[dict]]:
    """Each ``(requests, num_gpu_blocks)`` through vLLM's scheduler (one process): its step records."""
    doc = {"runs": [{"requests": req, "engine": {**ENGINE, "num_gpu_blocks": blocks}} for req, blocks in runs]}
    proc = subprocess.run([str(VLLM_PYTHON), str(DRIVER)], input=json.dumps(doc), capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM replay failed (exit {proc.returncode}):\n" + proc.stderr[-3000:])
    return [r["records"] for r in json.loads(proc.stdout)["runs"]]


def run_ours(requests: list[dict], num_blocks: int, *, keys: bool = True) -> list[dict]:
    """The same requests through the ``vllm-v1`` preset (with or without their keys): step records."""
    from kvdro.sim.engine_presets import replay_steps
    from kvdro.sim.engines import make_config

    cfg = make_config("vllm-v1", {k: ENGINE[k] for k in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                                                         "long_prefill_token_threshold", "enable_prefix_caching")})
    prompt = np.array([r["input_tokens"] for r in requests], dtype=np.int64)
    limit = np.minimum([r["output_tokens"] for r in requests], ENGINE["max_model_len"] - prompt)
    rows = replay_steps("vllm-v1", cfg, arrival=np.array([r["arrival_step"] for r in requests]), prompt=prompt,
                        limit=limit, max_new=limit, pages=num_blocks - 1, window=ENGINE["max_model_len"],
                        prefix_keys=[r["keys"] for r in requests] if keys else None)
    ids = [r["request_id"] for r in requests]
    return [{"step": k, "scheduled": {ids[j]: n for j, n in s.items()}, "preempted": [ids[j] for j in p],
             "finished": [ids[j] for j in f]} for k, s, p, f in rows]


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="python -m kvdro.bench conformance-prefix", description=__doc__.splitlines()[0]
                            ).parse_args(argv)
    reason = skip_reason()
    if reason:
        print(f"conformance-prefix: {reason}")
        return 2
    loads = [(workload(seed), blocks) for seed, blocks in CASES]
    theirs = run_vllm(loads)
    ok = True
    print("seed  blocks  steps  identical  first divergence  preemptions ours/vLLM  tokens scheduled (vLLM)")
    for (seed, blocks), (req, _), rec in zip(CASES, loads, theirs):
        cmp = compare_steps(run_ours(req, blocks), rec)
        ok &= cmp.identical == cmp.compared
        tokens = sum(v for r in rec for v in r["scheduled"].values())
        print(f"{seed:4d}  {blocks:6d}  {cmp.compared:5d}  {cmp.share_identical:9.1%}  {str(cmp.first_divergence):>16}"
              f"  {cmp.preemptions_ours:>10d}/{cmp.preemptions_theirs:<10d}  {tokens:,}")
    control = compare_steps(run_ours(loads[0][0], CASES[0][1], keys=False), theirs[0])
    print(f"control (ours without keys, seed {CASES[0][0]}, {CASES[0][1]} blocks): {control.share_identical:.1%} "
          f"identical, first divergence at step {control.first_divergence}: {control.difference}")
    ok &= control.first_divergence is not None
    return 0 if ok else 1
