"""Instances of any size for the scalability study (the paper's Table III and beyond).

:func:`scaled_instance` generalises :func:`kvdro.joint.paper_instance`'s ``"large"`` family to any
number of classes and any GPU budget J: ``n_classes`` calibrated synthetic twins of the six real
Azure 2023 classes (:func:`kvdro.workload.synthetic_classes`, log-normal mixture fits), ``n_samples``
output samples each, the paper's four configurations, and rates scaled so that the total arrival rate
*per GPU* equals the small instance's (times ``load``). The load per GPU is therefore the same at
every size, so time and gap measure the size of the problem, not a change of regime.

:func:`random_small_instance` draws a deliberately small and *tight* instance (a few classes with
outputs of at most 96 tokens, a TP2 whose KV cache is cut so that memory (6e) can bind, and TP4):
small enough that the exact MILP is instant, tight enough that the blocks of BCD interact. The tests
and chapter 6 use it to look for points where BCD stops short of the optimum.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from kvdro.hardware import A100_80GB, LLAMA2_70B, PAPER_CONFIGS, ParallelConfig, config_performance
from kvdro.joint import Instance
from kvdro.joint.paper import DEFAULT_LOAD, SIZES, azure_classes
from kvdro.joint.paper import _base_models as paper_base_models
from kvdro.workload import RequestClass, synthetic_classes

__all__ = ["random_small_instance", "scaled_instance"]


def _base_models():
    """The EM fits of the six real classes: the large family's, read from data/paper_base_models.json
    (:func:`kvdro.joint.paper.fit_base_models` refits them where the file does not match the traces)."""
    return paper_base_models()


@lru_cache(maxsize=1)
def _configs():
    return tuple(config_performance(LLAMA2_70B, A100_80GB, c) for c in PAPER_CONFIGS)


def scaled_instance(
    n_classes: int,
    total_gpus: int,
    seed: int = 0,
    *,
    n_samples: int = 1000,
    load: float = DEFAULT_LOAD,
    **costs: float,
) -> Instance:
    """An instance with ``n_classes`` synthetic classes and J = ``total_gpus`` (module docstring).

    Args:
        n_classes: number of request classes (>= 1).
        total_gpus: the GPU budget J (>= 2, the smallest configuration).
        seed: seed of the :class:`numpy.random.Generator` that draws the classes and their samples.
        n_samples: output-length samples per class N (>= 1).
        load: multiplier of the small instance's arrival rate per GPU.
        **costs: overrides of :class:`~kvdro.joint.Instance` fields.
    """
    for name, value, low in (("n_classes", n_classes, 1), ("total_gpus", total_gpus, 1), ("n_samples", n_samples, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if not (np.isfinite(load) and load > 0):
        raise ValueError(f"load: must be a positive number, got {load!r}")
    rng = np.random.default_rng(int(seed))
    models = synthetic_classes(_base_models(), int(n_classes), rng)
    drawn = [m.to_request_class(int(n_samples), rng) for m in models]
    rate_per_gpu = sum(c.arrival_rate for c in azure_classes()) / SIZES["small"][1]
    scale = rate_per_gpu * int(total_gpus) / sum(c.arrival_rate for c in drawn)
    classes = tuple(replace(c, arrival_rate=c.arrival_rate * scale * load) for c in drawn)
    return Instance(
        classes=classes,
        configs=_configs(),
        total_gpus=int(total_gpus),
        name=f"scaled-I{n_classes}-J{total_gpus}-seed{seed}-load{load:g}",
        **costs,
    )


def random_small_instance(rng: np.random.Generator, n_classes: int = 3, **overrides) -> Instance:
    """A small random instance (module docstring), deterministic in ``rng``.

    Each class: rate U(0.3, 2.5) req/s, one prompt length U{300..2999} tokens, 30 outputs U{1..96},
    inter-arrival CV U(0.8, 3), prefix U{0..L_in/2}, SLO U(1, 6) s, L_max = 96. TP2 with a KV cache
    of U{4000..19999} tokens and TP4; J in {4, 6, 8}; three utilisation bands; c_gpu U(20, 120).
    ``overrides`` replace :class:`~kvdro.joint.Instance` fields.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng: pass a numpy.random.Generator")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes: must be a positive integer, got {n_classes!r}")
    classes = []
    for i in range(int(n_classes)):
        L_in = int(rng.integers(300, 3000))
        classes.append(
            RequestClass(
                f"c{i}",
                float(rng.uniform(0.3, 2.5)),
                np.full(30, L_in),
                rng.integers(1, 97, 30),
                interarrival_cv=float(rng.uniform(0.8, 3.0)),
                prefix_tokens=int(rng.integers(0, L_in // 2)),
                slo_s=float(rng.uniform(1.0, 6.0)),
                max_output_tokens=96,
            )
        )
    tp2, tp4 = (config_performance(LLAMA2_70B, A100_80GB, ParallelConfig(t, 1)) for t in (2, 4))
    cap = int(rng.integers(4000, 20000))
    args = dict(
        classes=tuple(classes),
        configs=(replace(tp2, kv_capacity_tokens=cap, kv_capacity_blocks=cap // 16), tp4),
        total_gpus=int(rng.choice([4, 6, 8])),
        waiting_bands=3,
        c_gpu=float(rng.uniform(20.0, 120.0)),
    )
    args.update(overrides)
    return Instance(**args)
