"""Remake the files in data/ from the real Azure 2023 traces (fixed seed; deterministic).

    KVDRO_DATA_DIR=../shared/data .venv/bin/python data/make_synthetic.py

Writes
  data/azure2023_class_models.json  fitted ClassModel parameters (kvdro.workload) for the two Azure
                                    2023 classes and their six input-length sub-classes
  data/synthetic_trace.csv          a 10-minute synthetic trace sampled from the six sub-class models
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvdro import datasets, workload

HERE = Path(__file__).resolve().parent
SEED = 20261129
DURATION_S = 600.0


def main() -> None:
    names = ["azure-2023-code", "azure-2023-conv"]
    trace = pd.concat([datasets.load_trace(n) for n in names], ignore_index=True)
    trace = trace.sort_values("arrival_s", kind="stable", ignore_index=True)
    whole = workload.classes_from_trace(trace)
    split = workload.split_by_input_quantile(trace, 3)
    six = workload.classes_from_trace(split)
    models = [workload.fit_class_model(c) for c in (*whole, *six)]
    meta = {
        "made_by": "data/make_synthetic.py",
        "sources": {n: datasets.REGISTRY[n].sha256 for n in names},
        "input_edges_tokens": split.attrs["input_edges"],
        "note": "prefix_tokens and slo_s are kvdro.workload defaults, not trace data",
    }
    workload.save_class_models(models, HERE / "azure2023_class_models.json", meta=meta)
    rng = np.random.default_rng(SEED)
    sub = [m for m in models if m.name not in {"code", "conversation"}]
    synthetic = workload.synthesize_trace(sub, DURATION_S, rng)
    synthetic.to_csv(HERE / "synthetic_trace.csv", index=False, float_format="%.6f")
    print(f"wrote {len(models)} class models and {len(synthetic)} synthetic requests")


if __name__ == "__main__":
    main()
