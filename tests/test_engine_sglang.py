"""sglang preset, rule by rule (SGLang 0.5: schedule_policy.PrefillAdder, scheduler.update_running_batch,
schedule_batch.retract_decode). Expected values are worked out by hand from the source (comments)."""

import pytest

from kvdro.sim.engine_presets import preset_state, replay
from kvdro.sim.engines import make_config, sglang

CFG = make_config("sglang")
DECAY = (0.7 - 0.7 * 0.14) / 600  # (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 0.0010033 per decode step


def _run(prompt, limit, arrival, pages, cfg=CFG, max_new=None):
    st = preset_state("sglang", cfg, prompt=prompt, limit=limit, max_new=max_new or limit, pages=pages, window=10_000)
    return replay("sglang", cfg, st, arrival), st


def test_ratio_constants_from_the_source():
    assert CFG.init_ratio == pytest.approx(0.7) and CFG.min_ratio == pytest.approx(0.098)
    assert CFG.decay == pytest.approx(0.001003333, rel=1e-6)
    half = make_config("sglang", {"schedule_conservativeness": 0.5})  # init = 0.7 x 0.5
    assert half.init_ratio == pytest.approx(0.35) and half.min_ratio == pytest.approx(0.049)


def test_ratio_after_quiet_decode_steps_and_the_idle_reset():
    # one request, prompt 10, 11 tokens: step 0 prefill (no decay), steps 1-10 decode: 10 decays.
    _, st = _run([10], [11], [0], pages=1000)
    assert st.extra["new_token_ratio"] == pytest.approx(0.7 - 10 * DECAY)
    # a second request after an idle gap: the idle loop resets the ratio to 0.7; its one decode
    # step decays it once (without the reset it would be 0.7 - 3 decays).
    _, st = _run([10, 10], [3, 2], [0, 10], pages=1000)
    assert st.extra["new_token_ratio"] == pytest.approx(0.7 - DECAY)


def test_prefill_adder_discounts_running_requests_by_the_ratio():
    # r1 (prompt 100, max_new 900) fits alone: 100 + min(900, 4096) = 1000 < P. It is prefilled at
    # step 0 (100 slots held). r2 (prompt 100, max_new 200) arrives for step 1: rem_total_tokens =
    # free - 0.7 x min(900 - 1, 4096) = (P - 100) - 629.3; r2 is admitted iff 100 + 200 = 300 < that,
    # i.e. P > 1029.3.
    rows, _ = _run([100, 100], [900, 200], [0, 1], pages=1030)
    assert rows[1][1] == {1: 100}  # P = 1030: 300 < 300.7 -> a prefill-only step of r2
    rows, st = _run([100, 100], [900, 200], [0, 1], pages=1029)
    # P = 1029: 300 >= 299.7 -> NO_TOKEN, batch_is_full: r2 waits although the ratio decays every
    # step, until the running batch shrinks (r1 finishes at step 899: token k+1 at step k). SGLang
    # sees that one iteration later: at 900 get_new_batch_prefill still finds the batch full, then
    # update_running_batch filters r1 out (batch_is_full cleared) and nothing runs; r2 is
    # prefilled at step 901.
    assert rows[1][1] == {0: 1}
    assert all(1 not in r[1] for r in rows[1:901]) and rows[899][3] == [0]
    assert rows[900][1] == {} and rows[901][1] == {1: 100}


def test_a_batch_that_finishes_at_its_prefill_is_no_longer_full():
    # max_running_requests 1: r0 is admitted and the pass marks the batch full (no room for r1). r0
    # (one output token) finishes at its prefill; SGLang's get_next_batch_to_run filters that prefill
    # batch, it shrank, batch_is_full is cleared, and r1 is admitted in the next step (it once waited
    # for ever: an InvariantError).
    cfg = make_config("sglang", {"max_running_requests": 1})
    rows, _ = _run([10, 10], [1, 5], [0, 0], pages=1000, cfg=cfg)
    assert rows[0][1] == {0: 10} and rows[0][3] == [0]
    assert rows[1][1] == {1: 10}


def test_a_long_prompt_is_chunked_in_prefill_only_steps():
    # chunked_prefill_size 16: prompt 40 -> extends 16, 16, 8 (the last samples the first token), then a decode.
    cfg = make_config("sglang", {"chunked_prefill_size": 16})
    rows, _ = _run([40], [2], [0], pages=1000, cfg=cfg)
    assert [r[1] for r in rows] == [{0: 16}, {0: 16}, {0: 8}, {0: 1}]


def test_retract_decode_takes_the_fewest_generated_then_the_longest_prompt_to_the_tail():
    # running a, b, c with generated 5, 2, 2 and prompts 10, 20, 30; every slot in use.
    # sorted by (generated, -prompt) descending: a, b, c -> c is retracted first (tie with b broken
    # by the longer prompt); its 31 slots cover a's and b's next token, so only c goes. The new ratio:
    # (5 + 2 + 20 x 2) / (100 + 100) = 0.235. c goes to the waiting queue's tail, behind d.
    st = preset_state("sglang", CFG, prompt=[10, 20, 30, 5], limit=[100] * 4, max_new=[100] * 4, pages=66, window=10_000)
    for j, g in zip(range(3), (5, 2, 2)):
        st.generated[j] = g
        st.computed[j] = st.prompt[j] + g - 1
        st.held[j] = st.computed[j]
    st.free = 66 - sum(st.held)
    assert st.free == 0
    st.running = [0, 1, 2]
    st.waiting.append(3)
    st.extra["new_token_ratio"] = 0.5
    step = sglang.update_running_batch(st, CFG)
    assert step.preempted == [2] and list(st.waiting) == [3, 2] and st.running == [0, 1]
    assert step.scheduled == {0: 1, 1: 1}
    assert st.extra["new_token_ratio"] == pytest.approx(0.235)
    assert st.computed[2] == 0 and st.recomputed[2] == 31 and st.free == 31 - 2


@pytest.mark.parametrize("options, name", [({"init_new_token_ratio": -0.1}, "init_new_token_ratio"),
                                           ({"schedule_conservativeness": 0}, "schedule_conservativeness"),
                                           ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
                                           ({"clip_max_new_tokens": 0}, "clip_max_new_tokens")])
def test_bad_knobs_name_the_argument(options, name):
    with pytest.raises(ValueError, match=name):
        make_config("sglang", options)


def test_soft_estimate_lets_a_request_run_past_its_max_new():
    # max_new="policy-soft": estimate 5, true length 20: the request is not cut. Past its estimate it
    # reserves nothing in the PrefillAdder (max(0, 5 - generated) = 0): r2 (prompt 10, estimate 5),
    # arriving at step 10, needs 15 < 1000 - 19 and gets a prefill-only step 10, in which r1 does not
    # decode; so r1 (token 1 at step 0, tokens 2-10 at steps 1-9) samples its 20th token at step 20.
    rows, _ = _run([10, 10], [20, 3], [0, 10], pages=1000, max_new=[5, 5])
    assert rows[10][1] == {1: 10} and rows[20][3] == [0]
