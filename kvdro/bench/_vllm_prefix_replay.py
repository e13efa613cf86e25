"""Replay shared-prefix requests through vLLM's own v1 scheduler, prefix caching on (runs inside ``.venv-vllm``).

The driver of :mod:`kvdro.bench.conformance_prefix`; like :mod:`kvdro.bench._vllm_replay` (whose scheduler,
fake model output and replay loop it reuses) it imports nothing from :mod:`kvdro`. Each request carries
``keys``, one per full 16-token block at the start of its prompt: a key's block holds 16 token ids that are a
function of the key alone (:func:`block_tokens`; distinct for keys below 19,000), so two requests share a
block's hash in vLLM (``vllm/v1/core/kv_cache_utils.py``: a chain over the parent hash and the block's tokens)
exactly when they share the key and every key before it. The rest of the prompt (under 16 tokens) is the
request's own token ``20000 + index``, so no block past the keys is shared.

Input (JSON on stdin): ``{"runs": [{"requests": [{"request_id", "arrival_step", "input_tokens",
"output_tokens", "keys": [...]}, ...], "engine": {...}}, ...]}`` (engine keys as ``_vllm_replay``'s, with
``enable_prefix_caching`` true). Output: ``{"vllm_version": ..., "runs": [{"records": [...]}, ...]}``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _vllm_replay as base  # noqa: E402  (the sibling driver: no kvdro import)

#: Blocks of this many tokens carry the keys (vLLM's default ``block_size``).
KEY_BLOCK = 16


def block_tokens(key: int) -> list[int]:
    """The 16 token ids of a block with ``key`` (in [100, 19100); a function of ``key`` mod 19,000)."""
    return [(key * 7919 + t * 104729) % 19000 + 100 for t in range(KEY_BLOCK)]


def request_maker(keys_by_id: dict[str, list[int]]):
    """A ``make_request`` for :func:`_vllm_replay.replay` whose prompts are built from the keys."""

    def make_request(spec: dict, index: int, block_size: int):
        from vllm.sampling_params import SamplingParams
        from vllm.utils import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        prompt = [t for k in keys_by_id[str(spec["request_id"])] for t in block_tokens(int(k))]
        if len(prompt) > int(spec["input_tokens"]):
            raise ValueError(f"request {spec['request_id']}: more keyed tokens than input_tokens")
        prompt += [20000 + index] * (int(spec["input_tokens"]) - len(prompt))
        params = SamplingParams(max_tokens=int(spec["output_tokens"]), ignore_eos=True)
        hasher = get_request_block_hasher(block_size, sha256)
        return Request(request_id=str(spec["request_id"]), prompt_token_ids=prompt, sampling_params=params,
                       pooling_params=None, eos_token_id=None, block_hasher=hasher)

    return make_request


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    doc = json.load(sys.stdin)
    stdout, sys.stdout = sys.stdout, sys.stderr  # vLLM logs to stdout: keep stdout JSON only
    try:
        import vllm

        results = []
        for run in doc["runs"]:
            requests = [{k: v for k, v in r.items() if k != "keys"} for r in run["requests"]]
            base._check_input({"requests": requests, "engine": run["engine"]})
            base.make_request = request_maker({str(r["request_id"]): r["keys"] for r in run["requests"]})
            scheduler = base.build_scheduler(run["engine"])
            results.append({"records": base.replay(scheduler, requests, run["engine"])})
    finally:
        sys.stdout = stdout
    json.dump({"vllm_version": vllm.__version__, "runs": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
