"""Prefix reuse across requests (issue 32, item 4): vLLM v1's automatic prefix caching
(vLLM 0.11.0 v1/core/block_pool.py, kv_cache_manager.py) and SGLang's radix cache (SGLang 0.5
mem_cache/radix_cache.py, managers/schedule_policy.py PrefillAdder), driven by 16-token prefix keys.

Expected steps are worked out by hand from the sources (comments); keys are small integers, one per
full 16-token prompt block (kvdro.datasets.prefix_block_keys gives them for a Mooncake trace).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvdro.datasets import read_mooncake_jsonl
from kvdro.sim import simulate
from kvdro.sim.engine_presets import preset_state, replay
from kvdro.sim.engines import make_config, sglang

V1 = make_config("vllm-v1", {"max_num_batched_tokens": 256, "max_num_seqs": 8})
SG = make_config("sglang")


def _run(engine, cfg, *, arrival, prompt, limit, pages, keys=None, max_new=None):
    max_new = limit if max_new is None else max_new
    st = preset_state(engine, cfg, prompt=prompt, limit=limit, max_new=max_new, pages=pages, window=10_000,
                      prefix_keys=keys)
    return [r[1] for r in replay(engine, cfg, st, arrival)], st


@pytest.mark.parametrize("engine, cfg, pages", [("vllm-v1", V1, 20), ("sglang", SG, 400)])
def test_a_finished_requests_prefix_is_hit_by_a_later_request(engine, cfg, pages):
    # a: prompt 64 = 4 full blocks (keys 1-4), 2 tokens: prefill at step 0, decode at step 1, done.
    # vLLM: its blocks join the free queue still cached (BlockPool.free_blocks keeps the hash);
    # SGLang: cache_finished_req inserts its 64 computed prompt tokens (4 blocks) into the tree.
    # b (step 3): prompt 70, keys 1, 2, 3, 9: the longest cached run is 3 blocks (48 tokens), so its
    # prefill is 70 - 48 = 22 tokens; without keys it is 70.
    kw = dict(arrival=[0, 3], prompt=[64, 70], limit=[2, 2], pages=pages)
    shared, st = _run(engine, cfg, keys=[[1, 2, 3, 4], [1, 2, 3, 9]], **kw)
    plain, _ = _run(engine, cfg, **kw)
    assert shared == [{0: 64}, {0: 1}, {}, {1: 22}, {1: 1}]
    assert plain == [{0: 64}, {0: 1}, {}, {1: 70}, {1: 1}]
    assert st.prefix.hit_tokens == [0, 48] and st.recomputed == [0, 0]


def test_vllm_a_running_requests_blocks_are_shared_and_take_no_new_block():
    # 7 blocks. Step 0: a (prompt 64, keys 1-4) takes 4 blocks. Step 1: a's decode (token 65) takes a
    # 5th; 2 free. b arrives (prompt 70, keys 1, 2, 3, 9): get_computed_blocks finds blocks 1-3 of a
    # (cached when allocated: allocate_slots -> cache_blocks), ref_cnt 1, so they are not counted by
    # get_num_blocks_to_allocate: b needs ceil(70/16) - 3 = 2 new blocks <= 2 free -> admitted with 22
    # tokens beside a's decode. Without keys b needs 5 blocks and waits until a finishes (step 2).
    kw = dict(arrival=[0, 1], prompt=[64, 70], limit=[3, 2], pages=7)
    shared, st = _run("vllm-v1", V1, keys=[[1, 2, 3, 4], [1, 2, 3, 9]], **kw)
    plain, _ = _run("vllm-v1", V1, **kw)
    assert shared[:2] == [{0: 64}, {0: 1, 1: 22}]
    assert plain[:4] == [{0: 64}, {0: 1}, {0: 1}, {1: 70}]
    assert st.free == 7 and st.used_pages == 0


def test_vllm_free_queue_evicts_the_least_recently_freed_block_first():
    # 6 blocks, ids 0-5, free queue [0..5]. Each request ends at its prefill (1 token).
    # a (prompt 32, keys 1, 2) pops 0, 1; frees them last first: queue [2, 3, 4, 5, 1, 0].
    # c (prompt 32, keys 3, 4) pops 2, 3 -> queue [4, 5, 1, 0, 3, 2].
    # d (prompt 48, keys 7, 8, 9) pops 4, 5, 1: block 1 (a's key 2) is evicted; freed reversed ->
    # queue [0, 3, 2, 1, 5, 4]; cached: key 1 (block 0), c's 3, 4 (blocks 2, 3), d's 7-9.
    kw = dict(arrival=[0, 1, 2], prompt=[32, 32, 48], limit=[1, 1, 1], pages=6, keys=[[1, 2], [3, 4], [7, 8, 9]])
    _, st = _run("vllm-v1", V1, **kw)
    pool = st.prefix
    assert list(pool.free_queue) == [0, 3, 2, 1, 5, 4]
    shared = {k: v for k, v in pool.cached.items() if isinstance(k, int)}
    assert shared == {1: [0], 3: [2], 4: [3], 7: [4], 8: [5], 9: [1]}
    # e (prompt 33, keys 1, 2) then hits key 1 only (block 0): 33 - 16 = 17 tokens to prefill.
    rows, st = _run("vllm-v1", V1, arrival=[0, 1, 2, 3], prompt=[32, 32, 48, 33], limit=[1, 1, 1, 1], pages=6,
                    keys=[[1, 2], [3, 4], [7, 8, 9], [1, 2]])
    assert rows == [{0: 32}, {1: 32}, {2: 48}, {3: 17}]


def test_vllm_unique_keys_give_todays_engine():
    # Today's free-queue model (a preempted request hits only its own freed blocks,
    # kvdro.sim.engines.free_queue.FreeBlockQueue) is the special case of keys no two requests share:
    # on random traces with preemptions both give the same steps, preemptions and recomputed tokens.
    preempted = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        n = 30
        arrival = np.sort(rng.integers(0, 60, n))
        prompt, limit = rng.integers(1, 120, n), rng.integers(1, 80, n)
        keys = [list(range(1000 * j, 1000 * j + p // 16)) for j, p in enumerate(prompt)]
        cfg = make_config("vllm-v1", {"max_num_batched_tokens": 128, "max_num_seqs": 16})
        a, st_a = _run("vllm-v1", cfg, arrival=arrival, prompt=prompt, limit=limit, pages=40)
        b, st_b = _run("vllm-v1", cfg, arrival=arrival, prompt=prompt, limit=limit, pages=40, keys=keys)
        assert a == b and st_a.preemptions == st_b.preemptions and st_a.recomputed == st_b.recomputed
        preempted += sum(st_a.preemptions)
    assert preempted > 0  # the own-block hits after a preemption are exercised


def test_sglang_counts_evictable_tokens_as_available_and_evicts_them_lru():
    # 120 slots. a (prompt 64, keys 1-4) ends at its prefill: cache_finished_req puts its 4 blocks
    # (64 tokens) in the tree, unlocked: available 56, evictable 64.
    _, st = _run("sglang", SG, arrival=[0], prompt=[64], limit=[1], pages=120, keys=[[1, 2, 3, 4]])
    assert (st.free, st.prefix.evictable, st.used_pages) == (56, 64, 0)
    assert sglang.PrefillAdder(st, SG, 0.7).rem_total_tokens == 56 + 64  # nothing running: no offset
    # b (step 1, prompt 100, no shared key, max_new 10): PrefillAdder's rem_total_tokens =
    # available + evictable = 120 > 100 + 10 -> admitted (counting only the 56 free slots it would
    # not be); alloc_for_extend: 56 < 100 -> evict(100) frees every unlocked leaf (64 tokens).
    # c (step 3, prompt 40, keys 1, 2) then matches nothing: a's blocks were evicted.
    rows, st = _run("sglang", SG, arrival=[0, 1, 3], prompt=[64, 100, 40], limit=[1, 2, 1], pages=120,
                    keys=[[1, 2, 3, 4], [20, 21, 22, 23, 24, 25], [1, 2]], max_new=[1, 10, 1])
    assert rows[1] == {1: 100} and rows[3] == {2: 40}
    assert st.prefix.hit_tokens == [0, 0, 0]


def test_sglang_evicts_the_least_recently_used_leaf_first():
    # 160 slots. a (prompt 32, keys 1, 2) ends at step 0, c (keys 3, 4) at step 1: the tree holds 4
    # unlocked blocks (64 tokens), 96 available. d (step 2, prompt 80) fits the 96 available: no
    # eviction (evict_from_tree_cache evicts only when available < the tokens to allocate), so e
    # (step 4, prompt 33, keys 3, 4) matches c's 2 blocks and prefills 1 token.
    rows, _ = _run("sglang", SG, arrival=[0, 1, 2, 4], prompt=[32, 32, 80, 33], limit=[1, 1, 2, 1], pages=160,
                   keys=[[1, 2], [3, 4], [5, 6, 7, 8, 9], [3, 4]])
    assert rows == [{0: 32}, {1: 32}, {2: 80}, {2: 1}, {3: 1}]
    # evict(32) on the tree of a and c pops leaves by last access: a's leaf (key 2), then its parent
    # (key 1), now a leaf and older than c's: c's blocks stay.
    _, st = _run("sglang", SG, arrival=[0, 1], prompt=[32, 32], limit=[1, 1], pages=130, keys=[[1, 2], [3, 4]])
    assert (st.free, st.prefix.evictable) == (66, 64)
    st.prefix.evict_tokens(st, 32)
    assert set(st.prefix.root.children) == {3} and (st.free, st.prefix.evictable) == (98, 32)


def test_sglang_shares_a_running_requests_prompt_and_locks_it():
    # a (prompt 64, keys 1-4, 10 tokens) is prefilled at step 0; cache_unfinished_req inserts its 4
    # blocks, locked. b (step 2, prompt 70, keys 1, 2, 3, 9) matches 3 blocks (48 tokens) and
    # prefills 22 (a prefill-only step: a's decode waits); at the end both released their paths: nothing locked.
    rows, st = _run("sglang", SG, arrival=[0, 2], prompt=[64, 70], limit=[10, 2], pages=400,
                    keys=[[1, 2, 3, 4], [1, 2, 3, 9]])
    assert rows[2] == {1: 22}
    assert st.prefix.hit_tokens == [0, 48]
    assert st.used_pages == 0 and st.prefix.evictable == st.pages - st.free  # all unlocked at the end


def test_sglang_retracted_request_hits_its_cached_prompt_on_readmission():
    # 110 slots; a (keys 1, 2) and b (keys 3, 4), prompt 32 each, 40 tokens, max_new 1 (reserved
    # against, soft): both prefilled at step 0 (46 free), then decode 2 slots a step: full after step
    # 23. Step 24: check_decode_mem fails, nothing evictable (both prompts locked): retract_decode
    # takes b (tie on generated and prompt: the sort keeps a first) with 24 generated, 55 computed.
    # release_kv_cache(is_insert=False) frees its 23 output slots and unlocks its prompt: cached.
    # a ends at step 39 (its 40th token); at step 40 SGLang still finds the batch full (b was refused
    # meanwhile) and only filters a out; step 41 re-admits b: 32 + 24 = 56 tokens, 32 matched in the
    # tree -> 24 to prefill, 55 - 32 = 23 recomputed. Without keys: 56 prefilled, 55 recomputed.
    runs = {}
    for keys in ([[1, 2], [3, 4]], None):
        rows, st = _run("sglang", SG, arrival=[0, 0], prompt=[32, 32], limit=[40, 40], max_new=[1, 1], pages=110,
                        keys=keys)
        runs[keys is not None] = (rows, st)
    for shared, prefill, recomputed in ((True, 24, 23), (False, 56, 55)):
        rows, st = runs[shared]
        assert rows[24] == {0: 1} and rows[40] == {} and rows[41] == {1: prefill}
        assert st.preemptions == [0, 1] and st.recomputed == [0, recomputed]
    assert runs[True][1].prefix.hit_tokens == [0, 32]


@pytest.mark.parametrize("engine, options, pages", [
    ("vllm-v1", {"max_num_batched_tokens": 64, "max_num_seqs": 16}, 45),
    ("sglang", {"chunked_prefill_size": 64, "max_prefill_tokens": 128, "schedule_conservativeness": 0.3}, 700),
])
def test_heavy_sharing_under_memory_pressure_conserves_tokens_and_slots(engine, options, pages):
    # Random traces: 3 shared prefixes of 1-5 blocks, 0-3 own blocks, tight pools (vllm-v1 preempts,
    # sglang retracts: its max_new is a third of the true length, reserved against). Every request
    # ends with exactly its tokens; at the end nothing is held and, in SGLang, every tree node is
    # unlocked (all cached tokens evictable: available + evictable = the pool).
    cfg = make_config(engine, options)
    preempted = hits = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        n = 40
        systems = [list(range(100 * c, 100 * c + int(rng.integers(1, 6)))) for c in range(3)]
        keys, prompt, nxt = [], [], 5000
        for _ in range(n):
            own = int(rng.integers(0, 4))
            keys.append(systems[int(rng.integers(0, 3))] + list(range(nxt, nxt + own)))
            nxt += own
            prompt.append(max(1, 16 * len(keys[-1]) + int(rng.integers(0, 16))))
        arrival, limit = np.sort(rng.integers(0, 80, n)), rng.integers(1, 120, n)
        max_new = np.maximum(limit // 3, 1) if engine == "sglang" else limit
        rows, st = _run(engine, cfg, arrival=arrival, prompt=prompt, limit=limit, pages=pages, max_new=max_new,
                        keys=[k[:p // 16] for k, p in zip(keys, prompt)])
        assert st.generated == list(limit) and st.used_pages == 0 and not any(st.held)
        if engine == "sglang":
            assert st.prefix.evictable + st.free == st.pages
            stack = list(st.prefix.root.children.values())
            while stack:
                node = stack.pop()
                assert node.lock == 0
                stack.extend(node.children.values())
        preempted += sum(st.preemptions)
        hits += sum(st.prefix.hit_tokens)
    assert preempted > 0 and hits > 0


def _trace(n=4):
    return pd.DataFrame({"arrival_s": np.arange(n) * 0.5, "input_tokens": [64, 70, 64, 40][:n],
                         "output_tokens": [3, 2, 4, 2][:n], "request_class": "c"})


def test_simulate_without_keys_is_unchanged_and_with_keys_runs_the_reference_engine():
    tr = _trace()
    keys = (np.array([0, 4, 8, 12, 14]), np.array([1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3, 4, 5, 6]))
    for engine in ("vllm-v1", "sglang"):
        base = simulate(tr, policy="vllm", rng=np.random.default_rng(0), engine=engine, implementation="reference")
        off = simulate(tr, policy="vllm", rng=np.random.default_rng(0), engine=engine, prefix_keys=None,
                       implementation="reference")
        on = simulate(tr, policy="vllm", rng=np.random.default_rng(0), engine=engine, prefix_keys=keys)
        assert on.implementation == "reference"
        assert {k: v for k, v in base.metrics.items() if k != "wall_s"} == \
               {k: v for k, v in off.metrics.items() if k != "wall_s"}
        assert "prefix_hit_tokens" not in base.metrics
        # no memory pressure: every prompt token is either prefilled or hit (requests 1 and 2 share
        # a's blocks if a's prefix is cached when they arrive: routing spreads them over 2 engines)
        assert on.metrics["prefill_tokens"] + on.metrics["prefix_hit_tokens"] == int(tr["input_tokens"].sum())


@pytest.mark.parametrize("kwargs, name", [
    ({"engine": "trtllm-gne"}, "prefix_keys"),
    ({"engine": "vllm-v0"}, "prefix_keys"),
    ({"engine": "vllm-v1", "implementation": "fast"}, "implementation"),
    ({"engine": "sglang", "prefix_keys": (np.array([0, 1]), np.array([5]))}, "prefix_keys"),
    ({"engine": "sglang", "prefix_keys": "hash_ids"}, "prefix_keys"),
    ({"engine": "sglang", "prefix_keys": (np.array([0, 5, 5, 5, 5]), np.arange(5))}, "prefix_keys"),
])
def test_bad_prefix_input_names_the_argument(kwargs, name):
    kw = {"prefix_keys": (np.array([0, 1, 1, 1, 1]), np.array([7]))} | kwargs
    with pytest.raises(ValueError, match=name):
        simulate(_trace(), policy="vllm", rng=np.random.default_rng(0), **kw)


def test_mooncake_conversation_slice_saves_prefill(data_dir):
    """The first 120 requests of Mooncake's conversation trace (arrivals stretched 8 x) on Llama-3.1-70B:
    with its hash_ids, both engines skip the shared prefixes' prefill; without, they compute every token."""
    path = data_dir / "mooncake-traces" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"Mooncake traces not in KVDRO_DATA_DIR ({data_dir})")
    from kvdro.hardware import H100_80GB, LLAMA31_70B
    from kvdro.sim import default_deployment

    tr = read_mooncake_jsonl(path, "mooncake-conversation").iloc[:120].copy()
    tr["arrival_s"] *= 8.0
    dep = default_deployment(model=LLAMA31_70B, gpu=H100_80GB, max_model_len=LLAMA31_70B.max_context)
    for engine in ("vllm-v1", "sglang"):
        on = simulate(tr, policy="vllm", deployment=dep, rng=np.random.default_rng(0), engine=engine,
                      prefix_keys="hash_ids").metrics
        assert on["completed"] == 120 and on["prefix_hit_tokens"] > 0
        assert on["preemptions"] == 0  # light load: every prompt token is prefilled or hit, once
        assert on["prefill_tokens"] + on["prefix_hit_tokens"] == int(tr["input_tokens"].sum())
