"""Replay a request trace through vLLM's own v1 scheduler, step by step (runs inside ``.venv-vllm``).

This file imports nothing from :mod:`kvdro`: :mod:`kvdro.bench.conformance` runs it as a script with the
separate environment that ``make conformance-install`` builds (vLLM 0.11.0 installed ``--no-deps`` beside a
CPU build of torch; pins in ``conformance-requirements.txt``). No GPU, no weights, no network: the model is a
``config.json`` of a Llama shape written to a temporary folder, the tokenizer is never loaded
(``skip_tokenizer_init=True``) and ``HF_HUB_OFFLINE=1``.

The scheduler is built as vLLM's own unit tests build it (``tests/v1/core/utils.py``, ``create_scheduler``:
a ``SchedulerConfig`` with chunked prefill on, a ``CacheConfig``, a ``KVCacheConfig`` of one full-attention
group of ``num_gpu_blocks`` blocks, ``Scheduler(vllm_config, kv_cache_config, structured_output_manager)``).
The model is replaced by a fabricated ``ModelRunnerOutput`` (``vllm/v1/outputs.py``) that samples one token
for a request exactly when the step completed its prefill, i.e. when ``num_computed_tokens`` has caught up
with ``num_tokens`` (prompt plus the tokens generated so far) -- what the GPU model runner does, which discards
the sample of a partial prefill chunk. Requests run with ``ignore_eos=True`` and ``max_tokens`` = their true
output length, so each finishes (``FINISHED_LENGTH_CAPPED``, ``vllm/v1/core/sched/utils.py`` ``check_stop``)
when it has generated exactly ``output_tokens`` tokens.

Input (JSON on stdin, or the file named by the first argument): one or more runs, each replayed by a
new scheduler in the same process (vLLM is imported once)::

    {"runs": [{"requests": [{"request_id": "0", "arrival_step": 0, "input_tokens": 374, "output_tokens": 44}, ...],
               "engine": {"num_gpu_blocks": 600, "block_size": 16, "max_num_seqs": 64,
                          "max_num_batched_tokens": 2048, "max_model_len": 4096,
                          "enable_prefix_caching": false, "long_prefill_token_threshold": 0}}, ...]}

Output (JSON on stdout): ``{"vllm_version": ..., "torch_version": ..., "import_s": ..., "runs": [{"build_s": ...,
"replay_s": ..., "records": [...]}, ...]}`` (seconds) with, per run, one record per ``Scheduler.schedule()`` call::

    {"step": i, "scheduled": {request_id: num_scheduled_tokens}, "preempted": [...], "finished": [...]}

Step ``i`` is the ``i``-th call; the requests whose ``arrival_step`` is ``i`` are added (in input order)
just before it, so a step with nothing to run is recorded with an empty ``scheduled``. ``preempted`` lists,
in the order vLLM preempted them, the requests that were running before the call and were preempted in it:
vLLM 0.11.0's ``SchedulerOutput`` does not list them, so they are read off the request status
(``RequestStatus.PREEMPTED``) of the requests running before the call; ``Scheduler.schedule`` pops victims
from the tail of ``running`` and prepends each to ``waiting``, so the waiting queue's head holds them in
reverse order. ``finished`` lists the requests that finished in the ``update_from_output`` that follows the
call. The replay stops after the step in which the last request finished.

Prompts carry distinct token ids per request (request ``k``'s prompt is ``k+1`` repeated, and the sampled
token is 0), so prefix caching, when it is enabled, can hit only a request's own blocks (after a
preemption), never another request's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

ENGINE_KEYS = ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "enable_prefix_caching", "long_prefill_token_threshold")
REQUEST_KEYS = ("request_id", "arrival_step", "input_tokens", "output_tokens")
SAMPLED_TOKEN = 0


def _check_input(doc: dict) -> tuple[list[dict], dict]:
    """The requests and engine settings of the input document; ``ValueError`` names what is wrong."""
    if not isinstance(doc, dict) or "requests" not in doc or "engine" not in doc:
        raise ValueError("input: a JSON object with the keys 'requests' and 'engine'")
    engine = doc["engine"]
    missing = [k for k in ENGINE_KEYS if k not in engine]
    if missing:
        raise ValueError(f"engine: missing keys {missing}")
    for k in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if not isinstance(engine[k], int) or engine[k] < 1:
            raise ValueError(f"engine.{k}: a positive integer, got {engine[k]!r}")
    requests = doc["requests"]
    seen = set()
    for i, r in enumerate(requests):
        missing = [k for k in REQUEST_KEYS if k not in r]
        if missing:
            raise ValueError(f"requests[{i}]: missing keys {missing}")
        if r["request_id"] in seen:
            raise ValueError(f"requests[{i}].request_id: {r['request_id']!r} repeated")
        seen.add(r["request_id"])
        if r["input_tokens"] < 1 or r["output_tokens"] < 1 or r["arrival_step"] < 0:
            raise ValueError(f"requests[{i}]: input_tokens, output_tokens >= 1 and arrival_step >= 0 needed")
        if r["input_tokens"] + r["output_tokens"] > engine["max_model_len"]:
            raise ValueError(f"requests[{i}]: input_tokens + output_tokens exceeds engine.max_model_len")
    return requests, engine


def _llama_config_dir(max_model_len: int) -> str:
    """A temporary folder holding a ``config.json`` of a (tiny) Llama shape: no weights, no tokenizer."""
    folder = tempfile.mkdtemp(prefix="kvdro-vllm-model-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
              "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": max_model_len,
              "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def build_scheduler(engine: dict):
    """A vLLM v1 ``Scheduler`` as ``tests/v1/core/utils.py`` ``create_scheduler`` builds one, on the CPU."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_config = SchedulerConfig(
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        max_model_len=engine["max_model_len"],
        long_prefill_token_threshold=engine["long_prefill_token_threshold"],
        enable_chunked_prefill=True,
    )
    model_config = ModelConfig(model=_llama_config_dir(engine["max_model_len"]), dtype="float32", seed=0,
                               max_model_len=engine["max_model_len"], skip_tokenizer_init=True)
    cache_config = CacheConfig(block_size=engine["block_size"], gpu_memory_utilization=0.9, swap_space=0,
                               cache_dtype="auto", enable_prefix_caching=bool(engine["enable_prefix_caching"]))
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    kv_cache_config = KVCacheConfig(
        num_blocks=engine["num_gpu_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"],
                                          FullAttentionSpec(engine["block_size"], 1, 1, torch.float32, False))],
    )
    cache_config.num_gpu_blocks = engine["num_gpu_blocks"]
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
                     structured_output_manager=StructuredOutputManager(vllm_config))


