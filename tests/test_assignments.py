"""The course kit (book/assignments): masters, student notebooks and otter-grader autograders.

Built once per session into a temporary folder with the same code as ``make assignments``. For
every assignment: the master's solutions get full points from ``otter run`` (public and hidden
tests); the student notebook runs top to bottom without error (``otter run --debug`` stops on any
error) and scores zero; the student notebook contains no solution line and no hidden test; plausible
wrong answers get a message that says what is wrong. Needs the real traces (``KVDRO_DATA_DIR``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kvdro_course_build", ROOT / "book" / "assignments" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

ASSIGNMENTS = sorted(build.masters())


# ----------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def kit(tmp_path_factory, data_dir) -> Path:
    """Every assignment built by book/assignments/build.py into a temporary folder."""
    out = tmp_path_factory.mktemp("assignments")
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    try:
        build.build(out)
        yield out
    finally:
        mp.undo()


def _otter_run(kit: Path, name: str, notebook: Path, out: Path, *, debug: bool = False) -> dict[str, tuple[float, float]]:
    """Grade ``notebook`` with ``otter run`` (no Docker); return {question: (score, max_score)}."""
    zip_path = kit / name / "autograder" / f"{name}-autograder.zip"
    cmd = [sys.executable, "-m", "otter", "run", "--no-logo", "-a", str(zip_path), "-o", str(out), str(notebook)]
    if debug:
        cmd.insert(4, "--debug")
    run = subprocess.run(cmd, capture_output=True, text=True)  # inherits KVDRO_DATA_DIR (set by ``kit``)
    assert run.returncode == 0, f"otter run failed on {notebook.name} (debug={debug}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    results = json.loads((out / "results.json").read_text())
    return {t["name"]: (float(t["score"]), float(t["max_score"])) for t in results["tests"] if "max_score" in t}


def _autograded(name: str) -> dict[str, float]:
    return {q["name"]: float(q["points"]) for q in build.questions(build.masters()[name]) if not q["manual"]}


def _test_file(kit: Path, name: str, question: str) -> str:
    with zipfile.ZipFile(kit / name / "autograder" / f"{name}-autograder.zip") as zf:
        return zf.read(f"tests/{question}.py").decode()


_ENVS: dict[str, dict] = {}


def _master_env(name: str) -> dict:
    """The globals after running every code cell of the master (solutions and test cells) in-process."""
    if name not in _ENVS:
        nb = jupytext.read(build.masters()[name])
        env: dict = {"__name__": f"master_{name}", "display": lambda *a, **k: None}
        for cell in nb.cells:
            if cell.cell_type == "code":
                exec(compile(cell.source, f"<{name} master>", "exec"), env)
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


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_first_code_cell_installs_kvdro_only_where_missing(kit, name):
    """Colab: the first code cell of the master and of the student notebook (before otter's ``import otter``)
    clones this repository (the URL of _config.yml) and installs it with otter-grader, guarded by
    ``find_spec("kvdro") is None`` so that it does nothing in a clone, in CI or in the autograder."""
    import yaml

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    first = next(c for c in jupytext.read(build.masters()[name]).cells if c.cell_type == "code").source
    student = json.loads((kit / name / "student" / f"{name}.ipynb").read_text())
    assert "".join(student["cells"][0]["source"]) == first, "the student notebook must start with the install cell"
    assert 'if importlib.util.find_spec("kvdro") is None:' in first and f'"{url}"' in first, first
    assert "otter-grader==7.0.0" in first and "otter-grader==7.0.0" in (ROOT / "pyproject.toml").read_text()
    env: dict = {}
    exec(compile(first, "<install cell>", "exec"), env)  # kvdro is installed here: nothing may run
    assert "repo" not in env, "the install cell ran although kvdro is installed"


# ----------------------------------------------------------------------------------------- grading
#: ``otter run`` processes at once: each grades one notebook in its own kernel (one core each).
GRADING_WORKERS = 2


@pytest.fixture(scope="module")
def graded(kit, tmp_path_factory) -> dict[tuple[str, str], Future]:
    """Every master and every blank student notebook graded by ``otter run``, :data:`GRADING_WORKERS`
    at a time: {(name, "master" | "student"): future of :func:`_otter_run`'s scores}. A failed run
    raises in the test that reads it."""
    jobs = {}
    with ThreadPoolExecutor(GRADING_WORKERS) as pool:
        for name in ASSIGNMENTS:
            jobs[(name, "master")] = pool.submit(_otter_run, kit, name, kit / name / "autograder" / f"{name}.ipynb",
                                                 tmp_path_factory.mktemp(f"{name}-master"))
            # --debug: otter stops (non-zero exit) on the first cell that raises, so the blank notebook's
            # run also proves that it runs top to bottom
            jobs[(name, "student")] = pool.submit(_otter_run, kit, name, kit / name / "student" / f"{name}.ipynb",
                                                  tmp_path_factory.mktemp(f"{name}-student"), debug=True)
        wait(jobs.values())
    return jobs


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


# ----------------------------------------------------------------------------------------- helpful messages
#: (assignment, question, a plausible wrong answer, words the failure message must contain, the score the
#: answer gets on that question, whether a PUBLIC test (the one a student sees) must say it). Each answer is
#: run against the question's public and hidden tests in the master's environment, as otter does.
WRONG_ANSWERS = [
    ("a1_newsvendor", "q1", """
def cost_slope(samples, eta, c_p, c_w):
    return (c_p + c_w) * np.mean(np.asarray(samples) <= eta) - c_w
""", "slope starts at -c_p", 0.0, False),
    ("a1_newsvendor", "q2", """
def critical_fractile(c_p, c_w):
    return c_w / (c_p + c_w)
""", "1 - q*: the roles of c_p and c_w are swapped", 0.0, True),
    ("a1_newsvendor", "q3", """
def saa_buffer(samples, c_p, c_w):
    return float(np.quantile(samples, c_w / (c_p + c_w), method="inverted_cdf"))
""", "quantile at 1 - q*", 0.0, True),
    ("a1_newsvendor", "q3", """
def saa_buffer(samples, c_p, c_w):
    return float(np.quantile(samples, c_p / (c_p + c_w)))
""", "LOWER empirical quantile", 0.0, True),
    ("a1_newsvendor", "q4", """
def saa_lp(samples, c_p, c_w):
    xi = np.asarray(samples, dtype=float)
    eta, theta = cp.Variable(), cp.Variable(xi.size)
    cons = [theta >= c_w * (xi - eta), theta >= c_p * (eta - xi)]
    return cp.Problem(cp.Minimize(cp.sum(theta) / xi.size), cons), eta
""", "1 - q* quantile", 0.0, True),
    # gaming: the reference package's number wrapped in a problem, no dual written
    ("a2_wasserstein", "q1", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    return cp.Problem(cp.Minimize(wasserstein.worst_case_cost(samples, eta, c_p, c_w, eps, L_max)))
""", "is not a dual", 0.0, True),
    # gaming: the reference package's own dual problem (it merges equal samples)
    ("a2_wasserstein", "q1", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    return wasserstein.dual_problem(samples, eta, c_p, c_w, eps, L_max).problem
""", "one entry per sample", 0.0, True),
    ("a2_wasserstein", "q1", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi),
            theta >= c_p * (L_max - eta) + gamma * (L_max - xi), theta >= c_w * eta + gamma * xi]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
""", "SIGN of the gamma", 0.0, True),
    ("a2_wasserstein", "q1", """
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi)]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
""", "violate (8e), (8f)", 0.0, True),
    # upstream failure: the dual was never solved, so its value is None (was "ufunc 'isfinite' not supported")
    ("a2_wasserstein", "q3", """
wc_dual = dual_lp(xi_small, eta_saa, C_P, C_W, eps_paper, L_MAX).value
""", "wc_dual is None", 0.0, True),
    ("a2_wasserstein", "q4", """
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    return 0.15 * float(np.mean(samples))  # the paper's radius, not the threshold
""", "not by a formula for the radius", 0.0, True),
    ("a3_joint_milp", "q1", """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum(d["lam"][i] * d["H"][i, k] * (d["L_in"][i] + d["eta"][i]) @ v["w"][i][k] for i in range(I))
              <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", "factor 1 + kappa", 1.0, False),
    ("a3_joint_milp", "q1", """
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum((1 + d["kappa"]) * d["lam"][i] * d["T"][i, k] * (d["L_in"][i] + d["eta"][i]) @ v["w"][i][k]
                  for i in range(I)) <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
""", "residence time H", 1.0, False),
    ("a3_joint_milp", "q2", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] <= v["pi"][i, k])]
""", "w >= pi + x - 1 is missing", 0.0, True),
    # was 11/11: the old tests checked only points with x = 1
    ("a3_joint_milp", "q2", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["pi"][i, k], v["w"][i][k] >= v["pi"][i, k] + v["x"][i] - 1)]
