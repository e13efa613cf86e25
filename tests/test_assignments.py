"""The course kit (book/assignments): masters, student notebooks and otter-grader autograders.

Built once per session into a temporary folder with the same code as ``make assignments`` (or read
from ``KVDRO_KIT_DIR``, where ``make test`` points at the kit ``make assignments`` built). For
every assignment: the master's solutions get full points from ``otter run`` (public and hidden
tests); the student notebook runs top to bottom without error (``otter run --debug`` stops on any
error) and scores zero; the student notebook contains no solution line and no hidden test; plausible
wrong answers get a message that says what is wrong. Needs the real traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from concurrent.futures import Future
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kvdro_course_build", ROOT / "book" / "assignments" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

ASSIGNMENTS = sorted(build.masters())
# the graders' helper (book/assignments/kit_guard.py) that the hidden tests import, as in the autograder zip,
# and the grading plugin with its worker (kit_grade.py) and the pre-grading pass (kit_static.py)
sys.path.insert(0, str(ROOT / "book" / "assignments"))
import kit_grade  # noqa: E402
import kit_static  # noqa: E402


# ----------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def kit(tmp_path_factory, data_dir) -> Path:
    """Every assignment built by book/assignments/build.py: into a temporary folder, or, with
    ``KVDRO_KIT_DIR`` set, the kit already built there (``make test`` points it at the kit that
    ``make assignments`` keeps up to date with the masters, build.py and kvdro, so it is built once)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    try:
        if os.environ.get("KVDRO_KIT_DIR"):
            out = Path(os.environ["KVDRO_KIT_DIR"])
            index = out / "index.json"
            assert index.is_file(), f"KVDRO_KIT_DIR={out}: no index.json there (run `make assignments`)"
            built = sorted(a["name"] for a in json.loads(index.read_text()))
            assert built == ASSIGNMENTS, f"KVDRO_KIT_DIR={out} holds {built}, the masters are {ASSIGNMENTS}"
            stale = [m.name for m in build.masters().values() if m.stat().st_mtime > index.stat().st_mtime]
            assert not stale, f"KVDRO_KIT_DIR={out} is older than {stale} (run `make assignments`)"
        else:
            out = tmp_path_factory.mktemp("assignments")
            build.build(out)
        yield out
    finally:
        mp.undo()


#: One grading process: ``otter run`` (otter.run.main, what the command line calls) for each job in
#: turn, so that otter is imported once per process and not once per notebook (5 s each). A job that
#: raises (with ``debug``, the first cell of the notebook that raises) leaves its traceback in
#: ``error.txt`` in its output folder instead of ``results.json``.
_GRADER = r"""
import json, sys, traceback
from pathlib import Path
sys.path.insert(0, sys.argv[2])  # book/assignments: the grading plugin (kit_grade.KitGrader), as kit_grade.py's command line
import otter.run
for job in json.loads(sys.argv[1]):
    try:
        otter.run.main(job["notebook"], autograder=job["autograder"], output_dir=job["out"], no_logo=True, debug=job["debug"])
    except BaseException:
        Path(job["out"], "error.txt").write_text(traceback.format_exc())
"""


