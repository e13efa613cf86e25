"""Validation of an engine preset's knobs: a bad value raises ValueError naming the argument."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["positive_int", "non_negative_int", "ratio", "positive_real"]


def _number(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    return float(value)


def positive_int(name: str, value, *, at_least: int = 1, why: str = "") -> int:
    """``value`` as an int >= ``at_least``; ValueError naming ``name`` (``why`` says what the bound is)."""
    v = _number(name, value)
    if v != int(v) or v < at_least:
        bound = f">= {at_least}" + (f" ({why})" if why else "")
        raise ValueError(f"{name}: must be an integer {bound}, got {value!r}")
    return int(v)


def non_negative_int(name: str, value) -> int:
    """``value`` as an int >= 0; ValueError naming ``name``."""
    return positive_int(name, value, at_least=0)


def ratio(name: str, value, *, low: float = 0.0, high: float = 1.0, low_open: bool = False) -> float:
    """``value`` as a float in [low, high] ((low, high] when ``low_open``); ValueError naming ``name``."""
    v = _number(name, value)
    if v > high or v < low or (low_open and v == low):
        raise ValueError(f"{name}: must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r}")
    return v


def positive_real(name: str, value) -> float:
    """``value`` as a float > 0; ValueError naming ``name``."""
    v = _number(name, value)
    if v <= 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")
    return v
