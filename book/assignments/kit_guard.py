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
import itertools
import os
import sys
import types
from collections.abc import Callable, Iterator

__all__ = ["ReferenceUsed", "forbidden_objects", "once", "own_work", "with_globals"]


class ReferenceUsed(AssertionError):
    """A student function called (or names) a reference function it was asked to write itself."""


def forbidden_objects(*targets: str) -> dict[int, str]:
    """{id(object): dotted name} of the public callables named by ``targets``.

    A target is a module (``"kvdro.newsvendor"``: every public function it defines) or one function
    (``"kvdro.wasserstein.saa_threshold_radius"``).
    """
    out: dict[int, str] = {}
    for target in targets:
        _collect(target, out)
    return out


#: {id: (object, dotted name)} of every reference ever named (the objects stay alive, so ids stay theirs).
_OBJECTS: dict[int, tuple[object, str]] = {}


def _collect(target: str, out: dict[int, str]) -> None:
    try:
        module = importlib.import_module(target)
    except ImportError:
        module_name, _, attr = target.rpartition(".")
        obj = getattr(importlib.import_module(module_name), attr)
        out[id(obj)] = target
        _OBJECTS[id(obj)] = (obj, target)
        return
    # a package: its loaded modules too (a notebook that imported one has loaded it in this process)
    family = [m for name, m in list(sys.modules.items()) if name == target or name.startswith(target + ".")]
    for mod in family:
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or not callable(obj) or isinstance(obj, type):
                continue
            home = getattr(obj, "__module__", None) or ""
            if home == target or home.startswith(target + "."):
                out.setdefault(id(obj), f"{home}.{attr}")
                _OBJECTS.setdefault(id(obj), (obj, out[id(obj)]))


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


#: The folder of the kvdro package: code whose file is inside it is kvdro's own ("internal" use).
KVDRO_DIR = os.path.dirname(os.path.realpath(importlib.import_module("kvdro").__file__)) + os.sep
#: Folders of installed libraries and the standard library (never the notebook's code).
_LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                      | {os.path.dirname(os.path.realpath(__file__)) + os.sep})


def _code_file(code: types.CodeType) -> str:
    name = code.co_filename
    return name if name.startswith("<") else os.path.realpath(name)


def is_kvdro_code(code: types.CodeType) -> bool:
    """Whether ``code`` is defined in a file of the kvdro package (judged by the file, not ``__name__``)."""
    return _code_file(code).startswith(KVDRO_DIR)


def _is_notebook_code(code: types.CodeType) -> bool:
    """Code written in the notebook (a cell), not in kvdro, a library, the standard library or the kit."""
    name = _code_file(code)
    if name.startswith(("<frozen", "<string>", "<kit_guard", "<tests ")) or name.startswith(KVDRO_DIR):
        return False
    return not name.startswith(_LIBRARY_DIRS)


#: At most this many objects are inspected per function, and this many items per container.
_MAX_SEEN, _MAX_ITEMS = 50_000, 2_000


def _captured(obj: object) -> Iterator[object]:
    """The objects a callable or a container holds: a function's closure cells, defaults and keyword
    defaults; a ``functools.partial``'s function, arguments and keywords; a bound method's function and
    instance; an object's attributes and its class's; a list, tuple, set or dict's items."""
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                pass
        yield from obj.__defaults__ or ()
        yield from (obj.__kwdefaults__ or {}).values()
        wrapped = obj.__dict__.get("__wrapped__")
        if wrapped is not None:
            yield wrapped
    elif isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    elif isinstance(obj, types.MethodType):
        yield obj.__func__
        yield obj.__self__
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from itertools.islice(obj, _MAX_ITEMS)
    elif isinstance(obj, dict):
        yield from itertools.islice(obj.values(), _MAX_ITEMS)
    elif isinstance(obj, (staticmethod, classmethod)):
        yield obj.__func__
    elif isinstance(obj, type):
        if _is_notebook_class(obj):
            yield from vars(obj).values()
    elif not isinstance(obj, types.ModuleType) and _is_notebook_class(type(obj)):
        yield type(obj)
        yield from getattr(obj, "__dict__", {}).values()