def _otter_jobs(kit: Path, jobs: list[dict]) -> subprocess.Popen:
    """Start one grading process for ``jobs`` (dicts: name, notebook, out, debug); no Docker."""
    payload = [{"notebook": str(j["notebook"]), "out": str(j["out"]), "debug": j["debug"],
                "autograder": str(kit / j["name"] / "autograder" / f"{j['name']}-autograder.zip")} for j in jobs]
    # inherits KVDRO_DATA_DIR (set by ``kit``)
    return subprocess.Popen([sys.executable, "-c", _GRADER, json.dumps(payload), str(ROOT / "book" / "assignments")],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


#: A cell of the issue's gaming routes: otter's test runner and numpy patched from the notebook.
GAMED_CELL = """import otter.test_files.exception_test as t
t.ExceptionTestFile.run = lambda self, env: None
np.isclose = lambda *a, **k: True"""


def _scores(out: Path, what: str, log: str) -> dict[str, tuple[float, float]]:
    """{question: (score, max_score)} of a finished job, or the reason it has none."""
    if (out / "error.txt").exists():
        raise AssertionError(f"otter run failed on {what}:\n{(out / 'error.txt').read_text()[-3000:]}")
    if not (out / "results.json").exists():
        raise AssertionError(f"otter run wrote no results for {what}:\n{log[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    return {t["name"]: (float(t["score"]), float(t["max_score"])) for t in results["tests"] if "max_score" in t}


def _autograded(name: str) -> dict[str, float]:
    return {q["name"]: float(q["points"]) for q in build.questions(build.masters()[name]) if not q["manual"]}


def _test_file(kit: Path, name: str, question: str) -> str:
    with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
        return zf.read(f"tests/{question}.py").decode()


_ENVS: dict[str, dict] = {}


def _master_env(name: str) -> dict:
    """The globals after running every code cell of the master (solutions and test cells) in-process; test
    cells are compiled as ``<tests ...>``, as kit_grade.py compiles the tests (their own references are
    the tests', not the student's)."""
    if name not in _ENVS:
        nb = jupytext.read(build.masters()[name])
        env: dict = {"__name__": f"master_{name}", "display": lambda *a, **k: None}
        for cell in nb.cells:
            if cell.cell_type == "code":
                where = f"<tests {name}>" if "# BEGIN TEST CONFIG" in cell.source else f"<{name} master>"
                exec(compile(cell.source, where, "exec"), env)
        _ENVS[name] = env
    return _ENVS[name]


# ----------------------------------------------------------------------------------------- layout
def test_at_least_four_assignments_with_points(kit):
    assert len(ASSIGNMENTS) >= 4, ASSIGNMENTS
    index = {a["name"]: a for a in json.loads((kit / "index.json").read_text())}
    assert sorted(index) == ASSIGNMENTS
    for name in ASSIGNMENTS:
        assert (kit / name / "student" / f"{name}.ipynb").is_file()
        assert (kit / name / "autograder" / f"{name}-autograder.zip").is_file()
        assert index[name]["autograded_points"] == sum(_autograded(name).values()) > 0
        assert index[name]["manual_points"] > 0, f"{name}: every assignment has a written (derivation) question"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_question_has_public_and_hidden_tests(kit, name):
    for question in _autograded(name):
        source = _test_file(kit, name, question)
        hidden = re.findall(r"@test_case\(.*?hidden=(True|False)", source)
        assert "False" in hidden, f"{name}/{question}: no public test (the student sees nothing)"
        assert "True" in hidden, f"{name}/{question}: no hidden test"
    with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
        names = set(zf.namelist())
    assert "files/kvdro/__init__.py" in names, "the zip carries kvdro for Docker grading (otter grade)"
    # otter folds requirements.txt (kvdro's pins) into the grading image's conda environment
    with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
        env_yml = zf.read("environment.yml").decode()
    assert "python=3.11" in env_yml and "cvxpy==" in env_yml, env_yml


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_written_questions_have_a_rubric_and_pdfs(kit, name):
    """Each written question states its split per part and has a rubric whose points add up; the kit has the
    Gradescope template (blank written questions, one per page) and the graders' PDF with model answers."""
    text = build.masters()[name].read_text()
    for q in (q for q in build.questions(build.masters()[name]) if q["manual"]):
        block = text[text.index(f"name: {q['name']}"):]
        block = block[: block.index("# END QUESTION")]
        split = re.search(r"\(written, ([\d.]+) points: ((?:\([a-z]\) [\d.]+(?:, )?)+)\)", block)
        assert split, f"{name}/{q['name']}: the question does not state its point split per part"
        parts = [float(x) for x in re.findall(r"\([a-z]\) ([\d.]+)", split.group(2))]
        assert float(split.group(1)) == q["points"] == pytest.approx(sum(parts)), (name, q, parts)
        assert re.search(rf"\*\*Rubric \({q['points']:g} points?\)\.\*\*", block), f"{name}/{q['name']}: no rubric"
    if build.chromium() is None:
        pytest.skip("no Chromium: the kit was built without the PDFs of the written questions")
    entry = next(a for a in json.loads((kit / "index.json").read_text()) if a["name"] == name)
    pdfs = {Path(p).name: kit / p for p in entry["pdfs"]}
    assert sorted(pdfs) == sorted([f"{name}-written.pdf", f"{name}-written-solutions.pdf"]), pdfs
    n_written = sum(q["manual"] for q in build.questions(build.masters()[name]))
    for pdf in pdfs.values():
        data = pdf.read_bytes()
        assert data.startswith(b"%PDF") and b"%%EOF" in data[-1024:], f"{pdf} is not a whole PDF"
        pages = len(re.findall(rb"/Type\s*/Page\b", data))
        assert n_written <= pages <= 6 * n_written, f"{pdf}: {pages} pages for {n_written} written question(s)"
    assert pdfs[f"{name}-written-solutions.pdf"].stat().st_size > pdfs[f"{name}-written.pdf"].stat().st_size


def test_written_pdf_page_has_the_local_fonts_and_braced_accents(kit):
    """The xi-hat of the written questions: the page printed to PDF loads MathJax with the STIX-Web fonts it
    ships (not the missing TeX web font, whose fallback set the hat apart as a stray "^"), and a bare
    accent is braced (\\hat{\\xi})."""
    html = build.written_html(kit / "a2_wasserstein" / "autograder" / "a2_wasserstein.ipynb")
    assert build.MATHJAX_FONTS in html and html.index(build.MATHJAX_FONTS) < html.index("MathJax.js")
    assert "\\hat{\\xi}" in html and "\\hat\\xi" not in html


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_first_code_cell_installs_kvdro_only_where_missing(kit, name, tmp_path, monkeypatch):
    """Colab: the first code cell of the master and of the student notebook (before otter's ``import otter``)
    installs the kvdro wheel that the student edition publishes (the package alone: no master, no kit build
    on the student's machine) with otter-grader, and writes the assignment's public tests, which the build
    puts into the cell; guarded by ``find_spec("kvdro") is None`` so that it does nothing in a clone, in CI
    or in the autograder (D7)."""
    import yaml

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    first = next(c for c in jupytext.read(build.masters()[name]).cells if c.cell_type == "code").source
    student = json.loads((kit / name / "student" / f"{name}.ipynb").read_text())
    cell = "".join(student["cells"][0]["source"])
    assert 'if importlib.util.find_spec("kvdro") is None:' in first and build.PUBLIC_TESTS_LINE in first, first
    assert f'"{build.wheel_url(url)}"' in first and "git clone" not in first and "build.py" not in first, first
    assert "Restart session" in first, "the cell says when Colab needs a restart"
    assert "otter-grader==7.0.0" in first and "otter-grader==7.0.0" in (ROOT / "pyproject.toml").read_text()
    assert cell.startswith(first.split(build.PUBLIC_TESTS_LINE)[0]), "the student notebook must start with the install cell"
    monkeypatch.chdir(tmp_path)  # the cell writes ./tests
    env: dict = {}
    exec(compile(cell.replace('if importlib.util.find_spec("kvdro") is None:', "if True:")
                 .replace("subprocess.run(", "(lambda *a, **k: None)("), "<install cell>", "exec"), env)
    public = student["metadata"]["otter"]["tests"]
    assert env["PUBLIC_TESTS"] == public and public, "the cell carries exactly the public tests"
    assert all("hidden=True" not in source for source in env["PUBLIC_TESTS"].values())
    assert sorted(p.name for p in (tmp_path / "tests").iterdir()) == sorted(f"{q}.py" for q in public)
    env = {}
    exec(compile(cell, "<install cell>", "exec"), env)  # kvdro is installed here: nothing may run
    assert "WHEEL" not in env, "the install cell ran although kvdro is installed"


# ----------------------------------------------------------------------------------------- grading
#: Grading processes at once: each grades its share of the notebooks in turn, each notebook in its own
#: kernel (one core each).
GRADING_WORKERS = 2


@pytest.fixture(scope="module")
def graded(kit, tmp_path_factory) -> dict[tuple[str, str], Future]:
    """Every master and every blank student notebook graded by ``otter run``, in :data:`GRADING_WORKERS`
    processes: {(name, "master" | "student"): future of the scores, {question: (score, max_score)}}.
    A failed run raises in the test that reads it."""
    jobs = []
    for name in ASSIGNMENTS:
        jobs.append({"key": (name, "master"), "name": name, "notebook": kit / name / "autograder" / f"{name}.ipynb",
                     "out": tmp_path_factory.mktemp(f"{name}-master"), "debug": False})
        # debug: otter stops (an exception) on the first cell that raises, so the blank notebook's run also
        # proves that it runs top to bottom
        jobs.append({"key": (name, "student"), "name": name, "notebook": kit / name / "student" / f"{name}.ipynb",
                     "out": tmp_path_factory.mktemp(f"{name}-student"), "debug": True})
    # the master's solutions with one cell that patches numpy and otter: the plugin must refuse it
    import nbformat

    gamed = tmp_path_factory.mktemp("gamed") / "a1_newsvendor.ipynb"
    nb = nbformat.read(kit / "a1_newsvendor" / "autograder" / "a1_newsvendor.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(GAMED_CELL))
    nbformat.write(nb, gamed)
    jobs.append({"key": ("a1_newsvendor", "gamed"), "name": "a1_newsvendor", "notebook": gamed,
                 "out": tmp_path_factory.mktemp("a1-gamed"), "debug": False})
    shares = [jobs[i::GRADING_WORKERS] for i in range(GRADING_WORKERS)]
    procs = [_otter_jobs(kit, share) for share in shares]
    logs = [proc.communicate()[0] for proc in procs]
    futures = {}
    for share, log in zip(shares, logs):
        for job in share:
            future = futures[job["key"]] = Future()
            try:
                future.set_result(_scores(job["out"], f"{job['notebook'].name} (debug={job['debug']})", log))
            except AssertionError as exc:
                future.set_exception(exc)
    return futures


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_master_gets_full_points(graded, name):
    scores = graded[(name, "master")].result()
    expected = _autograded(name)
    assert {q: s for q, (s, _) in scores.items()} == expected, f"{name}: scores {scores}, points {expected}"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_blank_student_notebook_runs_and_scores_zero(graded, name):
    scores = graded[(name, "student")].result()
    assert {q: m for q, (_, m) in scores.items()} == _autograded(name)
    assert {q: s for q, (s, _) in scores.items() if s != 0} == {}, f"{name}: a blank notebook scores points: {scores}"


def test_a_notebook_that_patches_the_grader_is_refused_by_otter_run(graded):
    """Issue 35, through otter run and the plugin: the master's full answers plus one cell that patches
    otter's runner and numpy score 0 on every question (the message is checked by the unit tests of the pass)."""
    scores = graded[("a1_newsvendor", "gamed")].result()
    assert scores and all(s == 0 for s, _ in scores.values()), scores
    assert {q: m for q, (_, m) in scores.items()} == _autograded("a1_newsvendor")


# ----------------------------------------------------------------------------------------- no leaks
def _solution_lines(master: Path) -> tuple[set[str], set[str]]:
    """(lines of solution code and written solutions, lines of hidden tests) of a master.

    A solution line that the master also gives outside every solution block (e.g. a ``for`` header
    repeated in a given print loop) is not a leak and is left out.
    """
    nb = jupytext.read(master)
    solution, hidden, given, in_md_solution = set(), set(), set(), False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for block in re.split(r"```otter\n(.*?)\n```", cell.source, flags=re.DOTALL):
                head = block.strip().splitlines()[:1]
                if head and re.match(r"#\s*BEGIN SOLUTION", head[0]):
                    in_md_solution = True
                elif head and re.match(r"#\s*END SOLUTION", head[0]):
                    in_md_solution = False
                elif in_md_solution:
                    solution |= {ln.strip() for ln in block.splitlines() if len(ln.strip()) > 20}
            continue
        lines = cell.source.splitlines()
        if lines and "BEGIN TEST CONFIG" in lines[0] and re.search(r"hidden:\s*true", cell.source):
            hidden |= {ln.strip() for ln in lines if len(ln.strip()) > 20 and "TEST CONFIG" not in ln}
        if lines and ("BEGIN TEST CONFIG" in lines[0] or lines[0].startswith("def test_")):
            continue  # a test cell: public tests are meant to be seen, hidden ones are collected above
        inside = False
        for ln in lines:
            if re.match(r"\s*# BEGIN SOLUTION", ln):
                inside = True
            elif re.match(r"\s*# END SOLUTION", ln):
                inside = False
            elif (inside or ln.rstrip().endswith("# SOLUTION")) and len(ln.strip()) > 12:
                solution.add(ln.strip())
            else:
                given.add(ln.strip())
    return solution - given, hidden - given


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_student_notebook_leaks_no_solution(kit, name):
    student = json.loads((kit / name / "student" / f"{name}.ipynb").read_text())
    text = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in student["cells"])
    text += "\n" + json.dumps(student["metadata"]).replace("\\n", "\n")
    student_lines = {ln.strip() for ln in text.splitlines()}
    public = "\n".join(student["metadata"]["otter"]["tests"].values())
    solution, hidden = _solution_lines(build.masters()[name])
    assert solution and hidden, f"{name}: found no solution or hidden-test lines to look for"
    assert sorted(solution & student_lines) == [], f"{name}: solution lines in the student notebook"
    hidden_only = {ln for ln in hidden if ln not in public}
    assert sorted(hidden_only & student_lines) == [], f"{name}: hidden-test lines in the student notebook"
    assert "hidden=True" not in public, f"{name}: a hidden test is stored in the student notebook"
    for fn in re.findall(r"def (test_\w+)\(", "\n".join(hidden)):
        assert fn not in text, f"{name}: hidden test {fn} named in the student notebook"


# ----------------------------------------------------------------------------------------- grading table
#: (assignment, question, submission, its code, the score it must get on that question, words the failure
#: messages must contain (None: it must pass), whether a PUBLIC test (the one a student sees) must say them).
#: Each submission is run against the question's public and hidden tests in the master's environment with
#: the code executed on top (notebook functions see the redefined names, as in a real notebook), as otter
#: does. D1-D7 are the defects of issue 28; every one of them has its case here.
GRADING_TABLE = [
    ("a1_newsvendor", "q1", "slope with -c_w", """
def cost_slope(samples, eta, c_p, c_w):
    return (c_p + c_w) * np.mean(np.asarray(samples) <= eta) - c_w
""", 0.0, "slope starts at -c_p", False),
    ("a1_newsvendor", "q2", "c_w / (c_p + c_w)", """
def critical_fractile(c_p, c_w):
    return c_w / (c_p + c_w)
""", 0.0, "1 - q*: the roles of c_p and c_w are swapped", True),
    ("a1_newsvendor", "q2", "D1: calls kvdro.newsvendor", """
from kvdro import newsvendor as _nv
def critical_fractile(c_p, c_w):
    return _nv.critical_fractile(c_p / c_w)
""", 0.0, "critical_fractile", False),
    ("a1_newsvendor", "q2", "D6: tuned to the public inputs", """
def critical_fractile(c_p, c_w):
    return {(1.0, 1.0): 0.5, (3.0, 1.0): 0.75}.get((c_p, c_w), 0.5)
""", 0.0, "expected", False),
    ("a1_newsvendor", "q2", "correct, written from scratch", """
def critical_fractile(c_p, c_w):
    rho = c_p / c_w
    return rho / (rho + 1.0)
""", 2.0, None, False),
    ("a1_newsvendor", "q3", "quantile at 1 - q*", """
def saa_buffer(samples, c_p, c_w):
    return float(np.quantile(samples, c_w / (c_p + c_w), method="inverted_cdf"))
""", 0.0, "quantile at 1 - q*", True),
    ("a1_newsvendor", "q3", "interpolated quantile", """
def saa_buffer(samples, c_p, c_w):
    return float(np.quantile(samples, c_p / (c_p + c_w)))
""", 0.0, "LOWER empirical quantile", True),
    ("a1_newsvendor", "q3", "D1: returns kvdro's saa_reservation", """
from kvdro.newsvendor import saa_reservation
def saa_buffer(samples, c_p, c_w):
    return saa_reservation(samples, c_p, c_w)
""", 0.0, "kvdro.newsvendor.saa_reservation", False),
    ("a1_newsvendor", "q3", "D1: reaches kvdro through importlib", """
import importlib
def saa_buffer(samples, c_p, c_w):
    module = importlib.import_module("kvdro." + "news" + "vendor")
    return getattr(module, "saa_" + "reservation")(samples, c_p, c_w)
""", 0.0, "called kvdro.newsvendor.saa_reservation", False),
    ("a1_newsvendor", "q3", "correct, np.quantile inverted_cdf", """
def saa_buffer(samples, c_p, c_w):
    return float(np.quantile(np.asarray(samples, dtype=float), c_p / (c_p + c_w), method="inverted_cdf"))
""", 2.0, None, False),
    ("a1_newsvendor", "q4", "epigraph with c_p and c_w swapped", """
def saa_lp(samples, c_p, c_w):
    xi = np.asarray(samples, dtype=float)
    eta, theta = cp.Variable(), cp.Variable(xi.size)
    cons = [theta >= c_w * (xi - eta), theta >= c_p * (eta - xi)]
    return cp.Problem(cp.Minimize(cp.sum(theta) / xi.size), cons), eta
""", 0.0, "1 - q* quantile", True),
    ("a1_newsvendor", "q5", "D2: the buffer table typed in", """
def trace_buffers(samples, rhos):
    table = {2.0: 357.0, 10.0: 427.0, 100.0: 602.0}
    return dict(table), dict(table)
""", 0.0, "one entry per rho", False),
    ("a2_wasserstein", "q1", "gaming: kvdro's number wrapped in a problem", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    return cp.Problem(cp.Minimize(wasserstein.worst_case_cost(samples, eta, c_p, c_w, eps, L_max)))
""", 0.0, "is not a dual", True),
    ("a2_wasserstein", "q1", "gaming: kvdro's own dual problem", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    return wasserstein.dual_problem(samples, eta, c_p, c_w, eps, L_max).problem
""", 0.0, "one entry per sample", True),
    ("a2_wasserstein", "q1", "gamma sign flipped", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi),
            theta >= c_p * (L_max - eta) + gamma * (L_max - xi), theta >= c_w * eta + gamma * xi]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
""", 0.0, "SIGN of the gamma", True),
    ("a2_wasserstein", "q1", "(8e), (8f) missing", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi)]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
""", 0.0, "violate (8e), (8f)", True),
    ("a2_wasserstein", "q3", "problems never solved (value None)", """
def duality_check(samples, c_p, c_w, L_max):
    eta = newsvendor.saa_reservation(samples, c_p, c_w)
    eps = 0.15 * float(np.mean(samples))
    return dual_lp(samples, eta, c_p, c_w, eps, L_max).value, primal_lp(samples, eta, c_p, c_w, eps, L_max).value
wc_dual, wc_primal = duality_check(xi_small, C_P, C_W, L_MAX)
""", 0.0, "wc_dual is None", True),
    ("a2_wasserstein", "q3", "D2: wc_dual/wc_primal pasted", """
_pasted = (wc_dual, wc_primal)
def duality_check(samples, c_p, c_w, L_max):
    return _pasted
""", 0.0, "never calls dual_lp", False),
    ("a2_wasserstein", "q3", "D3: wrong q1 dual, q3 itself right", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi)]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
