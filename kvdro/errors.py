"""Exceptions shared by the package."""

from __future__ import annotations


class SolverError(RuntimeError):
    """A solver did not reach optimality. ``status`` carries the solver's own status string."""

    def __init__(self, what: str, status: str | None):
        self.status = status
        super().__init__(f"{what}: solver status {status!r} (expected 'optimal')")