""", "w <= x is missing", 0.0, True),
    ("a3_joint_milp", "q2", """
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] >= v["pi"][i, k] + v["x"][i] - 1)]
""", "w <= pi is missing", 0.0, True),
    ("a3_joint_milp", "q3", """
def disaggregated_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] <= v["pi"][i, k])]
""", "sum_c w_ikc = pi", 0.0, True),
    ("a3_joint_milp", "q3", """
def disaggregated_links(d, v):
    return [cp.sum(v["w"][i][k]) == v["pi"][i, k] for i in range(len(d["lam"])) for k in range(len(d["M"]))]
""", "w <= x is missing", 0.0, True),
    # upstream failure: the q4 cell stopped in its first solve (was "KeyError: 'mccormick'")
    ("a3_joint_milp", "q4", """
results = {}
""", "results has no entry 'mccormick'", 0.0, True),
    ("a4_policy", "q1", """
def holdout(trace, n_test):
    mid = len(trace) // 2
    test = trace.iloc[mid:mid + n_test]
    return trace.iloc[:mid], test.assign(arrival_s=test["arrival_s"] - test["arrival_s"].min())
""", "BY ARRIVAL TIME", 1.0, False),
    ("a4_policy", "q2", """
def my_buffers(train, rho):
    return {str(c): float(np.quantile(p["output_tokens"], 1 / (rho + 1), method="inverted_cdf"))
            for c, p in train.groupby("request_class")}
