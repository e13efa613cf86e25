"""Helpers shared by the benchmarks: median timing, and silencing C-level writes to fd 1."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

from kvdro._fd import fd1_redirected

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """(median seconds, last value) over ``repeats`` calls of ``fn``."""
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def quiet_fd1():
    """HiGHS writes a banner to fd 1 from C; send it to /dev/null to keep the tables readable."""
    return fd1_redirected("devnull")


def at_least(parser, flag: str, value: float, minimum: float, what: str) -> None:
    """Refuse ``flag`` (exit 2 through ``parser.error``, naming it) below ``minimum``: a benchmark
    asked for no work, or negative work, must not print PASS over nothing."""
    if not value >= minimum:  # NaN too
        parser.error(f"{flag}: must be {what}, got {value!r}")


def split_parts(parser, flag: str, text: str, known) -> list[str]:
    """A comma-separated ``flag`` as a list of known part names; exit 2 (naming ``flag``) when it
    names no part (``--parts ,``) or an unknown one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        parser.error(f"{flag}: names no part ({text!r}); choose from {sorted(known)}")
    bad = sorted(set(parts) - set(known))
    if bad:
        parser.error(f"{flag}: unknown part(s) {bad}; choose from {sorted(known)}")
    return parts
