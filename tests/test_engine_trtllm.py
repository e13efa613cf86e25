"""trtllm-gne / trtllm-maxutil presets, rule by rule (TensorRT-LLM capacityScheduler.cpp:
GuaranteedNoEvictScheduler, MaxUtilizationScheduler). Expected steps are worked out by hand (comments)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from kvdro.sim.engine_presets import replay_steps
from kvdro.sim.engines import make_config


def _steps(engine, prompt, limit, arrival, pages, max_new=None, **options):
    cfg = make_config(engine, {"tokens_per_block": 16, **options})
    return replay_steps(engine, cfg, arrival=arrival, prompt=prompt, limit=limit, max_new=max_new or limit,
                        pages=pages, window=10_000)


def test_gne_admits_only_within_the_reservation_to_completion_and_never_preempts():
    # 10 blocks of 16. r1: prompt 32, max_new 64 -> ceil(96/16) = 6 blocks reserved; r2: prompt 16,
    # max_new 64 -> 5 blocks > the 4 left: r2 waits (head of line) while r1 runs: every step
    # available = free - (6 - held by r1) = 4. r1: token 1 at step 0, its 64th at step 63; r2 at step 64.
    rows = _steps("trtllm-gne", [32, 16], [64, 64], [0, 0], pages=10)
    assert rows[0][1] == {0: 32}
    assert all(r[1] == {0: 1} for r in rows[1:64]) and rows[63][3] == [0]
    assert rows[64][1] == {1: 16}
    assert all(not r[2] for r in rows)
    # r2 with max_new 48: ceil(64/16) = 4 blocks fit beside r1's 6: both in the first (mixed) step.
    rows = _steps("trtllm-gne", [32, 16], [64, 48], [0, 0], pages=10)
    assert rows[0][1] == {0: 32, 1: 16}


def test_gne_reserves_max_new_even_when_the_request_ends_earlier():
    # r1 reserves ceil((32 + 96)/16) = 8 of 10 blocks but stops after 4 tokens (true length 4 < max_new).
    # r2 (prompt 16, max_new 64: 5 blocks) cannot join while r1 runs (steps 0-3), joins at step 4.
    rows = _steps("trtllm-gne", [32, 16], [4, 64], [0, 0], pages=10, max_new=[96, 64])
    assert rows[0][1] == {0: 32} and rows[3][3] == [0] and rows[4][1] == {1: 16}


def test_maxutil_pauses_the_last_started_request_and_admits_nothing_that_step():
    # 4 blocks of 16. r1, r2 (prompt 16 each, 40 tokens) start together at step 0 (1 block each) and
    # take their 2nd block at step 1 (slot 17). At step 17 both need a 3rd block (slot 33), none is
    # free: r1 does not fit -> the last started, r2, is paused (2 blocks freed) and r1 retried: it fits.
    # r1 takes its 4th block at step 33 and ends at step 39 (token k+1 at step k). r2 (17 tokens
    # generated, 33 to recompute = 3 blocks) waits until then and is recomputed at step 40; its 40th
    # token comes 22 decode steps later, at step 62.
    rows = _steps("trtllm-maxutil", [16, 16], [40, 40], [0, 0], pages=4)
    assert rows[0][1] == {0: 16, 1: 16}
    assert rows[17][1] == {0: 1} and rows[17][2] == [1]
    assert sum(len(r[2]) for r in rows) == 1
    assert rows[39][3] == [0] and rows[40][1] == {1: 33} and rows[62][3] == [1] and len(rows) == 63


def test_the_token_budget_bounds_a_step_and_long_prompts_wait():
    # max_num_tokens 32: r1 (prompt 20) fits, r2 (prompt 20) would make 40 -> it waits for step 1,
    # where r1's decode (1 token) and r2's prompt (20) share the step.
    rows = _steps("trtllm-gne", [20, 20], [3, 3], [0, 0], pages=20, max_num_tokens=32)
    assert rows[0][1] == {0: 20} and rows[1][1] == {0: 1, 1: 20}


@pytest.mark.parametrize("options, name", [({"tokens_per_block": 0}, "tokens_per_block"),
                                           ({"max_num_tokens": 8}, "max_num_tokens"),
                                           ({"capacity_scheduler_policy": "STATIC_BATCH"}, "capacity_scheduler_policy")])
def test_bad_knobs_name_the_argument(options, name):
    with pytest.raises(ValueError, match=name):
        make_config("trtllm-maxutil" if "capacity" not in name else "trtllm-gne", options)


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 30), hst.integers(1, 90), hst.integers(1, 60), hst.integers(0, 40)),
                 min_size=1, max_size=12))
def test_gne_never_preempts_and_the_running_reservations_always_fit(reqs):
    # requests (arrival step, prompt, true length, max_new - true length >= 0) on a pool of 12 blocks of 16
    # (192 tokens: any single request's prompt + max_new <= 90 + 100 fits). GUARANTEED_NO_EVICT admits a
    # request only if its blocks to completion fit beside the running ones' remaining blocks, so at every
    # step the running requests' full reservations ceil((prompt + max_new)/16) sum to <= 12.
    reqs = sorted(reqs)
    arrival = [a for a, _, _, _ in reqs]
    prompt = [p for _, p, _, _ in reqs]
    limit = [x for _, _, x, _ in reqs]
    max_new = [x + extra for _, _, x, extra in reqs]
    rows = _steps("trtllm-gne", prompt, limit, arrival, pages=12, max_new=max_new)
    assert all(not r[2] for r in rows)
    start, end = {}, {}
    for k, sched, _, done in rows:
        for j in sched:
            start.setdefault(j, k)
        for j in done:
            end[j] = k
    assert sorted(end) == list(range(len(reqs)))
    for k in range(len(rows)):
        running = [j for j in start if start[j] <= k <= end[j]]
        assert sum(-(-(prompt[j] + max_new[j]) // 16) for j in running) <= 12
