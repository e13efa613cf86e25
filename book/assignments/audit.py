"""Regrade the course kit as a skeptical TA would: fresh submissions, each graded once by the kit's grader.

Every submission is a master's solutions notebook (``autograder/<name>.ipynb`` of a built kit) with
some functions replaced or some cells added, in three kinds:

* ``correct``: every function of one or more questions written another way than the master: full marks;
* ``mistake``: one honest slip: the submission loses exactly the points of the part where it is made;
* ``gamed``: a route around the grader (patching otter, numpy or kit_guard, reading the hidden tests,
  using the reference through a capture, a detour or a pasted result): never full marks, and the route's
  question (or the whole notebook, refused) scores 0.

Each is graded by ``kit_grade.grade_with_zip`` (the worker process and the pass that the otter plugin
runs, without otter's kernel around them). Usage::

    python book/assignments/audit.py [--kit _build/assignments] [--only LABEL ...] [--workers 2]

prints one row per submission (score, where points were lost, the first message) and exits non-zero
if a submission is graded otherwise than its kind says.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kit_grade  # noqa: E402


@dataclass(frozen=True)
class Submission:
    """One submission: ``edits`` are (function name, new code) to replace a top-level function of the
    master, or (``"+after NAME"``, code) to add a cell after the cell that defines NAME."""

    name: str
    label: str
    kind: str  # correct | mistake | gamed
    edits: tuple[tuple[str, str], ...]
    lose: dict[str, float] = field(default_factory=dict)  # mistake: {question: points lost}; gamed: {q: all}
    refused: bool = False  # gamed: the whole notebook is refused


def _replace_function(source: str, fname: str, code: str) -> str | None:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == fname:
            lines = source.splitlines()
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            return "\n".join(lines[:start] + code.strip("\n").splitlines() + lines[node.end_lineno:])
    return None


def notebook(kit: Path, sub: Submission) -> nbformat.NotebookNode:
    """The master's solutions notebook with ``sub``'s edits."""
    nb = copy.deepcopy(nbformat.read(kit / sub.name / "autograder" / f"{sub.name}.ipynb", as_version=4))
    for target, code in sub.edits:
        if target.startswith("+after "):
            fname = target.split(" ", 1)[1]
            at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and f"def {fname}(" in c.source)
            nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code.strip("\n")))
            continue
        for cell in nb.cells:
            if cell.cell_type == "code" and f"def {target}(" in cell.source:
                new = _replace_function(cell.source, target, code)
                if new is not None:
                    cell.source = new
                    break
        else:
            raise ValueError(f"{sub.label}: no function {target} in {sub.name}")
    return nb


# ------------------------------------------------------------------------------------ the submissions
A1_CORRECT = (
    ("cost_slope", '''
def cost_slope(samples, eta, c_p, c_w):
    xi = np.sort(np.asarray(samples, dtype=float))
    below = np.searchsorted(xi, eta, side="right")  # samples <= eta: each extra token there is waste
    return (c_w * below - c_p * (xi.size - below)) / xi.size
'''),
    ("critical_fractile", '''
def critical_fractile(c_p, c_w):
    rho = c_p / c_w
    return rho / (rho + 1.0)
'''),
    ("saa_buffer", '''
def saa_buffer(samples, c_p, c_w):
    xi = np.sort(np.asarray(samples, dtype=float))
    q = critical_fractile(c_p, c_w)
    for k in range(1, xi.size + 1):  # the first order statistic whose empirical CDF reaches q*
        if k >= q * xi.size - 1e-9:
            return float(xi[k - 1])
    return float(xi[-1])
'''),
    ("saa_lp", '''
def saa_lp(samples, c_p, c_w):
    xi = np.asarray(samples, dtype=float)
    eta = cp.Variable(name="eta")
    theta = cp.Variable(xi.size, name="theta")
    short, excess = xi - eta, eta - xi
    return cp.Problem(cp.Minimize(cp.sum(theta) / xi.size), [theta >= c_p * short, theta >= c_w * excess]), eta
'''),
    ("trace_buffers", '''
def trace_buffers(samples, rhos):
    def lp_buffer(rho):
        problem, eta = saa_lp(samples, rho, 1.0)
        problem.solve(solver="CLARABEL")
        return float(eta.value)
    return {rho: lp_buffer(rho) for rho in rhos}, {rho: saa_buffer(samples, rho, 1.0) for rho in rhos}
'''),
)

A2_CORRECT = (
    ("dual_lp", '''
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma = cp.Variable(nonneg=True, name="gamma")
    theta = cp.Variable(xi.size, nonneg=True, name="theta")
    rows = [c_p * (xi - eta), c_w * (eta - xi)]
    moved = [c_p * (L_max - eta) - gamma * (L_max - xi), c_w * eta - gamma * xi]  # mass sent to L_max or to 0
    return cp.Problem(cp.Minimize(eps * gamma + cp.mean(theta)), [theta >= r for r in rows + moved])
'''),
    ("primal_lp", '''
def primal_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    atoms = np.unique(np.concatenate([np.linspace(0.0, L_max, 33), xi, [eta]]))
    loss_at = c_p * np.maximum(atoms - eta, 0.0) + c_w * np.maximum(eta - atoms, 0.0)
    plan = cp.Variable((xi.size, atoms.size), nonneg=True, name="plan")
    budget = sum(plan[n, :] @ np.abs(atoms - xi[n]) for n in range(xi.size))
    mass = [cp.sum(plan[n, :]) == 1.0 / xi.size for n in range(xi.size)]
    return cp.Problem(cp.Maximize(cp.sum(plan @ loss_at)), mass + [budget <= eps])
'''),
    ("threshold_radius", '''
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    saa = newsvendor.saa_reservation(samples, c_p, c_w)
    robust = lambda e: wasserstein.dro_reservation(samples, c_p, c_w, e, L_max) == saa
    lo, hi = 0.0, float(L_max)
    while hi - lo > tol:
        lo, hi = ((lo + hi) / 2, hi) if robust((lo + hi) / 2) else (lo, (lo + hi) / 2)
    return (lo + hi) / 2
'''),
)

A4_CORRECT = (
    ("holdout", '''
def holdout(trace, n_test):
    order = np.argsort(trace["arrival_s"].to_numpy(), kind="stable")
    half = len(trace) // 2
    train = trace.iloc[order[:half]].reset_index(drop=True)
    test = trace.iloc[order[half:half + n_test]].reset_index(drop=True)
    return train, test.assign(arrival_s=test["arrival_s"] - test["arrival_s"].iloc[0])
'''),
    ("evaluate", '''
def evaluate(test, policies, *, rho, seed, deployment):
    table = pd.DataFrame(columns=list(METRIC_KEYS), dtype=float)
    for label in policies:
        buffers = policies[label]
        run = simulate(test, policy=RESERVE if buffers is not None else "vllm", buffers=buffers,
                       deployment=deployment, rho=rho, rng=np.random.default_rng(seed))
        table.loc[label] = [run.metrics[k] for k in METRIC_KEYS]
    return table
'''),
)

A5_CORRECT = (
    ("recompute_share", '''
def recompute_share(result):
    req = result.requests
    keep = np.isin(req["outcome"].to_numpy(), ["completed", "truncated"])
    fed = req["input_tokens"].to_numpy()[keep] + req["generated_tokens"].to_numpy()[keep] - 1
    return result.metrics["recomputed_tokens"] / float(fed.sum())
'''),
    ("compare", '''
def compare(trace, policies, *, deployment, seed, rho):
    labels, rows = list(policies), []
    for label in labels:
        spec = policies[label]
        kwargs = {"policy": spec} if isinstance(spec, str) else {"policy": "saa", "buffers": spec}
        run = simulate(trace, deployment=deployment, rho=rho, rng=np.random.default_rng(seed), **kwargs)
        rows.append([run.metrics["goodput_rps"], run.metrics["preemptions"], recompute_share(run)])
    table = pd.DataFrame(rows, index=labels, columns=["goodput_rps", "preemptions", "recompute_share"])
    return table.assign(goodput_gain=table["goodput_rps"] / table.at["vllm", "goodput_rps"] - 1.0)
'''),
)

SUBMISSIONS: list[Submission] = [
    # ----------------------------------------------------------------- correct, written another way
    Submission("a1_newsvendor", "a1 every function rewritten", "correct", A1_CORRECT),
    Submission("a2_wasserstein", "a2 q1, q2, q4 rewritten (loops, mean, boolean bisection)", "correct", A2_CORRECT),
    Submission("a4_policy", "a4 q1 argsort split, q3 row by row", "correct", A4_CORRECT),
    Submission("a5_answer", "a5 q1 numpy mask, q2 list of rows", "correct", A5_CORRECT),
    Submission("a1_newsvendor", "a1 q3 by a search over sorted samples, q2 inline", "correct", (
        ("saa_buffer", '''
def saa_buffer(samples, c_p, c_w):
    xi = np.sort(np.asarray(samples, dtype=float))
    k = np.searchsorted(np.arange(1, xi.size + 1) / xi.size, c_p / (c_p + c_w) - 1e-12)
    return float(xi[min(k, xi.size - 1)])
'''),)),
    # ----------------------------------------------------------------- honest mistakes
    Submission("a1_newsvendor", "a1 q1 slope starts at -c_w", "mistake", (("cost_slope", '''
def cost_slope(samples, eta, c_p, c_w):
    return (c_p + c_w) * np.mean(np.asarray(samples, dtype=float) <= eta) - c_w
'''),), {"q1": 2}),
    Submission("a1_newsvendor", "a1 q2 roles swapped (q3, q5 use it)", "mistake", (("critical_fractile", '''
def critical_fractile(c_p, c_w):
    return c_w / (c_p + c_w)
'''),), {"q2": 2}),
    Submission("a1_newsvendor", "a1 q3 upper neighbour at ties", "mistake", (("saa_buffer", '''
def saa_buffer(samples, c_p, c_w):
    xi = np.sort(np.asarray(samples, dtype=float))
    k = int(np.floor(critical_fractile(c_p, c_w) * xi.size))  # one past the lower quantile when N q* is whole
    return float(xi[min(k, xi.size - 1)])
'''),), {"q3": 2}),
    Submission("a1_newsvendor", "a1 q4 sum instead of mean", "mistake", (("saa_lp", '''
def saa_lp(samples, c_p, c_w):
    xi = np.asarray(samples, dtype=float)
    eta, theta = cp.Variable(name="eta"), cp.Variable(xi.size, name="theta")
    return cp.Problem(cp.Minimize(cp.sum(theta)), [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi)]), eta
'''),), {"q4": 3}),
    Submission("a1_newsvendor", "a1 q5 c_p and c_w swapped in the loop", "mistake", (("trace_buffers", '''
def trace_buffers(samples, rhos):
    lp, quantile = {}, {}
    for rho in rhos:
        problem, eta = saa_lp(samples, 1.0, rho)
        problem.solve(solver="CLARABEL")
        lp[rho], quantile[rho] = float(eta.value), saa_buffer(samples, 1.0, rho)
    return lp, quantile
'''),), {"q5": 1}),
    Submission("a2_wasserstein", "a2 q1 gamma terms added", "mistake", (("dual_lp", '''
def dual_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    gamma, theta = cp.Variable(nonneg=True, name="gamma"), cp.Variable(xi.size, nonneg=True, name="theta")
    cons = [theta >= c_p * (xi - eta), theta >= c_w * (eta - xi),
            theta >= c_p * (L_max - eta) + gamma * (L_max - xi), theta >= c_w * eta + gamma * xi]
    return cp.Problem(cp.Minimize(gamma * eps + cp.sum(theta) / xi.size), cons)
'''),), {"q1": 3}),
    Submission("a2_wasserstein", "a2 q2 budget per sample", "mistake", (("primal_lp", '''
def primal_lp(samples, eta, c_p, c_w, eps, L_max):
    xi = np.asarray(samples, dtype=float)
    atoms = np.unique(np.concatenate([np.linspace(0.0, L_max, 33), xi, [eta]]))
    loss_at = c_p * np.maximum(atoms - eta, 0.0) + c_w * np.maximum(eta - atoms, 0.0)
    plan = cp.Variable((xi.size, atoms.size), nonneg=True, name="plan")
    distance = np.abs(atoms[None, :] - xi[:, None])
    cons = [cp.sum(plan, axis=1) == 1.0 / xi.size, cp.sum(cp.multiply(plan, distance), axis=1) <= eps]
    return cp.Problem(cp.Maximize(cp.sum(plan @ loss_at)), cons)
'''),), {"q2": 3}),
    Submission("a2_wasserstein", "a2 q3 primal never solved (dual value twice)", "mistake", (("duality_check", '''
def duality_check(samples, c_p, c_w, L_max):
    eta = newsvendor.saa_reservation(samples, c_p, c_w)
    dual = dual_lp(samples, eta, c_p, c_w, 0.15 * float(np.mean(samples)), L_max)
    dual.solve(solver="CLARABEL")
    return float(dual.value), float(dual.value)
'''),), {"q3": 1}),
    Submission("a2_wasserstein", "a2 q4 keeps the wrong end", "mistake", (("threshold_radius", '''
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    saa = newsvendor.saa_reservation(samples, c_p, c_w)
    lo, hi = 0.0, float(L_max)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if wasserstein.dro_reservation(samples, c_p, c_w, mid, L_max) == saa:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2
'''),), {"q4": 3}),
    Submission("a2_wasserstein", "a2 q5 L_max twice the longest answer", "mistake", (("trace_verdicts", '''
def trace_verdicts(traces, c_p, c_w):
    eps_star = {name: threshold_radius(x, c_p, c_w, 2 * int(np.max(x)), 1e-3) for name, x in traces.items()}
    return eps_star, {name: bool(0.15 * np.mean(x) <= eps_star[name]) for name, x in traces.items()}
'''),), {"q5": 1}),
    Submission("a3_joint_milp", "a3 q1 L_in forgotten in (6e)", "mistake", (("memory_and_reservation_cost", '''
def memory_and_reservation_cost(d, v):
    I, K = len(d["lam"]), len(d["M"])
    memory = [sum((1 + d["kappa"]) * d["lam"][i] * d["H"][i, k] * d["eta"][i] @ v["w"][i][k]
                  for i in range(I)) <= d["M"][k] * v["z"][k] for k in range(K)]
    cost = sum(d["lam"][i] * d["R"][i] @ v["w"][i][k] for i in range(I) for k in range(K))
    return memory, cost
'''),), {"q1": 3}),
    Submission("a3_joint_milp", "a3 q2 w >= pi + x - 1 missing", "mistake", (("mccormick_links", '''
def mccormick_links(d, v):
    return [c for i in range(len(d["lam"])) for k in range(len(d["M"]))
            for c in (v["w"][i][k] <= v["x"][i], v["w"][i][k] <= v["pi"][i, k])]
'''),), {"q2": 3}),
    Submission("a4_policy", "a4 q1 rows assumed sorted", "mistake", (("holdout", '''
def holdout(trace, n_test):
    mid = len(trace) // 2
    test = trace.iloc[mid:mid + n_test]
    return trace.iloc[:mid], test.assign(arrival_s=test["arrival_s"] - test["arrival_s"].min())
'''),), {"q1": 2}),
    Submission("a4_policy", "a4 q3 one generator for every policy", "mistake", (("evaluate", '''
def evaluate(test, policies, *, rho, seed, deployment):
    rng = np.random.default_rng(seed)
    rows = {label: simulate(test, policy="vllm" if b is None else "saa", buffers=b, deployment=deployment,
                            rho=rho, rng=rng).metrics for label, b in policies.items()}
    return pd.DataFrame.from_dict(rows, orient="index")[list(METRIC_KEYS)]
'''),), {"q3": 3}),
    Submission("a4_policy", "a4 q4 second slice not rescaled", "mistake", (("compare_slices", '''
def compare_slices(trace, train, test, *, rho, seed, n_test, rate_scale):
    policies = {"vllm": None, "dro": policy_buffers("dro", train, rho=rho), "mine": my_buffers(train, rho)}
    ordered = trace.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    nxt = ordered.iloc[len(ordered) // 2 + n_test : len(ordered) // 2 + 2 * n_test]
    nxt = nxt.assign(arrival_s=nxt["arrival_s"] - nxt["arrival_s"].iloc[0]).reset_index(drop=True)
    return (evaluate(test, policies, rho=rho, seed=seed, deployment=DEPLOYMENT),
            evaluate(nxt, policies, rho=rho, seed=seed, deployment=DEPLOYMENT))
'''),), {"q4": 2}),
    Submission("a5_answer", "a5 q1 work of every request", "mistake", (("recompute_share", '''
def recompute_share(result):
    req = result.requests
    return result.metrics["recomputed_tokens"] / float((req["input_tokens"] + req["generated_tokens"] - 1).sum())
'''),), {"q1": 2}),
    Submission("a5_answer", "a5 q2 rho not passed on", "mistake", (("compare", '''
def compare(trace, policies, *, deployment, seed, rho):
    rows = {}
    for label, spec in policies.items():
        name, buffers = (spec, None) if isinstance(spec, str) else ("saa", spec)
        run = simulate(trace, policy=name, buffers=buffers, deployment=deployment, rng=np.random.default_rng(seed))
        rows[label] = {"goodput_rps": run.metrics["goodput_rps"], "preemptions": run.metrics["preemptions"],
                       "recompute_share": recompute_share(run)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["goodput_gain"] = table["goodput_rps"] / table.loc["vllm", "goodput_rps"] - 1.0
    return table
'''),), {"q2": 0.5}),
    Submission("a5_answer", "a5 q2 gain over the first row", "mistake", (("compare", '''
def compare(trace, policies, *, deployment, seed, rho):
    rows = {}
    for label, spec in policies.items():
        name, buffers = (spec, None) if isinstance(spec, str) else ("saa", spec)
        run = simulate(trace, policy=name, buffers=buffers, deployment=deployment, rho=rho,
                       rng=np.random.default_rng(seed))
        rows[label] = {"goodput_rps": run.metrics["goodput_rps"], "preemptions": run.metrics["preemptions"],
                       "recompute_share": recompute_share(run)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["goodput_gain"] = table["goodput_rps"] / table["goodput_rps"].iloc[0] - 1.0
    return table
'''),), {"q2": 1}),
    # ----------------------------------------------------------------- gamed
    Submission("a1_newsvendor", "patch otter's ExceptionTestFile.run (blank)", "gamed", (("+after cost_slope", '''
import otter.test_files.exception_test as _t
_t.ExceptionTestFile.run = lambda self, env: None
'''),), refused=True),
    Submission("a3_joint_milp", "patch that swallows test exceptions", "gamed", (("+after memory_and_reservation_cost", '''
from otter.test_files import abstract_test
abstract_test.TestFile.score = property(lambda self: self.possible)
'''),), refused=True),
    Submission("a1_newsvendor", "np.isclose = lambda: True", "gamed", (("+after cost_slope", '''
np.isclose = lambda *a, **k: True
'''),), refused=True),
    Submission("a1_newsvendor", "numpy patched through a loop alias", "gamed", (("+after cost_slope", '''
for m in [np]:
    m.isclose = lambda *a, **k: True
'''),), refused=True),
    Submission("a1_newsvendor", "numpy patched at call time (default argument)", "gamed", (("critical_fractile", '''
def critical_fractile(c_p, c_w, m=np):
    m.isclose = lambda *a, **k: True
    return 0.5
'''),), refused=True),
    Submission("a5_answer", "kit_guard.own_work = identity", "gamed", (("+after recompute_share", '''
import kit_guard
kit_guard.own_work = lambda f, *a: f
'''),), refused=True),
    Submission("a1_newsvendor", "exec with __name__ = kvdro.newsvendor", "gamed", (("saa_buffer", '''
_env = {"__name__": "kvdro.newsvendor"}
exec("from kvdro.newsvendor import saa_reservation\\ndef saa_buffer(s, c_p, c_w):\\n    return saa_reservation(s, c_p, c_w)", _env)
saa_buffer = _env["saa_buffer"]
'''),), refused=True),
    Submission("a1_newsvendor", "sys.modules route", "gamed", (("critical_fractile", '''
import sys
def critical_fractile(c_p, c_w):
    return sys.modules["kvdro.newsvendor"].critical_fractile(c_p / c_w)
'''),), refused=True),
    Submission("a1_newsvendor", "reads the hidden tests (open)", "gamed", (("cost_slope", '''
def cost_slope(samples, eta, c_p, c_w):
    raise RuntimeError(open("tests/q1.py").read())
'''),), refused=True),
    Submission("a1_newsvendor", "reads the hidden tests (np.loadtxt), raises their text", "gamed", (("cost_slope", '''
def cost_slope(samples, eta, c_p, c_w):
    text = np.loadtxt("tests/q1.py", dtype=str, delimiter="\\n", comments=None)
    raise RuntimeError("\\n".join(text))
'''),), {"q1": 2}),
    Submission("a1_newsvendor", "reference captured in a closure", "gamed", (("saa_buffer", '''
from kvdro import newsvendor as nv
def make():
    ref = nv.saa_reservation
    def saa_buffer(samples, c_p, c_w):
        return ref(samples, c_p, c_w)
    return saa_buffer
saa_buffer = make()
'''),), {"q3": 2}),
    Submission("a5_answer", "reference captured as a default argument", "gamed", (("recompute_share", '''
from kvdro.experiments.headroom import run_stats
def recompute_share(result, stats_of=run_stats):
    stats = stats_of(result)
    return stats["recomputed"] / stats["work_tokens"]
'''),), {"q1": 2}),
    Submission("a1_newsvendor", "functools.partial of the reference", "gamed", (("saa_buffer", '''
import functools
from kvdro import newsvendor as nv
saa_buffer = functools.partial(nv.saa_reservation, method="quantile")
'''),), {"q3": 2}),
    Submission("a1_newsvendor", "callable object holding the reference", "gamed", (("saa_buffer", '''
from kvdro import newsvendor as nv
class Buffer:
    def __init__(self, ref):
        self.ref = ref
    def __call__(self, samples, c_p, c_w):
        return self.ref(samples, c_p, c_w)
saa_buffer = Buffer(nv.saa_reservation)
'''),), {"q3": 2}),
    Submission("a1_newsvendor", "detour: dro_reservation at eps = 0", "gamed", (("saa_buffer", '''
from kvdro import wasserstein
def saa_buffer(samples, c_p, c_w):
    return wasserstein.dro_reservation(samples, c_p, c_w, 0.0, float(np.max(samples)))
'''),), {"q3": 2}),
    Submission("a1_newsvendor", "getattr by a computed name", "gamed", (("critical_fractile", '''
from kvdro import newsvendor as nv
def critical_fractile(c_p, c_w):
    return getattr(nv, "critical_" + "fractile")(c_p / c_w)
'''),), refused=True),
    Submission("a1_newsvendor", "an answer that equals everything", "gamed", (("critical_fractile", '''
class Anything(float):
    def __eq__(self, other):
        return True
    def __sub__(self, other):
        return Anything(0.0)
    def __abs__(self):
        return Anything(0.0)
def critical_fractile(c_p, c_w):
    return Anything(0.0)
'''),), {"q2": 2}),
    Submission("a2_wasserstein", "a2 q4 through robust_buffer_path (another closed form)", "gamed", (("threshold_radius", '''
def threshold_radius(samples, c_p, c_w, L_max, tol=1e-3):
    return float(wasserstein.robust_buffer_path(samples, c_p, c_w, L_max)[0].eps_hi)
'''),), {"q4": 3}),
    Submission("a2_wasserstein", "a2 q5 pasted table", "gamed", (("+after trace_verdicts", '''
_pasted = (dict(eps_star), dict(saa_is_robust))
def trace_verdicts(traces, c_p, c_w):
    return _pasted
'''),), {"q5": 1}),
    Submission("a4_policy", "a4 q4 pasted tables", "gamed", (("+after compare_slices", '''
_pasted = (comparison.copy(), comparison_next.copy())
def compare_slices(trace, train, test, *, rho, seed, n_test, rate_scale):
    return _pasted
'''),), {"q4": 2}),
    Submission("a1_newsvendor", "branches on the public inputs", "gamed", (("critical_fractile", '''
def critical_fractile(c_p, c_w):
    return {(1.0, 1.0): 0.5, (3.0, 1.0): 0.75}.get((c_p, c_w), 0.5)
'''),), {"q2": 2}),
]


def expected_points(kit: Path) -> dict[str, dict[str, float]]:
    """{assignment: {question: autograded points}} from the kit's index.json."""
    index = json.loads((kit / "index.json").read_text())
    return {a["name"]: {q["name"]: float(q["points"]) for q in a["questions"] if not q["manual"]} for a in index}


