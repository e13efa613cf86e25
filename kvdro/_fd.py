"""Where C-level writes to file descriptor 1 go (HiGHS prints its banner from C, not through Python).

One helper for the command lines (``--json`` keeps stdout one JSON document: the banner goes to stderr),
the benchmarks and the chapters (the banner goes nowhere).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def fd1_redirected(to: str = "stderr") -> Iterator[None]:
    """Within the block, writes to fd 1 go to stderr (``to="stderr"``) or nowhere (``to="devnull"``).

    Child processes started inside the block inherit the redirection. Where fd 1 is not a real file
    descriptor (a test harness capturing stdout), nothing is redirected.
    """
    if to not in ("stderr", "devnull"):
        raise ValueError(f"to: must be 'stderr' or 'devnull', got {to!r}")
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real file descriptor (e.g. captured by a test harness)
        yield
        return
    target = 2 if to == "stderr" else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        if to == "devnull":
            os.close(target)
