"""Benchmarks: ``python -m kvdro.bench NAME``.

Each benchmark is a module ``kvdro.bench.NAME`` with ``main(argv: list[str]) -> int``. A benchmark
measures a *ratio* against a reference in the same run (never an absolute time in a unit test) and
prints one table plus a verdict line per quality bar in DESIGN.md.
"""
