"""Strict JSON for the command lines: never ``Infinity`` or ``NaN`` (not JSON, RFC 8259 section 6).

A non-finite float in a document (a cost that overflows a 64-bit float at ``--rho 1e308``, a
percentile of no requests) is printed as ``null``, and the reason -- which key, what it was -- goes
to stderr, so stdout stays one strict JSON document whose keys do not depend on the run.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["dumps", "finite_or_null"]


def _reason(value: float) -> str:
    if math.isnan(value):
        return "NaN (undefined for this run, e.g. a statistic of no requests)"
    return f"{'+' if value > 0 else '-'}Infinity (beyond a 64-bit float, e.g. a cost at a huge cost ratio)"


def finite_or_null(obj: Any, where: str = "") -> tuple[Any, dict[str, str]]:
    """``obj`` with every non-finite float (numpy's included) replaced by None, and
    {key path: reason} of what was replaced (paths like ``cost_breakdown.total`` or ``rows[3].gain``)."""
    reasons: dict[str, str] = {}

    def clean(x: Any, path: str) -> Any:
        if isinstance(x, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if hasattr(x, "item") and not isinstance(x, (str, bytes)):
            try:
                x = x.item()
            except (TypeError, ValueError):
                return x
        if isinstance(x, float) and not math.isfinite(x):
            reasons[path or "value"] = _reason(x)
            return None
        return x

    return clean(obj, where), reasons


def dumps(obj: Any, *, prog: str, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats as null (:func:`finite_or_null`), each named
    on stderr as ``<prog>: <key> is <reason>; printed as null``; ``allow_nan=False`` so nothing else slips by."""
    clean, reasons = finite_or_null(obj)
    for key, why in reasons.items():
        print(f"{prog}: {key} is {why}; printed as null", file=sys.stderr)
    return json.dumps(clean, allow_nan=False, **kwargs)
