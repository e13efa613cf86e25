"""lightllm preset, rule by rule (LightLLM 1.0.1 continues_batch/impl.py _can_add_new_req, Req.get_tuple_tokens,
RouterManager._step). Expected steps are worked out by hand (comments)."""

import pytest

from kvdro.sim.engine_presets import replay_steps
from kvdro.sim.engines import make_config

CFG = make_config("lightllm")


def test_admission_by_the_future_peak_of_the_batch():
    # pool 100 token slots. Pairs (a, b) = (prompt + generated + 1, max_new - generated - 1 + 6):
    # r1 (10, max_new 30): (11, 35); r2 (10, 40): (11, 45); r3 (10, 20): (11, 25).
    # step 0: r1 alone peaks at 35 + 11 = 46 < 100; with r2 (sorted by b: 45, 35) the peak is
    # max(45 + 11, 2 x 35 + 22) = 92 < 100: admitted; with r3 (45, 35, 25): 3 x 25 + 33 = 108: refused.
    # At step k (k <= 28; r1, r2 hold k generated tokens) r3 stays refused (e.g. k = 28: sorted b
    # 25, 17, 7 with a 11, 39, 39 -> 3 x 7 + 89 = 110). r1 ends at step 29 (a decode every step after
    # step 0's prefill and step 1's decode: token k+1 at step k). Step 30: r2 =
    # (10 + 30 + 1, 40 - 30 - 1 + 6) = (41, 15) and r3 (11, 25): max(25 + 11, 2 x 15 + 52) = 82 < 100: r3 in.
    rows = replay_steps("lightllm", CFG, arrival=[0, 0, 0], prompt=[10, 10, 10], limit=[30, 40, 20],
                        max_new=[30, 40, 20], pages=100, window=10_000)
    assert rows[0][1] == {0: 10, 1: 10}
    assert all(r[1] == {0: 1, 1: 1} for r in rows[1:30]) and rows[29][3] == [0]
    assert rows[30][1] == {2: 10} and rows[31][1] == {1: 1, 2: 1}
    assert all(not r[2] for r in rows)  # admission by the peak never pauses anyone


def test_a_prefill_step_is_followed_by_a_decode_step():
    # RouterManager._step: a new batch's prefill, then a decode of the whole running batch; r2
    # arriving at step 1 waits for step 2 (step 1 is the decode after r1's prefill).
    rows = replay_steps("lightllm", CFG, arrival=[0, 1], prompt=[10, 10], limit=[5, 5], max_new=[5, 5],
                        pages=1000, window=10_000)
    assert [r[1] for r in rows[:4]] == [{0: 10}, {0: 1}, {1: 10}, {0: 1, 1: 1}]


@pytest.mark.parametrize("options, name", [({"running_max_req_size": 0}, "running_max_req_size"),
                                           ({"router_token_ratio": -0.5}, "router_token_ratio"),
                                           ({"page_size": 16}, "page_size")])
def test_bad_knobs_name_the_argument(options, name):
    with pytest.raises(ValueError, match=name):
        make_config("lightllm", options)


def test_soft_estimate_an_overrun_pauses_the_newest_to_the_front():
    # max_new="policy-soft": the engine reserves against an estimate of 5 tokens, the requests generate 40.
    # pool 60 slots; r1, r2 (prompt 10): pairs (11, 4 + 6) -> peak max(10 + 11, 2 x 10 + 22) = 42 < 60:
    # both prefilled at step 0. Each decode adds a slot per request: before decode k they hold 10 + k - 1
    # each, so the 2 slots fit while 42 - 2k >= 2, i.e. k <= 20. At step 21 none is free: _can_decode
    # fails and the newest, r2 (21 tokens generated), is paused to the queue's front; r1 decodes alone.
    # r2 back needs a = 10 + 21 + 1 = 32 beside r1's a = 33 (b = 6 each): 6 + 6 + 65 = 77 >= 60, so it
    # waits until r1's 40th token (step 39), is recomputed at step 40 (31 tokens) and ends at step 58.
    rows = replay_steps("lightllm", CFG, arrival=[0, 0], prompt=[10, 10], limit=[40, 40], max_new=[5, 5],
                        pages=60, window=10_000)
    assert rows[0][1] == {0: 10, 1: 10} and all(r[1] == {0: 1, 1: 1} for r in rows[1:21])
    assert rows[21][1] == {0: 1} and rows[21][2] == [1]
    assert rows[39][3] == [0] and rows[40][1] == {1: 31} and rows[58][3] == [1] and len(rows) == 59
