"""kvdro.queueing: service time (1), Little's law, utilisation, Kingman / P-K waiting time (7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdro import hardware as hw
from kvdro import queueing as q
from kvdro.hardware import GPU, Model, ParallelConfig

# A toy model and GPU small enough to compute (1) by hand.
TOY = Model(name="toy", n_layers=2, hidden=4, ffn=8, n_heads=2, n_kv_heads=1, head_dim=2, n_params=1000, dtype_bytes=2, vocab=10)
TOY_GPU = GPU(name="toy-gpu", hbm_bytes=10**10, hbm_bandwidth=1e6, peak_flops=1e6, nvlink_bandwidth=1e5, allreduce_latency_s=1e-3)


def toy_perf(tp=1, pp=1, decode_batch=4):
    return hw.config_performance(TOY, TOY_GPU, ParallelConfig(tp, pp), decode_batch=decode_batch)


def test_service_time_by_hand_single_gpu():
    perf = toy_perf()
    # prefill: FLOPs = 2*1000*10 + 2*n_layers*d*(L^2) = 20000 + 2*2*4*100 = 21600; C = 1e6 FLOP/s
    prefill = 21600 / 1e6
    # decode per token: beta = 2000 bytes / 4 + kv(2*2*1*2*2 = 16 bytes) * (10 + 3/2) = 500 + 184 = 684
    # bytes / 1e6 B/s = 684e-6 s; compute 2000 FLOP / 1e6 = 2e-3 s is larger (toy is compute-bound)
    decode = 3 * max(684e-6, 2e-3)
    assert hw.kv_bytes_per_token(TOY) == 16
    assert q.service_time(TOY, perf, 10, 3) == pytest.approx(prefill + decode)
    assert q.prefill_time(TOY, perf, 10) == pytest.approx(prefill)


def test_service_time_by_hand_tensor_and_pipeline_parallel():
    perf = toy_perf(tp=2, pp=2, decode_batch=4)
    assert perf.compute_flops == pytest.approx(4e6, rel=1e-12) and perf.bandwidth == pytest.approx(4e6, rel=1e-12)
    ar_prefill = 1e-3 + 2 * (1 / 2) * (10 * 4 * 2) / 1e5  # 80-byte message, 2 workers
    ar_step = 1e-3 + 2 * (1 / 2) * (4 * 4 * 2) / 1e5  # 32-byte message of a 4-sequence step
    assert perf.allreduce_s == pytest.approx(ar_step)
    prefill = 2 * 21600 / 4e6 + 2 * 2 * ar_prefill  # p * FLOPs / C_k + 2 all-reduces per layer
    per_token = max(684 / 4e6, 2000 / 4e6) + 2 * 2 * ar_step / 4
    assert q.service_time(TOY, perf, 10, 3) == pytest.approx(prefill + 3 * per_token)
    # the request holds memory for 3 steps of a full pipeline of 2 micro-batches of 4
    assert q.residence_time(TOY, perf, 10, 3) == pytest.approx(prefill + 3 * 2 * 4 * per_token)


def test_cached_prefix_shortens_prefill_only():
    perf = toy_perf()
    full = q.service_time(TOY, perf, 10, 3, prefix_tokens=6, cached_prefix=False)
    cached = q.service_time(TOY, perf, 10, 3, prefix_tokens=6, cached_prefix=True)
    assert full == pytest.approx(q.service_time(TOY, perf, 10, 3))
    # new tokens 4: 2*1000*4 + 2*2*4*(100 - 36) = 8000 + 1024 FLOPs
    assert full - cached == pytest.approx((21600 - 9024) / 1e6)
    assert q.service_time(TOY, perf, 10, 0, prefix_tokens=10, cached_prefix=True) == 0.0


def test_service_time_bad_input():
    perf = toy_perf()
    with pytest.raises(ValueError, match="input_tokens"):
        q.service_time(TOY, perf, -1, 3)
    with pytest.raises(ValueError, match="mean_output_tokens"):
        q.service_time(TOY, perf, 10, float("nan"))
    with pytest.raises(ValueError, match="prefix_tokens"):
        q.service_time(TOY, perf, 10, 3, prefix_tokens=11, cached_prefix=True)


def test_service_time_70b_orders_of_magnitude():
    perf = hw.config_performance(hw.LLAMA2_70B, hw.A100_80GB, ParallelConfig(4, 1))
    # prefill of 1,000 tokens at TP4: 1000 * 138 GFLOP / (4 * 235 TFLOP/s) = 0.15 s (+ all-reduces)
    assert 0.14 < q.prefill_time(hw.LLAMA2_70B, perf, 1000) < 0.20
    # batching amortises weights: the work of a decode token at batch 64 is far below one step
    step = hw.step_time(hw.LLAMA2_70B, hw.A100_80GB, ParallelConfig(4, 1), 0, 64, 64 * 1100)
    per_token = q.decode_time_per_token(hw.LLAMA2_70B, perf, 1100, batch=64)
    assert per_token < step / 10
    # (1) omits kernel overheads, so it is below the detailed step model, but within 35%
    assert 0.65 * step / 64 < per_token < step / 64


def test_littles_law_and_utilisation_by_hand():
    assert q.memory_occupancy_tokens(2.0, 3.0, 500) == 3000.0
    assert q.utilisation([1.0, 2.0], [0.1, 0.2], groups=2) == pytest.approx((0.1 + 0.4) / 2)
    with pytest.raises(ValueError, match="arrival_rate"):
        q.memory_occupancy_tokens(-1, 1, 1)
    with pytest.raises(ValueError, match="same length"):
        q.utilisation([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="groups"):
        q.utilisation([1.0], [1.0], groups=0)


def test_waiting_time_is_pollaczek_khinchine_for_poisson():
    # M/M/1: W = u/(1-u) T; M/D/1: half of it.
    assert q.waiting_time(0.5, 2.0, 1.0, 1.0) == pytest.approx(2.0)
    assert q.waiting_time(0.5, 2.0, 0.0, 1.0) == pytest.approx(1.0)
    # P-K: lambda E[S^2] / (2 (1 - u)) with E[S^2] = T^2 (1 + c_s^2)
    lam, T, cs2 = 0.3, 2.0, 0.7
    u = lam * T
    assert q.waiting_time(u, T, cs2) == pytest.approx(lam * T**2 * (1 + cs2) / (2 * (1 - u)))
    with pytest.raises(ValueError, match="utilisation"):
        q.waiting_time(1.0, 1.0, 1.0)


def test_mixture_moments_by_hand():
    mean, scv = q.mixture_service_moments([1.0, 3.0], [1.0, 2.0], [0.0, 1.0])
    assert mean == pytest.approx(0.25 * 1 + 0.75 * 2)
    second = 0.25 * 1 + 0.75 * (1 + 4)
    assert scv == pytest.approx(second / mean**2 - 1)


def test_simulation_matches_exact_mm1_and_is_deterministic():
    rng = np.random.default_rng(7)
    sim = q.simulate_gg1_wait(0.7, 1.0, 1.0, 1.0, 400_000, rng)
    assert sim == pytest.approx(0.7 / 0.3, rel=0.05)  # M/M/1 exact mean wait
    a = q.simulate_gg1_wait(0.5, 0.5, 1.0, 2.0, 10_000, np.random.default_rng(1))
    b = q.simulate_gg1_wait(0.5, 0.5, 1.0, 2.0, 10_000, np.random.default_rng(1))
    assert a == b


def test_simulation_deterministic_queue_never_waits():
    # D/D/1 at u = 0.9: every customer finds the server free.
    assert q.simulate_gg1_wait(0.9, 0.0, 1.0, 0.0, 1000, np.random.default_rng(0)) == 0.0


def test_simulation_bad_input():
    with pytest.raises(ValueError, match="rng"):
        q.simulate_gg1_wait(0.5, 1.0, 1.0, 1.0, 100, rng=None)
    with pytest.raises(ValueError, match="n_customers"):
        q.simulate_gg1_wait(0.5, 1.0, 1.0, 1.0, 1, np.random.default_rng(0))


@settings(max_examples=30, deadline=None)
@given(u=st.floats(0.01, 0.95), T=st.floats(0.01, 10), cs2=st.floats(0, 5), ca2=st.floats(0, 5))
def test_kingman_is_linear_in_variability_and_increasing_in_load(u, T, cs2, ca2):
    w = q.waiting_time(u, T, cs2, ca2)
    assert w >= 0
    assert q.waiting_time(u, T, 2 * cs2, 2 * ca2) == pytest.approx(2 * w)
    assert q.waiting_time(min(u * 1.01, 0.99), T, cs2, ca2) >= w