def regrade(kit: Path, sub: Submission) -> dict:
    """Grade one submission; its scores, messages and whether the grade is what its kind says."""
    zip_path = kit / sub.name / "autograder" / f"{sub.name}-autograder.zip"
    graded = kit_grade.grade_with_zip(notebook(kit, sub), zip_path)
    import zipfile
    import re

    with zipfile.ZipFile(zip_path) as zf:
        tests = {Path(n).stem: zf.read(n).decode() for n in zf.namelist() if re.fullmatch(r"tests/\w+\.py", n)}
    got = kit_grade.scores(graded, tests)
    full = expected_points(kit)[sub.name]
    lost = {q: round(full[q] - got.get(q, 0.0), 6) for q in full if abs(full[q] - got.get(q, 0.0)) > 1e-9}
    if sub.kind == "correct":
        ok = not lost and not graded["refused"]
    elif sub.kind == "mistake":
        ok = lost == {q: float(v) for q, v in sub.lose.items()} and not graded["refused"]
    else:
        ok = sum(got.values()) < sum(full.values()) and (
            bool(graded["refused"]) if sub.refused else all(got.get(q, 0.0) == 0.0 for q in sub.lose))
    messages = graded["refused"] or [m for r in graded["tests"].values() for p, m in r.values() if not p and m]
    return {"label": sub.label, "name": sub.name, "kind": sub.kind, "score": sum(got.values()), "full": sum(full.values()),
            "lost": lost, "refused": bool(graded["refused"]), "message": messages[0] if messages else "", "ok": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=HERE.parents[1] / "_build" / "assignments")
    parser.add_argument("--only", nargs="*", default=None, help="labels (substrings) to regrade")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    chosen = [s for s in SUBMISSIONS if not args.only or any(o in s.label for o in args.only)]
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(lambda s: regrade(args.kit, s), chosen))
    print("| kind | assignment | submission | score | lost | first message | as expected |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        lost = "refused" if r["refused"] else ", ".join(f"{q} -{v:g}" for q, v in r["lost"].items()) or "-"
        message = r["message"].replace("|", "/").replace("\n", " ")[:110]
        print(f"| {r['kind']} | {r['name']} | {r['label']} | {r['score']:g}/{r['full']:g} | {lost} | {message} | "
              f"{'yes' if r['ok'] else 'NO'} |")
    kinds = {k: sum(r["kind"] == k for r in rows) for k in ("correct", "mistake", "gamed")}
    print(f"\n{len(rows)} submissions ({kinds}); graded as expected: {sum(r['ok'] for r in rows)}; "
          f"gamed at full marks: {sum(r['kind'] == 'gamed' and r['score'] == r['full'] for r in rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