def make_request(spec: dict, index: int, block_size: int):
    """A ``vllm.v1.request.Request`` of ``spec``'s lengths (prompt of token id ``index + 1``)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=int(spec["output_tokens"]), ignore_eos=True)
    return Request(request_id=str(spec["request_id"]), prompt_token_ids=[index + 1] * int(spec["input_tokens"]),
                   sampling_params=params, pooling_params=None, eos_token_id=None,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def fake_model_output(scheduler, scheduler_output):
    """One sampled token for each scheduled request whose prefill the step completed, none for the rest."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        request = scheduler.requests[rid]
        sampled.append([SAMPLED_TOKEN] if request.num_computed_tokens >= request.num_tokens else [])
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])


def replay(scheduler, requests: list[dict], engine: dict, max_steps: int | None = None) -> list[dict]:
    """One record per ``scheduler.schedule()`` call until every request has finished (module docstring)."""
    from vllm.utils import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.request import RequestStatus

    init_none_hash(sha256)
    by_step: dict[int, list[tuple[int, dict]]] = {}
    for i, r in enumerate(requests):
        by_step.setdefault(int(r["arrival_step"]), []).append((i, r))
    remaining = len(requests)
    limit = max_steps if max_steps is not None else 10 * sum(r["input_tokens"] + r["output_tokens"]
                                                             for r in requests) + 100
    records: list[dict] = []
    step = 0
    while remaining > 0:
        if step >= limit:
            raise RuntimeError(f"replay: {remaining} requests unfinished after {limit} steps")
        for i, spec in by_step.get(step, ()):
            scheduler.add_request(make_request(spec, i, engine["block_size"]))
        running_before = [r.request_id for r in scheduler.running]
        out = scheduler.schedule()
        preempted_now = {rid for rid in running_before
                         if scheduler.requests[rid].status == RequestStatus.PREEMPTED}
        # victims were prepended one by one: the waiting queue's head holds them last-preempted first
        head = [r.request_id for r in scheduler.waiting if r.request_id in preempted_now]
        preempted = head[::-1] if len(head) == len(preempted_now) else sorted(preempted_now)
        engine_outputs = scheduler.update_from_output(out, fake_model_output(scheduler, out))
        finished = [o.request_id for eo in engine_outputs.values() for o in eo.outputs if o.finished]
        remaining -= len(finished)
        records.append({"step": step, "scheduled": {k: int(v) for k, v in out.num_scheduled_tokens.items()},
                        "preempted": preempted, "finished": finished})
        step += 1
    return records


def main(argv: list[str]) -> int:
    """Read the input document, replay each run, print the result as one JSON document on stdout."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    doc = json.load(open(argv[0]) if argv else sys.stdin)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise ValueError("input: a JSON object with a non-empty list 'runs'")
    runs = [_check_input(run) for run in doc["runs"]]
    stdout, sys.stdout = sys.stdout, sys.stderr  # vLLM's log handler writes to sys.stdout: keep stdout JSON only
    try:
        start = time.perf_counter()
        import torch
        import vllm

        import_s = time.perf_counter() - start
        results = []
        for requests, engine in runs:
            start = time.perf_counter()
            scheduler = build_scheduler(engine)
            build_s = time.perf_counter() - start
            start = time.perf_counter()
            records = replay(scheduler, requests, engine)
            results.append({"build_s": round(build_s, 3), "replay_s": round(time.perf_counter() - start, 3),
                            "records": records})
    finally:
        sys.stdout = stdout
    json.dump({"vllm_version": vllm.__version__, "torch_version": torch.__version__, "import_s": round(import_s, 3),
               "runs": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
