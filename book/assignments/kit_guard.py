"""Graders' helpers for the course kit's hidden tests: the student's own work, not the reference's.

``build.py`` ships this module in every autograder zip (next to ``kvdro``), so a hidden test can::

    from kit_guard import own_work, with_globals
    saa_buffer = own_work(saa_buffer, "kvdro.newsvendor")   # after binding the reference it compares with

:func:`own_work` rejects a student function whose code names a forbidden reference function (also
through the student's own helper functions) and returns a wrapper that runs the student's code with
those reference functions disabled: a call to one of them from the student's code (not from inside
kvdro itself, which may use them internally) raises, and is reported even if the student's code
catches the exception. :func:`with_globals` runs a student function with some of the notebook's
names replaced (a hidden test of a later question builds with the reference answer of an earlier one,
so that each mistake costs points only where it is made).

Public tests do not use this module (students run them without it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from collections.abc import Callable, Iterator

__all__ = ["ReferenceUsed", "forbidden_objects", "own_work", "with_globals"]


class ReferenceUsed(AssertionError):
    """A student function called (or names) a reference function it was asked to write itself."""


def forbidden_objects(*targets: str) -> dict[int, str]:
    """{id(object): dotted name} of the public callables named by ``targets``.

    A target is a module (``"kvdro.newsvendor"``: every public function it defines) or one function
    (``"kvdro.wasserstein.saa_threshold_radius"``).
    """
    out: dict[int, str] = {}
    for target in targets:
        try:
            module = importlib.import_module(target)
        except ImportError:
            module_name, _, attr = target.rpartition(".")
            obj = getattr(importlib.import_module(module_name), attr)
            out[id(obj)] = target
            continue
        # a package: its loaded modules too (a notebook that imported one has loaded it in this process)
        family = [m for name, m in list(sys.modules.items()) if name == target or name.startswith(target + ".")]
        for mod in family:
            for attr, obj in vars(mod).items():
                if attr.startswith("_") or not callable(obj) or isinstance(obj, type):
                    continue
                home = getattr(obj, "__module__", None) or ""
                if home == target or home.startswith(target + "."):
                    out.setdefault(id(obj), f"{home}.{attr}")
    return out


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _static_check(func: Callable, forbidden: dict[int, str], targets: tuple[str, ...]) -> None:
    """Raise :class:`ReferenceUsed` if ``func`` (or a notebook function it calls) names a forbidden function."""
    short = {name.rsplit(".", 1)[1] for name in forbidden.values()}
    seen: set[int] = set()
    todo = [func]
    while todo:
        f = todo.pop()
        f = getattr(f, "__wrapped__", f)
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        env = getattr(f, "__globals__", {})
        names = _names(code)
        uses_kvdro = any(n == "kvdro" or n.startswith("kvdro.") for n in names) or any(
            isinstance(env.get(n), types.ModuleType) and env[n].__name__.startswith("kvdro") for n in names
        )
        for n in sorted(names):
            obj = env.get(n)
            if obj is not None and id(obj) in forbidden:
                raise ReferenceUsed(
                    f"{func.__name__} uses {forbidden[id(obj)]} (the reference the question asks you to write "
                    "yourself): this question scores 0. Write the computation with numpy/cvxpy."
                )
            if n in short and uses_kvdro:
                raise ReferenceUsed(
                    f"{func.__name__} calls kvdro's {n} (the reference the question asks you to write yourself): "
                    "this question scores 0."
                )
            if any(n == t or n.startswith(t + ".") for t in targets):
                raise ReferenceUsed(f"{func.__name__} imports {n}, the reference of this question: it scores 0.")
            if isinstance(obj, types.FunctionType) and obj.__globals__ is env:
                todo.append(obj)  # a helper written in the notebook


@contextlib.contextmanager
def _disabled(forbidden: dict[int, str]) -> Iterator[list[str]]:
    """Replace every forbidden function in every loaded kvdro module by a stub that records student calls."""
    calls: list[str] = []
    patched = []
    for module in [m for name, m in list(sys.modules.items()) if name == "kvdro" or name.startswith("kvdro.")]:
        for attr, obj in list(vars(module).items()):
            if id(obj) in forbidden:
                def stub(*args, __orig=obj, __name=forbidden[id(obj)], **kwargs):
                    caller = sys._getframe(1).f_globals.get("__name__", "")
                    if caller == "kvdro" or caller.startswith("kvdro."):
                        return __orig(*args, **kwargs)  # kvdro's own internal use
                    calls.append(__name)
                    raise ReferenceUsed(f"{__name} is disabled while your code is graded")
                patched.append((module, attr, obj))
                setattr(module, attr, stub)
    try:
        yield calls
    finally:
        for module, attr, obj in patched:
            setattr(module, attr, obj)


def own_work(func: Callable, *targets: str) -> Callable:
    """``func`` checked and wrapped so that it cannot use the reference functions named by ``targets``.

    Raises :class:`ReferenceUsed` (an AssertionError, so the test case fails with its message) at once
    if the code names one; the returned wrapper raises it if a call reaches one.
    """
    if not callable(func):
        raise AssertionError(f"expected a function, got {type(func).__name__}")
    forbidden = forbidden_objects(*targets)
    _static_check(func, forbidden, targets)

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        with _disabled(forbidden) as calls:
            try:
                result = func(*args, **kwargs)
            except ReferenceUsed:
                result = None
        if calls:
            raise ReferenceUsed(
                f"{func.__name__} called {calls[0]}, the reference the question asks you to write yourself: "
                "this question scores 0."
            )
        return result

    return guarded


@contextlib.contextmanager
def with_globals(func: Callable, **names) -> Iterator[None]:
    """Run ``func`` (a notebook function) with some of its global names replaced, then restore them."""
    env = func.__globals__
    old = {k: env[k] for k in names if k in env}
    env.update(names)
    try:
        yield
    finally:
        for k in names:
            if k in old:
                env[k] = old[k]
            else:
                env.pop(k, None)