""", 2.0, None, False),
    ("a2_wasserstein", "q4", "the paper's radius, not the threshold", """
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    return 0.15 * float(np.mean(samples))
""", 0.0, "not by a formula for the radius", True),
    ("a2_wasserstein", "q4", "D1: returns saa_threshold_radius", """
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    return wasserstein.saa_threshold_radius(samples, c_p, c_w, L_max)
""", 0.0, "saa_threshold_radius", False),
    ("a2_wasserstein", "q4", "correct, bisection on a boolean", """
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    saa = newsvendor.saa_reservation(samples, c_p, c_w)
    robust = lambda e: wasserstein.dro_reservation(samples, c_p, c_w, e, L_max) == saa
    lo, hi = 0.0, float(L_max)
    while hi - lo > tol:
        lo, hi = ((lo + hi) / 2, hi) if robust((lo + hi) / 2) else (lo, (lo + hi) / 2)
    return (lo + hi) / 2
""", 3.0, None, False),
    ("a3_joint_milp", "q1", "(1 + kappa) missing", """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum(d["lam"][i] * d["H"][i, k] * (d["L_in"][i] + d["eta"][i]) @ v["w"][i][k] for i in range(I))
              <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", 0.0, "factor 1 + kappa", False),
    ("a3_joint_milp", "q1", "work T instead of residence H", """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum((1 + d["kappa"]) * d["lam"][i] * d["T"][i, k] * (d["L_in"][i] + d["eta"][i]) @ v["w"][i][k]
                  for i in range(I)) <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", 0.0, "residence time H", False),
    ("a3_joint_milp", "q1", "D3: L_in forgotten in (6e)", A3_NO_LIN := """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum((1 + d["kappa"]) * d["lam"][i] * d["H"][i, k] * d["eta"][i] @ v["w"][i][k]
                  for i in range(I)) <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", 0.0, "(1 + kappa) sum_i lambda_i H_ik pi_ik (L_in + eta)", False),
    ("a3_joint_milp", "q2", "w >= pi + x - 1 missing", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] <= v["pi"][i, k])]