""", "never make the policy reserve less", 1.0, False),
    ("a4_policy", "q3", """
def evaluate(test, policies, *, rho, seed, deployment):
    rng = np.random.default_rng(seed)  # one generator shared by every policy
    rows = {label: simulate(test, policy="vllm" if b is None else "saa", buffers=b, deployment=deployment,
                            rho=rho, rng=rng).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", "own np.random.default_rng(seed)", 1.0, False),
    ("a4_policy", "q3", """
def evaluate(test, policies, *, rho, seed, deployment):
    rows = {label: simulate(test, policy="vllm" if b is None else "dro", buffers=None, deployment=deployment,
                            rho=rho, rng=np.random.default_rng(seed)).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", "refits the buffers on the TEST trace", 1.0, False),
    ("a4_policy", "q3", """
def evaluate(test, policies, *, rho, seed, deployment):
    rows = {label: simulate(test, policy="vllm" if b is None else "saa", buffers=b, deployment=deployment,
                            rng=np.random.default_rng(seed)).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
""", "pass rho to simulate", 1.0, False),
]


def grade_wrong_answer(kit: Path, name: str, question: str, wrong: str) -> tuple[float, float, str, str]:
    """Run a question's tests (public and hidden) on the master's environment with ``wrong`` executed
    on top; return (score, possible, messages of failed public tests, messages of failed hidden tests)."""
    from otter.test_files import ExceptionTestFile

    tests = ExceptionTestFile.from_string(_test_file(kit, name, question), path=f"{question}.py")
    right = dict(_master_env(name))
    tests.run(right)
    assert all(r.passed for r in tests.test_case_results), f"{name}/{question}: the master fails its own tests"
    env = dict(right)
    exec(compile(wrong, f"<wrong {name}/{question}>", "exec"), env)
    tests.run(env)
    failed = [r for r in tests.test_case_results if not r.passed]
    text = {True: "", False: ""}
    for r in failed:
        text[bool(r.test_case.hidden)] += (r.message or "") + (r.test_case.failure_message or "") + "\n"
    return float(tests.score), float(tests.possible), text[False], text[True]


@pytest.mark.parametrize(
    "name, question, wrong, hint, score, public",
    WRONG_ANSWERS,
    ids=[f"{a}-{q}-{i}" for i, (a, q, *_) in enumerate(WRONG_ANSWERS)],
)
def test_wrong_answer_gets_a_helpful_message(kit, name, question, wrong, hint, score, public):
    got, possible, public_text, hidden_text = grade_wrong_answer(kit, name, question, wrong)
    assert public_text or hidden_text, f"{name}/{question}: the wrong answer passes every test"
    assert got < possible, f"{name}/{question}: the wrong answer keeps all {possible} points"
    if score is not None:
        assert got == pytest.approx(score), f"{name}/{question}: the wrong answer scores {got}/{possible}, expected {score}"
    where = public_text if public else public_text + hidden_text
    assert hint in where, (
        f"{name}/{question}: the {'public ' if public else ''}message does not say {hint!r}:\n"
        f"public: {public_text}\nhidden: {hidden_text}"
    )
    assert "Traceback" not in public_text and "KeyError" not in public_text and "ufunc" not in public_text, (
        f"{name}/{question}: a confusing error reaches the student:\n{public_text}"
    )


if __name__ == "__main__":  # the grading table of WRONG_ANSWERS: python tests/test_assignments.py [KIT_DIR]
    import contextlib
    import io
    import tempfile

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    if not (out / "index.json").exists():
        build.build(out, pdfs=False)
    print("| assignment | question | score | first message the student sees (public) |\n|---|---|---|---|")
    for name, question, wrong, *_ in WRONG_ANSWERS:
        with contextlib.redirect_stdout(io.StringIO()):
            got, possible, public_text, hidden_text = grade_wrong_answer(out, name, question, wrong)
        lines = [ln[len("AssertionError: "):] for ln in public_text.splitlines() if ln.startswith("AssertionError: ")]
        print(f"| {name} | {question} | {got:g}/{possible:g} | {lines[0] if lines else '(public tests pass)'} |")
