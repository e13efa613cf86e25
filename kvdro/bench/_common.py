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