""", 0.0, "w >= pi + x - 1 is missing", True),
    ("a3_joint_milp", "q2", "w <= x missing", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["pi"][i, k], v["w"][i][k] >= v["pi"][i, k] + v["x"][i] - 1)]
""", 0.0, "w <= x is missing", True),
    ("a3_joint_milp", "q2", "w <= pi missing", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] >= v["pi"][i, k] + v["x"][i] - 1)]
""", 0.0, "w <= pi is missing", True),
    ("a3_joint_milp", "q2", "D3: wrong q1 (lambda missing), q2 itself right", A3_NO_LAMBDA := """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum((1 + d["kappa"]) * d["H"][i, k] * (d["L_in"][i] + d["eta"][i]) @ v["w"][i][k]
                  for i in range(I)) <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", 3.0, None, False),
    ("a3_joint_milp", "q3", "sum_c w = pi missing", """
def disaggregated_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] <= v["pi"][i, k])]
""", 0.0, "sum_c w_ikc = pi", True),
    ("a3_joint_milp", "q3", "w <= x missing", """
def disaggregated_links(d, v):
    return [cp.sum(v["w"][i][k]) == v["pi"][i, k] for i in range(len(d["lam"])) for k in range(len(d["M"]))]
""", 0.0, "w <= x is missing", True),
    ("a3_joint_milp", "q3", "D3: wrong q1 (lambda missing), q3 itself right", A3_NO_LAMBDA, 3.0, None, False),
    ("a3_joint_milp", "q4", "the q4 cell stopped (no results)", """
def root_gaps(d, formulations):
    return {}
results = {}
""", 0.0, "results has no entry 'mccormick'", True),
    ("a3_joint_milp", "q4", "D2: a classmate's results pasted, on a wrong q1", """
_pasted = {form: dict(r) for form, r in results.items()}
""" + A3_NO_LIN + """
def root_gaps(d, formulations):
    return _pasted
""", 0.0, "kvdro's exact solver", False),
    ("a3_joint_milp", "q4", "D1: the MILP optimum from kvdro's solve_milp", """
def root_gaps(d, formulations):
    out = {}
    for form, links in formulations.items():
        lp, _ = solve(build(d, links, relax=True))
        milp = solve_milp(instance).objective
        out[form] = {"milp": milp, "nodes": 0, "lp": lp, "gap": (milp - lp) / milp}
    return out
""", 0.0, "solve_milp", False),
    ("a3_joint_milp", "q4", "D3: wrong q1 (L_in forgotten), q4 itself right", A3_NO_LIN, 2.0, None, False),
    ("a4_policy", "q1", "split not by arrival time", """
def holdout(trace, n_test):
    mid = len(trace) // 2
    test = trace.iloc[mid:mid + n_test]
    return trace.iloc[:mid], test.assign(arrival_s=test["arrival_s"] - test["arrival_s"].min())
""", 0.0, "BY ARRIVAL TIME", False),
    ("a4_policy", "q2", "buffers shrink as rho grows", """
def my_buffers(train, rho):
    return {str(c): float(np.quantile(p["output_tokens"], 1 / (rho + 1), method="inverted_cdf"))
            for c, p in train.groupby("request_class")}
""", 0.0, "never make the policy reserve less", False),
    ("a4_policy", "q2", "D4: no design (all-zero buffers)", """
def my_buffers(train, rho):
    return {str(c): 0.0 for c in sorted(train["request_class"].astype(str).unique())}
""", 1.5, "all-zero or constant buffers", False),
    ("a4_policy", "q2", "D4: constant buffers, ignore the data", """
def my_buffers(train, rho):
    return {str(c): 0.0 if rho < 10 else 1.0 for c in sorted(train["request_class"].astype(str).unique())}
""", 1.5, "must depend on the data", False),
    ("a4_policy", "q2", "correct: the plain SAA buffer per class", """
def my_buffers(train, rho):
    q = rho / (rho + 1.0)
    return {str(c): float(np.quantile(p["output_tokens"], q, method="inverted_cdf"))
            for c, p in train.groupby("request_class")}
""", 3.0, None, False),
    ("a4_policy", "q3", "one generator shared by every policy", """
def evaluate(test, policies, *, rho, seed, deployment):
    rng = np.random.default_rng(seed)
    rows = {label: simulate(test, policy="vllm" if b is None else "saa", buffers=b, deployment=deployment,
                            rho=rho, rng=rng).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", 0.0, "own np.random.default_rng(seed)", False),
    ("a4_policy", "q3", "buffers refitted on the test trace", """
def evaluate(test, policies, *, rho, seed, deployment):
    rows = {label: simulate(test, policy="vllm" if b is None else "dro", buffers=None, deployment=deployment,
                            rho=rho, rng=np.random.default_rng(seed)).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", 0.0, "refits the buffers on the TEST trace", False),
    ("a4_policy", "q3", "rho not passed on", """
def evaluate(test, policies, *, rho, seed, deployment):
    rows = {label: simulate(test, policy="vllm" if b is None else "saa", buffers=b, deployment=deployment,
                            rng=np.random.default_rng(seed)).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", 0.0, "pass rho to simulate", False),
]
GRADING_TABLE += [
    ("a5_answer", "q1", "work without the - 1", """
def recompute_share(result):
    req = result.requests[result.requests["outcome"].isin(["completed", "truncated"])]
    return result.metrics["recomputed_tokens"] / float((req["input_tokens"] + req["generated_tokens"]).sum())
""", 0.0, "L_in + g - 1", False),
    ("a5_answer", "q1", "D1: kvdro's run_stats", """
from kvdro.experiments.headroom import run_stats
def recompute_share(result):
    stats = run_stats(result)
    return stats["recomputed"] / stats["work_tokens"]
""", 0.0, "run_stats", False),
    ("a5_answer", "q1", "D2: the slice's share typed in", """
_typed = recompute_share(vllm_run)
def recompute_share(result):
    return _typed
""", 0.0, "recompute share", False),
    ("a5_answer", "q2", "one generator shared by every run", """
def compare(trace, policies, *, deployment, seed, rho):
    rng, rows = np.random.default_rng(seed), {}
    for label, spec in policies.items():
        name, buffers = (spec, None) if isinstance(spec, str) else ("saa", spec)
        run = simulate(trace, policy=name, buffers=buffers, deployment=deployment, rho=rho, rng=rng)
        rows[label] = {"goodput_rps": run.metrics["goodput_rps"], "preemptions": run.metrics["preemptions"],
                       "recompute_share": recompute_share(run)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["goodput_gain"] = table["goodput_rps"] / table.loc["vllm", "goodput_rps"] - 1.0
    return table
""", 2.0, "own np.random.default_rng(seed)", False),
    ("a5_answer", "q2", "D3: wrong q1 (nan), q2 itself right", """
def recompute_share(result):
    return float("nan")
""", 3.0, None, False),
]
GRADING_TABLE += [
    ("a6_engines", "q1", "the bound against the cap (true - cap)", """
def length_value(trace, engine, *, deployment, seed, cap):
    g = {key: float(simulate(trace, policy="vllm", engine=engine, max_new=mn, deployment=deployment,
                             rng=np.random.default_rng(seed)).metrics["goodput_rps"])
         for key, mn in (("unset", "unset"), ("cap", cap), ("true", "true"))}
    return {**g, "value_lower_bound": g["true"] - g["cap"]}
""", 2.0, "true - unset", False),
    ("a6_engines", "q1", "the cap not passed (max_new unset twice)", """
def length_value(trace, engine, *, deployment, seed, cap):
    g = {key: float(simulate(trace, policy="vllm", engine=engine, max_new=mn, deployment=deployment,
                             rng=np.random.default_rng(seed)).metrics["goodput_rps"])
         for key, mn in (("unset", "unset"), ("cap", "unset"), ("true", "true"))}
    return {**g, "value_lower_bound": g["true"] - g["unset"]}
""", 2.5, "max_new=cap", False),
    ("a6_engines", "q1", "D2: the public slice's numbers typed in", """
_typed = dict(gne)
def length_value(trace, engine, *, deployment, seed, cap):
    return dict(_typed)
""", 0.0, "a direct simulation gives", False),
    ("a6_engines", "q2", "share of the default, not of the true-length arm", """
def value_table(trace, engines, *, deployment, seed, cap):
    table = pd.DataFrame({e: length_value(trace, e, deployment=deployment, seed=seed, cap=cap) for e in engines}).T
    table["value_share"] = table["value_lower_bound"] / table["unset"]
    return table
""", 1.0, "value_lower_bound / true", False),
    ("a6_engines", "q2", "D2: the public table typed in", """
_typed = table.copy()
def value_table(trace, engines, *, deployment, seed, cap):
    return _typed.copy()
""", 0.0, "one row per engine", False),
    ("a6_engines", "q2", "D3: wrong q1 (nan), q2 itself right", """
def length_value(trace, engine, *, deployment, seed, cap):
    return {"unset": float("nan"), "cap": float("nan"), "true": float("nan"), "value_lower_bound": float("nan")}
""", 2.0, None, False),
]


def _notebook_env(right: dict) -> dict:
    """A copy of a notebook's globals whose functions look names up in the copy (so that a submission
    that redefines question 1 changes what a given function calling it sees, as in a real notebook)."""
    import types

    env = dict(right)
    for key, value in right.items():
        if isinstance(value, types.FunctionType) and value.__globals__ is right:
            copy = types.FunctionType(value.__code__, env, value.__name__, value.__defaults__, value.__closure__)
            copy.__kwdefaults__, copy.__dict__ = value.__kwdefaults__, dict(value.__dict__)
            env[key] = copy
    return env


def grade_submission(kit: Path, name: str, question: str, code: str) -> tuple[float, float, str, str]:
    """Run a question's tests (public and hidden) on the master's environment with ``code`` executed on top,
    with kit_grade.run_tests (the messages a student reads); return (score, possible, messages of failed
    public tests, messages of failed hidden tests)."""
    from otter.test_files import ExceptionTestFile

    source = _test_file(kit, name, question)
    cases = {tc.body.test_func.__name__: tc for tc in ExceptionTestFile.from_string(source, path=f"{question}.py").test_cases}
    right = _master_env(name)
    got = kit_grade.run_tests(_notebook_env(right), {question: source})[question]
    assert all(p for p, _ in got.values()), f"{name}/{question}: the master fails its own tests: {got}"
    env = _notebook_env(right)
    exec(compile(code, f"<submission {name}/{question}>", "exec"), env)
    got = kit_grade.run_tests(env, {question: source})[question]
    text = {True: "", False: ""}
    for test, (passed, message) in got.items():
        if not passed:
            text[bool(cases[test].hidden)] += message + "\n"
    score = sum(cases[t].points for t, (p, _) in got.items() if p)
    return float(score), float(sum(tc.points for tc in cases.values())), text[False], text[True]


@pytest.mark.parametrize(
    "name, question, label, code, score, hint, public",
    GRADING_TABLE,
    ids=[f"{a}-{q}-{i}" for i, (a, q, *_) in enumerate(GRADING_TABLE)],
)
def test_grading_table(kit, name, question, label, code, score, hint, public):
    got, possible, public_text, hidden_text = grade_submission(kit, name, question, code)
    assert got == pytest.approx(score), (
        f"{name}/{question} ({label}): scores {got}/{possible}, expected {score}\npublic: {public_text}\nhidden: {hidden_text}"
    )
    if hint is None:
        assert got == possible and not public_text and not hidden_text, f"{name}/{question} ({label}) must pass"
        return
    assert public_text or hidden_text, f"{name}/{question}: the wrong answer passes every test"
    where = public_text if public else public_text + hidden_text
    assert hint in where, (
        f"{name}/{question}: the {'public ' if public else ''}message does not say {hint!r}:\n"
        f"public: {public_text}\nhidden: {hidden_text}"
    )
    for text in (public_text, hidden_text):  # what a student sees once grades are published (show_hidden)
        assert "Traceback" not in text and "KeyError" not in text and "ufunc" not in text, (
            f"{name}/{question}: a confusing error reaches the student:\n{text}"
        )


# ----------------------------------------------------------------------------------------- out of reach
#: Routes around the grader that the pre-grading pass refuses, with a word its message must say.
STATIC_ROUTES = [
    ("import otter.test_files.exception_test as t\nt.ExceptionTestFile.run = lambda self, env: None", "imports otter"),
    ("np.isclose = lambda *a, **k: True", "assigns into np.isclose"),
    ("m = np\nm.isclose = abs", "assigns into m.isclose"),
    ("import kit_guard\nkit_guard.own_work = lambda f, *a: f", "imports kit_guard"),
    ("exec('x = 1', {'__name__': 'kvdro.newsvendor'})", "uses exec"),
    ("f = eval('lambda: 0')", "uses eval"),
    ("m = __import__('os')", "uses __import__"),
    ("import sys\nsys.modules['numpy'].isclose = abs", "imports sys"),
    ("import importlib\nimportlib.import_module('os')", "imports importlib"),
    ("import builtins\nbuiltins.abs = round", "imports builtins"),
    ("text = open('tests/q1.py').read()", "uses open"),
    ("def f():\n    return f.__globals__", "reads the attribute .__globals__"),
    ("def f(g):\n    return g.__code__.co_filename", "reads the attribute .__code__"),
    ("x = getattr(np, 'isclose')", "uses getattr"),
    ("del np.isclose", "deletes np.isclose"),
    ("!pip install something", "IPython command !pip"),
    ("from os import path", "imports from os"),
    ("cp.Problem.solve = lambda self, *a, **k: 0.0", "assigns into cp.Problem.solve"),
]


@pytest.mark.parametrize("code, says", STATIC_ROUTES, ids=[s for _, s in STATIC_ROUTES])
def test_pre_grading_pass_refuses_and_names_the_cell(code, says):
    found = kit_static.refusals([("cell 1", "import numpy as np\nimport cvxpy as cp"), ("cell 7", code)])
    assert found and all(f.startswith("cell 7, ") for f in found), found
    assert any(says in f for f in found), f"no finding says {says!r}: {found}"


def test_pre_grading_pass_lets_an_answer_through():
    answer = """import numpy as np
from functools import partial
class Policy:
    def __init__(self, q):
        self._q = q
    def __call__(self, x):
        return float(np.quantile(x, self._q))
def saa_buffer(samples, c_p, c_w):
    xi = np.sort(np.asarray(samples, dtype=float))
    xi[0] = xi[0]  # an array of the notebook's own may be changed
    return Policy(c_p / (c_p + c_w))(xi)
%matplotlib inline
"""
    assert kit_static.refusals([("cell 3", answer)]) == []


def _cell_env(code: str) -> dict:
    """Globals after running ``code`` as a notebook cell (compiled as ``<cell 1>``, as the grader does)."""
    env: dict = {"__name__": "notebook"}
    exec(compile(code, "<cell 1>", "exec"), env)
    return env


#: Captures of the reference that own_work must see (issue 35): each defines ``f``.
CAPTURES = {
    "closure": "from kvdro import newsvendor as nv\ndef make():\n    ref = nv.saa_reservation\n"
               "    def f(x, c_p, c_w):\n        return ref(x, c_p, c_w)\n    return f\nf = make()",
    "default": "from kvdro.newsvendor import saa_reservation\ndef f(x, c_p, c_w, ref=saa_reservation):\n"
               "    return ref(x, c_p, c_w)",
    "partial": "import functools\nfrom kvdro import newsvendor as nv\nf = functools.partial(nv.saa_reservation)",
    "callable object": "from kvdro import newsvendor as nv\nclass B:\n    def __init__(self, r):\n        self.r = r\n"
                       "    def __call__(self, x, c_p, c_w):\n        return self.r(x, c_p, c_w)\nf = B(nv.saa_reservation)",
    "container": "from kvdro import newsvendor as nv\nREFS = [nv.saa_reservation]\ndef f(x, c_p, c_w):\n"
                 "    return REFS[0](x, c_p, c_w)",
    "helper's closure": "from kvdro import newsvendor as nv\ndef make():\n    ref = nv.saa_reservation\n"
                        "    return lambda x, c_p, c_w: ref(x, c_p, c_w)\nhelper = make()\n"
                        "def f(x, c_p, c_w):\n    return helper(x, c_p, c_w)",
}


@pytest.mark.parametrize("route", sorted(CAPTURES))
def test_own_work_sees_every_capture(route):
    from kit_guard import ReferenceUsed, own_work

    env = _cell_env(CAPTURES[route])
    with pytest.raises(AssertionError) as info:
        guarded = own_work(env["f"], "kvdro.newsvendor")
        guarded([1.0, 2.0, 3.0], 1.0, 1.0)
    assert isinstance(info.value, ReferenceUsed) or "written in your notebook" in str(info.value), str(info.value)


def test_own_work_disables_the_reference_as_an_object_and_judges_kvdro_by_file():
    """A reference reached in a way no inspection sees (here: a name the code builds) still fails at the
    call, because the function object itself is disabled; code compiled under a kvdro ``__name__`` is not
    kvdro's (its file is a cell); kvdro's own internal calls still run."""
    import numpy as np

    from kit_guard import ReferenceUsed, own_work
    from kvdro import newsvendor, wasserstein

    env = _cell_env("import kvdro.newsvendor\ndef f(x, c_p, c_w):\n"
                    "    return vars(kvdro)['newsvendor'].__dict__['saa_' + 'reservation'](x, c_p, c_w)")
    env["vars"] = vars
    with pytest.raises(ReferenceUsed, match="called kvdro.newsvendor.saa_reservation"):
        own_work(env["f"], "kvdro.newsvendor")([1.0, 2.0, 3.0], 1.0, 1.0)
    fake = {"__name__": "kvdro.newsvendor"}
    exec(compile("from kvdro.newsvendor import critical_fractile as cf\ndef f(c_p, c_w):\n    return g(c_p / c_w)\n"
                 "g = lambda r: cf(r)", "<cell 2>", "exec"), fake)
    with pytest.raises(ReferenceUsed):
        own_work(fake["f"], "kvdro.newsvendor")(3.0, 1.0)
    x = np.arange(1.0, 11.0)
    env = _cell_env("def f(x, c_p, c_w, L):\n    return wasserstein.dro_reservation(x, c_p, c_w, 1.0, L)")
    env["wasserstein"] = wasserstein  # dro_reservation calls newsvendor internally: allowed (kvdro's own file)
    assert own_work(env["f"], "kvdro.newsvendor")(x, 4.0, 1.0, 20.0) == wasserstein.dro_reservation(x, 4.0, 1.0, 1.0, 20.0)
    assert newsvendor.saa_reservation(x, 4.0, 1.0) == 8.0, "the reference is restored after the guarded call"


def test_a_test_reads_plain_data_and_no_student_exception_text():
    """What a test receives from a notebook function is plain data (an object of the notebook's own class
    could claim to equal anything); a failed test shows the test's own hint, or the type and place of
    the student's exception, never its text."""
    env = _cell_env("class Anything(float):\n    def __eq__(self, other):\n        return True\n"
                    "def g(c_p, c_w):\n    return Anything(0.0)\n"
                    "def h(c_p, c_w):\n    raise RuntimeError('SECRET: the hidden seed is 101')\n"
                    "def k(c_p, c_w):\n    return c_p / (c_p + c_w)")
    test = ("from otter.test_files import test_case\nOK_FORMAT = False\nname = 'q2'\npoints = 1\n"
            "@test_case(points=1, hidden=True)\ndef test_q(f):\n    assert f(1.0, 1.0) == 0.5, 'q* of equal costs is 1/2'\n")
    out = {}
    for name in ("g", "h", "k"):
        out[name] = kit_grade.run_tests({"f": env[name]}, {"q2": test})["q2"]["test_q"]
    assert out["k"] == [True, ""]
    assert out["g"][0] is False and "class your notebook defines" in out["g"][1], out["g"]
    assert out["h"][0] is False and "RuntimeError" in out["h"][1] and "SECRET" not in out["h"][1], out["h"]
    assert "cell 1" in out["h"][1], out["h"]


def test_the_audit_set_has_the_issue_s_size_and_every_route():
    """book/assignments/audit.py (run by hand: it grades each submission in the worker, minutes in all)
    holds >= 5 correct submissions and >= 26 wrong or gamed ones, each gamed one expected below full marks."""
    import audit

    kinds = [s.kind for s in audit.SUBMISSIONS]
    assert kinds.count("correct") >= 5 and kinds.count("mistake") + kinds.count("gamed") >= 26, kinds
    assert all(s.refused or s.lose for s in audit.SUBMISSIONS if s.kind != "correct")
    labels = " ".join(s.label for s in audit.SUBMISSIONS)
    for route in ("otter", "np.isclose", "kit_guard", "exec", "closure", "default argument", "partial",
                  "callable object", "hidden tests", "pasted"):
        assert route in labels, route


def test_every_handout_cell_the_student_may_edit_passes_the_pass(kit):
    """The masters' answers are graded, not refused: the pass finds nothing in the cells a student may
    edit (the handout's own cells are trusted), and the worker skips otter's and the install cell."""
    for name in ASSIGNMENTS:
        with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
            hand = json.loads(zf.read(kit_grade.HANDOUT_FILE))
        import nbformat

        for nb_path in (kit / name / "autograder" / f"{name}.ipynb", kit / name / "student" / f"{name}.ipynb"):
            run, read = kit_grade.cells_to_run(nbformat.read(nb_path, as_version=4), hand)
            assert kit_static.refusals(read) == [], (nb_path.name, kit_static.refusals(read))
            assert not any("import otter" in src or "find_spec" in src for _, src in run), nb_path


# ----------------------------------------------------------------------------------------- the graders' rules
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_hidden_results_shown_and_public_tests_earn_at_most_a_fifth(kit, name):
    """D5: students see the hidden tests' messages once grades are published; D6: public tests carry at most
    20 % of a question's points (here none), so an answer tuned to them earns nothing."""
    with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
        config = json.loads(zf.read("otter_config.json"))
        assert config["show_hidden"] is True, config
        assert config["plugins"] == ["kit_grade.KitGrader"], "grading runs out of the student's kernel (kit_grade.py)"
        names = set(zf.namelist())
        assert {"kit_grade.py", "kit_static.py", "kit_guard.py", "kit_handout.json"} <= names, "the grader sits at the zip's root"
        assert not any(n.startswith("files/kit_") for n in names), "no grader file in the submission's folder"
    from otter.test_files import ExceptionTestFile

    for question, points in _autograded(name).items():
        tests = ExceptionTestFile.from_string(_test_file(kit, name, question), path=f"{question}.py")
        public = sum(tc.points for tc in tests.test_cases if not tc.hidden)
        assert sum(tc.points for tc in tests.test_cases) == pytest.approx(points)
        assert public <= 0.2 * points, f"{name}/{question}: public tests carry {public} of {points} points"


def test_a3_course_instance_binds_the_memory_constraint():
    """D3: at the course instance's optimum (6e) holds with equality on a deployed configuration, and the
    memory model without L_in has another optimum (so a wrong (6e) changes the answer)."""
    import numpy as np

    env = _master_env("a3_joint_milp")
    d = env["data"]
    v, cons, fixed = env["base_model"](d)
    memory, cost = env["memory_and_reservation_cost"](d, v)
    problem = env["cp"].Problem(env["cp"].Minimize(cost + fixed), cons + memory + env["disaggregated_links"](d, v))
    value, _ = env["solve"](problem)
    z = np.round(v["z"].value)
    slack = [float(-np.sum(c.expr.value)) / (d["M"][k] * z[k]) for k, c in enumerate(memory) if z[k] > 0]
    assert min(slack) <= 1e-6, f"(6e) has relative slack {slack} at the optimum z = {z}: it does not bind"
    wrong = _notebook_env(env)
    exec(compile(A3_NO_LIN, "<no L_in>", "exec"), wrong)
    other, _ = wrong["solve"](wrong["build"](d, wrong["disaggregated_links"]))
    assert other < value * (1 - 1e-4), f"without L_in in (6e) the optimum {other} equals the right one {value}"


def test_a5_slice_is_the_chapter_memory_point():
    """a5 names the memory point itself (a wheel install has no data/ cache); it must be the chapter's."""
    from kvdro.sim import regimes

    env = _master_env("a5_answer")
    point = regimes.OPERATING_POINTS["memory"]
    assert env["MEMORY_POINT"] == {"deployment": point.deployment_label, "load": point.scale}
    assert env["vllm_run"].metrics["preemptions"] > 0, "vLLM must preempt on a5's slice (memory binds)"


def test_a6_slice_separates_the_engine_that_reserves_from_the_one_that_does_not():
    """a6's written question asks why knowing the length is worth nothing to vllm-v1 through max_new and
    where the DRO estimate lands between unset and true in trtllm-gne: the handout's slice must show both."""
    env = _master_env("a6_engines")
    table, dro = env["table"], env["dro_runs"]["trtllm-gne"].metrics["goodput_rps"]
    assert table.loc["vllm-v1", "value_lower_bound"] == 0.0, table
    assert table.loc["trtllm-gne", "unset"] < dro < table.loc["trtllm-gne", "true"], (table, dro)
    assert env["dro_runs"]["trtllm-gne"].metrics["capped"] > 0, "the DRO estimate caps some requests on the slice"


def test_a4_design_paragraph_is_graded_by_hand():
    """D4: the design paragraph of a4 is a written question of its own, with points and a rubric."""
    qs = {q["name"]: q for q in build.questions(build.masters()["a4_policy"])}
    assert qs["q2b"]["manual"] and qs["q2b"]["points"] >= 1, qs


if __name__ == "__main__":  # the grading table: python tests/test_assignments.py [KIT_DIR]
    import contextlib
    import io
    import tempfile

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    if not (out / "index.json").exists():
        build.build(out, pdfs=False)
    print("| assignment | question | submission | expected | got |\n|---|---|---|---|---|")
    for name, question, label, code, score, *_ in GRADING_TABLE:
        with contextlib.redirect_stdout(io.StringIO()):
            got, possible, public_text, hidden_text = grade_submission(out, name, question, code)
        print(f"| {name} | {question} | {label} | {score:g}/{possible:g} | {got:g}/{possible:g} |")
