"""The course kit's pre-grading pass: refuse a notebook whose code reaches for the grader, before it runs.

:func:`refusals` reads every code cell a student may have written or changed (cells identical to the
handout's are the kit's own code and are trusted) with Python's ``ast`` and returns one sentence per
finding, naming the cell. ``kit_grade.py`` grades a notebook with any finding as 0 on every question,
with these sentences as the message, and never runs it.

What is refused, and why (each is a route by which a notebook could change how it is graded):

* importing anything but the numerical libraries an answer needs (:data:`ALLOWED_IMPORTS`): ``os``,
  ``sys``, ``importlib``, ``builtins``, ``inspect``, ``gc``, ``otter``, ``kit_guard``... reach the
  grader, the tests' files or other frames;
* the names :data:`BANNED_NAMES` (``exec``, ``eval``, ``compile``, ``__import__``, ``open``,
  ``getattr``/``setattr``, ``globals``, ``vars``, ``sys``, ``otter``, ``grader``, ``kit_guard``, ...):
  they run code the pass cannot read, read files, or reach objects by a computed name;
* an attribute that starts with an underscore on anything but ``self`` (``__code__``, ``__dict__``,
  ``__globals__``, ``np.__builtins__``, ``kvdro._private``) and the frame and code attributes
  (``f_globals``, ``co_filename``, ...);
* assigning into, or deleting from, an imported module or anything reached from one
  (``np.isclose = ...``, ``cp.Problem.solve = ...``, ``del np.isclose``);
* shell escapes and magics other than ``%matplotlib`` (``!pip``, ``%run``, ``%%bash``).

The pass is the first of two locks: ``kit_grade.py`` also runs the notebook in a fresh process with a
restricted import, and checks that no library module changed, before the tests run in it.
"""

from __future__ import annotations

import ast
import re

__all__ = ["ALLOWED_IMPORTS", "BANNED_NAMES", "refusals", "strip_magics"]

#: Top-level modules a notebook may import (everything an answer of the five assignments needs).
ALLOWED_IMPORTS = frozenset({
    "numpy", "scipy", "pandas", "cvxpy", "kvdro", "matplotlib", "math", "cmath", "statistics", "random",
    "itertools", "functools", "operator", "collections", "dataclasses", "typing", "heapq", "bisect",
    "fractions", "decimal", "numbers", "warnings", "time", "datetime", "enum", "abc", "string", "textwrap",
    "copy", "re", "json",
})

#: Names a notebook may not use at all (as a variable, a call or an attribute).
BANNED_NAMES = frozenset({
    "exec", "eval", "compile", "__import__", "open", "input", "breakpoint", "help", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "memoryview", "__builtins__", "builtins", "__loader__", "__spec__",
    "sys", "os", "importlib", "inspect", "gc", "ctypes", "ctypeslib", "types", "subprocess", "pickle", "dill",
    "marshal", "io", "pathlib", "shutil", "socket", "threading", "multiprocessing", "signal", "atexit",
    "otter", "grader", "kit_guard", "kit_grade", "kit_static", "modules", "_getframe", "settrace", "setprofile",
})

#: Frame, code and traceback attributes (a function that reads them can see the tests' locals).
_FRAME_ATTRS = re.compile(r"^(f|co|gi|cr|ag|tb)_[a-z]+$")

#: IPython lines that are allowed (and dropped): the matplotlib backend.
_MAGIC_OK = re.compile(r"^\s*%matplotlib\b")


def strip_magics(source: str) -> tuple[str, list[str]]:
    """``source`` with its IPython lines blanked, and a sentence for each that is not ``%matplotlib``
    (``!cmd``, ``%magic``, ``%%cell``: a notebook with any of those is refused)."""
    lines, bad = [], []
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.lstrip()
        if stripped.startswith(("!", "%")):
            if not _MAGIC_OK.match(line):
                bad.append(f"line {number}: runs the IPython command {stripped.split()[0] if stripped.split() else stripped}")
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines), bad


def _root(node: ast.AST) -> ast.AST:
    """The innermost object of ``a.b[c].d`` (``a``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


class _Reader(ast.NodeVisitor):
    def __init__(self, where: str, imported: set[str]):
        self.where, self.imported, self.found = where, imported, []

    def _say(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.where}, line {getattr(node, 'lineno', '?')}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top not in ALLOWED_IMPORTS:
                self._say(node, f"imports {alias.name}")
            self.imported.add((alias.asname or alias.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        top = (node.module or "").split(".")[0]
        if node.level or top not in ALLOWED_IMPORTS:
            self._say(node, f"imports from {'.' * node.level}{node.module or ''}")
        for alias in node.names:
            if alias.name == "*":
                self._say(node, f"imports * from {node.module}")
            self.imported.add(alias.asname or alias.name)
            if alias.name in BANNED_NAMES or alias.name.startswith("_"):
                self._say(node, f"imports {alias.name}")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in BANNED_NAMES or node.id.startswith("__kit"):
            self._say(node, f"uses {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        private = node.attr.startswith("_") and not (isinstance(base, ast.Name) and base.id in ("self", "cls")
                                                     and not node.attr.startswith("__"))
        if private or node.attr in BANNED_NAMES or _FRAME_ATTRS.match(node.attr):
            self._say(node, f"reads the attribute .{node.attr}")
        self.generic_visit(node)

    def _target(self, target: ast.AST, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._target(t, verb)
        elif isinstance(target, ast.Starred):
            self._target(target.value, verb)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            root = _root(target)
            if isinstance(root, ast.Name) and root.id in self.imported:
                self._say(target, f"{verb} {ast.unparse(target)}, part of the imported {root.id}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._target(t, "assigns into")
        alias = node.value
        while isinstance(alias, ast.Attribute):
            alias = alias.value
        if isinstance(alias, ast.Name) and alias.id in self.imported:  # m = np, P = cp.Problem: an alias
            self.imported |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, "assigns into")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._target(node.target, "assigns into")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._target(t, "deletes")
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._target(node.target, "assigns into")
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self._target(item.optional_vars, "assigns into")
        self.generic_visit(node)


def refusals(cells: list[tuple[str, str]]) -> list[str]:
    """Every finding of the pass on ``cells`` ([(label, source)], in notebook order): one sentence each,
    e.g. ``"cell 7, line 3: imports os"``. An empty list: the notebook may be graded."""
    found: list[str] = []
    imported: set[str] = set()
    for label, source in cells:
        code, magics = strip_magics(source)
        found += [f"{label}, {magic}" for magic in magics]
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            found.append(f"{label}, line {exc.lineno}: is not valid Python ({exc.msg})")
            continue
        reader = _Reader(label, imported)
        reader.visit(tree)
        found += reader.found
    return found