def _is_notebook_class(cls: type) -> bool:
    """A class defined in the notebook (its module is not a loaded module with a file)."""
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    return module is None or not getattr(module, "__file__", None)


def _check_plain(func: Callable) -> types.FunctionType:
    """The notebook function behind ``func`` (a function the kit's grader passed to a test carries it as
    ``__kit_student__``); an AssertionError that a student understands for anything else."""
    func = getattr(func, "__kit_student__", func)
    if not isinstance(func, types.FunctionType):
        kind = "functools.partial" if isinstance(func, functools.partial) else type(func).__name__
        raise AssertionError(
            f"expected a function written in your notebook (def name(...): ...), got a {kind}: define the answer "
            "with def, as the question's scaffold does."
        )
    if not _is_notebook_code(func.__code__):
        raise ReferenceUsed(
            f"{func.__name__} is not a function written in your notebook (it is defined in {func.__code__.co_filename}):"
            " this question scores 0. Write the computation yourself."
        )
    return func


def _static_check(func: types.FunctionType, forbidden: dict[int, str], targets: tuple[str, ...]) -> None:
    """Raise :class:`ReferenceUsed` if ``func``, or anything it reaches (the notebook functions it calls,
    what they capture in closures, defaults, partials, callable objects and containers), is or names a
    forbidden function."""
    short = {name.rsplit(".", 1)[1] for name in forbidden.values()}
    seen: set[int] = set()
    todo: list[object] = [func]
    while todo and len(seen) < _MAX_SEEN:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in forbidden:
            raise ReferenceUsed(
                f"{func.__name__} holds {forbidden[id(obj)]} (the reference the question asks you to write yourself),"
                " captured in a closure, a default argument, a partial or an object: this question scores 0."
                " Write the computation with numpy/cvxpy."
            )
        if isinstance(obj, types.FunctionType) and not _is_notebook_code(obj.__code__):
            continue  # a library's function that is not a reference: not the student's to inspect
        todo.extend(_captured(obj))
        if not isinstance(obj, types.FunctionType):
            continue
        code, env = obj.__code__, obj.__globals__
        where = func.__name__ if obj is func else f"{func.__name__} (through your {obj.__name__})"
        names = _names(code)
        uses_kvdro = any(n == "kvdro" or n.startswith("kvdro.") for n in names) or any(
            isinstance(env.get(n), types.ModuleType) and env[n].__name__.startswith("kvdro") for n in names
        )
        for n in sorted(names):
            value = env.get(n)
            if value is not None and id(value) in forbidden:
                raise ReferenceUsed(
                    f"{where} uses {forbidden[id(value)]}, a reference this question disables (it asks you to write "
                    "that computation yourself): this question scores 0. Write it with numpy/cvxpy."
                )
            if n in short and uses_kvdro:
                raise ReferenceUsed(
                    f"{where} calls kvdro's {n}, a reference this question disables: this question scores 0."
                )
            if any(n == t or n.startswith(t + ".") for t in targets):
                raise ReferenceUsed(f"{where} imports {n}, which this question disables: it scores 0.")
            if value is not None and not isinstance(value, types.ModuleType):
                todo.append(value)  # a helper, an object or a container of the notebook


#: The calls a student's code made to a disabled reference (filled while :func:`_disabled` is active).
_CALLS: list[str] = []
_ORIGINALS: dict[str, types.FunctionType] = {}


def _dispatch(name: str, args: tuple, kwargs: dict):
    """What a disabled reference does when called: run it for kvdro's own code (the caller's code object
    is in a file of the kvdro package) and for a test's code (``kit_grade`` compiles a test file as
    ``<tests qN>``; a notebook cannot compile code), refuse it for anything else."""
    caller = sys._getframe(2).f_code
    if is_kvdro_code(caller) or caller.co_filename.startswith("<tests "):  # kvdro itself, or a test's own reference
        return _ORIGINALS[name](*args, **kwargs)
    _CALLS.append(name)
    raise ReferenceUsed(f"{name} is disabled while your code is graded")


@functools.lru_cache(maxsize=None)
def _stub_code(name: str) -> types.CodeType:
    """A code object that hands a call of the reference ``name`` to :func:`_dispatch` (no free variables,
    so it can replace any module-level function's code)."""
    source = f"def stub(*args, **kwargs):\n    import kit_guard\n    return kit_guard._dispatch({name!r}, args, kwargs)\n"
    env: dict = {}
    exec(compile(source, f"<kit_guard stub of {name}>", "exec"), env)
    return env["stub"].__code__


