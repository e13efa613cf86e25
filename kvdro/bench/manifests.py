"""The manifests of the cached results: ``python -m kvdro.bench manifests [--write] [FILE ...]``.

Every ``data/<stem>.csv`` has ``data/<stem>.manifest.json`` beside it (rows, columns, key columns,
sha256: :mod:`kvdro.cachefile`), written by the atomic writer whenever a benchmark regenerates the
file; every reader refuses a file that differs from its manifest. This step

* (default) **checks** every ``data/*.csv`` against its manifest and lists what is wrong (exit 1 if
  anything is; 0 when every file matches);
* ``--write`` writes the manifests of the files as they are now (the committed files were given
  theirs this way, issue 36). Run it only on files you know to be whole: a manifest written over an
  edited file vouches for the edit.

``FILE ...`` limits either to those names (``sim_regimes.csv``). A ``*.partial.csv`` (an
interrupted grid's cells, :func:`kvdro.cachefile.partial_path`) is not a cached result and is skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvdro.cachefile import check_manifest, manifest_path, write_manifest

DATA = Path(__file__).resolve().parents[2] / "data"


def cached_files(folder: Path = DATA, names: list[str] | None = None) -> list[Path]:
    """The cached CSVs of ``folder`` (every ``*.csv`` but a grid's ``*.partial.csv``), or the ``names``
    given; ValueError names a file that is not there."""
    if names:
        out = []
        for n in names:
            p = folder / Path(n).name
            if p.suffix != ".csv" or not p.is_file():
                raise ValueError(f"FILE: {n!r} is not a CSV file in {folder}")
            out.append(p)
        return out
    return sorted(p for p in folder.glob("*.csv") if not p.name.endswith(".partial.csv"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench manifests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="file names under data/ (default: every data/*.csv)")
    parser.add_argument("--write", action="store_true", help="write the manifests of the files as they are now")
    args = parser.parse_args(argv)
    try:
        files = cached_files(DATA, args.files)
    except ValueError as exc:
        parser.error(str(exc))
    if args.write:
        for p in files:
            write_manifest(p)
        print(f"wrote {len(files)} manifests (data/*{manifest_path(Path('x.csv')).name[1:]})")
        return 0
    bad = [(p, problem) for p in files for problem in check_manifest(p)]
    for p, problem in bad:
        print(problem, file=sys.stderr)
    print(f"{len(files) - len({p for p, _ in bad})} of {len(files)} cached files match their manifests")
    return 1 if bad else 0
