"""Dispatcher: ``python -m kvdro.bench NAME [args]`` or ``python -m kvdro.bench all``."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import kvdro.bench


def available() -> list[str]:
    """Names of the benchmark modules in this package."""
    return sorted(m.name for m in pkgutil.iter_modules(kvdro.bench.__path__) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: python -m kvdro.bench {" + ",".join(names + ["all"]) + "} [args]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    name = name.replace("-", "_") if name.replace("-", "_") in names else name  # regimes-new: module regimes_new
    if name != "all" and name not in names:
        print(f"unknown benchmark {name!r}; choose from {names + ['all']}", file=sys.stderr)
        return 2
    from kvdro.cachefile import FolderNotWritableError

    try:  # data/ or the cache folder unwritable: named as such (exit 2), not an OSError traceback
        if name == "all":  # a bench that needs its own install (skip_reason) is skipped, saying so
            codes = []
            for n in names:
                module = importlib.import_module(f"kvdro.bench.{n}")
                reason = getattr(module, "skip_reason", lambda: None)()
                if reason:
                    print(f"[SKIP] {n}: {reason}")
                    continue
                codes.append(module.main(rest))
            return max(codes, default=0)
        return importlib.import_module(f"kvdro.bench.{name}").main(rest)
    except FolderNotWritableError as exc:
        print(f"python -m kvdro.bench {name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