@contextlib.contextmanager
def _disabled(forbidden: dict[int, str]) -> Iterator[list[str]]:
    """Disable every forbidden function *as an object*: its code is swapped for a stub, so that every
    reference to it (a module attribute, a name imported before, a closure, a default, a partial) calls
    the stub; kvdro's own code still runs it (judged by the calling code's file). Other forbidden
    callables (not plain functions) are replaced in the loaded kvdro modules."""
    del _CALLS[:]
    swapped, patched = [], []
    for obj, name in _OBJECTS.values():
        if id(obj) not in forbidden:
            continue
        if isinstance(obj, types.FunctionType) and not obj.__code__.co_freevars:
            original = types.FunctionType(obj.__code__, obj.__globals__, obj.__name__, obj.__defaults__, obj.__closure__)
            original.__kwdefaults__ = obj.__kwdefaults__
            _ORIGINALS[name] = original
            swapped.append((obj, obj.__code__))
            obj.__code__ = _stub_code(name)
    for module in [m for n, m in list(sys.modules.items()) if n == "kvdro" or n.startswith("kvdro.")]:
        for attr, obj in list(vars(module).items()):
            if id(obj) in forbidden and not any(obj is f for f, _ in swapped):
                def stub(*args, __orig=obj, __name=forbidden[id(obj)], **kwargs):
                    if is_kvdro_code(sys._getframe(1).f_code):
                        return __orig(*args, **kwargs)  # kvdro's own internal use
                    _CALLS.append(__name)
                    raise ReferenceUsed(f"{__name} is disabled while your code is graded")
                patched.append((module, attr, obj))
                setattr(module, attr, stub)
    try:
        yield _CALLS
    finally:
        for obj, code in swapped:
            obj.__code__ = code
        for module, attr, obj in patched:
            setattr(module, attr, obj)


def own_work(func: Callable, *targets: str) -> Callable:
    """``func`` checked and wrapped so that it cannot use the reference functions named by ``targets``.

    ``func`` must be a plain function written in the notebook (not a ``functools.partial``, a callable
    object, a method or a function of a library: an AssertionError says so). Raises
    :class:`ReferenceUsed` (an AssertionError, so the test case fails with its message) at once if its
    code names a reference, or if it, or a notebook function it calls, holds one in a closure, a
    default, a partial, an object or a container; the returned wrapper runs it with every reference
    disabled as an object (any call from code that is not kvdro's own fails) and raises
    :class:`ReferenceUsed` if a call reached one, even if the student's code caught the exception.
    """
    outer = func
    plain = _check_plain(func)
    forbidden = forbidden_objects(*targets)
    _static_check(plain, forbidden, targets)

    @functools.wraps(plain)
    def guarded(*args, **kwargs):
        with _disabled(forbidden) as calls:
            try:
                result = outer(*args, **kwargs)
            except ReferenceUsed:
                result = None
            used = list(calls)
        if used:
            raise ReferenceUsed(
                f"{plain.__name__} called {used[0]}, the reference the question asks you to write yourself: "
                "this question scores 0."
            )
        return result

    guarded.__kit_student__ = plain
    return guarded


@contextlib.contextmanager
def with_globals(func: Callable, **names) -> Iterator[None]:
    """Run ``func`` (a notebook function) with some of its global names replaced, then restore them."""
    env = getattr(func, "__kit_student__", func).__globals__
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


_ONCE: dict = {}


def once(name: str, func: Callable, compute: Callable[[], object]):
    """``compute()`` for the student function ``func``, computed at the first call and reused (an
    exception too): several test cases of one question grade one expensive run, each its own part."""
    key = (name, id(getattr(func, "__kit_student__", func)))
    if key not in _ONCE:
        try:
            _ONCE[key] = (True, compute(), func)  # func kept alive, so that its id stays its own
        except AssertionError as exc:
            _ONCE[key] = (False, exc, func)
    ok, value, _ = _ONCE[key]
    if not ok:
        raise value
    return value
