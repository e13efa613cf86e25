"""Helpers shared by the benchmarks: median timing, and silencing C-level writes to fd 1."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """(median seconds, last value) over ``repeats`` calls of ``fn``."""
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


@contextlib.contextmanager
def quiet_fd1() -> Iterator[None]:
    """HiGHS writes a banner to fd 1 from C; send it to /dev/null to keep the tables readable."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real file descriptor (e.g. captured by a test harness)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
