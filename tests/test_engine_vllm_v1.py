"""vllm-v1 preset, rule by rule (vLLM 0.11.0 v1/core/sched/scheduler.py, Scheduler.schedule).

Every expected step below is worked out by hand from the source (comments), not by running the code.
"""

import pandas as pd
import pytest

from kvdro.sim.engines import make_config, step_trace


def _reqs(*rows):
    return pd.DataFrame(rows, columns=["request_id", "arrival_step", "input_tokens", "output_tokens"])


def test_token_budget_chunks_a_prompt_and_mixes_decodes_with_a_chunk():
    # budget 32, 5 usable blocks of 16 (num_blocks 6: block 0 is the null block).
    # step 0: a (prompt 40) gets min(40, 32) = 32 tokens (2 blocks); the budget is spent, b waits.
    # step 1: running first: a's rest 8 (blocks for 40 tokens: 3); then b (prompt 20): 20 <= 24 left,
    #         2 blocks -> 5 blocks in use. Both prefills complete: each samples its first token.
    # step 2: decodes a:1 (slot 41 in block 3), b:1 (slot 21 in block 2).
    # step 3: c arrives; a:1, b:1; a has 3 tokens = output 3 -> finished. c needs 1 block, 0 free: waits.
    # step 4: b:1; c: 10 tokens, 1 block (a's 3 are free again).
    # step 5: b samples its 5th token, c its 2nd: both finished.
    steps = step_trace(_reqs(("a", 0, 40, 3), ("b", 0, 20, 5), ("c", 3, 10, 2)), num_blocks=6, max_num_seqs=4,
                       max_num_batched_tokens=32, max_model_len=100)
    assert [s["scheduled"] for s in steps] == [
        {"a": 32}, {"a": 8, "b": 20}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, {"b": 1, "c": 10}, {"b": 1, "c": 1}]
    assert [s["finished"] for s in steps] == [[], [], [], ["a"], [], ["b", "c"]]
    assert all(s["preempted"] == [] for s in steps)


def test_the_last_admitted_is_preempted_to_the_front_and_nothing_is_admitted_that_step():
    # 3 usable blocks; a and b (prompt 16 each) are admitted at step 0 (1 block each, 1 free) and
    # sample their first token. Step 1: a's decode needs slot 17 -> a 2nd block (the last free one);
    # b's decode needs one too: none free -> running.pop() is b itself: b is preempted (recompute),
    # to the waiting front; the step holds only a, and no waiting request is considered.
    # a then decodes alone: its 3rd block at slot 33 (step 17) takes the block b freed; a's 20th
    # token comes at step 19 (token k+1 at step k). Step 20: b is re-admitted with prompt + its 1
    # token = 17 tokens (2 blocks), samples its 2nd token, and finishes its 20th at step 38.
    steps = step_trace(_reqs(("a", 0, 16, 20), ("b", 0, 16, 20)), num_blocks=4, max_num_seqs=4,
                       max_num_batched_tokens=64, max_model_len=1000)
    assert steps[0]["scheduled"] == {"a": 16, "b": 16}
    assert steps[1] == {"step": 1, "scheduled": {"a": 1}, "preempted": ["b"], "finished": []}
    assert all(s["scheduled"] == {"a": 1} for s in steps[2:20])
    assert steps[19]["finished"] == ["a"]
    assert steps[20]["scheduled"] == {"b": 17}
    assert steps[38]["finished"] == ["b"] and len(steps) == 39


def test_long_prefill_threshold_and_max_num_seqs():
    # threshold 8: a prompt of 20 goes in chunks 8, 8, 4; max_num_seqs 1: b waits for a to finish.
    # a: steps 0-2 prefill (first token at step 2), a decode at step 3 gives its 2nd = last token.
    steps = step_trace(_reqs(("a", 0, 20, 2), ("b", 0, 5, 1)), num_blocks=10, max_num_seqs=1,
                       max_num_batched_tokens=64, max_model_len=100, long_prefill_token_threshold=8)
    assert [s["scheduled"] for s in steps] == [{"a": 8}, {"a": 8}, {"a": 4}, {"a": 1}, {"b": 5}]
    assert steps[3]["finished"] == ["a"] and steps[4]["finished"] == ["b"]


def test_idle_steps_before_an_arrival_are_listed_empty():
    steps = step_trace(_reqs(("a", 2, 4, 1)), num_blocks=3, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=50)
    assert steps == [{"step": 0, "scheduled": {}, "preempted": [], "finished": []},
                     {"step": 1, "scheduled": {}, "preempted": [], "finished": []},
                     {"step": 2, "scheduled": {"a": 4}, "preempted": [], "finished": ["a"]}]


@pytest.mark.parametrize("options, name", [({"max_num_batched_tokens": 8}, "max_num_batched_tokens"),
                                           ({"max_num_seqs": 0}, "max_num_seqs"),
                                           ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
                                           ({"swap_space": 4}, "engine_options")])
def test_bad_knobs_name_the_argument(options, name):
    with pytest.raises(ValueError, match=name):
        make_config("vllm-v1", options)


def test_bad_requests_name_the_column():
    with pytest.raises(ValueError, match="output_tokens"):
        step_trace(_reqs(("a", 0, 4, 0)), num_blocks=3, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=50)
    with pytest.raises(ValueError, match="engine"):
        step_trace(_reqs(("a", 0, 4, 1)), engine="sglang", num_blocks=3, max_num_seqs=2, max_num_batched_tokens=16,
                   max_model_len=50)


def test_with_prefix_caching_a_preempted_request_hits_its_own_freed_blocks():
    # The preemption scenario above with prefix caching on: b is preempted at step 1 holding 1 block
    # with its 16 computed prompt tokens (a full block: cached). The free queue hands out its head
    # first: the 1 never-used block (a's 2nd at step 1... taken before b's freeing), then b's freed
    # block is the only free one: a's 3rd block at step 17 evicts it. So at step 20 b misses and
    # recomputes all 17 tokens, as without the cache.
    steps = step_trace(_reqs(("a", 0, 16, 20), ("b", 0, 16, 20)), num_blocks=4, max_num_seqs=4,
                       max_num_batched_tokens=64, max_model_len=1000, enable_prefix_caching=True)
    assert steps[1]["preempted"] == ["b"] and steps[20]["scheduled"] == {"b": 17}
    # a shorter a (10 tokens, done at step 9 before needing a 3rd block): b's cached block survives;
    # at step 10 b hits it (16 tokens) and computes only its 17th token: 1 scheduled token.
    steps = step_trace(_reqs(("a", 0, 16, 10), ("b", 0, 16, 20)), num_blocks=4, max_num_seqs=4,
                       max_num_batched_tokens=64, max_model_len=1000, enable_prefix_caching=True)
    assert steps[1]["preempted"] == ["b"] and steps[9]["finished"] == ["a"]
    assert steps[10]["scheduled"] == {"b": 1}
