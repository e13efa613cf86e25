"""The cached full-sweep results the chapter reads: ``data/experiments_<name>.csv``.

They are written by ``python -m kvdro.bench experiments`` (all of them) or
``python -m kvdro.experiments NAME --write`` (one); :data:`COMMANDS` says which command remakes each.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["COMMANDS", "DATA", "path", "read"]

DATA = Path(__file__).resolve().parents[2] / "data"

#: The command that regenerates each cached file.
COMMANDS = {
    name: f"python -m kvdro.bench experiments --only {name}"
    for name in ("table2", "table4", "fig3", "fig5a", "fig5b", "table5", "fig6", "eps_joint")
}


def path(name: str) -> Path:
    """``data/experiments_<name>.csv``."""
    if name not in COMMANDS:
        raise ValueError(f"name: must be one of {sorted(COMMANDS)}, got {name!r}")
    return DATA / f"experiments_{name}.csv"


def read(name: str) -> pd.DataFrame:
    """The cached rows of sweep ``name``; FileNotFoundError names the command that makes them."""
    p = path(name)
    if not p.is_file():
        raise FileNotFoundError(f"{p} is missing: run `{COMMANDS[name]}`")
    return pd.read_csv(p)
