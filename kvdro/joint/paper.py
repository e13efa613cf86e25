"""The paper's instance families (Table III): ``"small"`` and ``"large"``, built from the real Azure traces.

* ``"small"`` -- 6 classes, J = 8 A100-80GB, the four configurations (TP, PP) in
  {(2,1), (4,1), (2,2), (4,2)}, 200 output-length samples per class. The classes are the Azure 2023
  code and conversation traces :cite:`patel2024splitwise`, each split into three input-length buckets
  (:func:`kvdro.workload.split_by_input_quantile`); rates are the trace's own (requests in the bucket /
  trace span) times ``load``.
* ``"large"`` -- 15 classes, J = 48, the same four configurations, 1,000 samples per class: calibrated
  synthetic twins of the six real classes (:func:`kvdro.workload.synthetic_classes`, log-normal mixture
  fits), with the rates scaled so that the total rate per GPU equals the small instance's.

``seed`` drives every random draw (the subsample of output lengths; for "large" also the synthetic
classes). L_pre and D are not in any trace: they are the documented defaults of
:class:`kvdro.workload.RequestClass` (L_pre = min(128, L_in/2) tokens; D = 2 s + 0.1 s per mean output
token). Costs are the paper's ratios (:data:`kvdro.joint.instance.PAPER_COSTS`) with our GPU price
:data:`kvdro.joint.instance.DEFAULT_C_GPU`; eps_i = 0.15 E[xi_i].

The real traces are read with :func:`kvdro.datasets.load_trace` (``KVDRO_DATA_DIR``); they are never
copied into the repository.
"""

from __future__ import annotations

import warnings
from dataclasses import fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvdro.hardware import A100_80GB, LLAMA2_70B, PAPER_CONFIGS, config_performance
from kvdro.joint.instance import Instance
from kvdro.workload import (
    ClassModel,
    RequestClass,
    classes_from_trace,
    fit_class_model,
    load_class_models,
    save_class_models,
    split_by_input_quantile,
    synthetic_classes,
)

__all__ = ["SIZES", "DEFAULT_LOAD", "SERVING_SOURCE", "azure_classes", "paper_instance", "paper_trace"]

#: Which calibration table each family reads under ``serving="calibrated"``: the small instance is
#: the real Azure traces, the large one their synthetic twins.
SERVING_SOURCE = {"small": "real", "large": "synthetic"}

#: (classes, J, samples per class) of each family.
SIZES = {"small": (6, 8, 200), "large": (15, 48, 1000)}

#: Default multiplier of the trace's arrival rates. At 1.0 the 8-GPU cluster cannot carry the Azure
#: trace (about 7.8 requests/s) and the optimum rejects a class; 0.5 (about 3.9 requests/s) keeps
#: every group busy without forcing rejection, the regime in which reservations and routing matter.
DEFAULT_LOAD = 0.5


@lru_cache(maxsize=2)
def azure_classes() -> tuple[RequestClass, ...]:
    """The six real classes: Azure 2023 code and conversation x input buckets short/medium/long.

    Every request of the trace is kept (subsample with :meth:`RequestClass.subsample`). Rates are
    requests per second over each trace's own span.
    """
    from kvdro.datasets import load_trace

    parts = []
    for name in ("azure-2023-code", "azure-2023-conv"):
        df = split_by_input_quantile(load_trace(name), 3)
        parts.extend(classes_from_trace(df))
    return tuple(parts)


#: The EM fits of the six real classes (the base models of the "large" family), cached because
#: fitting them takes seconds (about 4 s here; the MILP itself takes a few). :func:`write_base_models`
#: writes the file (``python -m kvdro.bench exact --refit``); a test checks it equals a fresh fit.
BASE_MODELS_FILE = Path(__file__).resolve().parents[2] / "data" / "paper_base_models.json"


def fit_base_models() -> tuple[ClassModel, ...]:
    """Fit :func:`kvdro.workload.fit_class_model` to each of the six real classes (slow: EM + BIC)."""
    return tuple(fit_class_model(c) for c in azure_classes())


def write_base_models(path: Path = BASE_MODELS_FILE) -> Path:
    """Fit the six base models and write them to ``path`` (JSON of :func:`kvdro.workload.save_class_models`)."""
    from kvdro.datasets import REGISTRY

    meta = {
        "made_by": "kvdro.joint.paper.write_base_models (python -m kvdro.bench exact --refit)",
        "sources": {n: REGISTRY[n].sha256 for n in ("azure-2023-code", "azure-2023-conv")},
        "note": "fit_class_model of each Azure 2023 class x input bucket, as split by azure_classes()",
    }
    save_class_models(fit_base_models(), path, meta=meta)
    return Path(path)


def _cache_matches(models: tuple[ClassModel, ...], classes: tuple[RequestClass, ...]) -> bool:
    """The cached fits belong to these classes (same names, rates, CVs, L_pre and D)."""
    return len(models) == len(classes) and all(
        m.name == c.name
        and np.isclose(m.arrival_rate, c.arrival_rate, rtol=1e-12)
        and np.isclose(m.interarrival_cv, c.interarrival_cv, rtol=1e-12)
        and np.isclose(m.prefix_tokens, float(c.prefix_tokens))
        and np.isclose(m.slo_s, float(c.slo_s))
        for m, c in zip(models, classes)
    )


@lru_cache(maxsize=1)
def _base_models() -> tuple[ClassModel, ...]:
    classes = azure_classes()
    if BASE_MODELS_FILE.exists():
        cached = load_class_models(BASE_MODELS_FILE)
        if _cache_matches(cached, classes):
            return cached
        warnings.warn(f"{BASE_MODELS_FILE} does not match the traces; refitting (write_base_models() updates it)", stacklevel=2)
    return fit_base_models()


