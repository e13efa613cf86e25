"""The cached full-sweep results the chapter reads: ``data/experiments_<name>_<regime>.csv`` (and
``data/experiments_eps_joint.csv``, which has no regime).

They are written by ``python -m kvdro.bench experiments`` (all of them) or
``python -m kvdro.experiments NAME --write`` (one); :data:`COMMANDS` says which command remakes each.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["COMMANDS", "DATA", "REGIME_SWEEPS", "path", "read"]

DATA = Path(__file__).resolve().parents[2] / "data"

#: Sweeps run in each regime (file ``experiments_<name>_<regime>.csv``).
REGIME_SWEEPS = ("table2", "table4", "fig3", "fig5a", "fig5b", "table5", "fig6")

#: The command that regenerates each cached file.
COMMANDS = {
    f"{name}_{regime}": f"python -m kvdro.bench experiments --only {name} --regime {regime} --n-jobs 2"
    for name in REGIME_SWEEPS for regime in ("memory", "light")
}
COMMANDS["eps_joint"] = "python -m kvdro.bench experiments --only eps_joint"
for _name in ("table2", "table4"):
    COMMANDS[f"{_name}_memory_hard"] = f"python -m kvdro.bench experiments --only {_name}_hard --n-jobs 2"


def path(name: str) -> Path:
    """``data/experiments_<name>.csv``."""
    if name not in COMMANDS:
        raise ValueError(f"name: must be one of {sorted(COMMANDS)}, got {name!r}")
    return DATA / f"experiments_{name}.csv"


def read(name: str, regime: str | None = None, reading: str = "soft") -> pd.DataFrame:
    """The cached rows of sweep ``name`` (in ``regime``, for the simulated sweeps; ``reading="hard"``
    for the hard-reservation sensitivity), checked against the file's manifest
    (:func:`kvdro.cachefile.read_csv_checked`: a cut, renamed or edited file is a ValueError naming
    it and what is wrong); FileNotFoundError names the command that makes them."""
    if regime is not None:
        name = f"{name}_{regime}" + ("_hard" if reading == "hard" else "")
    from kvdro.cachefile import read_csv_checked

    return read_csv_checked(path(name), remake=COMMANDS[name])
