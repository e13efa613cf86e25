"""Grade a course-kit submission out of the student's reach: an otter-grader plugin and its worker.

otter-grader (7.0, ``otter run`` and the Gradescope autograder) executes the student's notebook in a
Jupyter kernel and runs the tests *in that kernel*: a cell that patches ``otter``, ``numpy`` or
``kit_guard`` changes how the notebook is graded, and ``./tests`` (the hidden tests) is readable from
it. This plugin (:class:`KitGrader`, named in every autograder's ``otter_config.json``) takes grading
out of that kernel:

1. **before grading** (otter's own process): the test files are read into memory and deleted from
   the disk (``submission/tests`` and ``source/tests``), so no code that runs later can read them;
2. **before execution**: the notebook goes through the pre-grading pass (``kit_static.py``): a
   notebook that touches the grader is refused, every question 0, the message names the cell. Else it
   is run by a **fresh Python process** (this file's worker, ``python -I kit_grade.py --worker``; its
   working folder an empty temporary one; the tests handed over on its stdin; its stdout and stderr
   discarded while student code runs): the libraries, ``kit_guard`` and ``otter.test_files`` are
   imported first, the student's cells run in a namespace whose imports are restricted to the
   numerical libraries, the handout's own functions are defined again over the student's copies, every
   library module and class is checked unchanged (and restored: a change refuses the notebook), then
   every test runs there on values the student's code returned, checked to be plain data (numbers,
   arrays, dicts, DataFrames, cvxpy objects) and not objects of the student's own classes;
   otter's kernel is handed an empty notebook, so the student's code never runs where otter grades;
3. **after grading**: otter's results are replaced by the worker's, one per test case. A failed
   test's message is the test's own assertion text (its hint), or, when the student's code raised, the
   exception's *type* and the cell and line: never the exception's text, which the student's code
   controls.

Grading locally runs the student's code on your machine: the pass and the process are locks against
gaming the grade, not a sandbox against a hostile program. Grade untrusted notebooks in a container
(``otter grade``, Gradescope) or a throw-away VM.

Command line (``otter run`` with this plugin importable)::

    python kit_grade.py -a a1_newsvendor-autograder.zip submission.ipynb [-o OUTPUT_DIR]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The file of the autograder zip that lists the handout's own cells (written by build.py).
HANDOUT_FILE = "kit_handout.json"
#: A submission's notebook may run this long in the worker [s] (the five masters take < 2 min here).
TIMEOUT_S = 1200.0
#: Cells the worker never runs: otter's own and its checks (the handout's install and otter cells are
#: listed in the handout file; a student's edited copy of them is read by the pass like any cell).
_CHECK_CELL = re.compile(r"^\s*(grader\.check(_all)?\(\s*(\"\w*\"|'\w*')?\s*\)\s*)+$")
#: Library modules whose functions and classes the worker checks unchanged after the student's code.
PROTECTED = ("builtins", "numpy", "pandas", "scipy", "cvxpy", "kvdro", "otter", "kit_guard", "kit_static", "json",
             "math", "functools", "itertools", "collections", "inspect", "types", "traceback")


# ------------------------------------------------------------------------------------ the handout
def handout(student_nb, solutions_nb) -> dict:
    """What the worker must know of a handout (from build.py): ``skip``, the cells it never runs (the
    install cell, otter's cell); ``provided``, every code cell the student notebook and the solutions
    share (the handout's own code: trusted, not read by the pass); ``definitions``, the function and
    class definitions and imports of the provided cells, run again after the student's cells so that
    a test calls the handout's ``build`` and not a student's copy of it."""
    student = [c.source for c in student_nb.cells if c.cell_type == "code"]
    solution = {c.source for c in solutions_nb.cells if c.cell_type == "code"}
    skip = [s for s in student + sorted(solution)
            if 'importlib.util.find_spec("kvdro") is None' in s or re.search(r"^import otter$", s, re.M)]
    provided = [s for s in student if s in solution and s not in skip and not _CHECK_CELL.match(s)]
    definitions = []
    for source in provided:
        tree = ast.parse(source)
        keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))]
        if any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in keep):
            definitions.append(ast.unparse(ast.Module(body=keep, type_ignores=[])))
    return {"skip": skip, "provided": provided, "definitions": definitions}


def cells_to_run(nb, hand: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(every code cell the worker runs, the ones the pass reads), as (label, source): cells are labelled
    by their number among the notebook's code cells ("cell 3")."""
    run, read = [], []
    for number, source in enumerate((c.source for c in nb.cells if c.cell_type == "code"), start=1):
        if source in hand["skip"] or _CHECK_CELL.match(source) or not source.strip():
            continue
        run.append((f"cell {number}", source))
        if source not in hand["provided"]:
            read.append((f"cell {number}", source))
    return run, read


# ------------------------------------------------------------------------------------ the grading
def grade(nb, tests: dict[str, str], hand: dict, *, kit_dir: Path, kvdro_root: Path | None = None,
          timeout: float = TIMEOUT_S) -> dict:
    """Grade notebook ``nb`` on ``tests`` ({question: test file source}) in a fresh process.

    Returns ``{"refused": [sentences], "tests": {question: {test name: [passed, message]}},
    "errors": [sentences]}``; a refused notebook has no test results (every question scores 0).
    """
    import kit_static

    run, read = cells_to_run(nb, hand)
    refused = kit_static.refusals(read)
    if refused:
        return {"refused": refused, "tests": {}, "errors": []}
    payload = {"cells": run, "definitions": hand["definitions"], "tests": tests,
               "paths": [str(kit_dir)] + ([str(kvdro_root)] if kvdro_root else [])}
    with tempfile.TemporaryDirectory(prefix="kit-grade-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-I", str(HERE / "kit_grade.py"), "--worker"], cwd=cwd,
                                  input=json.dumps(payload), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"refused": [f"your notebook did not finish within {timeout / 60:.0f} minutes: look for a "
                                "loop that does not end or a computation far larger than the question's"],
                    "tests": {}, "errors": []}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert set(out) == {"refused", "tests", "errors"}
    except (IndexError, ValueError, AssertionError):
        return {"refused": ["the grader's process ended before it reported (your code may have ended it): "
                            "run the notebook top to bottom in a fresh kernel and check that it finishes"],
                "tests": {}, "errors": [proc.stderr[-2000:]]}
    return out


def grade_with_zip(nb, autograder: Path, timeout: float = TIMEOUT_S) -> dict:
    """:func:`grade` with the tests and the handout of an autograder zip, without otter's kernel (what
    the plugin does, minus otter's bookkeeping): for the kit's own tests and its audit."""
    import zipfile

    with zipfile.ZipFile(autograder) as zf:
        tests = {Path(n).stem: zf.read(n).decode() for n in sorted(zf.namelist()) if re.fullmatch(r"tests/\w+\.py", n)}
        hand = json.loads(zf.read(HANDOUT_FILE))
    return grade(nb, tests, hand, kit_dir=HERE, timeout=timeout)


def scores(graded: dict, tests: dict[str, str]) -> dict[str, float]:
    """{question: points earned} of a :func:`grade` result (otter's rule: the points of the passed cases)."""
    from otter.test_files import ExceptionTestFile

    out = {}
    for question, source in tests.items():
        tf = ExceptionTestFile.from_string(source, path=f"{question}.py")
        got = graded["tests"].get(question, {})
        out[question] = sum(tc.points for tc in tf.test_cases if got.get(tc.body.test_func.__name__, [False])[0])
    return out


class NotPlainData(AssertionError):
    """A student's function returned an object the tests do not read (an object of its own class)."""


def plain(value, depth: int = 0):
    """``value`` rebuilt from plain data (numbers, strings, arrays, lists, tuples, dicts, sets,
    DataFrames and objects of libraries: numpy, pandas, cvxpy, kvdro, ...); a :class:`NotPlainData` for
    an object of a class the notebook defines (or derives), which could claim to equal anything."""
    import types

    import numpy as np
    import pandas as pd

    kind = type(value)
    if depth > 20:
        raise NotPlainData("your answer is nested more than 20 levels deep")
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    if kind in (list, tuple, set, frozenset):
        return kind(plain(v, depth + 1) for v in value)
    if kind is dict:
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if kind is np.ndarray:
        if value.dtype == object:
            return np.array([plain(v, depth + 1) for v in value.ravel()], dtype=object).reshape(value.shape)
        return value
    if kind in (pd.DataFrame, pd.Series):
        for column in ([value] if kind is pd.Series else [value[c] for c in value.columns]):
            if column.dtype == object:
                for v in column:
                    plain(v, depth + 1)
        return value
    if isinstance(value, types.FunctionType):
        return for_test(value) if _from_notebook(value) else value
    if not _from_notebook_class(kind):
        return value  # an object of a library (cvxpy, kvdro, numpy, ...) or of Python
    raise NotPlainData(f"your answer holds a {kind.__name__}, an object of a class your notebook defines: "
                       "return numbers, arrays, lists, dicts or DataFrames")


def _from_notebook(func) -> bool:
    return func.__code__.co_filename.startswith("<cell")


def _from_notebook_class(kind: type) -> bool:
    return any(getattr(k, "__module__", None) == "notebook" for k in kind.__mro__)


def for_test(value):
    """What a test receives for a notebook name: a function of the notebook wrapped so that what it
    returns is :func:`plain` (``__kit_student__`` is the function itself, for ``kit_guard``), any other
    value rebuilt by :func:`plain`."""
    import functools
    import types

    if isinstance(value, types.FunctionType) and _from_notebook(value):
        @functools.wraps(value)
        def returns_plain(*args, **kwargs):
            return plain(value(*args, **kwargs))

        returns_plain.__kit_student__ = value
        return returns_plain
    return plain(value)


def _message(exc: BaseException, test_file: str) -> str:
    """What a student reads for a failed test: the test's own assertion (its hint), or the type and place
    of an exception, never the text of an exception raised by the student's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    kit = {str(HERE / "kit_guard.py"), str(HERE / "kit_grade.py")}
    last = frames[-1] if frames else None
    ours = last is not None and (last.filename == test_file or os.path.realpath(last.filename) in kit
                                 or last.filename.endswith(("kit_guard.py", "kit_grade.py")))
    if isinstance(exc, AssertionError) and ours:
        return str(exc)
    student = [f for f in frames if f.filename.startswith("<cell")]
    name = type(exc).__name__
    if student:
        f = student[-1]
        where = f"{f.name} ({f.filename.strip('<>')}, line {f.lineno})"
        if f is last:
            return (f"your code raised {name} in {where}. Run that cell and the question's check in your "
                    "notebook to see the whole error.")
        return (f"{name} in a library your code called from {where}: check the types and shapes of what you "
                "pass it (run the question's check in your notebook to see the whole error).")
    line = next((f.lineno for f in reversed(frames) if f.filename == test_file), None)
    return (f"{name} while the test used your answer" + (f" (line {line} of the test)" if line else "")
            + ": check the type and shape of what your function returns against the question.")


def run_tests(env: dict, tests: dict[str, str], after=None) -> dict[str, dict[str, list]]:
    """Run every test of ``tests`` ({question: source of otter's exception test file}) on the notebook
    globals ``env``; {question: {test function name: [passed, message]}}. ``after(question)`` is called
    after each question (the worker checks there that no library changed)."""
    import inspect

    from otter.test_files.exception_test import test_case

    out: dict[str, dict[str, list]] = {}
    for question, source in tests.items():
        filename = f"<tests {question}>"
        tns: dict = {"__name__": f"kit_tests_{question}"}
        exec(compile(source, filename, "exec"), tns)
        results = out[question] = {}
        for case in [v for v in list(tns.values()) if isinstance(v, test_case)]:
            func = case.test_func
            params = list(inspect.signature(func).parameters)
            missing = [p for p in params if p != "env" and p not in env]
            if missing:
                results[func.__name__] = [False, f"your notebook does not define {missing[0]}: run the cell that "
                                                 "defines it (and check that it runs without an error)"]
                continue
            try:
                kwargs = {p: (env if p == "env" else for_test(env[p])) for p in params}
                func(**kwargs)
                results[func.__name__] = [True, ""]
            except BaseException as exc:  # noqa: BLE001 - SystemExit from student code fails the test too
                results[func.__name__] = [False, _message(exc, filename)]
        if after is not None:
            after(question)
    return out


# ------------------------------------------------------------------------------------ the worker
def _snapshot() -> dict:
    """{(module, attribute) or (class, attribute): object} of every function, class and module held by the
    protected modules and their classes (what a patch replaces)."""
    import types

    snap = {}
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or name.split(".")[0] not in PROTECTED:
            continue
        for attr, obj in list(vars(module).items()):
            if callable(obj) or isinstance(obj, types.ModuleType):
                snap[(module, attr)] = obj
                if isinstance(obj, type) and getattr(obj, "__module__", "").split(".")[0] in PROTECTED:
                    for cattr, cobj in list(vars(obj).items()):
                        if callable(cobj) or isinstance(cobj, (property, staticmethod, classmethod)):
                            snap[(obj, cattr)] = cobj
    return snap


def _changes(snap: dict) -> list[str]:
    """The entries of ``snap`` that differ now (each is restored), as 'numpy.isclose'."""
    changed = []
    for (owner, attr), obj in snap.items():
        current = vars(owner).get(attr, _MISSING)
        if current is not obj:
            label = f"{getattr(owner, '__name__', owner)}.{attr}"
            changed.append(label)
            try:
                setattr(owner, attr, obj)
            except (TypeError, AttributeError):
                pass
    return changed


_MISSING = object()
_NO_BUILTINS = ("exec", "eval", "compile", "open", "input", "breakpoint", "globals", "locals", "vars", "help",
                "exit", "quit", "memoryview", "delattr", "setattr")


def _worker() -> None:
    payload = json.loads(sys.stdin.read())
    sys.path[:0] = payload["paths"]
    import builtins
    import importlib

    import numpy  # noqa: F401  the libraries, the guard and otter's test decorator, before any student code
    import pandas  # noqa: F401
    import cvxpy  # noqa: F401
    import kit_guard  # noqa: F401
    import kit_static
    import otter.test_files.exception_test  # noqa: F401
    for module in sorted(set(re.findall(r"(?:from|import)\s+(kvdro(?:\.\w+)*)", "\n".join(payload["tests"].values())))):
        importlib.import_module(module)
    snap = _snapshot()
    report = os.fdopen(os.dup(1), "w")  # the report's channel; the student's code prints into the void
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")

    real_import = builtins.__import__

    def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or name.split(".")[0] not in kit_static.ALLOWED_IMPORTS:
            raise ImportError(f"the autograder does not let a notebook import {name}")
        return real_import(name, globals, locals, fromlist, level)

    safe = {k: v for k, v in vars(builtins).items() if k not in _NO_BUILTINS}
    safe["__import__"] = restricted_import
    env = {"__name__": "notebook", "__builtins__": safe, "display": lambda *a, **k: None}
    errors, refused = [], []
    for label, source in payload["cells"]:
        code, _ = kit_static.strip_magics(source)
        try:
            exec(compile(code, f"<{label}>", "exec"), env)
        except BaseException as exc:  # noqa: BLE001 - a cell that fails leaves the next ones to run, as in otter
            line = next((f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__))
                         if f.filename == f"<{label}>"), "?")
            errors.append(f"{label}, line {line}: {type(exc).__name__}")
    for source in payload["definitions"]:
        exec(compile(source, "<handout>", "exec"), env)
    changed = _changes(snap)
    if changed:
        refused.append(f"your notebook changed {', '.join(sorted(set(changed))[:5])} (a library the grader uses): "
                       "it is not graded")

    def after(question: str) -> None:
        changed = _changes(snap)
        if changed:
            refused.append(f"while {question} was graded your code changed {', '.join(sorted(set(changed))[:5])} "
                           "(a library the grader uses): the notebook is not graded")

    tests = run_tests(env, payload["tests"], after) if not refused else {}
    report.write("\n" + json.dumps({"refused": refused, "tests": {} if refused else tests, "errors": errors}) + "\n")
    report.flush()
    os._exit(0)  # no student object's finaliser runs after the report


# ------------------------------------------------------------------------------------ otter's side
try:
    from otter.plugins import AbstractOtterPlugin
except ImportError:  # the worker imports otter itself; build.py needs no otter at import
    AbstractOtterPlugin = object


class KitGrader(AbstractOtterPlugin):
    """The otter plugin (``plugins: [kit_grade.KitGrader]`` in the assignment config)."""

    def _source(self) -> Path:
        return Path.cwd().parent / "source"  # otter runs plugins in <autograder>/submission

    def before_grading(self, config) -> None:
        tests = sorted(Path("tests").glob("*.py")) or sorted((self._source() / "tests").glob("*.py"))
        self.tests = {p.stem: p.read_text() for p in tests}
        for folder in (Path("tests"), self._source() / "tests"):
            if folder.is_dir():
                shutil.rmtree(folder)

    def before_execution(self, submission):
        import nbformat

        source = self._source()
        hand = json.loads((source / HANDOUT_FILE).read_text())
        files = source / "files"
        self.graded = grade(submission, self.tests, hand, kit_dir=source,
                            kvdro_root=files if (files / "kvdro").is_dir() else None)
        return nbformat.v4.new_notebook()  # otter's kernel runs nothing of the student's

    def after_grading(self, results) -> None:
        from otter.test_files import ExceptionTestFile
        from otter.test_files.abstract_test import TestCaseResult

        refused = self.graded["refused"]
        files = {}
        for question, source in self.tests.items():
            tf = ExceptionTestFile.from_string(source, path=f"{question}.py")
            got = self.graded["tests"].get(question, {})
            tf.test_case_results = []
            for tc in tf.test_cases:
                name = tc.body.test_func.__name__
                passed, message = got.get(name, [False, "not graded: your notebook was refused (see the message at the"
                                                 " top)" if refused else "not graded (the notebook did not reach it)"])
                tf.test_case_results.append(TestCaseResult(
                    test_case=tc, passed=passed, message="✅ Test case passed" if passed else "❌ " + message))
            files[question] = tf
        results.results = files
        results._catastrophic_error = None
        if refused:
            results.set_output("Your notebook was not graded:\n" + "\n".join(f"- {r}" for r in refused)
                               + "\nRemove what these lines name and submit again.")
        elif self.graded["errors"]:
            results.set_output("These cells raised an error when the autograder ran your notebook:\n"
                               + "\n".join(f"- {e}" for e in self.graded["errors"]))


def main(argv: list[str] | None = None) -> None:
    """``otter run`` with this file's folder on the path, so that otter finds the plugin."""
    parser = argparse.ArgumentParser(description="Grade a submission with a kit autograder (otter run + KitGrader).")
    parser.add_argument("submission")
    parser.add_argument("-a", "--autograder", required=True)
    parser.add_argument("-o", "--output-dir", default=".")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import otter.run

    otter.run.main(args.submission, autograder=args.autograder, output_dir=args.output_dir, no_logo=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        main()