def _configs():
    return tuple(config_performance(LLAMA2_70B, A100_80GB, c) for c in PAPER_CONFIGS)


def paper_instance(size: str = "small", seed: int = 0, *, load: float = DEFAULT_LOAD, serving: str = "analytic",
                   **costs: float) -> Instance:
    """The paper's ``"small"`` or ``"large"`` instance (module docstring), deterministic in ``seed``.

    Args:
        size: ``"small"`` (6 classes, J = 8, N = 200) or ``"large"`` (15 classes, J = 48, N = 1,000).
        seed: seed of the :class:`numpy.random.Generator` that draws the samples (and synthetic classes).
        load: multiplier of the arrival rates (1.0 = the trace's own rates).
        serving: ``"analytic"`` (chapter 4) or ``"calibrated"`` (the simulator's table of
            :data:`SERVING_SOURCE` ``[size]``; :mod:`kvdro.joint.serving`).
        **costs: overrides of :class:`Instance` fields (``c_p``, ``c_gpu``, ``eps``, ``u_max``, ...).
    """
    if not isinstance(size, str) or size not in SIZES:
        raise ValueError(f"size: must be one of {sorted(SIZES)}, got {size!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if isinstance(load, (bool, np.bool_, str, bytes)) or load is None or np.ndim(load) != 0:
        raise ValueError(f"load: must be a positive number, got {load!r}")
    try:
        load = float(load)
    except (TypeError, ValueError):
        raise ValueError(f"load: must be a positive number, got {load!r}") from None
    if not (np.isfinite(load) and load > 0):
        raise ValueError(f"load: must be a positive number, got {load!r}")
    fixed = {"classes", "configs", "total_gpus", "name"}
    allowed = {f.name for f in fields(Instance)} - fixed
    unknown = sorted(set(costs) - allowed)
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an Instance field that paper_instance can override ({sorted(allowed)})")
    classes, _ = _draw(size, int(seed), load)
    costs.setdefault("calibration_source", SERVING_SOURCE[size])
    n_classes, J, n_samples = SIZES[size]
    return Instance(
        classes=classes,
        configs=_configs(),
        total_gpus=J,
        name=f"{size}-seed{seed}-load{load:g}",
        serving=serving,
        **costs,
    )


def _draw(size: str, seed: int, load: float):
    """(classes, models): the family's request classes at ``load``; for "large" also their generative
    models with the same rates (for :func:`paper_trace`), else ``None``."""
    n_classes, J, n_samples = SIZES[size]
    rng = np.random.default_rng(int(seed))
    real = azure_classes()
    if size == "small":
        return tuple(replace(c.subsample(n_samples, rng), arrival_rate=c.arrival_rate * load) for c in real), None
    models = synthetic_classes(_base_models(), n_classes, rng)
    drawn = [m.to_request_class(n_samples, rng) for m in models]
    small_rate = sum(c.arrival_rate for c in real) / SIZES["small"][1]
    scale = small_rate * J / sum(c.arrival_rate for c in drawn)
    classes = tuple(replace(c, arrival_rate=c.arrival_rate * scale * load) for c in drawn)
    return classes, tuple(replace(m, arrival_rate=m.arrival_rate * scale * load) for m in models)


#: Length of the large family's synthetic trace [s]; its first half trains, its second half tests.
LARGE_TRACE_S = 3600.0


def paper_trace(size: str = "small", seed: int = 0, *, load: float = DEFAULT_LOAD, part: str = "test",
                trace_seed: int | None = None):
    """The instance's own trace, cut in time: ``part="train"`` the first half, ``"test"`` the second
    (arrivals re-based to 0 s), in the tidy schema with the instance's class names.

    * ``"small"``: the Azure 2023 code + conversation traces, each split into input buckets with the
      whole trace's edges (as :func:`azure_classes`), merged; arrival times divided by ``load``
      (the instance's rates are the trace's times ``load``).
    * ``"large"``: a synthetic trace of :data:`LARGE_TRACE_S` seconds drawn from the instance's
      15 class models (Gamma arrivals with each class's CV, its rate at ``load``), seeded by
      ``[trace_seed, 16]`` (default ``trace_seed = seed``; independent of the instance's samples);
      another ``trace_seed`` gives another realisation of the same instance's traffic.
    """
    import pandas as pd

    from kvdro.workload import synthesize_trace

    if not isinstance(size, str) or size not in SIZES:
        raise ValueError(f"size: must be one of {sorted(SIZES)}, got {size!r}")
    if part not in ("train", "test"):
        raise ValueError(f"part: must be 'train' or 'test', got {part!r}")
    load = float(load)
    if not (np.isfinite(load) and load > 0):
        raise ValueError(f"load: must be a positive number, got {load!r}")
    if size == "small":
        from kvdro.datasets import load_trace

        df = pd.concat([split_by_input_quantile(load_trace(n), 3) for n in ("azure-2023-code", "azure-2023-conv")],
                       ignore_index=True)
        df = df.sort_values("arrival_s", kind="stable", ignore_index=True)
        df["arrival_s"] = (df["arrival_s"] - df["arrival_s"].min()) / load
    else:
        _, models = _draw(size, int(seed), load)
        ts = int(seed) if trace_seed is None else int(trace_seed)
        df = synthesize_trace(models, LARGE_TRACE_S, np.random.default_rng([ts, 16]))
    t = df["arrival_s"].to_numpy(dtype=float)
    cut = t.min() + 0.5 * (t.max() - t.min())
    out = df[t < cut] if part == "train" else df[t >= cut]
    out = out.reset_index(drop=True)
    out["arrival_s"] = out["arrival_s"] - float(out["arrival_s"].min())
    out.attrs = {"source": f"{size}-seed{seed}-load{load:g}", "part": part}
    return out
